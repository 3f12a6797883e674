#include "node/sim_progress.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "core/logging.h"
#include "node/run_output.h"

namespace starling {
namespace {

using google::protobuf::Struct;

std::vector<std::string> EventPaths(const std::string& dir,
                                    const std::vector<std::string>& ids) {
  std::vector<std::string> paths;
  for (const std::string& id : ids) {
    paths.push_back(absl::StrCat(dir, "/", id, "/events.jsonl"));
  }
  return paths;
}

}  // namespace

std::string FormatProgressLine(const ProgressFigures& f) {
  const std::string exchanging =
      f.exchanging_round >= 0
          ? absl::StrCat(" | exchanging round ", f.exchanging_round + 1,
                         " for ", FormatDuration(f.exchanging_seconds))
          : "";
  return absl::StrFormat(
      "sim | %s %d%s | step %d/%d | loss %s | val %s%s | sent %s | %s | "
      "eta %s%s",
      f.gossip ? "pushes" : "round", f.count,
      f.members >= 0 ? absl::StrFormat(" | members %d", f.members) : "", f.step,
      f.total_steps, f.step > 0 ? absl::StrFormat("%.4f", f.loss) : "-",
      std::isnan(f.val) ? "-" : absl::StrFormat("%.4f", f.val),
      std::isnan(f.acc) ? "" : absl::StrFormat(" | acc %.2f%%", 100 * f.acc),
      FormatBytes(f.sent), FormatDuration(f.elapsed), FormatDuration(f.eta),
      exchanging);
}

double EtaSeconds(double elapsed, int step, int total_steps) {
  return step > 0 ? elapsed * (total_steps - step) / step : NAN;
}

SimProgress::SimProgress(const std::string& dir,
                         const std::vector<std::string>& ids, int total_steps,
                         bool show_members, bool gossip)
    : tail_(EventPaths(dir, ids)),
      nodes_(ids.size()),
      total_steps_(total_steps),
      show_members_(show_members),
      gossip_(gossip) {}

void SimProgress::Poll() {
  const absl::Time now = absl::Now();
  tail_.Poll([&](size_t i, const Struct& ev) { Observe(i, ev, now); });
}

void SimProgress::Observe(size_t i, const Struct& ev, absl::Time now) {
  Node& n = nodes_[i];
  const std::string kind = FieldOf(ev, "event").string_value();
  const int step = static_cast<int>(FieldOf(ev, "step").number_value());
  if (kind == "round") {
    const int64_t r = FieldOf(ev, "round").number_value();
    if (r >= n.syncing) n.syncing = -1;
    if (r + 1 >= round_) {
      round_ = r + 1;
      members_ = FieldOf(ev, "members").list_value().values_size();
    }
    n.step = step;
    n.loss = FieldOf(ev, "train_loss").number_value();
    n.sent += FieldOf(ev, "bytes").number_value();
    ++n.rounds;
  } else if (kind == "sync") {
    // A DiLoCo round's exchange began (again, on a retry).
    const int64_t r = FieldOf(ev, "sync_round").number_value();
    if (r != n.syncing) {
      n.syncing = r;
      n.sync_since = now;
    }
  } else if (kind == "exchange") {
    // Gossip has no rounds: each push or absorb is progress.
    n.step = std::max(n.step, step);
    if (FieldOf(ev, "kind").string_value() == "push") {
      ++pushes_;
      n.sent += FieldOf(ev, "bytes").number_value();
      n.loss = FieldOf(ev, "train_loss").number_value();
    }
    ++n.rounds;
  } else if (kind == "end" || kind == "leave") {
    // Gossip's last steps may end in a push that found nobody left.
    n.step = std::max(n.step, step);
    n.syncing = -1;  // a node that left mid-exchange waits no more
  } else if (kind == "eval") {
    val_ = n.val = FieldOf(ev, "val_loss").number_value();
    if (const google::protobuf::Value& a = FieldOf(ev, "val_accuracy");
        a.kind_case() == google::protobuf::Value::kNumberValue) {
      acc_ = n.acc = a.number_value();
    }
  } else if (kind == "start" || kind == "resume") {
    formed_ = true;  // its --min_members were there
  }
}

ProgressFigures SimProgress::Figures(double elapsed, absl::Time now) const {
  int min_step = -1, counted = 0, with_val = 0, with_acc = 0;
  double loss = 0, sent = 0, val_sum = 0, acc_sum = 0;
  // The oldest exchange still open: a round's exchange that takes long (a
  // slow link, a member being waited for) is named.
  int64_t sync_round = -1;
  absl::Time since = absl::InfiniteFuture();
  for (const Node& n : nodes_) {
    sent += n.sent;
    if (!std::isnan(n.val)) {
      val_sum += n.val;
      ++with_val;
    }
    if (!std::isnan(n.acc)) {
      acc_sum += n.acc;
      ++with_acc;
    }
    if (!n.counted) continue;
    min_step = min_step < 0 ? n.step : std::min(min_step, n.step);
    loss += n.loss;
    ++counted;
    if (n.syncing >= 0 && n.sync_since < since) {
      since = n.sync_since;
      sync_round = n.syncing;
    }
  }
  ProgressFigures f;
  f.gossip = gossip_;
  f.count = gossip_ ? pushes_ : round_;
  f.members = show_members_ ? members_ : -1;
  f.step = std::max(min_step, 0);
  f.total_steps = total_steps_;
  f.loss = counted > 0 ? loss / counted : loss;
  // Gossip: each node evaluates its own model, so the mean of their
  // latest (as the run's result is); DiLoCo: the latest, of θ_global.
  f.val = !gossip_ ? val_ : with_val > 0 ? val_sum / with_val : NAN;
  f.acc = !gossip_ ? acc_ : with_acc > 0 ? acc_sum / with_acc : NAN;
  f.sent = sent;
  f.elapsed = elapsed;
  f.eta = EtaSeconds(elapsed, f.step, total_steps_);
  const absl::Duration waited = now - since;
  if (sync_round >= 0 && waited >= absl::Seconds(5)) {
    f.exchanging_round = sync_round;
    f.exchanging_seconds = absl::ToDoubleSeconds(waited);
  }
  return f;
}

void ProgressPrinter::Show(const std::string& line, absl::Time now) {
  if (tty_) {
    std::fprintf(stderr, "\r%-110s", line.c_str());
    std::fflush(stderr);
  } else if (line != last_line_ && now - last_print_ > absl::Seconds(5)) {
    WriteStderrLine(line);
    last_print_ = now;
    last_line_ = line;
  }
}

void ProgressPrinter::ShowFinal(const std::string& line) {
  if (tty_) {
    std::fprintf(stderr, "\r%-110s\n", line.c_str());
  } else if (line != last_line_) {
    WriteStderrLine(line);
  }
}

void ProgressPrinter::Say(const std::string& message) {
  if (tty_) std::fprintf(stderr, "\r%-110s\r", "");
  WriteStderrLine(message);
}

}  // namespace starling
