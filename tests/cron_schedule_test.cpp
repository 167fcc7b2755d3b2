// Cron schedules (docs/cron.md): expressions parse or are refused naming the
// field; next_after and latest_in walk local time in the schedule's zone, so a
// spring-forward gap's times fire once when the gap ends and a fall-back's
// repeated times fire once at their first instant; job specs and schedule
// files round-trip through JSON and a bad file is refused whole, naming the
// job and field.
#include <catch2/catch.hpp>
#include <fstream>
#include <set>

#include "catch_result.hpp"
#include "support.hpp"
#include "tether/protocol/cron.hpp"

using namespace tether;
using protocol::at_schedule;
using protocol::cron_job_spec;
using protocol::cron_schedule;
using protocol::every_schedule;
using protocol::schedule;

namespace {

std::int64_t utc(const std::string& text) {
  auto r = protocol::parse_utc(text);
  INFO(text);
  REQUIRE(r);
  return *r;
}

schedule cron(const std::string& expr, const std::string& zone = "UTC") {
  auto e = protocol::parse_cron(expr);
  INFO(expr);
  REQUIRE(e);
  return cron_schedule{*e, zone};
}

// The next `n` occurrences after `after`, as UTC text.
std::vector<std::string> next_n(const schedule& s, const std::string& after, int n) {
  std::vector<std::string> out;
  auto t = utc(after);
  for (int i = 0; i < n; ++i) {
    auto r = protocol::next_after(s, t);
    REQUIRE(r);
    if (!*r) break;
    REQUIRE(**r > t);
    out.push_back(protocol::format_utc(**r));
    t = **r;
  }
  return out;
}

std::optional<std::int64_t> next(const schedule& s, std::int64_t after) {
  auto r = protocol::next_after(s, after);
  REQUIRE(r);
  return *r;
}

// Every occurrence in (from, to], by next_after.
std::vector<std::int64_t> all_in(const schedule& s, std::int64_t from, std::int64_t to) {
  std::vector<std::int64_t> out;
  for (auto t = next(s, from); t && *t <= to; t = next(s, *t)) out.push_back(*t);
  return out;
}

std::string field_of_error(const std::string& expr) {
  auto r = protocol::parse_cron(expr);
  INFO(expr);
  REQUIRE_FALSE(r);
  return r.error().field;
}

std::string problem_of(const std::string& expr) {
  auto r = protocol::parse_cron(expr);
  REQUIRE_FALSE(r);
  return r.error().problem;
}

std::vector<int> members(const std::vector<bool>& s) {
  std::vector<int> out;
  for (std::size_t i = 0; i < s.size(); ++i)
    if (s[i]) out.push_back(static_cast<int>(i));
  return out;
}

cron_job_spec shell_job(const std::string& name) {
  cron_job_spec j;
  j.name = name;
  j.agent = "ops";
  j.when = cron("0 3 * * *", "Europe/Berlin");
  j.command = "echo hi";
  return j;
}

std::string file_error(const std::string& text) {
  auto r = protocol::parse_cron_file(text);
  INFO(text);
  REQUIRE_FALSE(r);
  return r.error().describe();
}

const std::string k_tether = std::string(TETHER_BIN_DIR) + "/tether";

}  // namespace

TEST_CASE("a cron expression parses numbers, ranges, steps, lists and names", "[cron_schedule]") {
  auto e = protocol::parse_cron("  5,10-12 */6 1-10/3 jan,Mar-MAY mon-fri ");
  REQUIRE(e);
  CHECK(e->text == "5,10-12 */6 1-10/3 jan,Mar-MAY mon-fri");
  CHECK(members(e->seconds) == std::vector<int>{0});
  CHECK(members(e->minutes) == std::vector<int>{5, 10, 11, 12});
  CHECK(members(e->hours) == std::vector<int>{0, 6, 12, 18});
  CHECK(members(e->days) == std::vector<int>{1, 4, 7, 10});
  CHECK(members(e->months) == std::vector<int>{1, 3, 4, 5});
  CHECK(members(e->weekdays) == std::vector<int>{1, 2, 3, 4, 5});
  CHECK_FALSE(e->days_any);
  CHECK_FALSE(e->weekdays_any);

  auto six = protocol::parse_cron("30/10 * * ? * 7,SAT");
  REQUIRE(six);
  CHECK(members(six->seconds) == std::vector<int>{30, 40, 50});
  CHECK(members(six->weekdays) == std::vector<int>{0, 6});  // 7 is Sunday
  CHECK(six->days_any);
  CHECK_FALSE(six->weekdays_any);
  CHECK(members(protocol::parse_cron("0 0 * * 5-7")->weekdays) == std::vector<int>{0, 5, 6});
  CHECK(protocol::parse_cron("* * * * *")->weekdays_any);
}

