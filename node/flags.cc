#include "node/flags.h"

#include <algorithm>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/reflection.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "core/file_util.h"
#include "core/status.h"

namespace starling {
namespace {

absl::Status ParseArgs(const Subcommand& sub,
                       const std::vector<std::string>& args, bool* help,
                       int depth) {
  if (depth > 8) {
    return absl::InvalidArgumentError("--flagfile nesting is too deep");
  }
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--help" || arg == "-h" || arg == "--helpfull") {
      *help = true;
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
    auto known = [&](const std::string& n) {
      return std::find(sub.flags.begin(), sub.flags.end(), n) !=
             sub.flags.end();
    };
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
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ParseSubcommandFlags(const Subcommand& sub,
                                  const std::vector<std::string>& args,
                                  bool* help) {
  *help = false;
  std::vector<std::string> rest = args;
  if (!sub.operand.empty()) {
    if (!rest.empty() && rest[0] == sub.operand) {
      rest.erase(rest.begin());
    } else if (std::find_if(rest.begin(), rest.end(), [](const std::string& a) {
                 return a == "--help" || a == "-h" || a == "--helpfull";
               }) != rest.end()) {
      *help = true;
      return absl::OkStatus();
    } else {
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

std::string SubcommandUsage(const Subcommand& sub) {
  std::string out =
      absl::StrCat("usage: starling ", sub.name, sub.operand.empty() ? "" : " ",
                   sub.operand, " [--flag=value ...] [--flagfile=FILE]\n\n",
                   sub.description, "\n\nflags:\n");
  for (const std::string& name : sub.flags) {
    absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    if (flag == nullptr) continue;
    auto own_help = sub.help.find(name);
    const std::string help =
        own_help != sub.help.end() ? own_help->second : flag->Help();
    auto own = sub.defaults.find(name);
    std::string def =
        own != sub.defaults.end() ? own->second : flag->DefaultValue();
    absl::StrAppend(&out, "  --", name,
                    "  (default: ", def.empty() ? "\"\"" : def, ")\n      ",
                    help, "\n");
  }
  absl::StrAppend(&out,
                  "  --flagfile=FILE\n      read more flags from FILE, one "
                  "--name=value per line ('#' starts a comment)\n");
  return out;
}

}  // namespace starling
