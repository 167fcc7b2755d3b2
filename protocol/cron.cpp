#include "tether/protocol/cron.hpp"

#include <date/date.h>
#include <date/tz.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <chrono>
#include <span>
#include <stdexcept>

namespace tether::protocol {

namespace {

using std::chrono::hours;
using std::chrono::milliseconds;
using std::chrono::minutes;
using std::chrono::seconds;
using local_seconds = date::local_seconds;
using sys_seconds = date::sys_seconds;

// ---- the expression ------------------------------------------------------

struct field_spec {
  const char* name;
  int min, max;
  std::span<const std::string_view> names;  // names[i] is the value min + i; empty: none
  bool question;                            // `?` allowed (a day field)
};

constexpr std::array<std::string_view, 12> k_month_names = {
    "JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC"};
constexpr std::array<std::string_view, 7> k_day_names = {"SUN", "MON", "TUE", "WED",
                                                         "THU", "FRI", "SAT"};

constexpr field_spec k_second{"second", 0, 59, {}, false};
constexpr field_spec k_minute{"minute", 0, 59, {}, false};
constexpr field_spec k_hour{"hour", 0, 23, {}, false};
constexpr field_spec k_dom{"day-of-month", 1, 31, {}, true};
constexpr field_spec k_month{"month", 1, 12, k_month_names, false};
// 7 is Sunday too; folded into 0 after parsing.
constexpr field_spec k_dow{"day-of-week", 0, 7, k_day_names, true};

bool iequal(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::toupper(static_cast<unsigned char>(x)) ==
                  std::toupper(static_cast<unsigned char>(y));
         });
}

std::string quoted(std::string_view s) {
  return "'" + std::string(s) + "'";
}