TEST_CASE("a malformed cron expression is refused naming its field and quoting the token",
          "[cron_schedule]") {
  CHECK(field_of_error("") == "");
  CHECK(problem_of("   ").find("empty") != std::string::npos);
  CHECK(problem_of("* * * *").find("got 4") != std::string::npos);
  CHECK(problem_of("* * * * * * *").find("got 7") != std::string::npos);
  CHECK(field_of_error("60 * * * *") == "minute");
  CHECK(problem_of("60 * * * *").find("'60'") != std::string::npos);
  CHECK(field_of_error("0 24 * * *") == "hour");
  CHECK(field_of_error("0 0 0 * *") == "day-of-month");
  CHECK(field_of_error("0 0 32 * *") == "day-of-month");
  CHECK(field_of_error("0 0 * 13 *") == "month");
  CHECK(field_of_error("0 0 * FOO *") == "month");
  CHECK(problem_of("0 0 * FOO *").find("'FOO'") != std::string::npos);
  CHECK(field_of_error("0 0 * * 8") == "day-of-week");
  CHECK(field_of_error("0 0 * * JAN") == "day-of-week");  // a month name is no day
  CHECK(field_of_error("0 0 * MON *") == "month");
  CHECK(field_of_error("61 * * * * *") == "second");
  CHECK(field_of_error("*/0 * * * *") == "minute");
  CHECK(problem_of("*/0 * * * *").find("step 0") != std::string::npos);
  CHECK(field_of_error("0 */x * * *") == "hour");
  CHECK(field_of_error("0 5-2 * * *") == "hour");
  CHECK(problem_of("0 5-2 * * *").find("reversed range '5-2'") != std::string::npos);
  CHECK(field_of_error("0 0 * * FRI-MON") == "day-of-week");
  CHECK(field_of_error("1,,2 * * * *") == "minute");
  CHECK(field_of_error("? * * * *") == "minute");  // `?` only in a day field
  CHECK(field_of_error("0 0 ?/2 * *") == "day-of-month");
  CHECK(field_of_error("0 0 1- * *") == "day-of-month");
  CHECK(field_of_error("-5 * * * *") == "minute");
}

TEST_CASE("a five-field expression fires at the next matching minute, strictly after",
          "[cron_schedule]") {
  auto s = cron("30 9 * * *");
  CHECK(next_n(s, "2026-12-03T08:00:00Z", 2) ==
        std::vector<std::string>{"2026-12-03T09:30:00.000Z", "2026-12-04T09:30:00.000Z"});
  // Exactly at an occurrence: the next one, never the same.
  CHECK(next_n(s, "2026-12-03T09:30:00Z", 1) ==
        std::vector<std::string>{"2026-12-04T09:30:00.000Z"});
  CHECK(next_n(s, "2026-12-03T09:29:59.999Z", 1) ==
        std::vector<std::string>{"2026-12-03T09:30:00.000Z"});
  // Year end rolls over.
  CHECK(next_n(cron("0 0 1 1 *"), "2026-06-01T00:00:00Z", 1) ==
        std::vector<std::string>{"2027-01-01T00:00:00.000Z"});
  CHECK(next_n(cron("* * * * *"), "2026-12-31T23:59:30Z", 2) ==
        std::vector<std::string>{"2027-01-01T00:00:00.000Z", "2027-01-01T00:01:00.000Z"});
  // A zone shifts the instant: 09:30 in Tokyo (UTC+9) is 00:30Z.
  CHECK(next_n(cron("30 9 * * *", "Asia/Tokyo"), "2026-12-03T01:00:00Z", 1) ==
        std::vector<std::string>{"2026-12-04T00:30:00.000Z"});
}

TEST_CASE("a six-field expression fires on its seconds", "[cron_schedule]") {
  CHECK(next_n(cron("*/20 * * * * *"), "2026-12-03T09:00:05Z", 4) ==
        std::vector<std::string>{"2026-12-03T09:00:20.000Z", "2026-12-03T09:00:40.000Z",
                                 "2026-12-03T09:01:00.000Z", "2026-12-03T09:01:20.000Z"});
  CHECK(next_n(cron("15 30 9 * * *"), "2026-12-03T09:30:15Z", 1) ==
        std::vector<std::string>{"2026-12-04T09:30:15.000Z"});
}

