// The recovery crash matrix (issue 16, part 4): recovery itself crashes. The
// demo's report story is SIGKILLed at a point that leaves work owed (a report
// unread in the parent's inbox, a child mid-turn with a running job row and a live shell, a
// shell only admitted on disk, a shell whose end was written and not handed
// over, a child that took its inbox and did not settle; the child's shell is
// an owned job in the host's local sandbox daemon); the restart is then SIGKILLed
// at every hit of every crash point it reaches (boot's phases, its owed
// deliveries, the resumed periods), and a second restart runs cleanly. After
// it the parent holds every owed report exactly once, the child's final
// report among them, and nothing is left owed or claimed.
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <iostream>

#include "crash_matrix_support.hpp"
#include "fault_support.hpp"

using namespace tether;

namespace {

const std::string& k_tether = test::k_tether_cli;

// Story kills that leave work for the restart.
const std::vector<std::string> k_owed_states = {
    "report.settle.after_commit:1",      // the child's first report is in its parent's inbox,
                                         // the parent not woken
    "delivery.started.after_commit:1",   // the child is mid-turn: a running job row, a live shell
    "delivery.launch.after_admit:1",     // the shell admitted, never dispatched: recovery marks it
                                         // lost
    "delivery.terminal.after_commit:1",  // the shell ended; its receipt is not handed over yet
    "report.drain.after_ack:2",          // the child took its shell's notice and did not settle
};

std::vector<std::string> story(const std::filesystem::path& dir) {
  return {k_tether, "demo", "--story", dir.string()};
}
std::vector<std::string> resume(const std::filesystem::path& dir) {
  return {k_tether, "demo", "--resume", dir.string()};
}

// Runs the story killed at `state`; it must die by SIGKILL.
void story_killed_at(const std::filesystem::path& dir, const std::string& state) {
  int s = test::run_process(story(dir), nullptr, {"TETHER_CRASH_AT=" + state});
  REQUIRE(WIFSIGNALED(s));
  REQUIRE(WTERMSIG(s) == SIGKILL);
}

// What a killed story left on disk, as far as a restart's path depends on it:
// each session's claim, counters and transcript length, the inbox, tasks and
// receipts by state. The story's parent and child run side by side, so the
// same kill (a point's nth hit) can land in more than one such state.
std::string story_state(const std::filesystem::path& dir) {
  SQLite::Database db((dir / "tether.db").string(), SQLite::OPEN_READONLY);
  std::ostringstream out;
  auto rows = [&](const char* sql) {
    SQLite::Statement q(db, sql);
    int n = q.getColumnCount();
    while (q.executeStep()) {
      for (int i = 0; i < n; ++i) out << q.getColumn(i).getText() << ',';
      out << ';';
    }
    out << '|';
  };
  rows(
      "SELECT id, status, time_suspended IS NOT NULL, resume_attempts, seq, input_cursor "
      "FROM sessions ORDER BY id");
  rows("SELECT session_id, state, count(*) FROM inbox GROUP BY 1, 2 ORDER BY 1, 2");
  rows("SELECT kind, state, count(*) FROM tasks GROUP BY 1, 2 ORDER BY 1, 2");
  rows("SELECT transition, state, count(*) FROM receipts GROUP BY 1, 2 ORDER BY 1, 2");
  return out.str();
}

// Kills the story at `state` until it leaves `wanted` on disk (a restart from
// one state reaches the same points, so a kill the trace saw must recur), at
// most `tries` times; false if every try left another state.
bool story_killed_in(const std::filesystem::path& dir, const std::string& state,
                     const std::string& wanted, int tries) {
  for (int i = 0; i < tries; ++i) {
    story_killed_at(dir, state);
    if (story_state(dir) == wanted) return true;
    if (i + 1 == tries) break;  // the last one is restarted all the same
    // Set aside: its shell, if one waits on the gate, is let go (its daemon
    // then exits once idle), and the directory moves out of the way.
    int gate = ::open((dir / "gate").c_str(), O_RDWR | O_NONBLOCK);
    if (gate >= 0) {
      [[maybe_unused]] auto n = ::write(gate, "go\n", 3);
      ::close(gate);
    }
    auto aside = dir;
    aside += "-other-" + std::to_string(i);
    std::filesystem::rename(dir, aside);
  }
  return false;
}

void check_all_delivered_once(const std::filesystem::path& dir) {
  auto o = test::read_report_outcome((dir / "tether.db").string());
  CHECK(o.outbox_rows == 0);       // nothing owed is left undelivered
  CHECK(o.claimed_sessions == 0);  // every busy period settled
  CHECK(o.pending == 0);           // every admitted report was acknowledged
  CHECK(o.transcript_mismatches == 0);
  CHECK(o.stray_transcript_reports == 0);
  std::set<std::string> distinct(o.bodies.begin(), o.bodies.end());
  CHECK(distinct.size() == o.bodies.size());  // no report twice under two ids
  CHECK(test::final_reports(o) == 1);
  CHECK(o.receipts_not_acked == 0);  // each job receipt went with its report
}

}  // namespace

