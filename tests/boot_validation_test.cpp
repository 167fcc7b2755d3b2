// What a boot decides from disk: the resume budget it counts, and the
// persisted fields it refuses to boot on when they do not validate.
#include <fstream>
#include <sstream>

#include "report_support.hpp"
#include "tether/runtime/clock.hpp"

using namespace tether;
using namespace tether::test;
using protocol::session_id;

namespace {

// A child "child" of "parent" that blocks until cancelled, every time it runs;
// `runs` counts its drains.
void blocking_child(report_fixture& f, std::shared_ptr<std::atomic<int>> runs,
                    std::shared_ptr<std::shared_ptr<runtime::one_shot<int>>> entered) {
  f.code("child")->fn = [runs, entered](agent_context&,
                                        drain_input) -> boost::asio::awaitable<void> {
    ++*runs;
    (*entered)->set(1);
    co_await until_cancelled();
  };
}

// More running background rows owed by "child" to "parent", written into the
// closed database.
void add_running_rows(report_fixture& f, int n) {
  SQLite::Database db(f.dir.file("tether.db"), SQLite::OPEN_READWRITE);
  for (int i = 0; i < n; ++i) {
    SQLite::Statement st(db,
                         "INSERT INTO tasks (id, notification_id, kind, mode, parent_id, child_id, "
                         "state, payload, created_at, updated_at) VALUES (?, ?, 'subagent', "
                         "'background', 'parent', 'child', 'running', "
                         "'{\"description\":\"more\"}', 0, 0)");
    st.bind(1, "job_more" + std::to_string(i));
    st.bind(2, "msg_more" + std::to_string(i));
    st.exec();
  }
}

int resume_attempts(report_fixture& f) {
  SQLite::Database db(f.dir.file("tether.db"), SQLite::OPEN_READONLY);
  return db.execAndGet("SELECT resume_attempts FROM sessions WHERE id = 'child'").getInt();
}

}  // namespace

TEST_CASE("a child owing four background jobs spends one resume per boot, not one per job") {
  report_fixture f("budget_once", /*resume_budget=*/3);
  auto runs = std::make_shared<std::atomic<int>>(0);
  auto entered =
      std::make_shared<std::shared_ptr<runtime::one_shot<int>>>(runtime::one_shot<int>::make());
  blocking_child(f, runs, entered);
  f.parent_spawns("child");
  f.sync((*entered)->async_wait(boost::asio::use_awaitable));
  f.close();
  add_running_rows(f, 3);

  *entered = runtime::one_shot<int>::make();
  f.open();  // one graceful restart
  CHECK(f.boot.exhausted == 0);
  f.sync((*entered)->async_wait(boost::asio::use_awaitable));  // the child runs again
  f.close();
  CHECK(resume_attempts(f) == 1);
  SQLite::Database db(f.dir.file("tether.db"), SQLite::OPEN_READONLY);
  CHECK(db.execAndGet("SELECT count(*) FROM tasks WHERE state = 'running'").getInt() == 4);
  CHECK(db.execAndGet("SELECT count(*) FROM inbox").getInt() == 0);
}

TEST_CASE(
    "an exhausted resume budget fails every job of the child and is not reset by its settle") {
  report_fixture f("budget_kept", /*resume_budget=*/1);
  auto runs = std::make_shared<std::atomic<int>>(0);
  auto entered =
      std::make_shared<std::shared_ptr<runtime::one_shot<int>>>(runtime::one_shot<int>::make());
  blocking_child(f, runs, entered);
  f.parent_spawns("child");
  f.sync((*entered)->async_wait(boost::asio::use_awaitable));
  f.close();
  add_running_rows(f, 1);
  {
    // One restart already spent the budget.
    SQLite::Database db(f.dir.file("tether.db"), SQLite::OPEN_READWRITE);
    db.exec("UPDATE sessions SET resume_attempts = 1 WHERE id = 'child'");
  }
  f.open();
  f.quiet();
  CHECK(f.boot.exhausted == 2);
  CHECK(*runs == 1);  // never ran again
  auto inbox = f.inbox("parent");
  REQUIRE(inbox.size() == 2);
  for (auto& r : inbox) CHECK(r.body.find("resume budget of 1 exhausted") != std::string::npos);
  f.close();
  CHECK(resume_attempts(f) == 2);
}