TEST_CASE("steps, lists and names select the documented times", "[cron_schedule]") {
  // 2026-12-03 is a Thursday.
  CHECK(next_n(cron("0 8-17/4 * * *"), "2026-12-03T00:00:00Z", 4) ==
        std::vector<std::string>{"2026-12-03T08:00:00.000Z", "2026-12-03T12:00:00.000Z",
                                 "2026-12-03T16:00:00.000Z", "2026-12-04T08:00:00.000Z"});
  CHECK(next_n(cron("0,45 22/1 * * *"), "2026-12-03T22:10:00Z", 3) ==
        std::vector<std::string>{"2026-12-03T22:45:00.000Z", "2026-12-03T23:00:00.000Z",
                                 "2026-12-03T23:45:00.000Z"});
  CHECK(next_n(cron("0 12 * * SAT,sun"), "2026-12-03T00:00:00Z", 3) ==
        std::vector<std::string>{"2026-12-05T12:00:00.000Z", "2026-12-06T12:00:00.000Z",
                                 "2026-12-12T12:00:00.000Z"});
  CHECK(next_n(cron("0 0 1 FEB,aug *"), "2026-12-03T00:00:00Z", 3) ==
        std::vector<std::string>{"2027-02-01T00:00:00.000Z", "2027-08-01T00:00:00.000Z",
                                 "2028-02-01T00:00:00.000Z"});
}

TEST_CASE("when both day fields are restricted a day matches either, and one `*` leaves the other",
          "[cron_schedule]") {
  // Day 10 of the month, or any Monday; December 2026: Mon 7, Thu 10, Mon 14.
  CHECK(next_n(cron("0 0 10 * MON"), "2026-12-03T00:00:00Z", 3) ==
        std::vector<std::string>{"2026-12-07T00:00:00.000Z", "2026-12-10T00:00:00.000Z",
                                 "2026-12-14T00:00:00.000Z"});
  CHECK(next_n(cron("0 0 10 * *"), "2026-12-03T00:00:00Z", 2) ==
        std::vector<std::string>{"2026-12-10T00:00:00.000Z", "2027-01-10T00:00:00.000Z"});
  CHECK(next_n(cron("0 0 ? * MON"), "2026-12-03T00:00:00Z", 2) ==
        std::vector<std::string>{"2026-12-07T00:00:00.000Z", "2026-12-14T00:00:00.000Z"});
}

TEST_CASE("February 29 fires only in leap years and February 30 never fires", "[cron_schedule]") {
  CHECK(next_n(cron("0 0 29 2 *"), "2026-12-03T00:00:00Z", 2) ==
        std::vector<std::string>{"2028-02-29T00:00:00.000Z", "2032-02-29T00:00:00.000Z"});
  CHECK(next(cron("0 0 30 2 *"), utc("2026-12-03T00:00:00Z")) == std::nullopt);
  CHECK(next(cron("0 0 31 4,6,9,11 *"), utc("2026-12-03T00:00:00Z")) == std::nullopt);
  // With a weekday restriction too, the OR rule makes it fire on those weekdays.
  CHECK(next_n(cron("0 0 30 2 MON"), "2026-12-03T00:00:00Z", 1) ==
        std::vector<std::string>{"2027-02-01T00:00:00.000Z"});
}

TEST_CASE("New York's spring-forward gap: a skipped local time fires once when the gap ends",
          "[cron_schedule]") {
  // 2026-03-08 02:00 EST (07:00Z) jumps to 03:00 EDT.
  auto daily = cron("30 2 * * *", "America/New_York");
  CHECK(next_n(daily, "2026-03-07T12:00:00Z", 3) ==
        std::vector<std::string>{"2026-03-08T07:00:00.000Z", "2026-03-09T06:30:00.000Z",
                                 "2026-03-10T06:30:00.000Z"});
  // Just before the gap's end, the gap's time is still due at its end.
  CHECK(next(daily, utc("2026-03-08T06:59:59.500Z")) == utc("2026-03-08T07:00:00Z"));
  CHECK(next(daily, utc("2026-03-08T07:00:00Z")) == utc("2026-03-09T06:30:00Z"));

  // Quarter-hours: 02:00..02:45 and 03:00 coalesce into 07:00Z, and nothing
  // is missing or repeated around it.
  auto quarter = cron("*/15 * * * *", "America/New_York");
  CHECK(next_n(quarter, "2026-03-08T06:20:00Z", 6) ==
        std::vector<std::string>{"2026-03-08T06:30:00.000Z", "2026-03-08T06:45:00.000Z",
                                 "2026-03-08T07:00:00.000Z", "2026-03-08T07:15:00.000Z",
                                 "2026-03-08T07:30:00.000Z", "2026-03-08T07:45:00.000Z"});
  auto all = all_in(quarter, utc("2026-03-08T00:00:00Z"), utc("2026-03-08T12:00:00Z"));
  // 12 real hours at 4 an hour: 48 instants, 15 minutes apart.
  CHECK(all.size() == 48);
  CHECK(std::set<std::int64_t>(all.begin(), all.end()).size() == all.size());
  for (std::size_t i = 1; i < all.size(); ++i) CHECK(all[i] - all[i - 1] == 15 * 60 * 1000);
}

