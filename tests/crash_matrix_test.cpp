// The crash matrix: the demo's background-subagent story (a child that starts
// a real shell, reports, is woken by the shell's exit and reports again) runs
// in a child process that is SIGKILLed at every hit of every crash point on
// the report path and on the job path its shell takes (the shell is an owned
// job in the host's local sandbox daemon: `delivery.*`), enumerated from the
// registry (`tether crash-points`), not from a hand-kept list. After each kill the host restarts on
// the same database; the parent must hold every owed report exactly once and nothing else.
#include <sys/wait.h>

#include <csignal>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>

#include "crash_matrix_support.hpp"
#include "fault_support.hpp"
#include "tether/persistence/task_store.hpp"

using namespace tether;

namespace {

const std::string& k_tether = test::k_tether_cli;

// The report path, and the job path of the child's shell. Not in the story: a
// cancel, and the acknowledgement on acceptance (the shell's receipt prompts
// the idle child, whose drain acknowledges it; the delivery crash matrix has
// both). The wake of that idle child is here, and only here.
bool on_report_path(const std::string& p) {
  return p.rfind("report.", 0) == 0 ||
         (p.rfind("delivery.", 0) == 0 && p != "delivery.cancel.after_kill" &&
          p != "delivery.ack.after_commit");
}

}  // namespace

TEST_CASE("SIGKILL at every crash point of the report path: every owed report arrives exactly once",
          "[crash]") {
  test::scratch_dir root("matrix");
  auto points = test::crash_points(on_report_path);
  REQUIRE(points.size() >= 8);

  // Baseline: the story without a crash, tracing how often each point is hit.
  auto base_dir = root.path() / "baseline";
  auto hits = test::traced_hits({k_tether, "demo", "--story", base_dir.string()},
                                root.path() / "trace", points);
  auto baseline = test::read_report_outcome((base_dir / "tether.db").string());
  REQUIRE(baseline.bodies.size() == 2);

  // The matrix: every hit of every point.
  auto story = [](const std::string& dir) {
    return std::vector<std::string>{k_tether, "demo", "--story", dir};
  };
  auto resume = [](const std::string& dir) {
    return std::vector<std::string>{k_tether, "demo", "--resume", dir};
  };
  auto check = [&](const std::string& p, const std::filesystem::path& dir) {
    auto o = test::read_report_outcome((dir / "tether.db").string());
    CHECK(o.outbox_rows == 0);            // nothing owed is left undelivered
    CHECK(o.claimed_sessions == 0);       // every busy period settled
    CHECK(o.pending == 0);                // every admitted report was acknowledged
    CHECK(o.transcript_mismatches == 0);  // each exactly once in the transcript
    CHECK(o.stray_transcript_reports == 0);
    CHECK(o.receipts >= 2);            // the background job's started and terminal receipts
    CHECK(o.receipts_not_acked == 0);  // its terminal receipt went with its report
    CHECK_FALSE(o.bodies.empty());
    std::set<std::string> distinct(o.bodies.begin(), o.bodies.end());
    CHECK(distinct.size() == o.bodies.size());  // no report twice under two ids
    for (auto& b : o.bodies) CHECK(b.find("sessionID=\"ses_audit\"") != std::string::npos);
    // Once the child's settle committed, the restart delivers exactly what
    // the uninterrupted run delivers; so it does once the shell ended (its
    // terminal receipt, written after report 1 went out).
    bool after_settle = p.rfind("report.settle.after", 0) == 0 || p.rfind("report.admit", 0) == 0 ||
                        p.rfind("report.complete", 0) == 0 || p.rfind("report.wake", 0) == 0 ||
                        p == "delivery.terminal.after_commit" ||
                        p == "delivery.handover.after_admit";
    if (after_settle) CHECK(o.bodies == baseline.bodies);
    // Wherever the kill fell, the child's final report arrives, once.
    CHECK(test::final_reports(o) == 1);
  };
  test::for_each_crash(root.path(), points, hits, story, resume, check);
}
