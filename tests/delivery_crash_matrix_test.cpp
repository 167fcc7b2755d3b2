// The delivery crash matrix: `tether jobs-story` (one turn launches three real
// commands into a real sandbox daemon: one succeeds, one fails, one is
// cancelled) runs in a child process that is SIGKILLed at every hit of every
// crash point of launch → dispatch → completion → receipt → delivery →
// acknowledgement, enumerated from the registry. The daemon outlives each
// kill. After a restart on the same database, each job has exactly one
// terminal receipt, delivered once to its owner, and no command ran twice
// (every command appends its letter to a side-effect file).
#include <sys/wait.h>

#include <csignal>
#include <set>

#include "crash_matrix_support.hpp"
#include "jobs_story_support.hpp"
#include "sandbox_support.hpp"

using namespace tether;
using persistence::owned_state;

namespace {

const std::string& k_tether = test::k_tether_cli;

// Not in the story: the wake of an idle owner (every receipt here is steered
// into the running turn; the report crash matrix has it).
bool on_delivery_path(const std::string& p) {
  return (p.rfind("delivery.", 0) == 0 && p != "delivery.handover.after_admit") ||
         p.rfind("report.drain.", 0) == 0;
}

}  // namespace

TEST_CASE(
    "SIGKILL at every crash point of the delivery path: each job's terminal receipt reaches "
    "its owner exactly once and no command runs twice",
    "[crash][delivery]") {
  test::sandbox_daemon daemon("delivery-matrix-sbx");
  test::scratch_dir root("delivery-matrix");
  auto sbx = daemon.options().state_dir;
  auto points = test::crash_points(on_delivery_path);
  REQUIRE(points.size() >= 8);

  // Baseline: no crash, tracing how often each point is hit.
  auto base = root.path() / "baseline";
  auto hits =
      test::traced_hits({k_tether, "jobs-story", "--story", base.string(), "--sandbox", sbx},
                        root.path() / "trace", points);
  auto baseline = test::read_story_outcome(base);
  REQUIRE(baseline.jobs.size() == 3);
  CHECK(baseline.jobs['a'].state == owned_state::completed);
  CHECK(baseline.jobs['b'].state == owned_state::failed);
  CHECK(baseline.jobs['c'].state == owned_state::cancelled);
  CHECK(baseline.ran['A'] == 1);
  CHECK(baseline.ran['B'] == 1);

  auto story = [&](const std::string& dir) {
    return std::vector<std::string>{k_tether, "jobs-story", "--story", dir, "--sandbox", sbx};
  };
  auto resume = [&](const std::string& dir) {
    return std::vector<std::string>{k_tether, "jobs-story", "--resume", dir, "--sandbox", sbx};
  };
  auto check = [&](const std::string&, const std::filesystem::path& dir) {
    test::check_story_outcome(test::read_story_outcome(dir));
  };
  test::for_each_crash(root.path(), points, hits, story, resume, check);
}
