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
// Schema v6 (no local shells): the fixtures v5-local-shell-*.db were made by
// main at 76defd0 (schema v5, the last build that ran local shells) with
// tests/fixtures/make_v5_local_shell.sh:
//   v5-local-shell-running.db  the demo story killed at report.settle.after_commit:1:
//                              a report owed to the parent, the child's local
//                              shell still running
//   v5-local-shell-notice.db   the demo story killed at shell.after_finish:1: the
//                              shell's notice admitted into the child's inbox,
//                              not drained, its row gone
#include <SQLiteCpp/Database.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <filesystem>
#include <set>

#include "crash_matrix_support.hpp"
#include "fault_support.hpp"
#include "jobs_story_support.hpp"
#include "sandbox_support.hpp"
#include "tether/persistence/schema.hpp"
#include "tether/persistence/task_store.hpp"

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
    persistence::task_store store(**w, db);
    auto subagents = store.jobs();
    auto shells = store.all_jobs();
    auto all_receipts = store.all_receipts();
    (*w)->stop();
    REQUIRE(subagents);
    REQUIRE(shells);
    REQUIRE(all_receipts);
    check_one_task_store(db);
    if (std::string(sub) == "r") {
      // The local shell that was running is history now (schema step 6: lost,
      // its owner told), not a row of the report path.
      REQUIRE(subagents->size() == 1);
      auto& report = subagents->at(0);
      CHECK(report.kind == "subagent");
      CHECK(report.status == persistence::job_status::completed);
      CHECK(report.owed);  // its terminal receipt, pending, is the outbox
      REQUIRE(report.body);
      CHECK(report.body->find("Background work still running") != std::string::npos);
      SQLite::Database c(db, SQLite::OPEN_READONLY);
      CHECK(c.execAndGet("SELECT count(*) FROM tasks WHERE kind = 'local_shell' AND state = 'lost'")
                .getInt() == 1);
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

namespace {

struct local_shell_outcome {
  std::string state;           // the local_shell row's state ("" when there is none)
  int child_notices = 0;       // rows in the child's inbox under a shell id
  int child_pending = 0;       // of those, not yet drained
  std::string notice;          // the last one's body
  int transcript_notices = 0;  // the child's transcript messages carrying a shell notice
  std::vector<std::string> parent_bodies;
};

local_shell_outcome read_local_shell(const std::string& db) {
  local_shell_outcome o;
  SQLite::Database c(db, SQLite::OPEN_READONLY);
  SQLite::Statement t(c, "SELECT state FROM tasks WHERE kind = 'local_shell'");
  if (t.executeStep()) o.state = t.getColumn(0).getString();
  SQLite::Statement i(c,
                      "SELECT state, body FROM inbox WHERE session_id = 'ses_audit' AND "
                      "notification_id GLOB 'sh_*' ORDER BY admitted_ord");
  while (i.executeStep()) {
    ++o.child_notices;
    o.child_pending += i.getColumn(0).getString() == "pending";
    o.notice = i.getColumn(1).getString();
  }
  SQLite::Statement m(c,
                      "SELECT count(*) FROM messages WHERE session_id = 'ses_audit' AND "
                      "payload LIKE '%[tether] background job sh\\_%' ESCAPE '\\'");
  m.executeStep();
  o.transcript_notices = m.getColumn(0).getInt();
  SQLite::Statement p(c,
                      "SELECT body FROM inbox WHERE session_id = 'ses_parent' ORDER BY "
                      "admitted_ord");
  while (p.executeStep()) o.parent_bodies.push_back(p.getColumn(0).getString());
  return o;
}

int bodies_containing(const local_shell_outcome& o, const std::string& text) {
  int n = 0;
  for (auto& b : o.parent_bodies) n += b.find(text) != std::string::npos;
  return n;
}

// `tether demo --resume DIR` on DIR/tether.db; the restart must succeed.
void resume_demo(const fs::path& dir) {
  std::string out;
  int st = test::run_process({k_tether, "demo", "--resume", dir.string()}, &out);
  INFO("the restart said: " << out);
  REQUIRE(WIFEXITED(st));
  REQUIRE(WEXITSTATUS(st) == 0);
}

}  // namespace

TEST_CASE("the v5 fixtures are what their names say: local shells of the previous build",
          "[migration]") {
  auto running = fixture("v5-local-shell-running.db").string();
  auto notice = fixture("v5-local-shell-notice.db").string();
  CHECK(schema_version(running) == 5);
  CHECK(schema_version(notice) == 5);
  auto r = read_local_shell(running);
  CHECK(r.state == "running");
  CHECK(r.child_notices == 0);
  SQLite::Database rc(running, SQLite::OPEN_READONLY);
  CHECK(rc.execAndGet("SELECT count(*) FROM receipts WHERE state = 'pending'").getInt() == 1);
  auto n = read_local_shell(notice);
  CHECK(n.state.empty());  // the previous build deleted the row with the notice's admission
  CHECK(n.child_notices == 1);
  CHECK(n.child_pending == 1);
  CHECK_THAT(n.notice, Catch::Contains("succeeded"));
}

TEST_CASE(
    "a local shell the previous build left running becomes lost when the file is migrated, and "
    "its owner is told exactly once, with no command in the notice",
    "[migration]") {
  test::scratch_dir root("migration-local-running");
  auto dir = root.path() / "story";
  install_fixture(dir, "v5-local-shell-running.db");
  resume_demo(dir);
  auto db = (dir / "tether.db").string();
  CHECK(schema_version(db) == persistence::latest_schema_version());
  auto o = read_local_shell(db);
  CHECK(o.state == "lost");
  CHECK(o.child_notices == 1);
  CHECK(o.child_pending == 0);  // drained by the child's next turn
  CHECK(o.transcript_notices == 1);
  CHECK_THAT(o.notice, Catch::Contains("ended with unknown status"));
  CHECK_THAT(o.notice, Catch::Contains("status: exit -1"));
  CHECK_THAT(o.notice, Catch::Contains("previous build"));
  CHECK(o.notice.find("check-routes") == std::string::npos);  // the unscrubbed command stays out
  // The parent: the report the file owed, once; then the child's answer to the notice, once.
  CHECK(bodies_containing(o, "Started the route check") == 1);
  CHECK(bodies_containing(o, "Route check finished") == 1);
  std::set<std::string> distinct(o.parent_bodies.begin(), o.parent_bodies.end());
  CHECK(distinct.size() == o.parent_bodies.size());
  // Another restart owes nothing and tells nobody again.
  resume_demo(dir);
  auto again = read_local_shell(db);
  CHECK(again.child_notices == 1);
  CHECK(again.transcript_notices == 1);
  CHECK(again.parent_bodies == o.parent_bodies);
}

TEST_CASE(
    "a local shell's notice the previous build admitted and did not drain is delivered exactly "
    "once by this build",
    "[migration]") {
  test::scratch_dir root("migration-local-notice");
  auto dir = root.path() / "story";
  install_fixture(dir, "v5-local-shell-notice.db");
  resume_demo(dir);
  auto db = (dir / "tether.db").string();
  auto o = read_local_shell(db);
  CHECK(o.state.empty());
  CHECK(o.child_notices == 1);
  CHECK(o.child_pending == 0);
  CHECK(o.transcript_notices == 1);
  CHECK_THAT(o.notice, Catch::Contains("succeeded"));
  CHECK(bodies_containing(o, "Route check finished") == 1);
  resume_demo(dir);
  auto again = read_local_shell(db);
  CHECK(again.transcript_notices == 1);
  CHECK(again.parent_bodies == o.parent_bodies);
}

TEST_CASE("boot refuses a local shell row still running, naming its table, key and field",
          "[migration]") {
  test::scratch_dir root("migration-local-refused");
  auto dir = root.path() / "story";
  install_fixture(dir, "v5-local-shell-running.db");
  auto db = (dir / "tether.db").string();
  {
    // Migrated by this build, then made to claim the shell still runs.
    auto w = persistence::writer::open(persistence::db_options{db});
    REQUIRE(w);
    (*w)->stop();
    SQLite::Database c(db, SQLite::OPEN_READWRITE);
    c.exec("UPDATE tasks SET state = 'running' WHERE kind = 'local_shell'");
  }
  std::string out;  // boot's refusal goes to stderr
  int st = test::run_process(
      {"/bin/sh", "-c", "exec \"$0\" demo --resume \"$1\" 2>&1", k_tether, dir.string()}, &out);
  INFO("the restart said: " << out);
  REQUIRE(WIFEXITED(st));
  CHECK(WEXITSTATUS(st) != 0);
  CHECK_THAT(out, Catch::Contains("table 'tasks' key 'sh_661944721b66d0004': state"));
  CHECK_THAT(out, Catch::Contains("a local shell still running"));
  CHECK(read_local_shell(db).state == "running");  // left as it was
}

TEST_CASE("tether inspect lists a local shell an earlier build left as a task of its own kind",
          "[migration]") {
  test::scratch_dir root("migration-local-inspect");
  auto dir = root.path() / "story";
  install_fixture(dir, "v5-local-shell-running.db");
  resume_demo(dir);
  auto db = (dir / "tether.db").string();
  std::string out;
  int st = test::run_process({k_tether, "inspect", db}, &out);
  INFO(out);
  REQUIRE(WIFEXITED(st));
  REQUIRE(WEXITSTATUS(st) == 0);
  CHECK_THAT(out, Catch::Contains("local_shell lost"));
  CHECK_THAT(out, Catch::Contains("(history: a kind this build no longer runs)"));
}

namespace {

// A file as a build before step 14 left it (schema `version`, at most 13:
// the transcript WITHOUT ROWID), with two sessions.
void make_file_before_step_14(const std::string& path, int version = 13) {
  const auto& steps = persistence::migrations();
  REQUIRE(steps.size() >= 14);
  SQLite::Database db(path, SQLite::OPEN_READWRITE | SQLite::OPEN_CREATE);
  for (int v = 0; v < version; ++v) db.exec(steps[static_cast<std::size_t>(v)]);
  db.exec("PRAGMA application_id = " + std::to_string(persistence::k_application_id));
  db.exec("PRAGMA user_version = " + std::to_string(version));
  REQUIRE_THAT(db.execAndGet("SELECT sql FROM sqlite_master WHERE name = 'messages'").getString(),
               Catch::Contains("WITHOUT ROWID"));
  db.exec("INSERT INTO sessions (id, seq, created_at) VALUES ('ses_a', 3, 1), ('ses_b', 3, 1)");
}

}  // namespace

TEST_CASE(
    "a transcript kept WITHOUT ROWID (schema 13) is migrated to a rowid table whole, in order, "
    "with its key and its cascade",
    "[migration]") {
  test::scratch_dir root("migration-messages-rowid");
  auto path = root.file("tether.db");
  make_file_before_step_14(path);
  {
    // Messages written interleaved, as sessions that run at once write them.
    SQLite::Database db(path, SQLite::OPEN_READWRITE);
    for (int seq = 1; seq <= 3; ++seq)
      for (auto s : {"ses_a", "ses_b"}) {
        SQLite::Statement ins(db,
                              "INSERT INTO messages (session_id, seq, role, kind, status, payload) "
                              "VALUES (?, ?, 'user', 'prompt', 'completed', ?)");
        ins.bind(1, s);
        ins.bind(2, seq);
        ins.bind(3, std::string("{\"text\":\"") + s + " " + std::to_string(seq) + "\"}");
        ins.exec();
      }
  }
  {
    auto w = persistence::writer::open(persistence::db_options{path});
    REQUIRE(w);
  }
  SQLite::Database db(path, SQLite::OPEN_READWRITE);
  db.exec("PRAGMA foreign_keys = ON");
  CHECK(db.execAndGet("PRAGMA user_version").getInt() == persistence::latest_schema_version());
  auto sql = db.execAndGet("SELECT sql FROM sqlite_master WHERE name = 'messages'").getString();
  CHECK(sql.find("WITHOUT ROWID") == std::string::npos);
  CHECK_THAT(sql, Catch::Contains("PRIMARY KEY (session_id, seq)"));
  CHECK(
      db.execAndGet("SELECT count(*) FROM sqlite_master WHERE name LIKE 'messages_v%'").getInt() ==
      0);
  // Every message, each session's in seq order, its payload as written.
  std::vector<std::string> rows;
  SQLite::Statement q(db,
                      "SELECT session_id || '/' || seq || ' ' || payload FROM messages "
                      "WHERE session_id = ? ORDER BY seq");
  for (auto s : {"ses_a", "ses_b"}) {
    q.bind(1, s);
    while (q.executeStep()) rows.push_back(q.getColumn(0).getString());
    q.reset();
  }
  CHECK(rows == std::vector<std::string>{
                    "ses_a/1 {\"text\":\"ses_a 1\"}", "ses_a/2 {\"text\":\"ses_a 2\"}",
                    "ses_a/3 {\"text\":\"ses_a 3\"}", "ses_b/1 {\"text\":\"ses_b 1\"}",
                    "ses_b/2 {\"text\":\"ses_b 2\"}", "ses_b/3 {\"text\":\"ses_b 3\"}"});
  // The key still refuses a second message at a seq; the cascade still
  // takes a deleted session's transcript.
  CHECK_THROWS_AS(db.exec("INSERT INTO messages (session_id, seq, role, kind, status, payload) "
                          "VALUES ('ses_a', 2, 'user', 'prompt', 'completed', '{}')"),
                  SQLite::Exception);
  CHECK(db.exec("DELETE FROM sessions WHERE id = 'ses_b'") == 1);
  CHECK(db.execAndGet("SELECT count(*) FROM messages WHERE session_id = 'ses_b'").getInt() == 0);
  CHECK(db.execAndGet("SELECT count(*) FROM messages").getInt() == 3);
  CHECK(db.execAndGet("PRAGMA integrity_check").getString() == "ok");
}

TEST_CASE(
    "a message whose session is gone (written with the foreign keys off) is refused by name "
    "before step 14, and the file is left at the step it had, with the message",
    "[migration]") {
  // From the step just before, and from an older one whose later steps ran
  // in the same transaction first.
  int version = GENERATE(13, 12);
  test::scratch_dir root("migration-messages-orphan-" + std::to_string(version));
  auto path = root.file("tether.db");
  make_file_before_step_14(path, version);
  {
    SQLite::Database db(path, SQLite::OPEN_READWRITE);  // foreign keys off, as another tool's
    db.exec(
        "INSERT INTO messages (session_id, seq, role, kind, status, payload) VALUES "
        "('ses_a', 1, 'user', 'prompt', 'completed', '{\"text\":\"kept\"}'), "
        "('ses_gone', 4, 'user', 'prompt', 'completed', '{\"text\":\"orphan\"}')");
  }
  auto w = persistence::writer::open(persistence::db_options{path});
  REQUIRE_FALSE(w);
  CHECK(w.error().code == errc::corrupt);
  CHECK_THAT(w.error().message, Catch::Contains("table 'messages' key 'ses_gone/4'"));
  CHECK_THAT(w.error().message, Catch::Contains("no such session"));
  CHECK_THAT(w.error().message, Catch::Contains("left at step " + std::to_string(version) + ")"));
  SQLite::Database db(path, SQLite::OPEN_READONLY);
  CHECK(db.execAndGet("PRAGMA user_version").getInt() == version);
  CHECK_THAT(db.execAndGet("SELECT sql FROM sqlite_master WHERE name = 'messages'").getString(),
             Catch::Contains("WITHOUT ROWID"));
  CHECK(db.execAndGet("SELECT count(*) FROM messages").getInt() == 2);
  CHECK(
      db.execAndGet("SELECT count(*) FROM sqlite_master WHERE name LIKE 'messages_v%'").getInt() ==
      0);
}
