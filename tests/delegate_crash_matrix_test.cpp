// The delegate crash matrix: `tether delegate-story` (a session delegates one
// background task whose runner answers at once) runs in a child process that
// is SIGKILLed at every hit of every `delegate.` crash point: after the row is
// registered, after the settlement intent, after the artifact is published,
// after the promotion; and at the `goal.` one, after the goal the task belongs
// to was closed. A restart on the same database (its boot recovers the task:
// the killed process is provably gone) leaves the task in exactly the state
// the protocol promises for that point, with one terminal receipt whose
// notice is in the session's transcript exactly once, and never `completed`
// without a valid artifact; the goal ends closed, its notice there once.
#include <SQLiteCpp/Database.h>
#include <SQLiteCpp/Statement.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <map>

#include "crash_matrix_support.hpp"
#include "tether/runtime/artifact.hpp"

using namespace tether;

namespace {

const std::string& k_tether = test::k_tether_cli;

struct delegate_outcome {
  std::string id, state, artifact, digest;
  int terminal_receipts = 0;
  int notices_in_transcript = 0;
  int intents = 0;
  std::string goal_state;
  int goal_notices = 0;
};

delegate_outcome read_outcome(const std::filesystem::path& dir) {
  SQLite::Database db((dir / "tether.db").string(), SQLite::OPEN_READONLY);
  delegate_outcome o;
  SQLite::Statement t(db,
                      "SELECT id, state, coalesce(json_extract(completion, '$.artifact'), ''), "
                      "coalesce(json_extract(completion, '$.digest'), '') FROM tasks WHERE "
                      "kind = 'delegate'");
  int rows = 0;
  while (t.executeStep()) {
    ++rows;
    o.id = t.getColumn(0).getString();
    o.state = t.getColumn(1).getString();
    o.artifact = t.getColumn(2).getString();
    o.digest = t.getColumn(3).getString();
  }
  REQUIRE(rows == 1);
  SQLite::Statement r(
      db, "SELECT count(*) FROM receipts WHERE task_id = ? AND transition != 'started'");
  r.bind(1, o.id);
  r.executeStep();
  o.terminal_receipts = r.getColumn(0).getInt();
  SQLite::Statement m(db,
                      "SELECT count(*) FROM messages WHERE session_id = 'ses_origin' AND "
                      "json_extract(payload, '$.text') LIKE ?");
  m.bind(1, "%[delegated task " + o.id + " (worker) %");
  m.executeStep();
  o.notices_in_transcript = m.getColumn(0).getInt();
  o.intents = db.execAndGet("SELECT count(*) FROM settlement_intents").getInt();
  o.goal_state =
      db.execAndGet("SELECT group_concat(state) FROM tasks WHERE kind = 'goal'").getString();
  o.goal_notices = db.execAndGet(
                         "SELECT count(*) FROM messages WHERE session_id = 'ses_origin' AND "
                         "json_extract(payload, '$.text') LIKE '[goal goal_% completed]%'")
                       .getInt();
  return o;
}

// What the protocol promises after a crash at `point` and a restart.
std::string expected_state(const std::string& point) {
  if (point == "delegate.admit.after_commit") return "lost";     // no outcome was recorded
  if (point == "delegate.intent.after_commit") return "failed";  // the bytes never reached disk
  return "completed";  // published: recovery validates and promotes, or it was promoted
}

}  // namespace

TEST_CASE(
    "SIGKILL at every delegate crash point: after a restart the task is settled as promised, "
    "once, and never completed without its artifact",
    "[crash][delegate]") {
  test::scratch_dir root("delegate-matrix");
  auto points = test::crash_points([](const std::string& p) {
    return p.rfind("delegate.", 0) == 0 || p.rfind("goal.", 0) == 0;
  });
  REQUIRE(points.size() == 5);

  auto base = root.path() / "baseline";
  auto hits = test::traced_hits({k_tether, "delegate-story", "--story", base.string()},
                                root.path() / "trace", points);
  auto b = read_outcome(base);
  CHECK(b.state == "completed");
  CHECK(b.terminal_receipts == 1);
  CHECK(b.notices_in_transcript == 1);
  CHECK(b.goal_state == "completed");
  CHECK(b.goal_notices == 1);

  auto story = [&](const std::string& dir) {
    return std::vector<std::string>{k_tether, "delegate-story", "--story", dir};
  };
  auto resume = [&](const std::string& dir) {
    return std::vector<std::string>{k_tether, "delegate-story", "--resume", dir};
  };
  auto check = [&](const std::string& point, const std::filesystem::path& dir) {
    auto o = read_outcome(dir);
    INFO("crashed at " << point << "; task " << o.id << " is " << o.state);
    CHECK(o.state == expected_state(point));
    CHECK(o.terminal_receipts == 1);
    CHECK(o.notices_in_transcript == 1);
    CHECK(o.intents == 0);
    CHECK(o.goal_state == "completed");
    CHECK(o.goal_notices == 1);
    if (o.state == "completed") {
      auto bytes = runtime::read_artifact(o.artifact, 1 << 20);
      REQUIRE(bytes);
      CHECK(runtime::sha256_digest(*bytes) == o.digest);
      CHECK(bytes->find("findings for: Summarise the failing tests.") != std::string::npos);
    }
  };
  test::for_each_crash(root.path(), points, hits, story, resume, check);
}