// A value of the field: a number or (where the field has them) a name.
decoded<int> field_value(const field_spec& f, std::string_view tok, std::string_view item) {
  if (tok.empty()) return decode_error{f.name, "missing a value in " + quoted(item)};
  if (std::all_of(tok.begin(), tok.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    int v = 0;
    for (char c : tok) v = std::min(v * 10 + (c - '0'), 10000);  // capped: no overflow
    if (v < f.min || v > f.max)
      return decode_error{f.name, quoted(tok) + " is out of range " + std::to_string(f.min) + ".." +
                                      std::to_string(f.max)};
    return v;
  }
  for (std::size_t i = 0; i < f.names.size(); ++i)
    if (iequal(tok, f.names[i])) return f.min + static_cast<int>(i);
  return decode_error{f.name, quoted(tok) + " is not a number" +
                                  (f.names.empty() ? std::string() : std::string(" or a name")) +
                                  " (in " + quoted(item) + ")"};
}

// Parses one field into `out` (indexed by value); `any` is set when the field
// is exactly `*` or `?`.
std::optional<decode_error> parse_field(const field_spec& f, std::string_view text,
                                        std::vector<bool>& out, bool& any) {
  out.assign(static_cast<std::size_t>(f.max + 1), false);
  any = text == "*" || (f.question && text == "?");
  if (text == "?" && !f.question) return decode_error{f.name, "'?' is allowed only in a day field"};
  std::size_t start = 0;
  while (start <= text.size()) {
    auto comma = text.find(',', start);
    auto item = text.substr(start, comma == std::string_view::npos ? text.npos : comma - start);
    start = comma == std::string_view::npos ? text.size() + 1 : comma + 1;
    if (item.empty()) return decode_error{f.name, "empty list item in " + quoted(text)};
    auto slash = item.find('/');
    auto base = item.substr(0, slash);
    int step = 1;
    bool has_step = slash != std::string_view::npos;
    if (has_step) {
      auto st = item.substr(slash + 1);
      if (st.empty() || st.size() > 4 ||
          !std::all_of(st.begin(), st.end(), [](char c) { return c >= '0' && c <= '9'; }))
        return decode_error{
            f.name, "step " + quoted(st) + " is not a whole number (in " + quoted(item) + ")"};
      step = std::stoi(std::string(st));
      if (step == 0) return decode_error{f.name, "step 0 in " + quoted(item)};
    }
    int lo = f.min, hi = f.max;
    if (base == "*" || base == "?") {
      if (base == "?" && (!f.question || item != "?"))
        return decode_error{f.name,
                            "'?' is allowed only alone in a day field, not " + quoted(item)};
    } else {
      auto dash = base.find('-');
      auto a = field_value(f, base.substr(0, dash), item);
      if (!a) return a.error();
      lo = *a;
      if (dash != std::string_view::npos) {
        auto b = field_value(f, base.substr(dash + 1), item);
        if (!b) return b.error();
        hi = *b;
        if (hi < lo) return decode_error{f.name, "reversed range " + quoted(item)};
      } else if (!has_step) {
        hi = lo;  // `a` alone; `a/n` runs to the field's end
      }
    }
    for (int v = lo; v <= hi; v += step) out[static_cast<std::size_t>(v)] = true;
  }
  return std::nullopt;
}

// The next allowed value >= v, or -1.
int next_set(const std::vector<bool>& s, int v) {
  for (int i = v; i < static_cast<int>(s.size()); ++i)
    if (s[static_cast<std::size_t>(i)]) return i;
  return -1;
}
// The last allowed value <= v, or -1.
int prev_set(const std::vector<bool>& s, int v) {
  for (int i = std::min(v, static_cast<int>(s.size()) - 1); i >= 0; --i)
    if (s[static_cast<std::size_t>(i)]) return i;
  return -1;
}

bool day_matches(const cron_expr& e, const date::year_month_day& ymd) {
  bool dom = e.days[unsigned(ymd.day())];
  bool dow = e.weekdays[date::weekday(date::sys_days(ymd)).c_encoding()];
  if (e.days_any && e.weekdays_any) return true;
  if (e.days_any) return dow;
  if (e.weekdays_any) return dom;
  return dom || dow;  // both restricted: either (Vixie cron)
}

// ---- civil (local) search ------------------------------------------------
// Field-wise: a month, day, hour or minute that cannot match is skipped whole,
// so a search visits at most about (days in range) * (24 + 60 + 60) steps.

struct civil {
  date::local_days day;
  date::year_month_day ymd;
  int h, mi, s;
  explicit civil(local_seconds t) : day(date::floor<date::days>(t)), ymd(day) {
    date::hh_mm_ss<seconds> hms(t - day);
    h = static_cast<int>(hms.hours().count());
    mi = static_cast<int>(hms.minutes().count());
    s = static_cast<int>(hms.seconds().count());
  }
};

// The first local time >= `from` that `e` matches, not after `limit`.
std::optional<local_seconds> next_match(const cron_expr& e, local_seconds from,
                                        local_seconds limit) {
  auto t = from;
  while (t <= limit) {
    civil c(t);
    if (!e.months[unsigned(c.ymd.month())]) {
      auto ym = c.ymd.year() / c.ymd.month() + date::months{1};
      t = local_seconds(date::local_days(ym / 1));
      continue;
    }
    if (!day_matches(e, c.ymd)) {
      t = c.day + date::days{1};
      continue;
    }
    int h = next_set(e.hours, c.h);
    if (h < 0) {
      t = c.day + date::days{1};
      continue;
    }
    if (h != c.h) {
      t = c.day + hours{h};
      continue;
    }
    int mi = next_set(e.minutes, c.mi);
    if (mi < 0) {
      t = c.day + hours{h + 1};
      continue;
    }
    if (mi != c.mi) {
      t = c.day + hours{h} + minutes{mi};
      continue;
    }
    int s = next_set(e.seconds, c.s);
    if (s < 0) {
      t = c.day + hours{h} + minutes{mi + 1};
      continue;
    }
    return c.day + hours{h} + minutes{mi} + seconds{s};
  }
  return std::nullopt;
}

// The last local time <= `from` that `e` matches, not before `limit`.
std::optional<local_seconds> prev_match(const cron_expr& e, local_seconds from,
                                        local_seconds limit) {
  auto t = from;
  while (t >= limit) {
    civil c(t);
    if (!e.months[unsigned(c.ymd.month())]) {
      t = local_seconds(date::local_days(c.ymd.year() / c.ymd.month() / 1)) - seconds{1};
      continue;
    }
    if (!day_matches(e, c.ymd)) {
      t = c.day - seconds{1};
      continue;
    }
    int h = prev_set(e.hours, c.h);
    if (h < 0) {
      t = c.day - seconds{1};
      continue;
    }
    if (h != c.h) {
      t = c.day + hours{h} + minutes{59} + seconds{59};
      continue;
    }
    int mi = prev_set(e.minutes, c.mi);
    if (mi < 0) {
      t = c.day + hours{h} - seconds{1};
      continue;
    }
    if (mi != c.mi) {
      t = c.day + hours{h} + minutes{mi} + seconds{59};
      continue;
    }
    int s = prev_set(e.seconds, c.s);
    if (s < 0) {
      t = c.day + hours{h} + minutes{mi} - seconds{1};
      continue;
    }
    return c.day + hours{h} + minutes{mi} + seconds{s};
  }
  return std::nullopt;
}

// Whether `e` has the shape parse_cron gives (a hand-built or default
// cron_expr may not): each set the right size and allowing some value.
bool well_formed(const cron_expr& e) {
  auto ok = [](const std::vector<bool>& s, std::size_t n, std::size_t first) {
    return s.size() == n && std::find(s.begin() + first, s.end(), true) != s.end();
  };
  return ok(e.seconds, 60, 0) && ok(e.minutes, 60, 0) && ok(e.hours, 24, 0) && ok(e.days, 32, 1) &&
         ok(e.months, 13, 1) && ok(e.weekdays, 7, 0);
}

decode_error malformed(const cron_expr& e) {
  return decode_error{"cron", quoted(e.text) + " is not a parsed cron expression"};
}

// ---- local time <-> instant ----------------------------------------------
// A local time's instant: the only one; the first of two (fall-back); the
// instant the gap ends (spring-forward). This map never decreases as the
// local time grows, which is what lets a search run in local time and stop at
// its first match.

constexpr date::days k_search_span{5 * 366};

decoded<const date::time_zone*> zone_of(const std::string& name) {
  try {
    return date::locate_zone(name);
  } catch (const std::exception&) {
    return decode_error{"zone", "unknown time zone " + quoted(name)};
  }
}

sys_seconds instant_of(const date::time_zone* z, local_seconds l) {
  return z->to_sys(l, date::choose::earliest);
}

// The first local time whose instant is >= t.
local_seconds first_local_at_or_after(const date::time_zone* z, sys_seconds t) {
  auto l = z->to_local(t);
  auto info = z->get_info(l);
  // t falls in a repeated hour's second pass: every local time of that hour
  // fires at its first pass, before t; the next one after the repeat is.
  if (info.result == date::local_info::ambiguous && instant_of(z, l) < t)
    return local_seconds((info.first.end + info.first.offset).time_since_epoch());
  // t is the instant a spring-forward gap ends: the gap's local times fire at t too.
  auto before = z->get_info(l - seconds{1});
  if (before.result == date::local_info::nonexistent)
    return local_seconds((before.first.end + before.first.offset).time_since_epoch());
  return l;
}

// The last local time whose instant is <= t.
local_seconds last_local_at_or_before(const date::time_zone* z, sys_seconds t) {
  auto l = z->to_local(t);
  auto info = z->get_info(l);
  if (info.result == date::local_info::ambiguous && instant_of(z, l) < t)
    return local_seconds((info.first.end + info.first.offset).time_since_epoch()) - seconds{1};
  return l;
}

std::int64_t floor_div(std::int64_t a, std::int64_t b) {
  auto q = a / b;
  return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}

// Instants as whole seconds of the epoch; ms bounds are rounded inwards.
constexpr std::int64_t k_max_ms = 253402300799999;  // 9999-12-31T23:59:59.999Z
constexpr std::int64_t k_min_ms = -62135596800000;  // 0001-01-01T00:00:00Z

decoded<std::optional<std::int64_t>> cron_next(const cron_schedule& c, std::int64_t after_ms) {
  if (!well_formed(c.expr)) return malformed(c.expr);
  auto z = zone_of(c.zone);
  if (!z) return z.error();
  if (after_ms >= k_max_ms - k_search_span.count() * std::int64_t{86400000})
    return std::optional<std::int64_t>();
  after_ms = std::max(after_ms, k_min_ms);
  sys_seconds t{seconds{floor_div(after_ms, 1000) + 1}};
  auto from = first_local_at_or_after(*z, t);
  auto l = next_match(c.expr, from, from + k_search_span);
  if (!l) return std::optional<std::int64_t>();
  auto at = instant_of(*z, *l);
  return std::optional<std::int64_t>(
      std::chrono::duration_cast<milliseconds>(at.time_since_epoch()).count());
}

decoded<std::optional<std::int64_t>> cron_latest(const cron_schedule& c, std::int64_t after_ms,
                                                 std::int64_t at_ms) {
  if (!well_formed(c.expr)) return malformed(c.expr);
  auto z = zone_of(c.zone);
  if (!z) return z.error();
  if (at_ms <= after_ms) return std::optional<std::int64_t>();
  at_ms = std::min(at_ms, k_max_ms - 2 * std::int64_t{86400000});
  after_ms = std::max(after_ms, k_min_ms + 2 * std::int64_t{86400000});
  if (at_ms <= after_ms) return std::optional<std::int64_t>();
  sys_seconds top{seconds{floor_div(at_ms, 1000)}};
  auto from = last_local_at_or_before(*z, top);
  // Nothing before the window can count; a day's margin covers any offset.
  auto floor_local =
      (*z)->to_local(sys_seconds{seconds{floor_div(after_ms, 1000)}}) - date::days{1};
  auto limit = std::max(floor_local, from - k_search_span);
  auto l = prev_match(c.expr, from, limit);
  if (!l) return std::optional<std::int64_t>();
  auto ms = std::chrono::duration_cast<milliseconds>(instant_of(*z, *l).time_since_epoch()).count();
  if (ms <= after_ms || ms > at_ms) return std::optional<std::int64_t>();
  return std::optional<std::int64_t>(ms);
}

// A restricted day-of-month alone (day-of-week `*`) matches only dates that
// exist in one of its months.
bool ever_fires(const cron_expr& e) {
  if (!e.weekdays_any || e.days_any) return true;
  constexpr std::array<int, 13> k_longest = {0, 31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
  for (int m = 1; m <= 12; ++m)
    if (e.months[static_cast<std::size_t>(m)])
      for (int d = 1; d <= k_longest[static_cast<std::size_t>(m)]; ++d)
        if (e.days[static_cast<std::size_t>(d)]) return true;
  return false;
}

// ---- JSON ----------------------------------------------------------------

template <std::size_t N>
std::optional<decode_error> unknown_key(const fields& f, const std::array<std::string_view, N>& k) {
  for (const auto& kv : f.obj())
    if (std::find(k.begin(), k.end(), std::string_view(kv.key())) == k.end()) {
      std::string known;
      for (auto n : k) known += (known.empty() ? "" : ", ") + std::string(n);
      return decode_error{f.path(kv.key()), "unknown field (known: " + known + ")"};
    }
  return std::nullopt;
}

constexpr std::array<std::string_view, 5> k_schedule_keys = {"cron", "tz", "at", "every_ms",
                                                             "anchor_ms"};
constexpr std::array<std::string_view, 15> k_job_keys = {"name",
                                                         "agent",
                                                         "schedule",
                                                         "command",
                                                         "cwd",
                                                         "prompt",
                                                         "session",
                                                         "timeout_ms",
                                                         "retries",
                                                         "backoff_ms",
                                                         "backoff_max_ms",
                                                         "max_output_bytes",
                                                         "enabled",
                                                         "delete_after_run",
                                                         "catch_up"};

decode_error under(const std::string& prefix, const decode_error& e) {
  if (prefix.empty()) return e;
  return decode_error{e.field.empty() ? prefix : prefix + "." + e.field, e.problem};
}

bool name_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
         c == '.' || c == '-';
}

}  // namespace