TEST_CASE("New York's fall-back: a repeated local time fires once, at its first instant",
          "[cron_schedule]") {
  // 2026-11-01 02:00 EDT (06:00Z) falls back to 01:00 EST.
  auto daily = cron("30 1 * * *", "America/New_York");
  CHECK(next_n(daily, "2026-10-31T12:00:00Z", 2) ==
        std::vector<std::string>{"2026-11-01T05:30:00.000Z", "2026-11-02T06:30:00.000Z"});
  // During the second pass of 01:xx, 01:30 has already fired.
  CHECK(next(daily, utc("2026-11-01T06:10:00Z")) == utc("2026-11-02T06:30:00Z"));

  auto hourly = cron("0 * * * *", "America/New_York");
  // 00:00 EDT, 01:00 EDT, (01:00 EST is the same local hour), 02:00 EST, 03:00 EST.
  CHECK(next_n(hourly, "2026-11-01T03:30:00Z", 4) ==
        std::vector<std::string>{"2026-11-01T04:00:00.000Z", "2026-11-01T05:00:00.000Z",
                                 "2026-11-01T07:00:00.000Z", "2026-11-01T08:00:00.000Z"});
  // Starting inside the repeated hour's second pass.
  CHECK(next(hourly, utc("2026-11-01T06:30:00Z")) == utc("2026-11-01T07:00:00Z"));
  auto all = all_in(hourly, utc("2026-10-31T20:00:00Z"), utc("2026-11-01T20:00:00Z"));
  CHECK(all.size() == 23);  // 24 real hours, 23 distinct local hours
  for (std::size_t i = 1; i < all.size(); ++i) CHECK(all[i] > all[i - 1]);
}

TEST_CASE("Berlin's 2026 transitions follow the same rules", "[cron_schedule]") {
  // 2026-03-29 02:00 CET (01:00Z) jumps to 03:00 CEST.
  auto daily = cron("30 2 * * *", "Europe/Berlin");
  CHECK(next_n(daily, "2026-03-28T12:00:00Z", 2) ==
        std::vector<std::string>{"2026-03-29T01:00:00.000Z", "2026-03-30T00:30:00.000Z"});
  // 2026-10-25 03:00 CEST (01:00Z) falls back to 02:00 CET: 02:30 fires at
  // its CEST instant only.
  CHECK(next_n(daily, "2026-10-24T12:00:00Z", 2) ==
        std::vector<std::string>{"2026-10-25T00:30:00.000Z", "2026-10-26T01:30:00.000Z"});
  CHECK(next(daily, utc("2026-10-25T01:10:00Z")) == utc("2026-10-26T01:30:00Z"));
}

TEST_CASE("a cron schedule whose expression was never parsed is an error, not a crash",
          "[cron_schedule]") {
  schedule blank = cron_schedule{};
  CHECK_FALSE(protocol::next_after(blank, 0));
  CHECK_FALSE(protocol::latest_in(blank, 0, 1000));
  auto j = shell_job("blank");
  j.when = blank;
  auto e = protocol::check(j);
  REQUIRE(e);
  CHECK(e->field == "schedule.cron");
}

TEST_CASE("an unknown zone is an error naming it", "[cron_schedule]") {
  auto r = protocol::next_after(cron("* * * * *", "Mars/Olympus_Mons"), 0);
  REQUIRE_FALSE(r);
  CHECK(r.error().problem.find("Mars/Olympus_Mons") != std::string::npos);
  CHECK(protocol::known_zone("Europe/Berlin"));
  CHECK(protocol::known_zone("UTC"));
  CHECK_FALSE(protocol::known_zone("Mars/Olympus_Mons"));
  CHECK_FALSE(protocol::known_zone(""));
}

