// Schema v4 (one task store): a database written by the previous build (schema
// v3: `jobs`, `owned_jobs`, `receipts`) is migrated on open with nothing lost,
// and what it owed is delivered once. The fixtures in tests/fixtures were made
// by commit e9d51cb's `tether` (see tests/fixtures/README.md):
//   v3-report-owed.db   the demo story killed at report.settle.after_commit:1:
//                       a subagent's report owed (terminal row, pending
//                       receipt), its local shell still running
//   v3-jobs-pending.db  the jobs story killed at delivery.terminal.after_commit:3:
//                       three owned shell jobs terminal, one notice admitted and
//                       not drained, two terminal receipts pending
#include <SQLiteCpp/Database.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <filesystem>
#include <set>

#include "crash_matrix_support.hpp"
#include "fault_support.hpp"
#include "jobs_story_support.hpp"
#include "sandbox_support.hpp"
#include "tether/persistence/receipt_store.hpp"
#include "tether/persistence/report_store.hpp"

using namespace tether;
namespace fs = std::filesystem;

namespace {

const std::string& k_tether = test::k_tether_cli;

fs::path fixture(const std::string& name) {
  return fs::path(TETHER_SOURCE_DIR) / "tests" / "fixtures" / name;
}

// A copy of a fixture as DIR/tether.db, so the committed file is never written.
void install_fixture(const fs::path& dir, const std::string& name) {
  fs::create_directories(dir);
  fs::copy_file(fixture(name), dir / "tether.db");
  fs::permissions(dir / "tether.db", fs::perms::owner_read | fs::perms::owner_write);
}

std::set<std::string> tables_of(const std::string& db) {
  SQLite::Database c(db, SQLite::OPEN_READONLY);
  SQLite::Statement q(c, "SELECT name FROM sqlite_master WHERE type = 'table'");
  std::set<std::string> out;
  while (q.executeStep()) out.insert(q.getColumn(0).getString());
  return out;
}

int schema_version(const std::string& db) {
  SQLite::Database c(db, SQLite::OPEN_READONLY);
  return c.execAndGet("PRAGMA user_version").getInt();
}

void check_one_task_store(const std::string& db) {
  CHECK(schema_version(db) == persistence::latest_schema_version());
  auto tables = tables_of(db);
  CHECK(tables.count("tasks") == 1);
  CHECK(tables.count("jobs") == 0);
  CHECK(tables.count("owned_jobs") == 0);
}

}  // namespace

TEST_CASE("the v3 fixtures are what their names say: the previous build's schema, work owed",
          "[migration]") {
  auto report = fixture("v3-report-owed.db").string();
  auto jobs = fixture("v3-jobs-pending.db").string();
  CHECK(schema_version(report) == 3);
  CHECK(schema_version(jobs) == 3);
  SQLite::Database r(report, SQLite::OPEN_READONLY);
  CHECK(r.execAndGet("SELECT count(*) FROM jobs WHERE kind = 'subagent' AND status = 'completed'")
            .getInt() == 1);
  CHECK(r.execAndGet("SELECT count(*) FROM jobs WHERE kind = 'shell' AND status = 'running'")
            .getInt() == 1);
  SQLite::Database j(jobs, SQLite::OPEN_READONLY);
  CHECK(j.execAndGet("SELECT count(*) FROM owned_jobs").getInt() == 3);
  CHECK(j.execAndGet("SELECT count(*) FROM receipts WHERE state = 'pending'").getInt() == 2);
}