// ---- public --------------------------------------------------------------

decoded<cron_expr> parse_cron(std::string_view text) {
  auto is_space = [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; };
  while (!text.empty() && is_space(text.front())) text.remove_prefix(1);
  while (!text.empty() && is_space(text.back())) text.remove_suffix(1);
  if (text.empty()) return decode_error{"", "empty cron expression"};
  std::vector<std::string_view> parts;
  for (std::size_t i = 0; i < text.size();) {
    if (is_space(text[i])) {
      ++i;
      continue;
    }
    std::size_t j = i;
    while (j < text.size() && !is_space(text[j])) ++j;
    parts.push_back(text.substr(i, j - i));
    i = j;
  }
  if (parts.size() != 5 && parts.size() != 6)
    return decode_error{"",
                        "expected 5 fields (minute hour day-of-month month day-of-week) or 6 "
                        "(a leading second), got " +
                            std::to_string(parts.size()) + " in " + quoted(text)};
  cron_expr e;
  e.text = std::string(text);
  std::size_t i = 0;
  bool any = false;
  if (parts.size() == 6) {
    if (auto err = parse_field(k_second, parts[i++], e.seconds, any)) return *err;
  } else {
    e.seconds.assign(60, false);
    e.seconds[0] = true;
  }
  if (auto err = parse_field(k_minute, parts[i++], e.minutes, any)) return *err;
  if (auto err = parse_field(k_hour, parts[i++], e.hours, any)) return *err;
  if (auto err = parse_field(k_dom, parts[i++], e.days, e.days_any)) return *err;
  if (auto err = parse_field(k_month, parts[i++], e.months, any)) return *err;
  if (auto err = parse_field(k_dow, parts[i++], e.weekdays, e.weekdays_any)) return *err;
  if (e.weekdays[7]) e.weekdays[0] = true;
  e.weekdays.resize(7);
  return e;
}

