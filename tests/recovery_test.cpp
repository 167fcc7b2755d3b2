// Recovery after a failed write: what a restart owes and delivers, and what
// the running host does by itself once the fault clears.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <fstream>

#include "report_support.hpp"
#include "sandbox_support.hpp"
#include "tether/sandbox/daemon_process.hpp"
#include "tether/sandbox/state_dir.hpp"

using namespace tether;
using namespace tether::test;

namespace {

// A child that says "started" to its prompt and "final answer" to anything
// its inbox brings (a shell's notice, a report); counts its drains.
std::shared_ptr<std::atomic<int>> child_answers_its_inbox(report_fixture& f) {
  auto drains = std::make_shared<std::atomic<int>>(0);
  f.code("child")->fn = [drains](agent_context& ctx,
                                 drain_input in) -> boost::asio::awaitable<void> {
    ++*drains;
    bool prompt = false, inbox = false;
    for (auto& i : in.inputs) {
      prompt |= i.kind == "prompt";
      inbox |= i.kind == "report" || i.kind == "notice";
    }
    if (prompt) co_await ctx.say("started");
    if (inbox) co_await ctx.say("final answer");
  };
  return drains;
}

// Admits one report into the child's inbox from outside (as a shell's exit
// does) and wakes it.
void report_into_child(report_fixture& f, const std::string& body) {
  actors::delivery_batch b;
  b.owner = session_id("child");
  b.items.push_back(
      {protocol::notification_id(protocol::mint("msg")), std::nullopt, std::nullopt, body});
  REQUIRE(f.sync(f.host->delivery().deliver(std::move(b))));
}

// The child starts a shell that waits on the fifo `gate` when prompted
// ("started"), and answers its inbox (the shell's notice) with "final answer".
void child_shell_waits_on(report_fixture& f, const std::string& gate) {
  f.code("child")->fn = [gate](agent_context& ctx, drain_input in) -> boost::asio::awaitable<void> {
    bool prompt = false, inbox = false;
    for (auto& i : in.inputs) {
      prompt |= i.kind == "prompt";
      inbox |= i.kind == "report" || i.kind == "notice";
    }
    if (prompt) {
      std::string command = "cat " + gate;
      auto sh = co_await ctx.start_shell(std::move(command));
      std::string answer = sh ? "started" : "no shell: " + sh.error().message;
      co_await ctx.say(std::move(answer));
    }
    if (inbox) co_await ctx.say("final answer");
  };
}

int bodies_with(report_fixture& f, const std::string& s, const std::string& text) {
  int n = 0;
  for (auto& r : f.inbox(s)) n += r.body.find(text) != std::string::npos;
  return n;
}

}  // namespace

namespace {

// From the child's second settle on (the one after its inbox drain), every
// commit fails until the host shuts down; the result is set once they do.
std::shared_ptr<runtime::one_shot<int>> fail_commits_from_second_child_settle(report_fixture& f) {
  auto settles = std::make_shared<std::atomic<int>>(0);
  auto failing = runtime::one_shot<int>::make();
  f.observer->on_settling = [&f, settles,
                             failing](const session_id& s) -> boost::asio::awaitable<void> {
    if (s.str() == "child" && ++*settles == 2) {
      f.host->store().db_writer().inject_commit_failures(1 << 20);
      failing->set(1);
    }
    co_return;
  };
  return failing;
}

}  // namespace

TEST_CASE(
    "a restart after a child's settle failed past its inbox drain delivers the child's final "
    "report exactly once",
    "[recovery][regression]") {
  report_fixture f("recovery-inbox-settle");
  auto drains = child_answers_its_inbox(f);
  // The child's second settle (the one after its inbox drain) fails, and
  // keeps failing until the host has shut down.
  auto failing = fail_commits_from_second_child_settle(f);
  f.parent_spawns("child");
  REQUIRE(f.sync(f.host->wait_idle(session_id("parent"))));
  f.quiet();  // the child's first report delivered
  REQUIRE(bodies_with(f, "parent", "started") == 1);
  report_into_child(f, "shell exited: 14 routes checked");
  f.sync(failing->async_wait(boost::asio::use_awaitable));
  // Shut down while the settle's retries fail: the claim stays on disk, the
  // inbox item was already acknowledged into the child's transcript.
  f.restart();
  f.quiet();
  CHECK(f.boot.resumed_children == 1);
  CHECK(bodies_with(f, "parent", "final answer") == 1);
  CHECK(bodies_with(f, "parent", "started") == 1);
  CHECK(*drains == 3);  // the prompt, the inbox, and the inbox again after the restart
  auto child = f.host->store().session(session_id("child"));
  REQUIRE(child);
  REQUIRE(*child);
  CHECK_FALSE((*child)->time_suspended);
  auto jobs = f.host->store().outstanding_jobs();  // nothing running or owed
  REQUIRE(jobs);
  CHECK(jobs->empty());
  // A second restart owes nothing and delivers nothing again.
  f.restart();
  f.quiet();
  CHECK(f.boot.resumed_children == 0);
  CHECK(bodies_with(f, "parent", "final answer") == 1);
}

