#include "tether/runtime/crash_point.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <set>

namespace tether::runtime {
namespace {

struct registry {
  std::mutex m;
  std::set<std::string> names;
};
registry& reg() {
  static registry r;
  return r;
}

struct arming {
  std::mutex m;
  std::atomic<bool> armed{false};
  std::string name;
  unsigned nth = 1;
  bool env_ok = true;
  std::string env_problem;

  arming() {
    const char* v = std::getenv("TETHER_CRASH_AT");
    if (!v || !*v) return;
    std::string s = v;
    auto colon = s.rfind(':');
    if (colon != std::string::npos) {
      std::string n = s.substr(colon + 1);
      char* end = nullptr;
      unsigned long k = std::strtoul(n.c_str(), &end, 10);
      if (n.empty() || *end != '\0' || k == 0) {
        env_ok = false;
        env_problem = "TETHER_CRASH_AT='" + s + "': count after ':' must be a positive integer";
        return;
      }
      nth = static_cast<unsigned>(k);
      s.resize(colon);
    }
    name = s;
    armed = true;
  }
};
arming& arm() {
  static arming a;
  return a;
}

}  // namespace

crash_point::crash_point(const char* name) : name_(name) {
  auto& r = reg();
  std::lock_guard lk(r.m);
  r.names.insert(name);
}

namespace {
// TETHER_CRASH_TRACE=FILE appends every hit's name to FILE, so a test can
// learn how often a scenario reaches each point before it crashes at them.
int trace_fd() {
  static int fd = [] {
    const char* p = std::getenv("TETHER_CRASH_TRACE");
    return (p && *p) ? ::open(p, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644) : -1;
  }();
  return fd;
}
}  // namespace

void crash_point::hit() {
  if (int fd = trace_fd(); fd >= 0) {
    std::string line = std::string(name_) + "\n";
    [[maybe_unused]] auto n = ::write(fd, line.data(), line.size());
  }
  auto& a = arm();
  if (!a.armed.load(std::memory_order_acquire)) return;
  unsigned nth;
  {
    std::lock_guard lk(a.m);
    if (a.name != name_) return;
    nth = a.nth;
  }
  if (hits_.fetch_add(1) + 1 != nth) return;
  // Say where we died; stderr is unbuffered, write(2) is async-signal-safe.
  std::string msg = std::string("tether: crash point '") + name_ + "' reached; raising SIGKILL\n";
  [[maybe_unused]] auto n = ::write(2, msg.data(), msg.size());
  std::raise(SIGKILL);
}

std::vector<std::string> crash_point_names() {
  auto& r = reg();
  std::lock_guard lk(r.m);
  return {r.names.begin(), r.names.end()};
}

void arm_crash_point(const std::string& name, unsigned nth) {
  auto& a = arm();
  std::lock_guard lk(a.m);
  a.name = name;
  a.nth = nth;
  a.armed = true;
}

void disarm_crash_points() {
  auto& a = arm();
  std::lock_guard lk(a.m);
  a.armed = false;
  a.name.clear();
}

result<void> check_crash_env() {
  auto& a = arm();
  std::lock_guard lk(a.m);
  if (!a.env_ok) return error{errc::invalid, a.env_problem + "; no crash point armed"};
  if (!a.armed) return {};
  auto names = crash_point_names();
  if (!std::binary_search(names.begin(), names.end(), a.name))
    return error{errc::invalid, "TETHER_CRASH_AT names unknown crash point '" + a.name +
                                    "'; `tether crash-points` lists the known ones"};
  return {};
}

}  // namespace tether::runtime