decoded<std::optional<std::int64_t>> next_after(const schedule& s, std::int64_t after_ms) {
  if (auto c = std::get_if<cron_schedule>(&s)) return cron_next(*c, after_ms);
  if (auto a = std::get_if<at_schedule>(&s))
    return a->at_ms > after_ms ? std::optional<std::int64_t>(a->at_ms) : std::nullopt;
  const auto& e = std::get<every_schedule>(s);
  if (e.every_ms <= 0) return decode_error{"every_ms", "must be > 0"};
  if (after_ms < e.anchor_ms) return std::optional<std::int64_t>(e.anchor_ms);
  __int128 k = (static_cast<__int128>(after_ms) - e.anchor_ms) / e.every_ms + 1;
  __int128 next = e.anchor_ms + k * e.every_ms;
  if (next > INT64_MAX) return std::optional<std::int64_t>();
  return std::optional<std::int64_t>(static_cast<std::int64_t>(next));
}

decoded<std::optional<std::int64_t>> latest_in(const schedule& s, std::int64_t after_ms,
                                               std::int64_t at_ms) {
  if (at_ms <= after_ms) return std::optional<std::int64_t>();
  if (auto c = std::get_if<cron_schedule>(&s)) return cron_latest(*c, after_ms, at_ms);
  if (auto a = std::get_if<at_schedule>(&s))
    return (a->at_ms > after_ms && a->at_ms <= at_ms) ? std::optional<std::int64_t>(a->at_ms)
                                                      : std::nullopt;
  const auto& e = std::get<every_schedule>(s);
  if (e.every_ms <= 0) return decode_error{"every_ms", "must be > 0"};
  if (at_ms < e.anchor_ms) return std::optional<std::int64_t>();
  __int128 k = (static_cast<__int128>(at_ms) - e.anchor_ms) / e.every_ms;
  auto newest = static_cast<std::int64_t>(e.anchor_ms + k * e.every_ms);
  if (newest <= after_ms) return std::optional<std::int64_t>();
  return std::optional<std::int64_t>(newest);
}