TEST_CASE("an every schedule counts from its anchor and an at schedule fires once",
          "[cron_schedule]") {
  schedule every = every_schedule{60000, 1000};
  CHECK(next(every, 0) == 1000);  // the anchor is the first occurrence
  CHECK(next(every, 999) == 1000);
  CHECK(next(every, 1000) == 61000);
  CHECK(next(every, 60999) == 61000);
  CHECK(next(every, 61000) == 121000);
  CHECK(next(every, -5000000) == 1000);
  // Near the end of time: the last occurrence that fits, then none.
  CHECK(next(every_schedule{INT64_MAX / 2, 0}, INT64_MAX - 10) == INT64_MAX - 1);
  CHECK(next(every_schedule{INT64_MAX / 2, 0}, INT64_MAX - 1) == std::nullopt);
  CHECK_FALSE(protocol::next_after(every_schedule{0, 0}, 0));

  schedule at = at_schedule{utc("2026-12-03T09:00:00Z")};
  CHECK(next(at, utc("2026-12-03T08:59:59.999Z")) == utc("2026-12-03T09:00:00Z"));
  CHECK(next(at, utc("2026-12-03T09:00:00Z")) == std::nullopt);
}

TEST_CASE("latest_in coalesces a run of missed occurrences to the newest", "[cron_schedule]") {
  auto minute = cron("* * * * *");
  auto from = utc("2026-12-03T00:00:00Z");
  auto to = from + 1000 * 60000 + 30000;  // 1000 minutes and a half later
  auto r = protocol::latest_in(minute, from, to);
  REQUIRE(r);
  CHECK(*r == from + 1000 * 60000);
  CHECK(all_in(minute, from, to).size() == 1000);
  // The window is (after, at]: its ends count as they should.
  CHECK(*protocol::latest_in(minute, from, from + 60000) == from + 60000);
  CHECK(*protocol::latest_in(minute, from, from + 59999) == std::nullopt);
  CHECK(*protocol::latest_in(minute, from - 1, from) == from);
  CHECK(*protocol::latest_in(minute, from, from) == std::nullopt);

  // A seconds field over a three-year window, and a rare expression.
  auto secs = cron("*/7 * * * * *");
  CHECK(*protocol::latest_in(secs, utc("2024-01-01T00:00:00Z"), utc("2027-01-01T00:00:10Z")) ==
        utc("2027-01-01T00:00:07Z"));
  CHECK(*protocol::latest_in(cron("0 0 29 2 *"), utc("2020-01-01T00:00:00Z"),
                             utc("2026-12-03T00:00:00Z")) == utc("2024-02-29T00:00:00Z"));
  CHECK(*protocol::latest_in(cron("0 0 30 2 *"), 0, utc("2026-12-03T00:00:00Z")) == std::nullopt);

  // every: O(1) over any window; at: inside the window or not.
  schedule every = every_schedule{1000, 500};
  CHECK(*protocol::latest_in(every, 0, utc("2026-12-03T00:00:00.700Z")) ==
        utc("2026-12-03T00:00:00.500Z"));
  CHECK(*protocol::latest_in(every, 0, 499) == std::nullopt);
  CHECK(*protocol::latest_in(every, 500, 1499) == std::nullopt);
  CHECK(*protocol::latest_in(at_schedule{100}, 99, 100) == 100);
  CHECK(*protocol::latest_in(at_schedule{100}, 100, 200) == std::nullopt);
}

TEST_CASE("latest_in agrees with walking next_after, across DST transitions", "[cron_schedule]") {
  struct window {
    const char* expr;
    const char* zone;
    const char* from;
    const char* to;
  };
  auto w = GENERATE(
      window{"*/15 * * * *", "America/New_York", "2026-03-08T05:00:00Z", "2026-03-08T09:00:00Z"},
      window{"0 * * * *", "America/New_York", "2026-11-01T03:00:00Z", "2026-11-01T09:00:00Z"},
      window{"30 1 * * *", "America/New_York", "2026-10-31T00:00:00Z", "2026-11-03T00:00:00Z"},
      window{"30 2 * * *", "Europe/Berlin", "2026-03-27T00:00:00Z", "2026-03-31T00:00:00Z"},
      window{"*/10 2 * * *", "Europe/Berlin", "2026-10-24T00:00:00Z", "2026-10-26T00:00:00Z"});
  auto s = cron(w.expr, w.zone);
  auto from = utc(w.from), to = utc(w.to);
  auto all = all_in(s, from, to);
  REQUIRE(!all.empty());
  // For every end point at, the newest occurrence in (from, at] is the last
  // one next_after found at or before at.
  for (auto at = from; at <= to; at += 5 * 60000) {
    std::optional<std::int64_t> want;
    for (auto t : all)
      if (t <= at) want = t;
    auto got = protocol::latest_in(s, from, at);
    REQUIRE(got);
    INFO(w.expr << " " << w.zone << " at " << protocol::format_utc(at));
    CHECK(*got == want);
  }
}