namespace {

// A story stopped mid-way: a parent whose background child is busy (claim,
// turn, running job row), an acknowledged report in the parent's inbox and a
// finished owned job. The host is closed.
void stopped_story(report_fixture& f) {
  f.spawn_blocking_child();
  f.close();
  SQLite::Database db(f.dir.file("tether.db"), SQLite::OPEN_READWRITE);
  db.exec(
      "INSERT INTO inbox (session_id, notification_id, from_session, body, state, admitted_seq, "
      "admitted_at, admitted_ord) VALUES ('parent', 'msg_x', 'child', 'earlier', 'acked', 1, 0, "
      "1)");
  db.exec(
      "INSERT INTO tasks (id, kind, tenant, thread, turn, scope, state, payload, created_at, "
      "updated_at) VALUES ('job_x', 'shell', 'default', 'parent', 'turn_1', "
      "'{\"tenant\":\"default\",\"thread\":\"parent\",\"turn\":\"turn_1\",\"sandbox\":\"sbx\","
      "\"generation\":1}', 'completed', '{\"preview\":\"true\",\"channel\":\"api\"}', 0, 0)");
}

// Runs `sql` on the closed database; it must change exactly one row.
void garble(report_fixture& f, const char* sql) {
  SQLite::Database db(f.dir.file("tether.db"), SQLite::OPEN_READWRITE);
  db.exec(sql);
  REQUIRE(db.getChanges() == 1);
}

// Boots the closed database, which must refuse; the file is left byte for
// byte.
error refused_untouched(report_fixture& f) {
  auto path = f.dir.file("tether.db");
  REQUIRE_FALSE(std::filesystem::exists(path + "-wal"));
  auto before = test::file_bytes(path);
  auto e = f.refused_boot();
  CHECK(test::file_bytes(path) == before);
  return e;
}

struct garbling {
  const char* sql;    // one field garbled
  const char* table;  // what the refusal names
  const char* key;
  const char* field;
};

const garbling k_garblings[] = {
    {"UPDATE sessions SET turn = NULL WHERE id = 'child'", "sessions", "child", "turn"},
    {"UPDATE sessions SET time_suspended = NULL WHERE id = 'child'", "sessions", "child",
     "time_suspended"},
    {"UPDATE sessions SET tenant = '' WHERE id = 'parent'", "sessions", "parent", "tenant"},
    {"UPDATE sessions SET seq = -3 WHERE id = 'child'", "sessions", "child", "seq"},
    {"UPDATE sessions SET seq = 'many' WHERE id = 'child'", "sessions", "child", "seq"},
    {"UPDATE sessions SET input_cursor = 99 WHERE id = 'child'", "sessions", "child",
     "input_cursor"},
    {"UPDATE sessions SET resume_attempts = -1 WHERE id = 'child'", "sessions", "child",
     "resume_attempts"},
    {"UPDATE sessions SET revert_staged = 7 WHERE id = 'parent'", "sessions", "parent",
     "revert_staged"},
    {"UPDATE inbox SET state = 'bogus'", "inbox", "parent/msg_x", "state"},
    {"UPDATE messages SET payload = '{\"nottext\":1}' WHERE session_id = 'child' AND seq = 1",
     "messages", "child/1", "payload"},
    {"UPDATE messages SET role = 'god' WHERE session_id = 'child' AND seq = 1", "messages",
     "child/1", "role"},
    {"UPDATE messages SET kind = 'whisper' WHERE session_id = 'child' AND seq = 1", "messages",
     "child/1", "kind"},
    {"UPDATE messages SET seq = 50 WHERE session_id = 'child' AND seq = 1", "messages", "child/50",
     "seq"},
    {"UPDATE messages SET seq = -1 WHERE session_id = 'child' AND seq = 1", "messages", "child/-1",
     "seq"},
    {"UPDATE tasks SET child_id = NULL WHERE child_id = 'child'", "tasks", "", "child_id"},
    {"UPDATE tasks SET generation = -1 WHERE child_id = 'child'", "tasks", "", "generation"},
    {"UPDATE tasks SET state = 'exploded' WHERE child_id = 'child'", "tasks", "", "state"},
    {"UPDATE tasks SET kind = 'mystery' WHERE child_id = 'child'", "tasks", "", "kind"},
    {"UPDATE tasks SET tenant = 'other' WHERE kind = 'shell'", "tasks", "job_x", "tenant"},
    {"UPDATE tasks SET turn = 'turn_2' WHERE kind = 'shell'", "tasks", "job_x", "turn"},
};

}  // namespace

TEST_CASE("a stopped story whose fields all validate boots") {
  report_fixture f("garble_none");
  stopped_story(f);
  f.agents->code.erase("child");
  f.on("child", 1, {say("done after the restart")});
  f.open();
  f.quiet();
  CHECK(f.inbox("parent").size() == 2);
}

