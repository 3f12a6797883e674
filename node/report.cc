#include "node/report.h"

#include <algorithm>
#include <cstdlib>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/file_util.h"
#include "core/json.h"
#include "core/status.h"

namespace starling {
namespace {

std::string Html(absl::string_view s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '&':
        out += "&amp;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

// Text for a single-quoted gnuplot string.
std::string GnuplotText(absl::string_view s) {
  std::string out;
  for (char c : s) {
    if (c != '\'' && c != '\\') out += c;
  }
  return out;
}

// The y axis of a members chart: from 0 to one above the most members any
// round had, so that the line (constant in most runs) is drawn inside the
// frame, not on its top border.
std::string MembersAxis(const ReportData& d) {
  int most = 0;
  for (const auto& r : d.rounds) most = std::max(most, r.members);
  std::string axis =
      absl::StrFormat("set ylabel 'members'; set yrange [0:%d];", most + 1);
  if (most <= 16) absl::StrAppend(&axis, "set ytics 1;");
  return axis;
}

// The membership-over-time chart: members of each round against wall time,
// with a dashed vertical line and a label at each fault carried out.
std::string MembershipOverTime(const ReportData& d) {
  double xmax = 0;
  for (const auto& r : d.rounds) xmax = std::max(xmax, r.wall_seconds);
  std::string script = absl::StrCat(
      "set xlabel 'wall seconds since the sim started';", MembersAxis(d));
  for (const auto& f : d.faults) {
    if (!f.skipped.empty()) continue;
    xmax = std::max(xmax, f.wall_seconds);
    const char* color = f.kind == "kill"                            ? "#c00000"
                        : f.kind == "leave"                         ? "#d07000"
                        : (f.kind == "join" || f.kind == "restart") ? "#008000"
                                                                    : "#0050c0";
    absl::StrAppendFormat(
        &script,
        "set arrow from first %.3f, graph 0 to first %.3f, graph 1 nohead "
        "lc rgb '%s' dt 2 lw 1.5;"
        "set label '%s %s' at first %.3f, graph 0.97 right rotate by 90 "
        "offset -0.7,0 noenhanced font ',8' tc rgb '%s';",
        f.wall_seconds, f.wall_seconds, color, GnuplotText(f.kind),
        GnuplotText(f.node), f.wall_seconds, color);
  }
  // Shade each partition from its start to its end.
  double partition_start = -1;
  for (const auto& f : d.faults) {
    if (!f.skipped.empty()) continue;
    if (f.kind == "partition_start") partition_start = f.wall_seconds;
    if (f.kind == "partition_end" && partition_start >= 0) {
      absl::StrAppendFormat(&script,
                            "set object rect from first %.3f, graph 0 to "
                            "first %.3f, graph 1 behind fc rgb '#0050c0' "
                            "fs transparent solid 0.08 noborder;",
                            partition_start, f.wall_seconds);
      partition_start = -1;
    }
  }
  absl::StrAppendFormat(&script, "set xrange [0:%.3f];", xmax * 1.05 + 1);
  absl::StrAppend(&script,
                  "plot 'rounds.csv' using 4:6 with linespoints lw 2 pt 7 ps "
                  "0.6 title 'members of each round'");
  return script;
}

// Loss against wall time, with a vertical line and a label at each data
// drift (solid red) and drift detection (dashed purple).
std::string LossVsTime(const ReportData& d) {
  std::string script =
      "set xlabel 'wall seconds'; set ylabel 'loss (nats/token)';";
  for (const auto& m : d.loss_marks) {
    const char* color = m.drift ? "#c00000" : "#8000a0";
    absl::StrAppendFormat(
        &script,
        "set arrow from first %.3f, graph 0 to first %.3f, graph 1 nohead "
        "lc rgb '%s' dt %d lw 1.5;"
        "set label '%s' at first %.3f, graph 0.97 right rotate by 90 "
        "offset -0.7,0 noenhanced font ',8' tc rgb '%s';",
        m.wall_seconds, m.wall_seconds, color, m.drift ? 1 : 2,
        GnuplotText(m.label), m.wall_seconds, color);
  }
  absl::StrAppend(&script,
                  "plot 'rounds.csv' using 4:3 with lines lw 2 title 'train "
                  "loss (mean of nodes)', 'val_loss.csv' using 1:2 with "
                  "linespoints lw 2 pt 7 title 'validation loss'");
  return script;
}

struct Chart {
  std::string file;  // PNG name
  std::string title;
  std::string script;  // gnuplot commands after the terminal/output lines
};

// The data behind the charts: DIR/report/*.csv.
absl::Status WriteCsvFiles(const std::string& rdir, const ReportData& d) {
  std::string val = "wall_seconds,val_loss\n";
  for (auto [t, v] : d.val_vs_time) {
    absl::StrAppendFormat(&val, "%.3f,%.6f\n", t, v);
  }
  std::string rounds =
      "round,cumulative_mb,train_loss,wall_seconds,hashes_agree,members\n";
  for (const auto& r : d.rounds) {
    absl::StrAppendFormat(&rounds, "%d,%.6f,%.6f,%.3f,%d,%d\n", r.round,
                          r.cumulative_bytes / 1e6, r.train_loss,
                          r.wall_seconds, r.hashes_agree ? 1 : 0, r.members);
  }
  std::string nodes = "node,sent_mb,received_mb,utilization\n";
  for (const auto& n : d.nodes) {
    absl::StrAppendFormat(&nodes, "%s,%.6f,%.6f,%.4f\n", n.id,
                          n.bytes_sent / 1e6, n.bytes_received / 1e6,
                          n.utilization);
  }
  STARLING_RETURN_IF_ERROR(WriteFileAtomic(rdir + "/val_loss.csv", val));
  STARLING_RETURN_IF_ERROR(WriteFileAtomic(rdir + "/rounds.csv", rounds));
  STARLING_RETURN_IF_ERROR(WriteFileAtomic(rdir + "/nodes.csv", nodes));
  if (!d.accuracy_vs_time.empty()) {
    std::string acc = "wall_seconds,val_accuracy\n";
    for (auto [t, a] : d.accuracy_vs_time) {
      absl::StrAppendFormat(&acc, "%.3f,%.6f\n", t, a);
    }
    STARLING_RETURN_IF_ERROR(WriteFileAtomic(rdir + "/val_accuracy.csv", acc));
  }
  if (!d.faults.empty()) {
    std::string faults = "wall_seconds,kind,node,skipped\n";
    for (const auto& f : d.faults) {
      absl::StrAppendFormat(&faults, "%.3f,%s,\"%s\",\"%s\"\n", f.wall_seconds,
                            f.kind, f.node, f.skipped);
    }
    STARLING_RETURN_IF_ERROR(WriteFileAtomic(rdir + "/faults.csv", faults));
  }
  if (!d.loss_marks.empty()) {
    std::string marks = "wall_seconds,kind,label\n";
    for (const auto& m : d.loss_marks) {
      absl::StrAppendFormat(&marks, "%.3f,%s,\"%s\"\n", m.wall_seconds,
                            m.drift ? "drift" : "drift_detected", m.label);
    }
    STARLING_RETURN_IF_ERROR(WriteFileAtomic(rdir + "/drift.csv", marks));
  }
  if (!d.consensus.empty()) {
    std::string csv = "step,distance,nodes\n";
    for (const auto& c : d.consensus) {
      absl::StrAppendFormat(&csv, "%d,%.9g,%d\n", c.step, c.distance, c.nodes);
    }
    STARLING_RETURN_IF_ERROR(WriteFileAtomic(rdir + "/consensus.csv", csv));
  }
  return absl::OkStatus();
}

// The charts the data has points for, in the page's order.
std::vector<Chart> ChartsFor(const ReportData& d) {
  std::vector<Chart> charts = {
      {"val_loss_vs_time.png",
       d.loss_marks.empty() ? "Validation loss vs wall time"
                            : "Validation loss vs wall time, with data drift",
       LossVsTime(d)},
      {"loss_vs_bytes.png", "Loss vs bytes sent (all nodes)",
       "set xlabel 'MB sent (all nodes)'; set ylabel 'train loss';"
       "plot 'rounds.csv' using 2:3 with linespoints lw 2 pt 7 title 'train "
       "loss after each round'"},
      {"bytes_per_node.png", "Bytes per node",
       "set style data histograms; set style fill solid 0.8; set ylabel "
       "'MB'; set yrange [0:*];"
       "plot 'nodes.csv' using 2:xtic(1) title 'sent', '' using 3 title "
       "'received'"},
      {"hash_agreement.png", "Model hash agreement per round",
       "set xlabel 'round'; set yrange [-0.1:1.1]; set ytics ('differ' 0, "
       "'agree' 1);"
       "plot 'rounds.csv' using 1:5 with points pt 7 ps 1.2 title 'all "
       "members hold the same model hash'"},
      {"membership.png", "Members per round",
       absl::StrCat("set xlabel 'round';", MembersAxis(d),
                    "plot 'rounds.csv' using 1:6 with steps lw 2 title "
                    "'members'")},
      {"membership_over_time.png",
       d.faults.empty() ? "Membership over time"
                        : "Membership over time, with the injected faults",
       MembershipOverTime(d)},
  };
  if (!d.accuracy_vs_time.empty()) {
    charts.insert(
        charts.begin() + 1,
        {"val_accuracy_vs_time.png", "Validation accuracy vs wall time",
         "set xlabel 'wall seconds'; set ylabel 'accuracy (%)';"
         "set yrange [0:100];"
         "plot 'val_accuracy.csv' using 1:($2*100) with linespoints "
         "lw 2 pt 7 title 'validation accuracy'"});
  }
  if (d.rounds.empty()) {
    // No rounds (gossip): charts drawn only from rounds.csv would have no
    // points, and gnuplot stops at the first empty one.
    charts.erase(std::remove_if(charts.begin(), charts.end(),
                                [](const Chart& c) {
                                  return c.file != "val_loss_vs_time.png" &&
                                         c.file != "val_accuracy_vs_time.png" &&
                                         c.file != "bytes_per_node.png";
                                }),
                 charts.end());
  }
  if (!d.consensus.empty()) {
    charts.push_back(
        {"consensus.png", "Consensus distance (gossip)",
         "set xlabel 'step'; set ylabel '(1/n) sum |theta_i - mean|^2';"
         "set logscale y;"
         "plot 'consensus.csv' using 1:2 with linespoints lw 2 pt 7 title "
         "'consensus distance over the nodes with a snapshot'"});
  }
  return charts;
}

// The gnuplot script that draws `charts` from the CSV files.
std::string ChartsScript(const std::vector<Chart>& charts) {
  std::string script;
  for (const Chart& c : charts) {
    // columnhead makes gnuplot read each CSV's first line as the header.
    absl::StrAppend(&script,
                    "reset; set datafile separator ','; set key autotitle "
                    "columnhead; set grid; set key outside bottom center "
                    "horizontal; set terminal pngcairo size 800,450;\n"
                    "set output '",
                    c.file, "';\nset title '", c.title, "';\n", c.script, "\n");
  }
  return script;
}

// Runs gnuplot on DIR/report/charts.gp. An error says why the page has no
// charts.
absl::Status DrawCharts(const std::string& rdir) {
  if (std::system("command -v gnuplot >/dev/null 2>&1") != 0) {
    return absl::FailedPreconditionError(
        "gnuplot is not installed (apt-get install gnuplot-nox); report.html "
        "has no charts");
  }
  std::string cmd =
      absl::StrCat("cd '", rdir, "' && gnuplot charts.gp >gnuplot.log 2>&1");
  if (std::system(cmd.c_str()) != 0) {
    return absl::InternalError(
        absl::StrCat("gnuplot failed; see ", rdir, "/gnuplot.log"));
  }
  return absl::OkStatus();
}

// The table of figures, then the table of fault events if any.
std::string TablesHtml(const ReportData& d) {
  std::string html = "<table>\n";
  for (const auto& [k, v] : d.facts) {
    absl::StrAppend(&html, "<tr><th>", Html(k), "</th><td>", Html(v),
                    "</td></tr>\n");
  }
  absl::StrAppend(&html, "</table>\n");
  if (d.faults.empty()) return html;
  absl::StrAppend(&html,
                  "<h2>Fault events</h2>\n<table>\n<tr><th>wall "
                  "seconds</th><th>event</th><th>node</th><th>outcome</th>"
                  "</tr>\n");
  for (const auto& f : d.faults) {
    absl::StrAppendFormat(
        &html, "<tr><td>%.1f</td><td>%s</td><td>%s</td><td>%s</td></tr>\n",
        f.wall_seconds, Html(f.kind), Html(f.node),
        f.skipped.empty() ? std::string("carried out")
                          : Html(absl::StrCat("skipped: ", f.skipped)));
  }
  absl::StrAppend(&html, "</table>\n");
  return html;
}

// The chart `file` in `rdir` as an <img> whose source is a data: URI (the
// PNG in base64), so that the page needs no side files; or a note when
// gnuplot left no such file.
std::string InlineImage(const std::string& rdir, const Chart& c) {
  absl::StatusOr<std::string> png = ReadFile(absl::StrCat(rdir, "/", c.file));
  if (!png.ok()) {
    return absl::StrCat("<p>(no chart: ", Html(png.status().message()),
                        ")</p>\n");
  }
  return absl::StrCat("<img src=\"data:image/png;base64,",
                      absl::Base64Escape(*png), "\" alt=\"", Html(c.title),
                      "\">\n");
}

// report.html: the tables, each chart (or why it is missing), the data.
std::string ReportHtml(const std::string& rdir, const ReportData& d,
                       const std::vector<Chart>& charts,
                       const absl::Status& charts_status) {
  std::string html = absl::StrCat(
      "<!doctype html>\n<html><head><meta charset=\"utf-8\"><title>",
      Html(d.title),
      "</title><style>body{font-family:sans-serif;max-width:900px;margin:2em "
      "auto}table{border-collapse:collapse}td,th{border:1px solid "
      "#ccc;padding:4px 10px;text-align:left}img{max-width:100%}</style>"
      "</head><body>\n<h1>",
      Html(d.title), "</h1>\n", TablesHtml(d));
  for (const Chart& c : charts) {
    absl::StrAppend(&html, "<h2>", Html(c.title), "</h2>\n");
    if (charts_status.ok()) {
      absl::StrAppend(&html, InlineImage(rdir, c));
    } else {
      absl::StrAppend(&html, "<p>(no chart: ", Html(charts_status.message()),
                      ")</p>\n");
    }
  }
  absl::StrAppend(
      &html,
      "<p>Data, beside this page: <a "
      "href=\"report/rounds.csv\">rounds.csv</a>, "
      "<a href=\"report/val_loss.csv\">val_loss.csv</a>, <a "
      "href=\"report/nodes.csv\">nodes.csv</a>, ",
      d.accuracy_vs_time.empty()
          ? ""
          : "<a href=\"report/val_accuracy.csv\">val_accuracy.csv</a>, ",
      d.faults.empty() ? "" : "<a href=\"report/faults.csv\">faults.csv</a>, ",
      "<a href=\"summary.json\">summary.json</a>.</p>\n</body></html>\n");
  return html;
}

}  // namespace

absl::Status WriteReport(const std::string& dir, const ReportData& d) {
  const std::string rdir = absl::StrCat(dir, "/report");
  STARLING_RETURN_IF_ERROR(MakeDirs(rdir));
  STARLING_RETURN_IF_ERROR(WriteCsvFiles(rdir, d));
  const std::vector<Chart> charts = ChartsFor(d);
  STARLING_RETURN_IF_ERROR(
      WriteFileAtomic(rdir + "/charts.gp", ChartsScript(charts)));
  const absl::Status charts_status = DrawCharts(rdir);
  STARLING_RETURN_IF_ERROR(WriteFileAtomic(
      dir + "/report.html", ReportHtml(rdir, d, charts, charts_status)));
  return charts_status;
}

}  // namespace starling