TEST_CASE("UTC times format with milliseconds and parse with offsets", "[cron_schedule]") {
  CHECK(protocol::format_utc(0) == "1970-01-01T00:00:00.000Z");
  CHECK(protocol::format_utc(1796288400123) == "2026-12-03T09:00:00.123Z");
  CHECK(protocol::format_utc(-1) == "1969-12-31T23:59:59.999Z");
  CHECK(utc("2026-12-03T09:00:00Z") == 1796288400000);
  CHECK(utc("2026-12-03T09:00:00.123Z") == 1796288400123);
  CHECK(utc("2026-12-03T09:00:00.5Z") == 1796288400500);
  CHECK(utc("2026-12-03T10:00:00+01:00") == 1796288400000);
  CHECK(utc("2026-12-03T04:30:00-04:30") == 1796288400000);
  for (auto bad : {"", "2026-12-03", "2026-12-03 09:00:00Z", "2026-12-03T09:00:00",
                   "2026-13-03T09:00:00Z", "2026-02-30T09:00:00Z", "2026-12-03T24:00:00Z",
                   "2026-12-03T09:00:00.Z", "2026-12-03T09:00:00+1:00", "2026-12-03T09:00:00Zx"}) {
    INFO(bad);
    auto r = protocol::parse_utc(bad);
    REQUIRE_FALSE(r);
    CHECK(r.error().problem.find("2026-12-03T09:00:00Z") != std::string::npos);
  }
}

TEST_CASE("schedules round-trip through JSON and a malformed one is refused by name",
          "[cron_schedule]") {
  for (const auto& s : {cron("*/5 9-17 * * MON-FRI", "Europe/Berlin"),
                        schedule(at_schedule{1796288400123}), schedule(every_schedule{60000, 7})}) {
    auto back = protocol::schedule_from_json(protocol::to_json(s));
    REQUIRE(back);
    CHECK(*back == s);
  }
  auto parse = [](const char* text) {
    return protocol::schedule_from_json(*protocol::parse_json(text), "schedule");
  };
  CHECK(*parse(R"({"at": "2026-12-03T10:00:00+01:00"})") == schedule(at_schedule{1796288400000}));
  CHECK(*parse(R"({"at": 5})") == schedule(at_schedule{5}));
  CHECK(*parse(R"({"every_ms": 10})") == schedule(every_schedule{10, 0}));
  auto c = parse(R"({"cron": "0 9 * * *"})");
  REQUIRE(c);
  CHECK(std::get<cron_schedule>(*c).zone == "UTC");

  auto error = [&](const char* text) {
    auto r = parse(text);
    INFO(text);
    REQUIRE_FALSE(r);
    return r.error().field;
  };
  CHECK(error(R"({"cron": "0 9 * * *", "at": 5})") == "schedule");
  CHECK(error(R"({})") == "schedule");
  CHECK(error(R"({"cron": "0 9 * * *", "tz": "Nowhere/City"})") == "schedule.tz");
  CHECK(error(R"({"cron": "0 25 * * *"})") == "schedule.cron");
  CHECK(error(R"({"cron": "0 0 30 2 *"})") == "schedule.cron");
  CHECK(error(R"({"every_ms": 0})") == "schedule.every_ms");
  CHECK(error(R"({"every_ms": 10, "tz": "UTC"})") == "schedule.tz");
  CHECK(error(R"({"at": 5, "anchor_ms": 1})") == "schedule.anchor_ms");
  CHECK(error(R"({"at": "tomorrow"})") == "schedule.at");
  CHECK(error(R"({"at": true})") == "schedule.at");
  CHECK(error(R"({"cron": "* * * * *", "zone": "UTC"})") == "schedule.zone");
}

