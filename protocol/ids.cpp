#include "tether/protocol/ids.hpp"

#include <atomic>
#include <chrono>
#include <cstdio>

namespace tether::protocol {

std::string_view to_string(transition t) {
  switch (t) {
    case transition::started: return "started";
    case transition::completed: return "completed";
    case transition::failed: return "failed";
    case transition::cancelled: return "cancelled";
    case transition::lost: return "lost";
  }
  return "unknown";
}

bool parse(std::string_view s, transition& out) {
  for (auto t : {transition::started, transition::completed, transition::failed,
                 transition::cancelled, transition::lost})
    if (s == to_string(t)) {
      out = t;
      return true;
    }
  return false;
}

event_id make_event_id(const job_id& job, transition t) {
  return event_id(job.str() + "/" + std::string(to_string(t)));
}

std::string mint(std::string_view prefix) {
  static std::atomic<unsigned> counter{0};
  auto us = std::chrono::duration_cast<std::chrono::microseconds>(
                std::chrono::system_clock::now().time_since_epoch())
                .count();
  char buf[48];
  std::snprintf(buf, sizeof buf, "_%012llx%04x", static_cast<unsigned long long>(us),
                counter.fetch_add(1) & 0xffff);
  return std::string(prefix) + buf;
}

}  // namespace tether::protocol