TEST_CASE(
    "a garbled field a boot decides on refuses the boot naming table, key and field, leaving the "
    "file byte for byte") {
  for (const auto& g : k_garblings) {
    DYNAMIC_SECTION(g.sql) {
      report_fixture f("garble");
      stopped_story(f);
      std::string key = g.key;
      if (key.empty()) {  // the job row's id is minted
        SQLite::Database db(f.dir.file("tether.db"), SQLite::OPEN_READONLY);
        key = db.execAndGet("SELECT id FROM tasks WHERE child_id = 'child'").getString();
      }
      garble(f, g.sql);
      auto e = refused_untouched(f);
      INFO(e.message);
      CHECK(e.code == errc::corrupt);
      CHECK(e.message.find("refusing to boot") != std::string::npos);
      CHECK(e.message.find(std::string("table '") + g.table + "' key '" + key + "': " + g.field +
                           ":") != std::string::npos);
    }
  }
}

TEST_CASE(
    "with bad rows in two tables the refusal names the check listed first, as checking each in "
    "turn would") {
  // The inbox's state check is listed before the shell row's tenant check,
  // though the tasks table has checks on both sides of it: the checks of
  // one table are scanned together, and only then each in the list's order.
  report_fixture f("garble_two");
  stopped_story(f);
  garble(f, "UPDATE tasks SET tenant = 'other' WHERE kind = 'shell'");
  garble(f, "UPDATE inbox SET state = 'bogus'");
  auto e = f.refused_boot();
  INFO(e.message);
  CHECK(e.code == errc::corrupt);
  CHECK(e.message.find("table 'inbox' key 'parent/msg_x': state:") != std::string::npos);
}

TEST_CASE(
    "a session policy that is JSON but not a policy refuses the boot naming the session, though "
    "boot reads only the sessions' links") {
  // Validation checks only that a policy is JSON; boot's read of every
  // session decodes the policy as a loaded session would, so the refusal
  // comes before anything runs, not when the session first loads.
  report_fixture f("garble_policy");
  stopped_story(f);
  garble(f, "UPDATE sessions SET policy = '{\"tools\":null}' WHERE id = 'parent'");
  auto e = refused_untouched(f);
  INFO(e.message);
  CHECK(e.code == errc::corrupt);
  CHECK(e.message.find("refusing to boot") != std::string::npos);
  CHECK(e.message.find("table 'sessions' key 'parent': policy") != std::string::npos);
}

TEST_CASE(
    "a session policy that does not decode refuses the boot before a recovery writes anything, "
    "leaving the file byte for byte") {
  // A delegated task its dead owner left running: the delegates' recovery
  // settles it lost (a write). The policy is refused by boot's read of the
  // sessions' links, which comes first, so nothing is written.
  report_fixture f("garble_policy_before_recovery");
  persistence::delegate_task t;
  t.id = protocol::job_id("dlg_orphan");
  t.scope.tenant = protocol::tenant_id("default");
  t.scope.thread = session_id("parent");
  t.scope.turn = protocol::turn_id("turn_1");
  t.agent = "worker";
  t.preview = "p";
  t.workspace = (f.dir.path() / "workspace").string();
  t.owner = dead_owner();
  t.lease_until = runtime::now_ms() + 3'600'000;
  REQUIRE(f.sync(f.host->store().admit_delegate(t)));
  stopped_story(f);
  garble(f, "UPDATE sessions SET policy = '{\"tools\":null}' WHERE id = 'parent'");
  auto e = refused_untouched(f);
  INFO(e.message);
  CHECK(e.code == errc::corrupt);
  CHECK(e.message.find("table 'sessions' key 'parent': policy") != std::string::npos);
  SQLite::Database db(f.dir.file("tether.db"), SQLite::OPEN_READONLY);
  CHECK(db.execAndGet("SELECT state FROM tasks WHERE id = 'dlg_orphan'").getString() == "running");
}

TEST_CASE(
    "an owed report whose row does not decode refuses the boot naming it, and stays pending, "
    "though boot reads its outbox a page at a time") {
  // Validation does not check a subagent row's mode; the outbox's read
  // decodes the owed row, and its refusal stops the boot as validation's
  // would, not a warning that skips the rest of the outbox.
  report_fixture f("garble_owed_mode");
  REQUIRE(f.sync(f.host->create_session("parent", session_id("parent"))));
  f.write_owed_report("parent", "child");
  f.close();
  garble(f, "UPDATE tasks SET mode = 'sideways' WHERE id = 'msg_owed'");
  auto e = f.refused_boot();
  INFO(e.message);
  CHECK(e.code == errc::corrupt);
  CHECK(e.message.find("refusing to boot") != std::string::npos);
  CHECK(e.message.find("table 'tasks' key 'msg_owed': mode:") != std::string::npos);
  SQLite::Database db(f.dir.file("tether.db"), SQLite::OPEN_READONLY);
  CHECK(db.execAndGet("SELECT count(*) FROM receipts WHERE task_id = 'msg_owed' AND transition != "
                      "'started' AND state = 'pending'")
            .getInt() == 1);
  CHECK(db.execAndGet("SELECT count(*) FROM inbox").getInt() == 0);
}