TEST_CASE("a job spec round-trips through JSON, shell and prompt alike", "[cron_schedule]") {
  auto shell = shell_job("nightly");
  shell.cwd = "/srv/app";
  shell.timeout_ms = 0;
  shell.retries = 0;
  shell.backoff_ms = 100;
  shell.backoff_max_ms = 100;
  shell.max_output_bytes = 64;
  shell.enabled = false;
  shell.catch_up = false;
  cron_job_spec prompt;
  prompt.name = "remind.me";
  prompt.when = at_schedule{1796288400000};
  prompt.kind = protocol::cron_action_kind::prompt;
  prompt.prompt = "Summarise the day";
  prompt.session = protocol::cron_session::main;
  prompt.delete_after_run = true;
  for (const auto& j : {shell, prompt, shell_job("plain")}) {
    REQUIRE_FALSE(protocol::check(j));
    auto back = protocol::cron_job_from_json(protocol::to_json(j));
    INFO(protocol::to_text(protocol::to_json(j)));
    REQUIRE(back);
    CHECK(*back == j);
  }
  CHECK_FALSE(protocol::to_json(prompt).as_object().contains("command"));
  CHECK_FALSE(protocol::to_json(shell).as_object().contains("prompt"));
}

TEST_CASE("check refuses a job field out of bounds, naming it", "[cron_schedule]") {
  auto refused = [](const cron_job_spec& j) {
    auto e = protocol::check(j);
    REQUIRE(e);
    return e->field;
  };
  auto j = shell_job("ok");
  REQUIRE_FALSE(protocol::check(j));
  j.name = "has space";
  CHECK(refused(j) == "name");
  j.name = std::string(65, 'a');
  CHECK(refused(j) == "name");
  j.name = std::string(64, 'a');
  CHECK_FALSE(protocol::check(j));
  j = shell_job("ok");
  j.when = cron("0 0 * * *", "Nowhere/City");
  CHECK(refused(j) == "schedule.tz");
  j.when = cron("0 0 31 2 *");
  CHECK(refused(j) == "schedule.cron");
  j.when = every_schedule{0, 0};
  CHECK(refused(j) == "schedule.every_ms");
  j = shell_job("ok");
  j.cwd = "relative/dir";
  CHECK(refused(j) == "cwd");
  j = shell_job("ok");
  j.command = "";
  CHECK(refused(j) == "command");
  j = shell_job("ok");
  j.timeout_ms = -1;
  CHECK(refused(j) == "timeout_ms");
  j = shell_job("ok");
  j.retries = 11;
  CHECK(refused(j) == "retries");
  j = shell_job("ok");
  j.backoff_ms = -1;
  CHECK(refused(j) == "backoff_ms");
  j = shell_job("ok");
  j.backoff_ms = 2000;
  j.backoff_max_ms = 1000;
  CHECK(refused(j) == "backoff_max_ms");
  j = shell_job("ok");
  j.max_output_bytes = 63;
  CHECK(refused(j) == "max_output_bytes");
  j.max_output_bytes = 1024 * 1024 + 1;
  CHECK(refused(j) == "max_output_bytes");
  j = shell_job("ok");
  j.delete_after_run = true;
  CHECK(refused(j) == "delete_after_run");
  j.when = at_schedule{5};
  CHECK_FALSE(protocol::check(j));
  j = shell_job("ok");
  j.kind = protocol::cron_action_kind::prompt;
  CHECK(refused(j) == "prompt");
}