bool known_zone(std::string_view zone) {
  if (zone.empty()) return false;
  return static_cast<bool>(zone_of(std::string(zone)));
}

std::string format_utc(std::int64_t ms) {
  return date::format("%FT%TZ", date::sys_time<milliseconds>{milliseconds{ms}});
}

decoded<std::string> format_local(std::int64_t ms, std::string_view zone) {
  auto z = zone_of(std::string(zone));
  if (!z) return z.error();
  auto t = date::floor<seconds>(date::sys_time<milliseconds>{milliseconds{ms}});
  return date::format("%F %T %Z", date::make_zoned(*z, t));
}

std::string describe(const schedule& s) {
  if (auto c = std::get_if<cron_schedule>(&s)) return "cron \"" + c->expr.text + "\" in " + c->zone;
  if (auto a = std::get_if<at_schedule>(&s)) return "at " + format_utc(a->at_ms);
  const auto& e = std::get<every_schedule>(s);
  return "every " + std::to_string(e.every_ms) + " ms from " + format_utc(e.anchor_ms);
}

decoded<std::int64_t> parse_utc(std::string_view text) {
  auto bad = [&](const std::string& why) {
    return decode_error{"", quoted(text) + " is not a time like 2026-12-03T09:00:00Z: " + why};
  };
  std::size_t i = 0;
  auto digits = [&](std::size_t n, int& out) {
    if (i + n > text.size()) return false;
    out = 0;
    for (std::size_t k = 0; k < n; ++k) {
      char c = text[i + k];
      if (c < '0' || c > '9') return false;
      out = out * 10 + (c - '0');
    }
    i += n;
    return true;
  };
  auto lit = [&](char c) {
    if (i < text.size() && text[i] == c) {
      ++i;
      return true;
    }
    return false;
  };
  int y, mo, d, h, mi, s;
  if (!digits(4, y) || !lit('-') || !digits(2, mo) || !lit('-') || !digits(2, d))
    return bad("expected the date as YYYY-MM-DD");
  if (!lit('T')) return bad("expected 'T' after the date");
  if (!digits(2, h) || !lit(':') || !digits(2, mi) || !lit(':') || !digits(2, s))
    return bad("expected the time as HH:MM:SS");
  std::int64_t frac_ms = 0;
  if (lit('.')) {
    std::size_t n = 0;
    while (i < text.size() && text[i] >= '0' && text[i] <= '9') {
      if (n < 3) frac_ms = frac_ms * 10 + (text[i] - '0');
      ++n;
      ++i;
    }
    if (n == 0 || n > 9) return bad("expected 1 to 9 digits after '.'");
    for (; n < 3; ++n) frac_ms *= 10;
  }
  std::int64_t offset_s = 0;
  if (lit('Z')) {
  } else if (i < text.size() && (text[i] == '+' || text[i] == '-')) {
    int sign = text[i] == '-' ? -1 : 1;
    ++i;
    int oh, om;
    if (!digits(2, oh) || !lit(':') || !digits(2, om) || oh > 23 || om > 59)
      return bad("expected the offset as +HH:MM or -HH:MM");
    offset_s = sign * (oh * 3600 + om * 60);
  } else {
    return bad("expected 'Z' or an offset +HH:MM after the time");
  }
  if (i != text.size()) return bad("unexpected " + quoted(text.substr(i)) + " at the end");
  date::year_month_day ymd{date::year{y}, date::month{unsigned(mo)}, date::day{unsigned(d)}};
  if (!ymd.ok()) return bad("no such date");
  if (h > 23 || mi > 59 || s > 59) return bad("no such time of day");
  auto t = date::sys_days(ymd) + hours{h} + minutes{mi} + seconds{s} - seconds{offset_s};
  return std::chrono::duration_cast<milliseconds>(t.time_since_epoch()).count() + frac_ms;
}

