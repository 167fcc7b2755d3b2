// `tether cron next EXPR ...`: the next occurrences of a cron expression, in
// UTC and in its zone; `tether cron validate FILE`: checks a schedule file
// (docs/cron.md) and prints each job's next run. Exit status: 0 when valid,
// 2 for a malformed expression, file or usage (the message names what is wrong).
// `tether cron run --db FILE ...`: a host's scheduler on FILE (cmd_cron_run.cpp).
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <optional>
#include <sstream>

#include "cmd_cron_run.hpp"
#include "command.hpp"
#include "tether/protocol/cron.hpp"

namespace tether::cli {
namespace {

namespace proto = tether::protocol;

constexpr const char* k_usage =
    "usage: tether cron next EXPR [--tz ZONE] [-n N] [--after TIME]\n"
    "       tether cron validate FILE [--after TIME]\n"
    "       tether cron run --db FILE [--file JOBS.json] [--catch-up on|off]\n"
    "                       [--virtual START_MS --until END_MS]\n"
    "  EXPR          a cron expression of 5 or 6 fields, quoted: \"*/15 9-17 * * MON-FRI\"\n"
    "  --tz ZONE     its IANA time zone (default UTC)\n"
    "  -n N          how many occurrences to print (default 5, at most 1000)\n"
    "  --after TIME  start after TIME (ISO 8601, e.g. 2026-12-03T09:00:00Z) instead of now\n";

int usage_error(const std::string& what) {
  std::cerr << "tether cron: " << what << "\n" << k_usage;
  return 2;
}

std::int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string local_time(std::int64_t ms, const std::string& zone) {
  auto local = proto::format_local(ms, zone);
  return local ? *local : std::string("?");
}

// "2026-03-08T07:00:00.000Z  2026-03-08 03:00:00 EDT"
std::string both_times(std::int64_t ms, const std::string& zone) {
  return proto::format_utc(ms) + "  " + local_time(ms, zone);
}

struct options {
  std::string operand;  // EXPR or FILE
  std::string zone = "UTC";
  long n = 5;
  std::int64_t after = 0;
};

// The arguments after the subcommand; `next` also takes --tz and -n. An
// error says what was wrong.
std::optional<std::string> parse_options(const args& a, bool is_next, options& o) {
  o.after = now_ms();
  for (std::size_t i = 1; i < a.size(); ++i) {
    bool has_value = i + 1 < a.size();
    if (is_next && a[i] == "--tz" && has_value) {
      o.zone = a[++i];
    } else if (is_next && a[i] == "-n" && has_value) {
      char* end = nullptr;
      o.n = std::strtol(a[++i].c_str(), &end, 10);
      if (*end != '\0' || o.n < 1 || o.n > 1000)
        return "-n '" + a[i] + "' is not a whole number in 1..1000";
    } else if (a[i] == "--after" && has_value) {
      auto t = proto::parse_utc(a[++i]);
      if (!t) return "--after: " + t.error().problem;
      o.after = *t;
    } else if (o.operand.empty() && !a[i].empty() && a[i][0] != '-') {
      o.operand = a[i];
    } else {
      return "unexpected argument '" + a[i] + "'" +
             (is_next ? " (quote the expression as one argument)" : "");
    }
  }
  if (o.operand.empty()) return is_next ? "next needs an expression" : "validate needs a file";
  return std::nullopt;
}

int next(const args& a) {
  options o;
  if (auto err = parse_options(a, true, o)) return usage_error(*err);
  auto e = proto::parse_cron(o.operand);
  if (!e) return usage_error(e.error().describe());
  if (!proto::known_zone(o.zone)) return usage_error("--tz: unknown time zone '" + o.zone + "'");
  proto::schedule s = proto::cron_schedule{*e, o.zone};
  auto t = o.after;
  for (long k = 0; k < o.n; ++k) {
    auto r = proto::next_after(s, t);
    if (!r) return usage_error(r.error().describe());
    if (!*r) {
      std::cout << "(no more occurrences within five years)\n";
      break;
    }
    std::cout << both_times(**r, o.zone) << "\n";
    t = **r;
  }
  return 0;
}

int validate(const args& a) {
  options o;
  if (auto err = parse_options(a, false, o)) return usage_error(*err);
  const auto& file = o.operand;
  std::ifstream in(file, std::ios::binary);
  if (!in) {
    std::cerr << "tether cron validate: cannot read " << file << "\n";
    return 2;
  }
  std::ostringstream text;
  text << in.rdbuf();
  auto jobs = proto::parse_cron_file(text.str());
  if (!jobs) {
    std::cerr << "tether cron validate: " << file << " refused: " << jobs.error().describe()
              << "\n";
    return 2;
  }
  for (const auto& j : *jobs) {
    std::cout << j.name << "  " << proto::describe(j.when) << "  ";
    auto zone = std::holds_alternative<proto::cron_schedule>(j.when)
                    ? std::get<proto::cron_schedule>(j.when).zone
                    : std::string("UTC");
    auto r = proto::next_after(j.when, o.after);
    if (r && *r)
      std::cout << "next " << proto::format_utc(**r) << " (" << local_time(**r, zone) << ")";
    else
      std::cout << "next none";
    if (!j.enabled) std::cout << "  (disabled)";
    std::cout << "\n";
  }
  std::cout << file << ": " << jobs->size() << " job" << (jobs->size() == 1 ? "" : "s")
            << ", valid\n";
  return 0;
}

int cron(const args& a) {
  if (a.empty()) return usage_error("missing a subcommand (next, validate or run)");
  if (a[0] == "run") return cron_run(args(a.begin() + 1, a.end()));
  if (a[0] == "next") return next(a);
  if (a[0] == "validate") return validate(a);
  if (a[0] == "-h" || a[0] == "--help") {
    std::cout << k_usage;
    return 0;
  }
  return usage_error("unknown subcommand '" + a[0] + "'");
}

registrar cron_cmd{
    {"cron",
     "next EXPR | validate FILE | run --db FILE: cron times, schedule files, and a\n"
     "                 scheduler running a schedule file on a database (docs/cron.md)",
     cron}};

}  // namespace
}  // namespace tether::cli
