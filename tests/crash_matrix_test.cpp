// The crash matrix: the demo's background-subagent story (a child that starts
// a real shell, reports, is woken by the shell's exit and reports again) runs
// in a child process that is SIGKILLed at every hit of every crash point on
// the report path, enumerated from the registry (`tether crash-points`), not
// from a hand-kept list. After each kill the host restarts on the same
// database; the parent must hold every owed report exactly once and nothing
// else.
#include <sys/wait.h>

#include <csignal>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>

#include "crash_matrix_support.hpp"
#include "tether/persistence/receipt_store.hpp"
#include "tether/persistence/report_store.hpp"

using namespace tether;

namespace {

const std::string& k_tether = test::k_tether_cli;

bool on_report_path(const std::string& p) {
  return p.rfind("report.", 0) == 0 || p.rfind("shell.", 0) == 0;
}

struct outcome {
  std::vector<std::string> bodies;   // inbox bodies, shell ids normalised
  int pending = 0;                   // inbox rows not acknowledged
  int transcript_mismatches = 0;     // inbox bodies not exactly once in the transcript
  int stray_transcript_reports = 0;  // transcript reports with no inbox row
  int outbox_rows = 0;               // job rows left
  int claimed_sessions = 0;          // sessions still holding a claim
  int receipts = 0;                  // the child's job receipts
  int receipts_not_acked = 0;        // of those, pending or dropped
};

outcome read_outcome(const std::string& db) {
  outcome o;
  auto w = persistence::writer::open(persistence::db_options{db});
  REQUIRE(w);
  persistence::report_store store(**w, db);
  auto inbox = store.inbox(protocol::session_id("ses_parent"));
  auto msgs = store.messages(protocol::session_id("ses_parent"));
  auto jobs = store.jobs();
  auto sessions = store.sessions();
  REQUIRE(inbox);
  REQUIRE(msgs);
  REQUIRE(jobs);
  REQUIRE(sessions);
  std::regex shell_id("sh_[0-9a-f]+");
  std::multiset<std::string> transcript;
  for (auto& m : *msgs)
    if (m.kind == "report") transcript.insert(m.text);
  for (auto& r : *inbox) {
    o.bodies.push_back(std::regex_replace(r.body, shell_id, "sh_N"));
    o.pending += r.acked ? 0 : 1;
    if (transcript.count(r.body) != 1) ++o.transcript_mismatches;
  }
  o.stray_transcript_reports =
      static_cast<int>(transcript.size()) - static_cast<int>(inbox->size());
  o.outbox_rows = static_cast<int>(jobs->size());
  for (auto& s : *sessions) o.claimed_sessions += s.time_suspended ? 1 : 0;
  persistence::receipt_reader receipts(db);
  auto rs = receipts.all_receipts();
  REQUIRE(rs);
  for (auto& r : *rs) {
    ++o.receipts;
    o.receipts_not_acked += r.state != persistence::receipt_state::acked;
  }
  (*w)->stop();
  return o;
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
  auto baseline = read_outcome((base_dir / "tether.db").string());
  REQUIRE(baseline.bodies.size() == 2);

  // The matrix: every hit of every point.
  auto story = [](const std::string& dir) {
    return std::vector<std::string>{k_tether, "demo", "--story", dir};
  };
  auto resume = [](const std::string& dir) {
    return std::vector<std::string>{k_tether, "demo", "--resume", dir};
  };
  auto check = [&](const std::string& p, const std::filesystem::path& dir) {
    auto o = read_outcome((dir / "tether.db").string());
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
    // the uninterrupted run delivers.
    bool after_settle = p.rfind("report.settle.after", 0) == 0 || p.rfind("report.admit", 0) == 0 ||
                        p.rfind("report.complete", 0) == 0 || p.rfind("report.wake", 0) == 0 ||
                        p == "shell.after_finish";
    if (after_settle) CHECK(o.bodies == baseline.bodies);
  };
  test::for_each_crash(root.path(), points, hits, story, resume, check);
}