json::value to_json(const schedule& s) {
  json::object o;
  if (auto c = std::get_if<cron_schedule>(&s)) {
    o["cron"] = c->expr.text;
    o["tz"] = c->zone;
  } else if (auto a = std::get_if<at_schedule>(&s)) {
    o["at"] = format_utc(a->at_ms);
  } else {
    const auto& e = std::get<every_schedule>(s);
    o["every_ms"] = e.every_ms;
    o["anchor_ms"] = e.anchor_ms;
  }
  return o;
}

decoded<schedule> schedule_from_json(const json::value& v, const std::string& prefix) {
  auto f = fields::of(v, prefix);
  if (!f) return f.error();
  if (auto e = unknown_key(*f, k_schedule_keys)) return *e;
  int forms = f->has("cron") + f->has("at") + f->has("every_ms");
  if (forms != 1)
    return decode_error{
        prefix, "needs exactly one of cron, at, every_ms (got " + std::to_string(forms) + ")"};
  if (f->has("cron")) {
    if (f->has("anchor_ms"))
      return decode_error{f->path("anchor_ms"), "only an every_ms schedule has an anchor"};
    auto text = f->str("cron");
    if (!text) return text.error();
    auto e = parse_cron(*text);
    if (!e) return decode_error{f->path("cron"), e.error().describe()};
    auto tz = f->opt_str("tz");
    if (!tz) return tz.error();
    cron_schedule c{std::move(*e), tz->value_or("UTC")};
    if (!known_zone(c.zone))
      return decode_error{f->path("tz"), "unknown time zone " + quoted(c.zone)};
    if (!ever_fires(c.expr))
      return decode_error{f->path("cron"),
                          quoted(c.expr.text) + " never fires (no such day in its months)"};
    return schedule(std::move(c));
  }
  if (f->has("tz")) return decode_error{f->path("tz"), "only a cron schedule has a time zone"};
  if (f->has("at")) {
    if (f->has("anchor_ms"))
      return decode_error{f->path("anchor_ms"), "only an every_ms schedule has an anchor"};
    const auto& a = f->obj().at("at");
    if (a.is_string()) {
      auto ms = parse_utc(a.get_string());
      if (!ms) return decode_error{f->path("at"), ms.error().problem};
      return schedule(at_schedule{*ms});
    }
    auto ms = f->i64("at");
    if (!ms)
      return decode_error{f->path("at"),
                          "expected an ISO 8601 time string or milliseconds since "
                          "the epoch"};
    return schedule(at_schedule{*ms});
  }
  auto every = f->i64("every_ms");
  if (!every) return every.error();
  if (*every <= 0) return decode_error{f->path("every_ms"), "must be > 0"};
  auto anchor = f->opt_i64("anchor_ms");
  if (!anchor) return anchor.error();
  return schedule(every_schedule{*every, anchor->value_or(0)});
}