TEST_CASE(
    "a child resumed for its inbox that runs out of resumes reports an error instead of being "
    "released",
    "[recovery][regression]") {
  report_fixture f("recovery-inbox-budget", /*resume_budget=*/0);
  child_answers_its_inbox(f);
  auto failing = fail_commits_from_second_child_settle(f);
  f.parent_spawns("child");
  REQUIRE(f.sync(f.host->wait_idle(session_id("parent"))));
  f.quiet();  // the child's first report delivered
  report_into_child(f, "shell exited");
  f.sync(failing->async_wait(boost::asio::use_awaitable));
  f.restart();
  f.quiet();
  CHECK(f.boot.exhausted == 1);
  CHECK(f.boot.resumed_children == 0);
  CHECK(bodies_with(f, "parent", "resume budget of 0 exhausted") == 1);
  auto child = f.host->store().session(session_id("child"));
  REQUIRE(child);
  REQUIRE(*child);
  CHECK_FALSE((*child)->time_suspended);
}

TEST_CASE(
    "a child that settles after its parent was deleted writes its report owed to nobody: the "
    "receipt is dropped and nothing waits in the outbox",
    "[recovery]") {
  report_fixture f("recovery-parent-deleted");
  auto entered = runtime::one_shot<int>::make();
  auto gate = runtime::one_shot<int>::make();
  f.code("child")->fn = [entered, gate](agent_context& ctx,
                                        drain_input) -> boost::asio::awaitable<void> {
    entered->set(1);
    co_await gate->async_wait(boost::asio::use_awaitable);
    co_await ctx.say("nobody reads this");
  };
  f.parent_spawns("child");
  f.sync(entered->async_wait(boost::asio::use_awaitable));
  REQUIRE(f.sync(f.host->delete_session(session_id("parent"))));
  gate->set(1);  // the child answers and settles: its parent is not there
  f.quiet();
  auto tasks = f.host->store().jobs();
  REQUIRE(tasks);
  REQUIRE(tasks->size() == 1);
  CHECK(tasks->front().status == persistence::job_status::completed);
  CHECK_FALSE(tasks->front().owed);
  auto receipts = f.host->store().receipts_of(tasks->front().id);
  REQUIRE(receipts);
  int dropped = 0;
  for (auto& r : *receipts)
    if (r.transition != protocol::transition::started) {
      CHECK(r.state == persistence::receipt_state::dropped);
      ++dropped;
    }
  CHECK(dropped == 1);
  auto owed = f.host->store().outstanding_jobs();
  REQUIRE(owed);
  CHECK(owed->empty());
  CHECK(warned(f, {"owner session 'parent'", "1 owed report(s) dropped"}));
}

TEST_CASE(
    "a report whose settle, folded with its admit, fails to commit reaches its parent while the "
    "host runs",
    "[recovery][regression]") {
  report_fixture f("recovery-deliver-retry");
  f.code("child")->fn = [](agent_context& ctx, drain_input) -> boost::asio::awaitable<void> {
    co_await ctx.say("the answer");
  };
  // The next COMMIT after the child classifies its busy period is its settle,
  // which admits the report in the same transaction: it fails.
  std::atomic<bool> injected{false};
  f.observer->on_settling = [&](const session_id& s) -> boost::asio::awaitable<void> {
    if (s.str() == "child" && !injected.exchange(true))
      f.host->store().db_writer().inject_commit_failures(1);
    co_return;
  };
  f.parent_spawns("child");
  f.quiet();
  CHECK(injected);
  CHECK(f.host->store().db_writer().stats().failed_commits == 1);
  CHECK(bodies_with(f, "parent", "the answer") == 1);  // delivered now, not at the next boot
  auto jobs = f.host->store().outstanding_jobs();      // nothing running or owed
  REQUIRE(jobs);
  CHECK(jobs->empty());
  CHECK(warned(f, {"settle did not commit", "the settle is retried"}));
}

