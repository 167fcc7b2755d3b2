// Crash points: registered before main, armed by name, kill with SIGKILL.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <csignal>

#include "tether/runtime/crash_point.hpp"

using namespace tether::runtime;

namespace {
void step_under_test(int& progress) {
  progress = 1;
  TETHER_CRASH_POINT("test.between_steps");
  progress = 2;
}
}  // namespace

TEST_CASE("every crash point is registered before it is ever reached") {
  auto names = crash_point_names();
  CHECK(std::find(names.begin(), names.end(), "test.between_steps") != names.end());
  CHECK(std::is_sorted(names.begin(), names.end()));
}

TEST_CASE("an armed crash point kills a forked child with SIGKILL and the parent sees it") {
  pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    arm_crash_point("test.between_steps", 2);
    int progress = 0;
    step_under_test(progress);  // first hit: passes
    step_under_test(progress);  // second hit: dies
    ::_exit(progress == 2 ? 0 : 3);
  }
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  REQUIRE(WIFSIGNALED(status));
  CHECK(WTERMSIG(status) == SIGKILL);
}

TEST_CASE("an unarmed crash point lets the process run on") {
  disarm_crash_points();
  int progress = 0;
  step_under_test(progress);
  CHECK(progress == 2);
}
