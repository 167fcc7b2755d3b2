#pragma once
// Named crash points. TETHER_CRASH_POINT("settle.after_commit") is present in
// every build; when TETHER_CRASH_AT=name (or name:N for the Nth hit) is set in
// the environment, or a test armed the point, the process raise(SIGKILL)s
// there. Every point registers its name before main() runs, so
// crash_point_names() (and `tether crash-points`) enumerate them all.
//
// A crash point marks a gap between two durable writes: its meaning is "the
// process died after everything before this line reached disk and before
// anything after it did".
#include <atomic>
#include <cstddef>
#include <string>
#include <vector>

#include "tether/runtime/error.hpp"

namespace tether::runtime {

class crash_point {
 public:
  explicit crash_point(const char* name);
  void hit();
  const char* name() const { return name_; }

 private:
  const char* name_;
  std::atomic<unsigned> hits_{0};
};

/// Every registered point, sorted.
std::vector<std::string> crash_point_names();

/// Arms `name` to kill the process at its nth hit (replaces any earlier arming).
void arm_crash_point(const std::string& name, unsigned nth = 1);
void disarm_crash_points();

/// Checks TETHER_CRASH_AT against the registry: an unknown name or a bad count
/// is an error naming it (so a typo never silently disables a crash test).
result<void> check_crash_env();

template <std::size_t N>
struct crash_point_name {
  char s[N];
  constexpr crash_point_name(const char (&a)[N]) {
    for (std::size_t i = 0; i < N; ++i) s[i] = a[i];
  }
};

template <crash_point_name Name>
struct crash_point_site {
  static inline crash_point point{Name.s};
};

}  // namespace tether::runtime

#define TETHER_CRASH_POINT(name) (::tether::runtime::crash_point_site<name>::point.hit())