std::optional<decode_error> check(const cron_job_spec& j) {
  if (j.name.empty() || j.name.size() > 64 || !std::all_of(j.name.begin(), j.name.end(), name_char))
    return decode_error{"name", quoted(j.name) + " is not 1..64 of A-Z a-z 0-9 _ . -"};
  if (auto c = std::get_if<cron_schedule>(&j.when)) {
    if (!well_formed(c->expr)) return under("schedule", malformed(c->expr));
    if (!known_zone(c->zone))
      return decode_error{"schedule.tz", "unknown time zone " + quoted(c->zone)};
    if (!ever_fires(c->expr))
      return decode_error{"schedule.cron",
                          quoted(c->expr.text) + " never fires (no such day in its months)"};
  } else if (auto e = std::get_if<every_schedule>(&j.when)) {
    if (e->every_ms <= 0) return decode_error{"schedule.every_ms", "must be > 0"};
  }
  if (j.kind == cron_action_kind::shell) {
    if (j.command.empty()) return decode_error{"command", "a shell job needs a command"};
    if (!j.prompt.empty()) return decode_error{"prompt", "a shell job has no prompt"};
    if (!j.cwd.empty() && j.cwd.front() != '/')
      return decode_error{"cwd", quoted(j.cwd) + " is not an absolute path"};
  } else {
    if (j.prompt.empty()) return decode_error{"prompt", "a prompt job needs a prompt"};
    if (!j.command.empty()) return decode_error{"command", "a prompt job has no command"};
    if (!j.cwd.empty()) return decode_error{"cwd", "only a shell job has a cwd"};
  }
  if (j.timeout_ms < 0) return decode_error{"timeout_ms", "must be >= 0 (0: none)"};
  if (j.retries < 0 || j.retries > 10)
    return decode_error{"retries", "must be in 0..10, not " + std::to_string(j.retries)};
  if (j.backoff_ms < 0) return decode_error{"backoff_ms", "must be >= 0"};
  if (j.backoff_max_ms < j.backoff_ms)
    return decode_error{"backoff_max_ms",
                        "must be >= backoff_ms (" + std::to_string(j.backoff_ms) + ")"};
  if (j.max_output_bytes < 64 || j.max_output_bytes > 1024 * 1024)
    return decode_error{"max_output_bytes",
                        "must be in 64..1048576, not " + std::to_string(j.max_output_bytes)};
  if (j.delete_after_run && !j.one_shot())
    return decode_error{"delete_after_run",
                        "only a one-shot (at) job can be deleted after it runs"};
  return std::nullopt;
}

json::value to_json(const cron_job_spec& j) {
  json::object o;
  o["name"] = j.name;
  if (!j.agent.empty()) o["agent"] = j.agent;
  o["schedule"] = to_json(j.when);
  if (j.kind == cron_action_kind::shell) {
    o["command"] = j.command;
    if (!j.cwd.empty()) o["cwd"] = j.cwd;
  } else {
    o["prompt"] = j.prompt;
  }
  o["session"] = j.session == cron_session::main ? "main" : "isolated";
  o["timeout_ms"] = j.timeout_ms;
  o["retries"] = j.retries;
  o["backoff_ms"] = j.backoff_ms;
  o["backoff_max_ms"] = j.backoff_max_ms;
  o["max_output_bytes"] = static_cast<std::int64_t>(j.max_output_bytes);
  o["enabled"] = j.enabled;
  o["delete_after_run"] = j.delete_after_run;
  if (j.catch_up) o["catch_up"] = *j.catch_up;
  return o;
}