TEST_CASE(
    "SIGKILL at every crash point of a restart that owes work: the next restart delivers every "
    "owed report exactly once",
    "[crash][recovery]") {
  test::scratch_dir root("recovery-matrix");
  std::set<std::string> covered;  // points a restart was killed at
  int runs = 0;
  int other_states = 0;  // restarts from another state than the traced one
  for (std::size_t si = 0; si < k_owed_states.size(); ++si) {
    const auto& state = k_owed_states[si];
    INFO("the story was killed at " << state);
    // Which points does a clean restart from this state reach, how often?
    auto traced = root.path() / ("trace-" + std::to_string(si));
    story_killed_at(traced, state);
    const auto traced_state = story_state(traced);
    auto trace = root.path() / ("trace-" + std::to_string(si) + ".log");
    int t = test::run_process(resume(traced), nullptr, {"TETHER_CRASH_TRACE=" + trace.string()});
    REQUIRE(WIFEXITED(t));
    REQUIRE(WEXITSTATUS(t) == 0);
    check_all_delivered_once(traced);
    auto hits = test::trace_counts(trace);
    REQUIRE_FALSE(hits.empty());
    for (auto& [p, count] : hits) {
      for (int n = 1; n <= count; ++n) {
        std::string at = p + ":" + std::to_string(n);
        INFO("the restart was killed at " << at);
        auto dir = root.path() / ("s" + std::to_string(si) + "-" + p + "-" + std::to_string(n));
        bool same_state = story_killed_in(dir, state, traced_state, 10);
        if (!same_state) ++other_states;
        int r = test::run_process(resume(dir), nullptr, {"TETHER_CRASH_AT=" + at});
        // That hit did not recur. On the job path this can happen at the first
        // hit too: whether the shell's end is seen by recovery's reattach
        // (recover.*) or by the live follow (delivery.*) depends on when the
        // daemon reports it. From another state than the traced one (ten
        // stories in a row landed elsewhere) any point may not recur. That
        // restart ran to the end: it is checked as one.
        bool job_path = p.rfind("delivery.", 0) == 0 || p.rfind("recover.", 0) == 0;
        if ((n > 1 || job_path || !same_state) && WIFEXITED(r) && WEXITSTATUS(r) == 0) {
          check_all_delivered_once(dir);
          continue;
        }
        REQUIRE(WIFSIGNALED(r));
        REQUIRE(WTERMSIG(r) == SIGKILL);
        std::string out;
        int again = test::run_process(resume(dir), &out);
        INFO("the second restart said: " << out);
        REQUIRE(WIFEXITED(again));
        REQUIRE(WEXITSTATUS(again) == 0);
        check_all_delivered_once(dir);
        covered.insert(p);
        ++runs;
      }
    }
  }
  // Boot's own points: every one a restart from these states reaches.
  auto boot_points =
      test::crash_points([](const std::string& p) { return p.rfind("boot.", 0) == 0; });
  int boot_covered = 0;
  std::string missed;
  for (auto& p : boot_points) {
    if (covered.count(p))
      ++boot_covered;
    else
      missed += " " + p;
  }
  std::cout << "recovery crash matrix: " << runs << " restarts killed at " << covered.size()
            << " distinct points; boot's points covered: " << boot_covered << " of "
            << boot_points.size() << " (not reached by the demo story:" << missed << "); "
            << other_states << " restarts ran from another state than the traced one\n";
  // The job queue's recovery of the child's shell: its lost, ended and resent receipts.
  for (auto p : {"boot.recover.after_jobs", "boot.resume.after_count", "boot.deliver.after_owed",
                 "boot.wake.after_tell", "boot.resume_inbox.after_count",
                 "recover.terminal.after_commit", "recover.handover.after_admit"}) {
    INFO("crash point " << p << " was never killed at");
    CHECK(covered.count(p) == 1);
  }
}