TEST_CASE("a schedule file is refused whole, naming the job and field", "[cron_schedule]") {
  auto ok = protocol::parse_cron_file(R"({"jobs": [
      {"name": "a", "schedule": {"every_ms": 60000}, "command": "true"},
      {"name": "b", "agent": "ops", "schedule": {"cron": "0 9 * * *", "tz": "Europe/Berlin"},
       "prompt": "hello", "session": "main"}]})");
  REQUIRE(ok);
  REQUIRE(ok->size() == 2);
  CHECK((*ok)[0].kind == protocol::cron_action_kind::shell);
  CHECK((*ok)[1].kind == protocol::cron_action_kind::prompt);
  CHECK((*ok)[1].session == protocol::cron_session::main);
  CHECK(protocol::parse_cron_file(R"({"jobs": []})"));

  const std::string job_a = R"({"name": "a", "schedule": {"every_ms": 60000}, "command": "true"})";
  CHECK(file_error(R"({"jobs": [)" + job_a + "," + job_a + "]}") ==
        "jobs[1] (a).name: duplicate of jobs[0]");
  CHECK(file_error(R"({"jobs": [)" + job_a +
                   R"(, {"name": "b", "schedule": {"at": 1}, "command": "x", "colour": 1}]})") ==
        "jobs[1] (b).colour: unknown field (known: name, agent, schedule, command, cwd, prompt, "
        "session, timeout_ms, retries, backoff_ms, backoff_max_ms, max_output_bytes, enabled, "
        "delete_after_run, catch_up)");
  CHECK(file_error(R"({"jobs": [{"name": "c", "schedule": {"at": 1}, "command": "x",
                    "prompt": "y"}]})") == "jobs[0] (c): has both command and prompt; give one");
  CHECK(file_error(R"({"jobs": [{"name": "c", "schedule": {"at": 1}}]})") ==
        "jobs[0] (c): needs a command (a shell job) or a prompt");
  CHECK(file_error(R"({"jobs": [)" + job_a + R"(, {"name": "nightly", "command": "x",
                    "schedule": {"cron": "0 3 * * *", "tz": "Europe/Berlim"}}]})") ==
        "jobs[1] (nightly).schedule.tz: unknown time zone 'Europe/Berlim'");
  CHECK(file_error(R"({"jobs": [{"name": "d", "schedule": {"at": 1}, "command": "x",
                    "retries": 99}]})")
            .rfind("jobs[0] (d).retries:", 0) == 0);
  CHECK(file_error(R"({"jobs": [{"name": "bad name", "schedule": {"at": 1}, "command": "x"}]})")
            .rfind("jobs[0] (bad name).name:", 0) == 0);
  CHECK(file_error(R"({"jobs": [{"schedule": {"at": 1}, "command": "x"}]})") ==
        "jobs[0].name: missing");
  CHECK(file_error(R"({"jobs": [3]})").rfind("jobs[0]:", 0) == 0);
  CHECK(file_error(R"({"jobs": [], "extra": 1})").rfind("extra:", 0) == 0);
  CHECK(file_error(R"({"jobs": [], "jobs": []})").find("'jobs' appears twice") !=
        std::string::npos);
  CHECK(file_error(R"({"jobs": )").find("not valid JSON") != std::string::npos);
  CHECK(file_error(R"({})") == "jobs: missing");
}

TEST_CASE("the example schedule file is valid", "[cron_schedule]") {
  auto text = test::file_bytes(std::string(TETHER_SOURCE_DIR) + "/examples/cron/jobs.json");
  REQUIRE_FALSE(text.empty());
  auto jobs = protocol::parse_cron_file(text);
  INFO((jobs ? std::string() : jobs.error().describe()));
  REQUIRE(jobs);
  CHECK(jobs->size() == 3);
}

TEST_CASE("tether cron next prints occurrences in UTC and local time, and validate checks a file",
          "[cron_schedule]") {
  auto r = test::run_captured({k_tether, "cron", "next", "30 2 * * *", "--tz", "America/New_York",
                               "-n", "2", "--after", "2026-03-07T12:00:00Z"});
  INFO(r.output);
  CHECK(r.exit_code == 0);
  CHECK(r.output ==
        "2026-03-08T07:00:00.000Z  2026-03-08 03:00:00 EDT\n"
        "2026-03-09T06:30:00.000Z  2026-03-09 02:30:00 EDT\n");

  auto bad = test::run_captured({k_tether, "cron", "next", "0 25 * * *"});
  CHECK(bad.exit_code == 2);
  CHECK(bad.output.find("hour") != std::string::npos);

  auto ok = test::run_captured({k_tether, "cron", "validate",
                                std::string(TETHER_SOURCE_DIR) + "/examples/cron/jobs.json",
                                "--after", "2026-12-03T00:00:00Z"});
  INFO(ok.output);
  CHECK(ok.exit_code == 0);
  CHECK(ok.output.find("next 2026-12-03T00:01:00.000Z") != std::string::npos);

  test::scratch_dir dir("cron_cli");
  std::ofstream(dir.file("bad.json"))
      << R"({"jobs": [{"name": "x", "schedule": {"cron": "0 0 * * *", "tz": "Nowhere"},
             "command": "true"}]})";
  auto refused = test::run_captured({k_tether, "cron", "validate", dir.file("bad.json")});
  CHECK(refused.exit_code == 2);
  CHECK(refused.output.find("jobs[0] (x).schedule.tz: unknown time zone 'Nowhere'") !=
        std::string::npos);
}
