// `tether cron next EXPR ...`: the next occurrences of a cron expression, in
// UTC and in its zone; `tether cron validate FILE`: checks a schedule file
// (docs/cron.md) and prints each job's next run. Exit status: 0 when valid,
// 2 for a malformed expression, file or usage (the message names what is wrong).
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <sstream>

#include "command.hpp"
#include "tether/protocol/cron.hpp"

namespace tether::cli {
namespace {

namespace proto = tether::protocol;

constexpr const char* k_usage =
    "usage: tether cron next EXPR [--tz ZONE] [-n N] [--after TIME]\n"
    "       tether cron validate FILE [--after TIME]\n"
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

int next(const args& a) {
  std::string expr, zone = "UTC";
  std::optional<std::int64_t> after;
  long n = 5;
  for (std::size_t i = 1; i < a.size(); ++i) {
    if (a[i] == "--tz" && i + 1 < a.size()) {
      zone = a[++i];
    } else if (a[i] == "-n" && i + 1 < a.size()) {
      char* end = nullptr;
      n = std::strtol(a[++i].c_str(), &end, 10);
      if (*end != '\0' || n < 1 || n > 1000)
        return usage_error("-n '" + a[i] + "' is not a whole number in 1..1000");
    } else if (a[i] == "--after" && i + 1 < a.size()) {
      auto t = proto::parse_utc(a[++i]);
      if (!t) return usage_error("--after: " + t.error().problem);
      after = *t;
    } else if (expr.empty() && !a[i].empty() && a[i][0] != '-') {
      expr = a[i];
    } else {
      return usage_error("unexpected argument '" + a[i] +
                         "' (quote the expression as one argument)");
    }
  }
  if (expr.empty()) return usage_error("next needs an expression");
  auto e = proto::parse_cron(expr);
  if (!e) return usage_error(e.error().describe());
  if (!proto::known_zone(zone)) return usage_error("--tz: unknown time zone '" + zone + "'");
  proto::schedule s = proto::cron_schedule{*e, zone};
  auto t = after.value_or(now_ms());
  for (long k = 0; k < n; ++k) {
    auto r = proto::next_after(s, t);
    if (!r) return usage_error(r.error().describe());
    if (!*r) {
      std::cout << "(no more occurrences within five years)\n";
      break;
    }
    std::cout << both_times(**r, zone) << "\n";
    t = **r;
  }
  return 0;
}

int validate(const args& a) {
  std::string file;
  std::optional<std::int64_t> after;
  for (std::size_t i = 1; i < a.size(); ++i) {
    if (a[i] == "--after" && i + 1 < a.size()) {
      auto t = proto::parse_utc(a[++i]);
      if (!t) return usage_error("--after: " + t.error().problem);
      after = *t;
    } else if (file.empty() && !a[i].empty() && a[i][0] != '-') {
      file = a[i];
    } else {
      return usage_error("unexpected argument '" + a[i] + "'");
    }
  }
  if (file.empty()) return usage_error("validate needs a file");
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
  auto t = after.value_or(now_ms());
  for (const auto& j : *jobs) {
    std::cout << j.name << "  " << proto::describe(j.when) << "  ";
    auto zone = std::holds_alternative<proto::cron_schedule>(j.when)
                    ? std::get<proto::cron_schedule>(j.when).zone
                    : std::string("UTC");
    auto r = proto::next_after(j.when, t);
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
  if (a.empty()) return usage_error("missing a subcommand (next or validate)");
  if (a[0] == "next") return next(a);
  if (a[0] == "validate") return validate(a);
  if (a[0] == "-h" || a[0] == "--help") {
    std::cout << k_usage;
    return 0;
  }
  return usage_error("unknown subcommand '" + a[0] + "'");
}

registrar cron_cmd{
    {"cron", "next EXPR | validate FILE: cron times and schedule files (docs/cron.md)", cron}};

}  // namespace
}  // namespace tether::cli