TEST_CASE(
    "a shell that ended while the host was down wakes its owner only after boot released the "
    "claims it owes nothing, so the period it begins keeps its claim on disk",
    "[recovery][regression]") {
  report_fixture f("recovery-shell-exited-down");
  // The child starts a shell (an owned job of its turn in the host's local
  // daemon: no sandbox is configured) that waits on a fifo, and answers its
  // inbox (the shell's notice) with "final answer".
  auto gate = f.dir.file("gate");
  REQUIRE(::mkfifo(gate.c_str(), 0600) == 0);
  child_shell_waits_on(f, gate);
  f.parent_spawns("child");
  REQUIRE(f.sync(f.host->wait_idle(session_id("parent"))));
  f.sync(f.host->wait_quiescent(false));  // report 1 delivered; the shell runs on
  auto live = f.host->store().live_jobs();
  REQUIRE(live);
  REQUIRE(live->size() == 1);
  auto job = live->front().id;
  // On disk at the restart: a report owed to the parent (boot delivers it
  // before it looks at claims); the shell ends while the host is down.
  f.write_owed_report("parent", "child");
  f.close();
  release_fifo(gate);

  // While boot delivers the owed report, the child's period must not have
  // begun: the shell's receipt is handed over only after boot's phases.
  std::atomic<bool> child_began{false}, began_during_delivery{false};
  f.observer->on_started = [&](const session_id& s) {
    if (s.str() == "child") child_began = true;
  };
  f.observer->on_admitted = [&](const session_id& s) {
    if (s.str() == "parent" && child_began) began_during_delivery = true;
  };
  // The child's period that answers the shell's notice holds at its settle.
  auto settling = runtime::one_shot<int>::make();
  auto release = runtime::one_shot<int>::make();
  f.observer->on_settling = [&](const session_id& s) -> boost::asio::awaitable<void> {
    if (s.str() != "child") co_return;
    settling->set(1);
    co_await release->async_wait(boost::asio::use_awaitable);
  };
  f.open();
  f.sync(settling->async_wait(boost::asio::use_awaitable));
  CHECK_FALSE(began_during_delivery);
  // The period is live and unsettled: its claim is on disk, so a crash now
  // leaves a claim the next boot resumes (its report is owed nowhere else).
  auto child = f.host->store().session(session_id("child"));
  REQUIRE(child);
  REQUIRE(*child);
  CHECK((*child)->time_suspended);
  release->set(1);
  f.quiet();
  // Recovery found the job ended, or followed it to its end: one way or the other.
  CHECK(f.boot.jobs.finished_while_down + f.boot.jobs.reattached == 1);
  auto done = f.host->store().job(job);
  REQUIRE(done);
  REQUIRE(*done);
  CHECK((*done)->state == persistence::owned_state::completed);
  CHECK(bodies_with(f, "parent", "owed report") == 1);
  CHECK(bodies_with(f, "parent", "final answer") == 1);
}

TEST_CASE(
    "a host's local sandbox daemon that died while a shell ran is started again at boot: the "
    "shell ends with an unknown status and its owner is told once",
    "[recovery]") {
  report_fixture f("recovery-local-daemon-gone");
  auto gate = f.dir.file("gate");
  REQUIRE(::mkfifo(gate.c_str(), 0600) == 0);
  child_shell_waits_on(f, gate);
  f.parent_spawns("child");
  REQUIRE(f.sync(f.host->wait_idle(session_id("parent"))));
  f.sync(f.host->wait_quiescent(false));  // report 1 delivered; the shell runs on
  auto live = f.host->store().live_jobs();
  REQUIRE(live);
  REQUIRE(live->size() == 1);
  auto job = live->front().id;
  f.close();
  // The daemon dies with the shell still running (a reboot, a kill): nothing
  // answers in <db>.sandbox when the host opens again.
  auto stopped = sandbox::stop_daemon_in(sandbox::local_state_dir_for(f.dir.file("tether.db")));
  REQUIRE(stopped);
  REQUIRE(*stopped);
  f.open();  // boot succeeds: recovery started the local daemon again
  f.quiet();
  auto done = f.host->store().job(job);
  REQUIRE(done);
  REQUIRE(*done);
  CHECK(persistence::is_terminal((*done)->state));
  CHECK((*done)->state != persistence::owned_state::completed);
  int notices = 0;
  for (auto& r : f.inbox("child")) notices += r.body.find(job.str()) != std::string::npos;
  CHECK(notices == 1);
  CHECK(bodies_with(f, "parent", "final answer") == 1);
  // Another restart tells nobody again.
  f.restart();
  f.quiet();
  notices = 0;
  for (auto& r : f.inbox("child")) notices += r.body.find(job.str()) != std::string::npos;
  CHECK(notices == 1);
  CHECK(bodies_with(f, "parent", "final answer") == 1);
}

