#pragma once
// Scheduled work (docs/cron.md): a job's schedule and its definition, as
// values with JSON codecs, and the schedule file a host reconciles at start.
//
// A schedule is one of:
//   - a cron expression of 5 fields (minute hour day-of-month month
//     day-of-week) or 6 (a leading seconds field), in an IANA time zone
//     (default "UTC");
//   - `at`: one instant (a one-shot);
//   - `every`: an interval, counted from an anchor instant.
// Times are wall-clock milliseconds since the Unix epoch (UTC).
//
// Daylight-saving rules of a cron expression's zone: a local time that a
// spring-forward gap skips fires once, at the instant the gap ends; a local
// time that a fall-back repeats fires once, at its first (earlier) instant.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "tether/protocol/json.hpp"

namespace tether::protocol {

/// A parsed cron expression. Each set holds the values a field allows.
struct cron_expr {
  std::string text;            // as written (trimmed)
  std::vector<bool> seconds;   // 60 entries; {0} when the expression has 5 fields
  std::vector<bool> minutes;   // 60
  std::vector<bool> hours;     // 24
  std::vector<bool> days;      // 32, index 1..31
  std::vector<bool> months;    // 13, index 1..12
  std::vector<bool> weekdays;  // 7, 0 = Sunday (7 in the text is Sunday too)
  bool days_any = true;        // day-of-month was `*` (or `?`)
  bool weekdays_any = true;    // day-of-week was `*` (or `?`)
  friend bool operator==(const cron_expr&, const cron_expr&) = default;
};

/// Parses `text`: numbers, `*`, `?` (in a day field), ranges `a-b`, steps
/// `*/n` and `a-b/n` and `a/n`, lists `a,b`, month names JAN..DEC and day
/// names SUN..SAT (any case). When both day fields are restricted a day
/// matches either (Vixie cron's rule). An error names the field (e.g.
/// "hour") and the problem, quoting the bad token.
decoded<cron_expr> parse_cron(std::string_view text);

struct cron_schedule {
  cron_expr expr;
  std::string zone = "UTC";  // IANA name
  friend bool operator==(const cron_schedule&, const cron_schedule&) = default;
};
struct at_schedule {
  std::int64_t at_ms = 0;
  friend bool operator==(const at_schedule&, const at_schedule&) = default;
};
struct every_schedule {
  std::int64_t every_ms = 0;   // > 0
  std::int64_t anchor_ms = 0;  // occurrences are anchor + k * every, k >= 0
  friend bool operator==(const every_schedule&, const every_schedule&) = default;
};
using schedule = std::variant<cron_schedule, at_schedule, every_schedule>;

/// The first occurrence strictly after `after_ms`, or nullopt when there is
/// none (a one-shot already past, an expression that never matches within
/// five years, e.g. "0 0 30 2 *"). An unknown zone is an error naming it.
/// A cron search walks local time field by field (a month, day, hour or
/// minute that cannot match is skipped whole), at most five years of it.
decoded<std::optional<std::int64_t>> next_after(const schedule& s, std::int64_t after_ms);

/// The last occurrence at or before `at_ms` that is strictly after
/// `after_ms`, or nullopt: the newest of the occurrences that fell in
/// (after_ms, at_ms] (catch-up coalesces a run of missed occurrences to it).
/// O(1) for `every`; for cron a field-wise search backwards from `at_ms`,
/// at most five years of local time, never one step per occurrence.
decoded<std::optional<std::int64_t>> latest_in(const schedule& s, std::int64_t after_ms,
                                               std::int64_t at_ms);

/// Whether a zone name is known to the system's time zone database.
bool known_zone(std::string_view zone);

/// `schedule` in JSON: {"cron": "...", "tz": "Europe/Berlin"} |
/// {"at": "2026-12-03T09:00:00Z" or ms} | {"every_ms": N, "anchor_ms": N}.
json::value to_json(const schedule& s);
decoded<schedule> schedule_from_json(const json::value& v, const std::string& prefix = "schedule");

/// "2026-12-03T09:00:00.000Z" (UTC) and back; an error names what is wrong.
std::string format_utc(std::int64_t ms);
decoded<std::int64_t> parse_utc(std::string_view text);

/// The wall-clock time of `ms` in `zone`: "2026-03-08 03:00:00 EDT"; an
/// unknown zone is an error naming it.
decoded<std::string> format_local(std::int64_t ms, std::string_view zone);

/// One line for people: `cron "0 3 * * *" in Europe/Berlin`, `at
/// 2026-12-03T09:00:00.000Z`, `every 60000 ms from 1970-01-01T00:00:00.000Z`.
std::string describe(const schedule& s);

/// What a run does.
enum class cron_action_kind { shell, prompt };
/// Where a prompt run runs: a fresh session of its own, or the agent's main one.
enum class cron_session { isolated, main };

struct cron_job_spec {
  std::string name;  // unique; [A-Za-z0-9_.-], 1..64 chars
  /// The owning agent: a run takes this agent's policy, never an ambient
  /// identity. Empty: the job is skipped when due, with a warning naming it.
  std::string agent;
  schedule when;
  cron_action_kind kind = cron_action_kind::shell;
  std::string command;  // shell: run by `bash -c` through the sandbox daemon
  std::string cwd;      // shell: absolute; empty = the scheduler's default directory
  std::string prompt;   // prompt
  cron_session session = cron_session::isolated;
  std::int64_t timeout_ms = 120000;  // 0: none
  int retries = 2;                   // after the first attempt
  std::int64_t backoff_ms = 500;     // first retry's pause, doubling (with jitter)
  std::int64_t backoff_max_ms = 30000;
  std::size_t max_output_bytes = 16384;  // a run's recorded output, ending "...[truncated]"
  bool enabled = true;
  /// A one-shot that succeeds is deleted (else disabled, as any other
  /// one-shot after its run).
  bool delete_after_run = false;
  /// Overrides the scheduler's catch-up policy for this job (nullopt: the
  /// scheduler's).
  std::optional<bool> catch_up;

  bool one_shot() const { return std::holds_alternative<at_schedule>(when); }
  friend bool operator==(const cron_job_spec&, const cron_job_spec&) = default;
};

/// Every field checked (name, schedule, zone, command or prompt, bounds); an
/// error names the field.
std::optional<decode_error> check(const cron_job_spec& j);

json::value to_json(const cron_job_spec& j);
decoded<cron_job_spec> cron_job_from_json(const json::value& v, const std::string& prefix = "");

/// A schedule file: {"jobs": [spec, ...]}. Names are unique. Any error
/// refuses the whole file, naming the job's index, name and field (the file
/// is never half-loaded).
decoded<std::vector<cron_job_spec>> parse_cron_file(std::string_view text);

}  // namespace tether::protocol
