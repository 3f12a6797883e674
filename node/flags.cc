#include "node/flags.h"

#include <algorithm>
#include <set>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/reflection.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "core/file_util.h"
#include "core/status.h"
#include "node/flag_sections.h"

namespace starling {
namespace {

// The flags the arguments gave (FlagGiven).
std::set<std::string>& GivenFlags() {
  static auto* given = new std::set<std::string>;
  return *given;
}

bool Accepts(const Subcommand& sub, absl::string_view name) {
  return std::find(sub.flags.begin(), sub.flags.end(), name) != sub.flags.end();
}

HelpRequest HelpRequestOf(absl::string_view arg) {
  if (arg == "--helpfull") return HelpRequest::kHelpFull;
  if (arg == "--help" || arg == "-h") return HelpRequest::kHelp;
  return HelpRequest::kNone;
}

absl::Status ParseArgs(const Subcommand& sub,
                       const std::vector<std::string>& args, HelpRequest* help,
                       int depth) {
  if (depth > 8) {
    return absl::InvalidArgumentError("--flagfile nesting is too deep");
  }
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (HelpRequest asked = HelpRequestOf(arg); asked != HelpRequest::kNone) {
      *help = std::max(*help, asked);
      continue;
    }
    if (!absl::StartsWith(arg, "-")) {
      return absl::InvalidArgumentError(absl::StrCat(
          "unexpected argument '", arg, "'; flags look like --name=value"));
    }
    absl::string_view body = arg;
    absl::ConsumePrefix(&body, "--") || absl::ConsumePrefix(&body, "-");
    std::string name(body.substr(0, body.find('=')));
    bool has_value = body.find('=') != absl::string_view::npos;
    std::string value =
        has_value ? std::string(body.substr(body.find('=') + 1)) : "";
    if (name == "flagfile") {
      if (!has_value) {
        if (i + 1 >= args.size()) {
          return absl::InvalidArgumentError("--flagfile needs a file path");
        }
        value = args[++i];
      }
      absl::StatusOr<std::string> text = ReadFile(value);
      if (!text.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat("--flagfile=", value, ": ", text.status().message()));
      }
      std::vector<std::string> lines;
      for (absl::string_view line : absl::StrSplit(*text, '\n')) {
        line = absl::StripAsciiWhitespace(line);
        if (line.empty() || absl::StartsWith(line, "#")) continue;
        lines.emplace_back(line);
      }
      STARLING_RETURN_IF_ERROR(ParseArgs(sub, lines, help, depth + 1));
      continue;
    }
    bool negated = false;
    auto known = [&](absl::string_view n) { return Accepts(sub, n); };
    if (!known(name) && absl::StartsWith(name, "no") && !has_value &&
        known(name.substr(2))) {
      name = name.substr(2);
      negated = true;
    }
    absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    if (flag == nullptr || !known(name)) {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown flag --", name, " for 'starling ", sub.name,
                       "' (see starling ", sub.name, " --help)"));
    }
    bool is_bool = flag->IsOfType<bool>();
    if (!has_value) {
      if (is_bool) {
        value = negated ? "false" : "true";
      } else if (i + 1 < args.size() && !absl::StartsWith(args[i + 1], "--")) {
        value = args[++i];
      } else {
        return absl::InvalidArgumentError(
            absl::StrCat("flag --", name, " needs a value (--", name, "=...)"));
      }
    }
    std::string error;
    if (!flag->ParseFrom(value, &error)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", name, "=", value, ": ", error));
    }
    GivenFlags().insert(std::string(name));
  }
  return absl::OkStatus();
}

// The flags of `sub` that the table places in `section`, in table order.
std::vector<std::string> FlagsIn(const Subcommand& sub, FlagSection section) {
  std::vector<std::string> names;
  for (const PlacedFlag& f : FlagTable()) {
    if (f.section == section && Accepts(sub, f.name)) {
      names.emplace_back(f.name);
    }
  }
  return names;
}

// The flags of `sub` that the table lacks: listed under "Other" rather than
// left out (cli_test fails on them, so they get placed).
std::vector<std::string> UnplacedFlags(const Subcommand& sub) {
  std::vector<std::string> names;
  for (const std::string& name : sub.flags) {
    if (!SectionOfFlag(name).has_value()) names.push_back(name);
  }
  return names;
}

// One flag's entry: name and default, then its help text on the next line.
std::string FlagUsage(const Subcommand& sub, const std::string& name) {
  absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
  if (flag == nullptr) return "";
  auto own_help = sub.help.find(name);
  const std::string help =
      own_help != sub.help.end() ? own_help->second : flag->Help();
  auto own = sub.defaults.find(name);
  std::string def =
      own != sub.defaults.end() ? own->second : flag->DefaultValue();
  return absl::StrCat("  --", name, "  (default: ", def.empty() ? "\"\"" : def,
                      ")\n      ", help, "\n");
}

}  // namespace

absl::Status ParseSubcommandFlags(const Subcommand& sub,
                                  const std::vector<std::string>& args,
                                  HelpRequest* help) {
  *help = HelpRequest::kNone;
  std::vector<std::string> rest = args;
  if (!sub.operand.empty()) {
    if (!rest.empty() && rest[0] == sub.operand) {
      rest.erase(rest.begin());
    } else {
      // Help needs no operand: `starling bench --help`.
      for (const std::string& a : rest) {
        *help = std::max(*help, HelpRequestOf(a));
      }
      if (*help != HelpRequest::kNone) return absl::OkStatus();
      return absl::InvalidArgumentError(absl::StrCat(
          "expected 'starling ", sub.name, " ", sub.operand, "'",
          rest.empty() ? "" : absl::StrCat(", got '", rest[0], "'")));
    }
  }
  for (const auto& [name, value] : sub.defaults) {
    absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    std::string error;
    if (flag == nullptr || !flag->ParseFrom(value, &error)) {
      return absl::InternalError(absl::StrCat("default --", name, "=", value,
                                              " of 'starling ", sub.name,
                                              "': ", error));
    }
  }
  return ParseArgs(sub, rest, help, 0);
}

bool FlagGiven(absl::string_view name) {
  return GivenFlags().count(std::string(name)) > 0;
}

std::string SubcommandUsage(const Subcommand& sub, HelpRequest help) {
  const bool full = help == HelpRequest::kHelpFull;
  std::string out = absl::StrCat(
      "usage: starling ", sub.name, sub.operand.empty() ? "" : " ", sub.operand,
      " [--flag=value ...] [--flagfile=FILE]\n\n", sub.description, "\n");
  auto section = [&](absl::string_view heading,
                     const std::vector<std::string>& names) {
    if (names.empty()) return;
    absl::StrAppend(&out, "\n", heading, "\n");
    for (const std::string& name : names) {
      absl::StrAppend(&out, FlagUsage(sub, name));
    }
  };
  int hidden = 0;
  for (const FlagSectionInfo& s : FlagSections()) {
    std::vector<std::string> names = FlagsIn(sub, s.section);
    if (s.hidden && !full) {
      hidden += static_cast<int>(names.size());
    } else {
      section(s.heading, names);
    }
  }
  section("Other flags:", UnplacedFlags(sub));
  absl::StrAppend(&out,
                  "\n--flagfile=FILE reads more flags from FILE, one "
                  "--name=value per line ('#' starts a comment).\n");
  if (hidden > 0) {
    absl::StrAppend(&out, "--helpfull also lists the ", hidden, " test-only ",
                    hidden == 1 ? "flag" : "flags", ", hidden here.\n");
  }
  return out;
}

}  // namespace starling