TEST_CASE(
    "a report a v4 database owed without a terminal receipt gets one when the file is migrated "
    "and is delivered exactly once",
    "[recovery][migration]") {
  report_fixture f("recovery-v4-owed-none");
  REQUIRE(f.sync(f.host->create_session("parent", session_id("parent"))));
  // A none-mode report as the previous build left it owed: a terminal row and
  // no terminal receipt (it minted none for mode none, and its row was the
  // outbox). Written as this build writes it, then its receipt is removed.
  f.write_owed_report("parent", "parent");
  f.close();
  {
    SQLite::Database db(f.dir.file("tether.db"), SQLite::OPEN_READWRITE);
    CHECK(db.exec("DELETE FROM receipts WHERE task_id = 'msg_owed'") == 1);
    db.exec("PRAGMA user_version = 4");
    // Steps 5-7 rebuild the tasks table; the columns later steps add to
    // sessions go too, as a v4 file never had them.
    for (auto c : {"policy", "depth", "budget_root", "task_id"})
      db.exec(std::string("ALTER TABLE sessions DROP COLUMN ") + c);
  }
  f.open();
  f.quiet();
  CHECK(f.boot.delivered == 1);
  CHECK(bodies_with(f, "parent", "owed report") == 1);
  {
    SQLite::Database db(f.dir.file("tether.db"), SQLite::OPEN_READONLY);
    CHECK(db.execAndGet("PRAGMA user_version").getInt() == persistence::latest_schema_version());
    CHECK(db.execAndGet("SELECT state FROM receipts WHERE id = 'msg_owed/completed'").getString() ==
          "acked");
    // The delivered task stays, terminal.
    CHECK(db.execAndGet("SELECT state FROM tasks WHERE id = 'msg_owed'").getString() ==
          "completed");
  }
  f.restart();
  f.quiet();
  CHECK(f.boot.delivered == 0);
  CHECK(bodies_with(f, "parent", "owed report") == 1);
}

TEST_CASE(
    "boot's phases read again only the sessions they may wake: mid-turn, with a pending inbox "
    "row, or the child of a live subagent task, in creation order",
    "[recovery]") {
  report_fixture f("resume-read");
  for (auto name : {"idle", "suspended", "waiting", "child", "owner"})
    REQUIRE(f.sync(f.host->create_session("agent", session_id(name))));
  // A report admitted without a wake (as boot's resend admits one): pending.
  actors::delivery_batch b;
  b.owner = session_id("waiting");
  b.recovering = true;
  b.items.push_back({protocol::notification_id("msg_w"), std::nullopt, std::nullopt, "report"});
  REQUIRE(f.sync(f.host->delivery().deliver(std::move(b))));
  f.close();
  {
    SQLite::Database db(f.dir.file("tether.db"), SQLite::OPEN_READWRITE);
    // Creation order, not the ids' order (the ties of one millisecond).
    db.exec(
        "UPDATE sessions SET created_at = CASE id WHEN 'idle' THEN 1 WHEN 'suspended' THEN 2 "
        "WHEN 'waiting' THEN 3 WHEN 'child' THEN 4 ELSE 5 END");
    db.exec("UPDATE sessions SET time_suspended = 1 WHERE id = 'suspended'");
    db.exec(
        "INSERT INTO tasks (id, notification_id, kind, mode, parent_id, child_id, state, body, "
        "payload, created_at, updated_at) VALUES ('job_live', 'msg_live', 'subagent', "
        "'background', 'owner', 'child', 'running', NULL, '{\"description\": \"d\"}', 0, 0)");
    // A delivered task's child owes nothing: not read.
    db.exec(
        "INSERT INTO tasks (id, notification_id, kind, mode, parent_id, child_id, state, body, "
        "payload, created_at, updated_at) VALUES ('job_done', 'msg_done', 'subagent', "
        "'background', 'owner', 'idle', 'completed', 'b', '{\"description\": \"d\"}', 0, 0)");
  }
  actors::host_options o;
  o.db_path = f.dir.file("tether.db");
  o.agents = f.agents;
  auto h = actors::host::open(o);
  REQUIRE(h);
  auto read = (*h)->store().sessions_to_resume();
  (*h)->shutdown();
  REQUIRE(read);
  std::vector<std::string> ids;
  for (auto& s : *read) ids.push_back(s.id.str());
  CHECK(ids == std::vector<std::string>{"suspended", "waiting", "child"});
  REQUIRE(read->size() == 3);
  CHECK((*read)[0].time_suspended);
  CHECK_FALSE((*read)[1].time_suspended);
}
