// `tether demo` (what `make demo` runs) end to end: it exits 0, every check
// it prints passes, and its delegated-task story (the host SIGKILLed between
// the artifact and the promotion) ends with the artifact promoted once and
// the originator's notice delivered once.
#include <sys/wait.h>

#include <catch2/catch.hpp>
#include <chrono>

#include "crash_matrix_support.hpp"

using namespace tether;

TEST_CASE(
    "the demo runs end to end, and its delegated task killed before its promotion is promoted "
    "and noticed once after the restart",
    "[demo][delegate]") {
  // A bound only so that a hung demo fails instead of stalling the suite.
  auto r = test::run_bounded({test::k_tether_cli, "demo"}, std::chrono::minutes(3));
  INFO("tether demo said:\n" << r.output);
  REQUIRE_FALSE(r.timed_out);
  REQUIRE(WIFEXITED(r.status));
  CHECK(WEXITSTATUS(r.status) == 0);
  CHECK(r.output.find("  FAIL  ") == std::string::npos);
  CHECK(r.output.find("  ok    the host died by SIGKILL after publishing the artifact, before "
                      "promoting it") != std::string::npos);
  CHECK(r.output.find("  restart: recovered: promoted 1, failed 0, lost 0, timed out 0") !=
        std::string::npos);
  CHECK(r.output.find("  ok    recovery checked the artifact against its digest and promoted it, "
                      "once") != std::string::npos);
  CHECK(r.output.find("  ok    the originator's notice was delivered once") != std::string::npos);
  // Its cron part: the schedule survived the SIGKILL with every occurrence run once.
  CHECK(
      r.output.find("  ok    the host died by SIGKILL with the second occurrence's command sent") !=
      std::string::npos);
  CHECK(r.output.find("  ok    every occurrence ran exactly once: none lost, none twice") !=
        std::string::npos);
  // Its SOP part: the run waited through a SIGKILL and a restart, then shipped once.
  CHECK(r.output.find("  ok    the host died by SIGKILL with the run waiting for approval") !=
        std::string::npos);
  CHECK(r.output.find("  ok    after the restart the run is still waiting for approval") !=
        std::string::npos);
  CHECK(r.output.find("  ok    each step ran exactly once: built once, shipped once") !=
        std::string::npos);
}