TEST_CASE(
    "a v3 database's rows move into the one task store with their meaning: every job and owned "
    "job is a task, receipts name their task",
    "[migration]") {
  test::scratch_dir root("migration-rows");
  install_fixture(root.path() / "r", "v3-report-owed.db");
  install_fixture(root.path() / "j", "v3-jobs-pending.db");
  for (auto sub : {"r", "j"}) {
    auto db = (root.path() / sub / "tether.db").string();
    auto w = persistence::writer::open(persistence::db_options{db});
    REQUIRE(w);
    persistence::report_store reports(**w, db);
    persistence::receipt_store receipts(**w, db);
    auto subagents = reports.jobs();
    auto shells = receipts.all_jobs();
    auto all_receipts = receipts.all_receipts();
    (*w)->stop();
    REQUIRE(subagents);
    REQUIRE(shells);
    REQUIRE(all_receipts);
    check_one_task_store(db);
    if (std::string(sub) == "r") {
      REQUIRE(subagents->size() == 2);
      auto& report = subagents->at(0);
      CHECK(report.kind == "subagent");
      CHECK(report.status == persistence::job_status::completed);
      CHECK(report.owed);  // its terminal receipt, pending, is the outbox
      REQUIRE(report.body);
      CHECK(report.body->find("Background work still running") != std::string::npos);
      CHECK(subagents->at(1).kind == "shell");
      CHECK(subagents->at(1).status == persistence::job_status::running);
      CHECK(shells->empty());
      REQUIRE(all_receipts->size() == 2);
      CHECK(all_receipts->at(1).job == report.id);
      CHECK(all_receipts->at(1).state == persistence::receipt_state::pending);
    } else {
      CHECK(subagents->empty());
      REQUIRE(shells->size() == 3);
      std::set<persistence::owned_state> states;
      for (auto& s : *shells) states.insert(s.state);
      CHECK(states == std::set<persistence::owned_state>{persistence::owned_state::completed,
                                                         persistence::owned_state::failed,
                                                         persistence::owned_state::cancelled});
      for (auto& s : *shells) {
        CHECK_FALSE(s.preview.empty());
        CHECK(s.channel == "tool");
        CHECK(s.completion.has_value());
      }
      CHECK(all_receipts->size() == 6);
    }
  }
}

TEST_CASE(
    "a v3 database that owed a subagent report, opened by this build, delivers that report "
    "exactly once",
    "[migration]") {
  test::scratch_dir root("migration-report");
  auto dir = root.path() / "story";
  install_fixture(dir, "v3-report-owed.db");
  std::string out;
  int st = test::run_process({k_tether, "demo", "--resume", dir.string()}, &out);
  INFO("the restart said: " << out);
  REQUIRE(WIFEXITED(st));
  REQUIRE(WEXITSTATUS(st) == 0);
  auto db = (dir / "tether.db").string();
  check_one_task_store(db);
  auto o = test::read_report_outcome(db);
  CHECK(o.outbox_rows == 0);
  CHECK(o.claimed_sessions == 0);
  CHECK(o.pending == 0);
  CHECK(o.transcript_mismatches == 0);
  CHECK(o.stray_transcript_reports == 0);
  CHECK(o.receipts_not_acked == 0);
  int owed = 0;
  for (auto& b : o.bodies) owed += b.find("Started the route check") != std::string::npos;
  CHECK(owed == 1);  // the report the v3 file owed, once
  std::set<std::string> distinct(o.bodies.begin(), o.bodies.end());
  CHECK(distinct.size() == o.bodies.size());
}

TEST_CASE(
    "a v3 database with owned jobs' receipts pending, opened by this build, delivers each "
    "exactly once",
    "[migration]") {
  test::sandbox_daemon daemon("migration-sbx");
  test::scratch_dir root("migration-jobs");
  auto dir = root.path() / "story";
  install_fixture(dir, "v3-jobs-pending.db");
  REQUIRE(::mkfifo((dir / "gate").c_str(), 0600) == 0);
  std::string out;
  int st = test::run_process(
      {k_tether, "jobs-story", "--resume", dir.string(), "--sandbox", daemon.options().state_dir},
      &out);
  INFO("the restart said: " << out);
  REQUIRE(WIFEXITED(st));
  REQUIRE(WEXITSTATUS(st) == 0);
  check_one_task_store((dir / "tether.db").string());
  auto o = test::read_story_outcome(dir);
  CHECK_FALSE(o.claimed);       // the turn settled
  CHECK(o.pending_inbox == 0);  // everything admitted was taken
  REQUIRE(o.jobs.size() == 3);
  for (auto& [key, j] : o.jobs) {
    INFO("job " << j.id.str());
    CHECK(j.terminal_receipts == 1);
    CHECK(j.undelivered == 0);
    // Each terminal receipt reaches the turn once as a notice. The cancelled
    // job's status is read by the replayed turn: if that read comes before
    // the drain, it suppresses the notice (the read is the delivery).
    if (j.state == persistence::owned_state::cancelled) {
      CHECK(j.notices <= 1);
      if (j.notices == 0) CHECK_FALSE(j.acked);  // read, never neither
    } else {
      CHECK(j.notices == 1);
      CHECK(j.acked);
    }
  }
}
