// Cron expressions and schedule files (docs/cron.md): whatever the bytes, a
// parse either fails with a named error or yields a value that survives a
// round trip, and a schedule's next occurrence is strictly after its start,
// with nothing between the two.
//
// Input: byte 0 picks what the rest is (an expression, a schedule file or a
// UTC time) and, for an expression, the zone and the start instant; the rest
// is the text.
#include "tether/protocol/cron.hpp"

#include <cstdint>
#include <cstdlib>
#include <string>

namespace p = tether::protocol;

namespace {

constexpr const char* k_zones[] = {"UTC", "America/New_York", "Europe/Berlin",
                                   "Australia/Lord_Howe", "America/Santiago"};

void check_expression(std::uint8_t sel, const std::string& text) {
  auto e = p::parse_cron(text);
  if (!e) return;
  auto again = p::parse_cron(e->text);
  if (!again || !(*again == *e)) std::abort();
  // A start instant between 1970 and about 2036, chosen by the input.
  std::int64_t after = static_cast<std::int64_t>(sel) * 8'000'000'000LL + (sel % 7) * 1'234'567;
  p::schedule s = p::cron_schedule{*e, k_zones[sel % std::size(k_zones)]};
  auto n = p::next_after(s, after);
  if (!n) std::abort();
  if (!*n) return;
  if (**n <= after) std::abort();
  auto latest = p::latest_in(s, after, **n);
  if (!latest || *latest != *n) std::abort();
  auto none = p::latest_in(s, after, **n - 1);
  if (!none || *none) std::abort();
}

void check_file(const std::string& text) {
  auto jobs = p::parse_cron_file(text);
  if (!jobs) return;
  for (const auto& j : *jobs) {
    if (p::check(j)) std::abort();
    auto back = p::cron_job_from_json(p::to_json(j));
    if (!back || !(*back == j)) std::abort();
  }
}

void check_utc(const std::string& text) {
  auto ms = p::parse_utc(text);
  if (!ms) return;
  auto back = p::parse_utc(p::format_utc(*ms));
  if (!back || *back != *ms) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  std::string text(reinterpret_cast<const char*>(data) + 1, size - 1);
  switch (data[0] % 3) {
    case 0:
      check_expression(data[0] / 3, text);
      break;
    case 1:
      check_file(text);
      break;
    default:
      check_utc(text);
      break;
  }
  return 0;
}
