#include "tether/protocol/ids.hpp"

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <random>

namespace tether::protocol {

std::string_view to_string(transition t) {
  switch (t) {
    case transition::started:
      return "started";
    case transition::completed:
      return "completed";
    case transition::failed:
      return "failed";
    case transition::cancelled:
      return "cancelled";
    case transition::lost:
      return "lost";
    case transition::timed_out:
      return "timed_out";
  }
  return "unknown";
}

bool parse(std::string_view s, transition& out) {
  for (auto t : {transition::started, transition::completed, transition::failed,
                 transition::cancelled, transition::lost, transition::timed_out})
    if (s == to_string(t)) {
      out = t;
      return true;
    }
  return false;
}

event_id make_event_id(const job_id& job, transition t) {
  return event_id(job.str() + "/" + std::string(to_string(t)));
}

namespace {

// "%012llx" is a minimum: µs since 1970 take 13 hex digits until 2112.
constexpr std::size_t k_counter_digits = 4, k_glob_digits = 13 + k_counter_digits;
std::atomic<std::uint64_t> g_last_us{0};

// Raises g_last_us to at least `us`; returns the value it holds after.
void raise_to(std::uint64_t us) {
  auto last = g_last_us.load();
  while (last < us && !g_last_us.compare_exchange_weak(last, us)) {
  }
}

}  // namespace

std::string_view minted_glob() {
  static const std::string glob = [] {
    std::string g = "*_";
    for (std::size_t i = 0; i < k_glob_digits; ++i) g += "[0-9a-f]";
    return g;
  }();
  return glob;
}

void mint_floor(std::string_view id) {
  auto at = id.rfind('_');
  if (at == std::string_view::npos) return;
  auto tail = id.size() - at - 1;
  if (tail < 12 + k_counter_digits || tail > 16 + k_counter_digits) return;
  std::uint64_t us = 0;
  for (std::size_t i = at + 1; i < id.size() - k_counter_digits; ++i) {
    char c = id[i];
    int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
    if (d < 0) return;
    us = us * 16 + static_cast<std::uint64_t>(d);
  }
  raise_to(us);
}

std::string mint(std::string_view prefix) {
  static std::atomic<unsigned> counter{0};
  auto now = static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::microseconds>(
                                            std::chrono::system_clock::now().time_since_epoch())
                                            .count());
  // Strictly after the last id minted or seen, whatever the wall clock says.
  auto last = g_last_us.load();
  std::uint64_t us;
  do {
    us = now > last ? now : last + 1;
  } while (!g_last_us.compare_exchange_weak(last, us));
  char buf[48];
  std::snprintf(buf, sizeof buf, "_%012llx%04x", static_cast<unsigned long long>(us),
                counter.fetch_add(1) & 0xffff);
  return std::string(prefix) + buf;
}

std::string random_uuid() {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  std::uint64_t a = rng(), b = rng();
  a = (a & 0xffffffffffff0fffULL) | 0x0000000000004000ULL;  // version 4
  b = (b & 0x3fffffffffffffffULL) | 0x8000000000000000ULL;  // variant 1
  char buf[37];
  std::snprintf(buf, sizeof buf, "%08x-%04x-%04x-%04x-%012llx", static_cast<unsigned>(a >> 32),
                static_cast<unsigned>((a >> 16) & 0xffff), static_cast<unsigned>(a & 0xffff),
                static_cast<unsigned>(b >> 48),
                static_cast<unsigned long long>(b & 0xffffffffffffULL));
  return buf;
}

}  // namespace tether::protocol
