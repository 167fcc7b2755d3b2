// The SOP crash matrix: `tether sop run --start-once pipeline --drive-as
// alice` runs an SOP whose shell steps append to a side-effect file, with an
// approval gate and a checkpoint the driver passes, in a child process that is
// SIGKILLed at every hit of every `sop.` crash point: after a run was
// admitted (a restart's --start-once finds it and starts no second), after a claim, after a
// step's task was admitted, after a retry's attempt was recorded, after a
// command was sent to the sandbox daemon, after a step ended, after the run
// parked. A restart on the same database (the killed claimant is provably
// gone, so its claim is cleared) resumes the run to its end.
//
// The rules the outcome must follow: an idempotent step is attempted again
// under the same daemon id (the daemon runs it at most once); a step that is
// not idempotent is followed if the daemon has its command, and otherwise it
// is lost and its failure transition runs. So every crash ends with the run
// completed and each step's effect exactly once, except a crash after the
// non-idempotent step `b` was admitted and before its command was sent: then
// `b` never ran, its failure step `b_lost` did, and the run failed.
#include <SQLiteCpp/Database.h>
#include <SQLiteCpp/Statement.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "crash_matrix_support.hpp"

using namespace tether;

namespace {

std::vector<std::string> lines_of(const std::filesystem::path& p) {
  std::vector<std::string> out;
  std::istringstream in(test::file_bytes(p.string()));
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

}  // namespace

TEST_CASE(
    "SIGKILL at every SOP crash point: after a restart each step's effect is as the rules say",
    "[crash][sop]") {
  test::scratch_dir root("sop-matrix");
  auto sops = root.file("sops");
  std::filesystem::create_directories(sops);
  std::ofstream(sops + "/pipeline.json") << R"({"name": "pipeline", "agent": "ops",
    "approvers": ["alice"], "steps": [
    {"name": "a", "kind": "shell", "command": "echo a >> side.txt", "idempotent": true},
    {"name": "gate", "kind": "approval"},
    {"name": "b", "kind": "shell", "command": "echo b >> side.txt", "retries": 0,
     "on_failure": "b_lost"},
    {"name": "flaky", "kind": "shell", "idempotent": true, "retries": 1,
     "command": "if [ -e flag ]; then echo f >> side.txt; else touch flag; exit 1; fi"},
    {"name": "hold", "kind": "checkpoint"},
    {"name": "c", "kind": "shell", "command": "echo c >> side.txt", "idempotent": true,
     "next": "end"},
    {"name": "b_lost", "kind": "shell", "command": "echo b-lost >> side.txt", "next": "fail"}]})";
  auto points = test::crash_points([](const std::string& p) { return p.rfind("sop.", 0) == 0; });
  REQUIRE(points.size() == 7);
  auto run = [&](const std::string& dir) {
    std::filesystem::create_directories(dir);
    return std::vector<std::string>{test::k_tether_cli, "sop",        "run",  "--db",
                                    dir + "/tether.db", "--dir",      sops,   "--start-once",
                                    "pipeline",         "--drive-as", "alice"};
  };
  auto check = [&](const std::string& point, const std::filesystem::path& dir) {
    INFO("crashed at " << point << " (" << dir.filename().string() << ")");
    // The second admission of a step task is b's (a's is the first).
    bool b_lost = point == "sop.step.after_admit" &&
                  dir.filename().string() == "crash-sop.step.after_admit-2";
    SQLite::Database db((dir / "tether.db").string(), SQLite::OPEN_READONLY);
    auto state = db.execAndGet("SELECT state FROM tasks WHERE kind = 'sop_run'").getString();
    CHECK(db.execAndGet("SELECT count(*) FROM tasks WHERE kind = 'sop_run'").getInt() == 1);
    CHECK(db.execAndGet("SELECT count(*) FROM tasks WHERE kind = 'sop_run' AND owner IS NOT NULL")
              .getInt() == 0);
    CHECK(db.execAndGet("SELECT count(*) FROM tasks WHERE kind = 'sop_step' AND state IN "
                        "('admitted','running')")
              .getInt() == 0);
    if (b_lost) {
      CHECK(state == "failed");
      CHECK(lines_of(dir / "side.txt") == std::vector<std::string>{"a", "b-lost"});
      CHECK(db.execAndGet("SELECT count(*) FROM tasks WHERE kind = 'sop_step' AND state = 'lost'")
                .getInt() == 1);
    } else {
      CHECK(state == "completed");
      CHECK(lines_of(dir / "side.txt") == std::vector<std::string>{"a", "b", "f", "c"});
    }
  };
  auto base = root.path() / "baseline";
  auto hits = test::traced_hits(run(base.string()), root.path() / "trace", points);
  check("(none)", base);
  test::for_each_crash(root.path(), points, hits, run, run, check);
}
