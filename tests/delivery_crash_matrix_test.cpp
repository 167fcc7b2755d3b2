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
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "crash_matrix_support.hpp"
#include "sandbox_support.hpp"
#include "tether/persistence/receipt_store.hpp"
#include "tether/persistence/report_store.hpp"

using namespace tether;
using persistence::owned_state;
using persistence::receipt_state;

namespace {

const std::string& k_tether = test::k_tether_cli;

bool on_delivery_path(const std::string& p) {
  return p.rfind("delivery.", 0) == 0 || p.rfind("report.drain.", 0) == 0;
}

struct job_outcome {
  owned_state state = owned_state::admitted;
  int terminal_receipts = 0;
  int undelivered = 0;  // terminal receipts pending or dropped
  bool acked = false;   // delivered as a notice (not read through a status call)
  int notices = 0;      // transcript notices naming the job
};

struct outcome {
  std::map<char, job_outcome> jobs;  // by key letter a, b, c
  std::map<char, int> ran;           // side-effect lines per letter
  int pending_inbox = 0;
  bool claimed = false;
};

outcome read_outcome(const std::filesystem::path& dir) {
  outcome o;
  auto db = (dir / "tether.db").string();
  auto w = persistence::writer::open(persistence::db_options{db});
  REQUIRE(w);
  persistence::report_store reports(**w, db);
  persistence::receipt_store receipts(**w, db);
  protocol::session_id owner("ses_owner");
  auto msgs = reports.messages(owner);
  REQUIRE(msgs);
  auto session = reports.session(owner);
  REQUIRE(session);
  REQUIRE(*session);
  o.claimed = (*session)->time_suspended.has_value();
  auto inbox = reports.inbox(owner);
  REQUIRE(inbox);
  for (auto& r : *inbox) o.pending_inbox += r.acked ? 0 : 1;
  REQUIRE((*session)->turn);
  auto jobs = receipts.jobs_of_turn(owner, *(*session)->turn);
  REQUIRE(jobs);
  for (auto& j : *jobs) {
    char key = j.id.str().back();
    auto& jo = o.jobs[key];
    jo.state = j.state;
    auto rs = receipts.receipts_of(j.id);
    REQUIRE(rs);
    for (auto& r : *rs) {
      if (r.transition == protocol::transition::started) continue;
      ++jo.terminal_receipts;
      if (r.state == receipt_state::pending || r.state == receipt_state::dropped) ++jo.undelivered;
      jo.acked = r.state == receipt_state::acked;
    }
    for (auto& m : *msgs)
      if (m.kind == "notice" && m.text.find(j.id.str()) != std::string::npos) ++jo.notices;
  }
  std::ifstream side(dir / "side-effects");
  std::string l;
  while (std::getline(side, l))
    if (!l.empty()) o.ran[l[0]]++;
  (*w)->stop();
  return o;
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
  auto baseline = read_outcome(base);
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
    auto o = read_outcome(dir);
    CHECK_FALSE(o.claimed);       // the turn settled
    CHECK(o.pending_inbox == 0);  // everything admitted was taken
    REQUIRE(o.jobs.size() == 3);  // the replayed turn got its jobs back, no new ones
    for (auto& [key, j] : o.jobs) {
      INFO("job " << key);
      CHECK(persistence::is_terminal(j.state));
      CHECK(j.terminal_receipts == 1);  // exactly one terminal transition
      CHECK(j.undelivered == 0);        // delivered (or read by its owner)
      CHECK(j.notices <= 1);            // never twice
      if (j.acked) CHECK(j.notices == 1);
      // A job is lost only when the kill fell between its admission and
      // its dispatch (whichever point fired): then it never ran, and the
      // replayed turn did not run it either.
      if (j.state == owned_state::lost) CHECK(o.ran[static_cast<char>(key - 'a' + 'A')] == 0);
    }
    for (auto& [letter, count] : o.ran) {
      INFO("command " << letter);
      CHECK(count <= 1);  // no command ran twice
    }
    CHECK(o.ran['A'] == (o.jobs['a'].state == owned_state::completed ? 1 : 0));
    CHECK(o.ran['B'] == (o.jobs['b'].state == owned_state::failed ? 1 : 0));
    if (o.jobs['a'].state != owned_state::lost) CHECK(o.jobs['a'].state == owned_state::completed);
    if (o.jobs['b'].state != owned_state::lost) CHECK(o.jobs['b'].state == owned_state::failed);
    if (o.jobs['c'].state != owned_state::lost) CHECK(o.jobs['c'].state == owned_state::cancelled);
  };
  test::for_each_crash(root.path(), points, hits, story, resume, check);
}