decoded<cron_job_spec> cron_job_from_json(const json::value& v, const std::string& prefix) {
  auto f = fields::of(v, prefix);
  if (!f) return f.error();
  if (auto e = unknown_key(*f, k_job_keys)) return *e;
  cron_job_spec j;
  auto name = f->str("name");
  if (!name) return name.error();
  j.name = std::move(*name);
  auto agent = f->opt_str("agent");
  if (!agent) return agent.error();
  j.agent = agent->value_or("");
  if (!f->has("schedule")) return decode_error{f->path("schedule"), "missing"};
  auto when = schedule_from_json(f->obj().at("schedule"), f->path("schedule"));
  if (!when) return when.error();
  j.when = std::move(*when);
  bool has_command = f->has("command"), has_prompt = f->has("prompt");
  if (has_command == has_prompt)
    return decode_error{prefix, has_command ? "has both command and prompt; give one"
                                            : "needs a command (a shell job) or a prompt"};
  auto command = f->opt_str("command");
  if (!command) return command.error();
  auto prompt = f->opt_str("prompt");
  if (!prompt) return prompt.error();
  j.kind = has_command ? cron_action_kind::shell : cron_action_kind::prompt;
  j.command = command->value_or("");
  j.prompt = prompt->value_or("");
  auto cwd = f->opt_str("cwd");
  if (!cwd) return cwd.error();
  j.cwd = cwd->value_or("");
  auto session = f->opt_str("session");
  if (!session) return session.error();
  if (*session) {
    if (**session == "main")
      j.session = cron_session::main;
    else if (**session == "isolated")
      j.session = cron_session::isolated;
    else
      return decode_error{f->path("session"),
                          quoted(**session) + " is not \"isolated\" or \"main\""};
  }
  for (auto [key, out] :
       {std::pair{"timeout_ms", &j.timeout_ms}, std::pair{"backoff_ms", &j.backoff_ms},
        std::pair{"backoff_max_ms", &j.backoff_max_ms}}) {
    auto n = f->opt_i64(key);
    if (!n) return n.error();
    if (*n) *out = **n;
  }
  auto retries = f->opt_i64("retries");
  if (!retries) return retries.error();
  if (*retries) {
    if (**retries < 0 || **retries > 10)
      return decode_error{f->path("retries"), "must be in 0..10, not " + std::to_string(**retries)};
    j.retries = static_cast<int>(**retries);
  }
  auto max_out = f->opt_i64("max_output_bytes");
  if (!max_out) return max_out.error();
  if (*max_out) {
    if (**max_out < 64 || **max_out > 1024 * 1024)
      return decode_error{f->path("max_output_bytes"),
                          "must be in 64..1048576, not " + std::to_string(**max_out)};
    j.max_output_bytes = static_cast<std::size_t>(**max_out);
  }
  for (auto [key, out] :
       {std::pair{"enabled", &j.enabled}, std::pair{"delete_after_run", &j.delete_after_run}}) {
    auto b = f->opt_bool(key);
    if (!b) return b.error();
    if (*b) *out = **b;
  }
  auto catch_up = f->opt_bool("catch_up");
  if (!catch_up) return catch_up.error();
  j.catch_up = *catch_up;
  if (auto e = check(j)) return under(prefix, *e);
  return j;
}

decoded<std::vector<cron_job_spec>> parse_cron_file(std::string_view text) {
  auto v = parse_json(text);
  if (!v) return v.error();
  if (auto dup = first_duplicate_key(text))
    return decode_error{"", "the key " + quoted(*dup) + " appears twice in one object"};
  auto f = fields::of(*v);
  if (!f) return f.error();
  if (auto e = unknown_key(*f, std::array<std::string_view, 1>{"jobs"})) return *e;
  auto jobs = f->array("jobs");
  if (!jobs) return jobs.error();
  std::vector<cron_job_spec> out;
  for (std::size_t i = 0; i < (*jobs)->size(); ++i) {
    const auto& jv = (**jobs)[i];
    std::string prefix = "jobs[" + std::to_string(i) + "]";
    if (jv.is_object())
      if (auto n = jv.get_object().if_contains("name"); n && n->is_string())
        prefix += " (" + std::string(n->get_string()) + ")";
    auto j = cron_job_from_json(jv, prefix);
    if (!j) return j.error();
    for (std::size_t k = 0; k < out.size(); ++k)
      if (out[k].name == j->name)
        return decode_error{prefix + ".name", "duplicate of jobs[" + std::to_string(k) + "]"};
    out.push_back(std::move(*j));
  }
  return out;
}

}  // namespace tether::protocol
