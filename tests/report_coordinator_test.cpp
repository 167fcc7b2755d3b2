// The run coordinator's busy periods, the guards of seed §4, and boot (§6).
#include <SQLiteCpp/Database.h>

#include <atomic>
#include <boost/asio/use_awaitable.hpp>

#include "report_support.hpp"
#include "tether/protocol/report.hpp"

using namespace tether;
using namespace tether::test;

TEST_CASE("wakes recorded during a drain coalesce into one more drain of the same busy period") {
  report_fixture f("coalesce");
  auto child = f.code("child");
  std::atomic<int> drains{0};
  child->fn = [&](agent_context& ctx, drain_input in) -> boost::asio::awaitable<void> {
    ++drains;
    if (in.drain_index == 0) {
      for (int i = 0; i < 5; ++i) ctx.wake_self();
    } else {
      co_await ctx.say("done after " + std::to_string(in.drain_index + 1) + " drains");
    }
  };
  f.parent_spawns("child");
  f.quiet();
  CHECK(drains == 2);
  CHECK(f.observer->started_of("child") == 1);
  CHECK(f.observer->settled_of("child") == 1);
  auto inbox = f.inbox("parent");
  REQUIRE(inbox.size() == 1);
  CHECK(inbox[0].body.find("done after 2 drains") != std::string::npos);
}

TEST_CASE("20,000 self-wakes in a row make one busy period without overflowing the stack") {
  report_fixture f("selfwake");
  auto child = f.code("child");
  std::atomic<int> drains{0};
  child->fn = [&](agent_context& ctx, drain_input in) -> boost::asio::awaitable<void> {
    ++drains;
    if (in.drain_index < 20000)
      ctx.wake_self();
    else
      co_await ctx.say("woke myself 20000 times");
  };
  f.parent_spawns("child");
  f.quiet();
  CHECK(drains == 20001);
  CHECK(f.observer->started_of("child") == 1);
  CHECK(f.observer->settled_of("child") == 1);
  REQUIRE(f.inbox("parent").size() == 1);
}

TEST_CASE(
    "input_ordinal counts a session's inputs up to any seq, and a seq past the transcript's end "
    "does not hide the inputs written after it") {
  report_fixture f("ordinal");
  auto solo = f.code("solo");
  // Per drain: the input's ordinal, one asked for a seq past the end of the
  // transcript, and (from the third prompt on) the ordinal of seq 1 again;
  // -1 for a read that failed. Written on the session's executor, read here
  // once the host is quiet.
  std::vector<std::vector<std::int64_t>> seen;
  solo->fn = [&](agent_context& ctx, drain_input in) -> boost::asio::awaitable<void> {
    for (auto& input : in.inputs) {
      std::vector<std::int64_t> got;
      for (auto seq : {input.seq, input.seq + 100}) {
        auto o = co_await ctx.input_ordinal(seq);
        got.push_back(o ? *o : -1);
      }
      if (seen.size() >= 2) {
        auto first = co_await ctx.input_ordinal(1);
        got.push_back(first ? *first : -1);
      }
      seen.push_back(got);
      co_await ctx.say("answer " + std::to_string(seen.size()));
    }
  };
  auto s = f.sync(f.host->create_session("solo", session_id("solo")));
  REQUIRE(s);
  for (auto text : {"one", "two", "three"}) {
    REQUIRE(f.sync(f.host->prompt(*s, text)));
    f.quiet();
  }
  // Inputs at seq 1, 3 and 5 (each answer takes the seq after its input).
  REQUIRE(seen.size() == 3);
  CHECK(seen[0] == std::vector<std::int64_t>{1, 1});
  CHECK(seen[1] == std::vector<std::int64_t>{2, 2});
  CHECK(seen[2] == std::vector<std::int64_t>{3, 3, 1});
}

TEST_CASE(
    "a prompt to an idle session drains a user message another writer put before it, then "
    "the prompt") {
  report_fixture f("beside");
  auto solo = f.code("solo");
  // The inputs of each drain, written on the session's executor and read
  // here once the host is quiet.
  std::vector<std::vector<std::string>> drains;
  solo->fn = [&](agent_context& ctx, drain_input in) -> boost::asio::awaitable<void> {
    std::vector<std::string> texts;
    for (auto& m : in.inputs) texts.push_back(m.text);
    drains.push_back(texts);
    co_await ctx.say("answered " + std::to_string(drains.size()));
  };
  auto s = f.sync(f.host->create_session("solo", session_id("solo")));
  REQUIRE(s);
  REQUIRE(f.sync(f.host->prompt(*s, "one")));
  f.quiet();
  // Written past the session's actor, as a follow-up's prompt is: the
  // actor does not know of it, and the claim of the next prompt must.
  REQUIRE(f.sync(f.host->store().append(*s, "user", "prompt", "completed", "written beside")));
  REQUIRE(f.sync(f.host->prompt(*s, "two")));
  f.quiet();
  REQUIRE(f.sync(f.host->prompt(*s, "three")));
  f.quiet();
  REQUIRE(drains.size() == 3);
  CHECK(drains[0] == std::vector<std::string>{"one"});
  CHECK(drains[1] == std::vector<std::string>{"written beside", "two"});
  CHECK(drains[2] == std::vector<std::string>{"three"});
}

TEST_CASE(
    "a prompt whose text is not UTF-8 is refused before it is written, and the session's next "
    "prompt runs") {
  // Regression: the prompt used to be written, its row then refused by every
  // read of the drain, so this and every later busy period of the session
  // ended "error" on the same row.
  report_fixture f("notutf8");
  auto solo = f.code("solo");
  std::vector<std::string> inputs;
  solo->fn = [&](agent_context& ctx, drain_input in) -> boost::asio::awaitable<void> {
    for (auto& m : in.inputs) inputs.push_back(m.text);
    co_await ctx.say("answered");
  };
  auto s = f.sync(f.host->create_session("solo", session_id("solo")));
  REQUIRE(s);
  auto bad = f.sync(f.host->prompt(*s, std::string("bad \xff byte")));
  REQUIRE_FALSE(bad);
  CHECK(bad.error().code == errc::invalid);
  CHECK(bad.error().message.find("not valid UTF-8 (byte 0xFF at offset 4 of 10)") !=
        std::string::npos);
  CHECK(bad.error().message.find("nothing of this request was written") != std::string::npos);
  f.quiet();
  CHECK(inputs.empty());
  auto msgs = f.host->store().messages(*s);
  REQUIRE(msgs);
  CHECK(msgs->empty());
  // A steer to the idle session takes the same claim.
  CHECK_FALSE(f.sync(f.host->prompt(*s, std::string("\xe2\x82"), true)));
  REQUIRE(f.sync(f.host->prompt(*s, "good \xe2\x82\xac")));
  f.quiet();
  CHECK(inputs == std::vector<std::string>{"good \xe2\x82\xac"});
  auto row = f.host->store().session(*s);
  REQUIRE(row);
  REQUIRE(*row);
  CHECK((*row)->idle_outcome == std::optional<std::string>("completed"));
}

TEST_CASE(
    "an answer, a spawn's prompt or a job description that is not UTF-8 is refused to the agent "
    "with nothing written, and the busy period goes on") {
  report_fixture f("notutf8agent");
  auto parent = f.code("parent");
  std::vector<error> refused;
  parent->fn = [&](agent_context& ctx, drain_input in) -> boost::asio::awaitable<void> {
    if (in.inputs.empty() || in.inputs.front().kind != "prompt") co_return;
    auto said = co_await ctx.say(std::string("half a \xc3"));
    if (!said) refused.push_back(said.error());
    actors::spawn_request bad_prompt;
    bad_prompt.child = session_id("child1");
    bad_prompt.description = "fine";
    bad_prompt.prompt = std::string("\xed\xa0\x80 a surrogate");
    auto c1 = co_await ctx.spawn_background(std::move(bad_prompt));
    if (!c1) refused.push_back(c1.error());
    actors::spawn_request bad_description;
    bad_description.child = session_id("child2");
    bad_description.description = std::string("over\xc0\xaflong");
    bad_description.prompt = "go";
    auto c2 = co_await ctx.spawn_background(std::move(bad_description));
    if (!c2) refused.push_back(c2.error());
    co_await ctx.say("still here");
  };
  auto p = f.sync(f.host->create_session("parent", session_id("parent")));
  REQUIRE(p);
  REQUIRE(f.sync(f.host->prompt(*p, "start")));
  f.quiet();
  REQUIRE(refused.size() == 3);
  for (auto& e : refused) {
    CHECK(e.code == errc::invalid);
    CHECK(e.message.find("not valid UTF-8") != std::string::npos);
  }
  CHECK(refused[0].message.find("offset 7") != std::string::npos);
  CHECK(refused[2].message.find("description") != std::string::npos);
  // Neither child exists: each spawn's transaction was rolled back whole.
  for (auto c : {"child1", "child2"}) {
    auto row = f.host->store().session(session_id(c));
    REQUIRE(row);
    CHECK_FALSE(*row);
  }
  auto jobs = f.host->store().outstanding_jobs();
  REQUIRE(jobs);
  CHECK(jobs->empty());
  auto msgs = f.host->store().messages(*p);
  REQUIRE(msgs);
  REQUIRE(msgs->size() == 2);
  CHECK((*msgs)[0].text == "start");
  CHECK((*msgs)[1].text == "still here");
  auto row = f.host->store().session(*p);
  REQUIRE(row);
  REQUIRE(*row);
  CHECK((*row)->idle_outcome == std::optional<std::string>("completed"));
}

TEST_CASE("started records the session's durable sequence number as startedSeq") {
  report_fixture f("startedseq");
  f.on("parent", 1, {say("one")});
  f.on("parent", 2, {say("two")});
  auto p = f.sync(f.host->create_session("parent", session_id("parent")));
  REQUIRE(p);
  REQUIRE(f.sync(f.host->prompt(*p, "first")));  // seq 1, answer seq 2
  f.quiet();
  REQUIRE(f.sync(f.host->prompt(*p, "second")));  // seq 3
  f.quiet();
  std::lock_guard lk(f.observer->m);
  auto& seqs = f.observer->started_seqs["parent"];
  REQUIRE(seqs.size() == 2);
  CHECK(seqs[0] == 1);
  CHECK(seqs[1] == 3);
}

TEST_CASE(
    "settled runs before waiters are released: the report is delivered when wait_idle returns") {
  report_fixture f("release");
  f.on("child", 1, {say("the answer")});
  f.parent_spawns("child");
  // The child exists once the parent's turn ran; waiting on the parent's
  // quiescence would hide the ordering, so wait on the child alone.
  auto exists = [&] { return f.host->store().session(session_id("child")).value().has_value(); };
  f.sync(f.host->wait_idle(session_id("parent")));
  REQUIRE(exists());
  auto r = f.sync(f.host->wait_idle(session_id("child")));
  REQUIRE(r);
  CHECK(f.inbox("parent").size() == 1);  // admitted before the child counted as idle
  auto jobs = f.host->store().outstanding_jobs();
  REQUIRE(jobs);
  CHECK(jobs->empty());
}

TEST_CASE("an interrupt settles the busy period once, as cancelled, and clears a pending wake") {
  report_fixture f("interrupt");
  auto child = f.code("child");
  std::atomic<int> drains{0};
  auto entered = runtime::one_shot<int>::make();
  child->fn = [&, entered](agent_context& ctx, drain_input) -> boost::asio::awaitable<void> {
    ++drains;
    ctx.wake_self();  // pending when the interrupt comes: must be cleared
    entered->set(1);
    co_await until_cancelled();
  };
  f.parent_spawns("child");
  f.sync(entered->async_wait(boost::asio::use_awaitable));
  f.host->interrupt(session_id("child"));
  f.quiet();
  CHECK(drains == 1);
  CHECK(f.observer->settled_of("child") == 1);
  auto inbox = f.inbox("parent");
  REQUIRE(inbox.size() == 1);
  CHECK(inbox[0].body ==
        "<subagent sessionID=\"child\" state=\"cancelled\" description=\"Audit routes\">\n"
        "Subagent cancelled\n</subagent>");
}

TEST_CASE("a drain that throws settles the busy period once, as error, with the error text") {
  report_fixture f("throws");
  f.on("child", 1, {script_action{script_action::kind::raise, "disk on fire"}});
  f.parent_spawns("child");
  f.quiet();
  auto inbox = f.inbox("parent");
  REQUIRE(inbox.size() == 1);
  CHECK(inbox[0].body.find("state=\"error\"") != std::string::npos);
  CHECK(inbox[0].body.find("disk on fire") != std::string::npos);
  CHECK(f.observer->settled_of("child") == 1);
}

TEST_CASE("a wake that arrives during settled starts a fresh busy period") {
  report_fixture f("wakesettle");
  f.on("child", 1, {say("first")});
  std::atomic<bool> nudged{false};
  f.observer->on_settling = [&](const session_id& s) -> boost::asio::awaitable<void> {
    if (s.str() == "child" && !nudged.exchange(true)) f.host->nudge(s);
    co_return;
  };
  f.parent_spawns("child");
  f.quiet();
  CHECK(f.observer->started_of("child") == 2);
  CHECK(f.observer->settled_of("child") == 2);
  // The second busy period had no answer and no job: nothing more was sent.
  CHECK(f.inbox("parent").size() == 1);
}

TEST_CASE("steer and input wakes merge with input winning") {
  report_fixture f("scopes");
  auto child = f.code("child");
  std::vector<wake_scope> scopes;
  auto entered = runtime::one_shot<int>::make();
  auto gate = runtime::one_shot<int>::make();
  child->fn = [&, entered, gate](agent_context& ctx,
                                 drain_input in) -> boost::asio::awaitable<void> {
    scopes.push_back(in.scope);
    if (in.drain_index == 0) {
      entered->set(1);
      co_await gate->async_wait(boost::asio::use_awaitable);
    }
    co_await ctx.say("drain " + std::to_string(in.drain_index));
  };
  f.parent_spawns("child");
  f.sync(entered->async_wait(boost::asio::use_awaitable));
  REQUIRE(f.sync(f.host->prompt(session_id("child"), "a steer", true)));
  f.host->nudge(session_id("child"), wake_scope::input);
  f.host->nudge(session_id("child"), wake_scope::steer);
  // Both wakes are in the mailbox before the gate opens; a wait_idle queued
  // behind them proves they were handled.
  auto idle = [](actors::host* h) -> boost::asio::awaitable<void> {
    co_await h->wait_idle(session_id("child"));
  };
  boost::asio::co_spawn(f.host->pool().at(0), idle(f.host.get()), boost::asio::detached);
  gate->set(1);
  f.quiet();
  REQUIRE(scopes.size() == 2);
  CHECK(scopes[1] == wake_scope::input);
}

TEST_CASE("a late request to background a settling job is refused") {
  report_fixture f("latebg");
  f.on("parent", 1, {spawn("child", "Audit routes", "go", /*background=*/false)});
  f.on("child", 1, {say("inline answer")});
  std::optional<result<protocol::notification_id>> late;
  f.observer->on_settling = [&](const session_id& s) -> boost::asio::awaitable<void> {
    if (s.str() == "child") late = co_await f.host->background(s);
  };
  auto p = f.sync(f.host->create_session("parent", session_id("parent")));
  REQUIRE(p);
  REQUIRE(f.sync(f.host->prompt(*p, "start")));
  f.quiet();
  REQUIRE(late);
  REQUIRE_FALSE(*late);
  CHECK(late->error().code == errc::refused);
  auto inl = f.agents->scripted->inline_results();
  REQUIRE(inl.size() == 1);
  CHECK(inl[0].find("inline answer") != std::string::npos);
  CHECK(f.inbox("parent").empty());  // foreground: no outbox row, no report
}

TEST_CASE("a settle that runs after delivery cannot make the delivered task owe its report again") {
  report_fixture f("resurrect");
  f.on("child", 1, {say("answer")});
  f.parent_spawns("child");
  f.quiet();
  REQUIRE(f.inbox("parent").size() == 1);
  // The delivered task stays, terminal, its terminal receipt acknowledged.
  SQLite::Database db(f.dir.file("tether.db"), SQLite::OPEN_READONLY);
  auto job = db.execAndGet("SELECT id FROM tasks WHERE kind = 'subagent'").getString();
  auto receipt_state = [&] {
    return db
        .execAndGet("SELECT state FROM receipts WHERE task_id = '" + job +
                    "' AND transition != 'started'")
        .getString();
  };
  REQUIRE(receipt_state() == "acked");
  persistence::settle_request late;
  late.child = session_id("child");
  late.background_job = protocol::job_id(job);
  late.body = "stale";
  auto r = f.sync(f.host->store().settle(late));
  REQUIRE(r);
  CHECK_FALSE(r->row_written);
  CHECK(receipt_state() == "acked");
  CHECK(
      db.execAndGet("SELECT body FROM tasks WHERE id = '" + job + "'").getString().find("answer") !=
      std::string::npos);
  auto owed = f.host->store().outstanding_jobs();
  REQUIRE(owed);
  CHECK(owed->empty());
  f.restart();
  f.quiet();
  CHECK(f.boot.delivered == 0);
  CHECK(f.inbox("parent").size() == 1);
}

TEST_CASE(
    "a job cancelled as its child starts is reported once, cancelled, whether the cancel comes "
    "before or during the child's first drain") {
  // The cancel is sent right behind the child's first wake, but it first reads
  // the child's row: the child may begin its busy period meanwhile. Its drain
  // waits until cancelled, so either way the period ends cancelled (the test
  // used to let the child say its answer, and a slow cancel lost the race).
  report_fixture f("creationtick");
  auto parent = f.code("parent");
  parent->fn = [](agent_context& ctx, drain_input in) -> boost::asio::awaitable<void> {
    if (in.inputs.empty() || in.inputs.front().kind != "prompt") co_return;
    actors::spawn_request req;
    req.child = session_id("child");
    req.description = "Audit routes";
    req.prompt = "go";
    auto c = co_await ctx.spawn_background(std::move(req));
    if (c) (void)co_await ctx.cancel_child(*c);  // queued right behind the child's first wake
  };
  f.code("child")->fn = [](agent_context&, drain_input) -> boost::asio::awaitable<void> {
    co_await until_cancelled();
  };
  auto p = f.sync(f.host->create_session("parent", session_id("parent")));
  REQUIRE(p);
  REQUIRE(f.sync(f.host->prompt(*p, "start")));
  f.quiet();
  auto inbox = f.inbox("parent");
  REQUIRE(inbox.size() == 1);
  CHECK(inbox[0].body.find("state=\"cancelled\"") != std::string::npos);
  CHECK(f.observer->settled_of("child") == 1);
}

TEST_CASE("last_assistant_after pages back past 20 rows and skips errors and older periods") {
  report_fixture f("paging");
  auto s = f.sync(f.host->create_session("s", session_id("s")));
  REQUIRE(s);
  auto& st = f.host->store();
  REQUIRE(f.sync(st.append(*s, "assistant", "answer", "completed", "before the boundary")));  // 1
  REQUIRE(f.sync(st.append(*s, "user", "prompt", "completed", "go")));                        // 2
  REQUIRE(f.sync(st.append(*s, "assistant", "answer", "completed", "the answer")));           // 3
  for (int i = 0; i < 45; ++i)
    REQUIRE(f.sync(st.append(*s, i % 2 ? "user" : "assistant", "answer",
                             i % 2 ? "completed" : "error", "noise " + std::to_string(i))));
  auto a = st.last_assistant_after(*s, 2);
  REQUIRE(a);
  REQUIRE(*a);
  CHECK((*a)->text == "the answer");
  CHECK((*a)->seq == 3);
  auto none = st.last_assistant_after(*s, 3);
  REQUIRE(none);
  CHECK_FALSE(*none);
}

TEST_CASE("graceful shutdown keeps the claim and the running row and sends no cancelled report") {
  report_fixture f("graceful");
  f.spawn_blocking_child();
  f.close();
  {
    SQLite::Database db(f.dir.file("tether.db"), SQLite::OPEN_READONLY);
    CHECK(db.execAndGet("SELECT count(*) FROM tasks WHERE state = 'running'").getInt() == 1);
    CHECK(db.execAndGet("SELECT time_suspended IS NOT NULL FROM sessions WHERE id = 'child'")
              .getInt() == 1);
    CHECK(db.execAndGet("SELECT count(*) FROM inbox").getInt() == 0);
  }
  // On restart the child resumes and reports its busy period once.
  f.agents->code.erase("child");
  f.on("child", 1, {say("finished after the restart")});
  f.open();
  f.quiet();
  auto inbox = f.inbox("parent");
  REQUIRE(inbox.size() == 1);
  CHECK(inbox[0].body.find("state=\"completed\"") != std::string::npos);
  CHECK(inbox[0].body.find("finished after the restart") != std::string::npos);
}

TEST_CASE("a child out of resume budget reports an error instead of running again") {
  report_fixture f("budget", /*resume_budget=*/1);
  auto child = f.code("child");
  std::atomic<int> runs{0};
  auto entered =
      std::make_shared<std::shared_ptr<runtime::one_shot<int>>>(runtime::one_shot<int>::make());
  child->fn = [&runs, entered](agent_context&, drain_input) -> boost::asio::awaitable<void> {
    ++runs;
    (*entered)->set(1);
    co_await until_cancelled();
  };
  f.parent_spawns("child");
  f.sync((*entered)->async_wait(boost::asio::use_awaitable));
  f.close();
  // First restart: within budget, the child runs again (and blocks again).
  *entered = runtime::one_shot<int>::make();
  f.open();
  CHECK(f.boot.exhausted == 0);
  f.sync((*entered)->async_wait(boost::asio::use_awaitable));
  f.close();
  // Second restart: the budget is spent; the job reports an error.
  f.open();
  f.quiet();
  CHECK(f.boot.exhausted == 1);
  CHECK(runs == 2);
  auto inbox = f.inbox("parent");
  REQUIRE(inbox.size() == 1);
  CHECK(inbox[0].body.find("state=\"error\"") != std::string::npos);
  CHECK(inbox[0].body.find("resume budget") != std::string::npos);
}

TEST_CASE("an owed report whose parent was deleted is cleared at boot with a warning") {
  report_fixture f("deletedparent");
  f.spawn_blocking_child();
  f.close();
  {
    SQLite::Database db(f.dir.file("tether.db"), SQLite::OPEN_READWRITE);
    // As a settle leaves it: the task terminal, its terminal receipt pending.
    db.exec("UPDATE tasks SET state = 'completed', body = 'owed' WHERE kind = 'subagent'");
    db.exec(
        "INSERT INTO receipts (id, task_id, transition, scope, body, state, created_at, "
        "updated_at) SELECT t.id || '/completed', t.id, 'completed', r.scope, 'owed', 'pending', "
        "0, 0 FROM tasks t JOIN receipts r ON r.id = t.id || '/started'");
    db.exec("DELETE FROM sessions WHERE id = 'parent'");
  }
  f.agents->code.erase("child");
  f.open();
  f.quiet();
  SQLite::Database db(f.dir.file("tether.db"), SQLite::OPEN_READONLY);
  // Nobody is owed the report any more: its receipt is dropped, the task stays.
  CHECK(db.execAndGet("SELECT state FROM receipts WHERE transition = 'completed'").getString() ==
        "dropped");
  CHECK(db.execAndGet("SELECT count(*) FROM tasks WHERE state = 'completed'").getInt() == 1);
  std::lock_guard lk(f.m);
  bool warned = false;
  for (auto& w : f.warnings)
    warned |= w.find("parent is gone") != std::string::npos || w.find("gone") != std::string::npos;
  CHECK(warned);
}

TEST_CASE("boot refuses a job row that does not parse and leaves it in place") {
  report_fixture f("corrupt");
  f.close();
  f.insert_job_row("job_42", "completed", "{\"description\": ");
  auto err = f.refused_boot();
  CHECK(err.code == errc::corrupt);
  CHECK(err.message.find("refusing to boot") != std::string::npos);
  CHECK(err.message.find("table 'tasks' key 'job_42'") != std::string::npos);
  CHECK(err.message.find("payload") != std::string::npos);
  SQLite::Database db(f.dir.file("tether.db"), SQLite::OPEN_READONLY);
  CHECK(db.execAndGet("SELECT count(*) FROM tasks WHERE id = 'job_42'").getInt() == 1);
}

TEST_CASE(
    "boot refuses a terminal subagent row with no terminal receipt, since it cannot tell whether "
    "its report is owed, and leaves it in place") {
  report_fixture f("no-terminal-receipt");
  f.close();
  f.insert_job_row("job_9", "completed", "{\"description\": \"Audit routes\"}");
  auto err = f.refused_boot();
  CHECK(err.code == errc::corrupt);
  CHECK(err.message.find("table 'tasks' key 'job_9': state: terminal with no terminal receipt") !=
        std::string::npos);
  SQLite::Database db(f.dir.file("tether.db"), SQLite::OPEN_READONLY);
  CHECK(db.execAndGet("SELECT count(*) FROM tasks WHERE id = 'job_9'").getInt() == 1);
}

TEST_CASE("boot refuses an unknown enum value naming table, key and field") {
  report_fixture f("badenum");
  f.close();
  f.insert_job_row("job_7", "exploded", "{}");
  auto err = f.refused_boot();
  CHECK(err.message.find("table 'tasks' key 'job_7': state: unknown value") != std::string::npos);
  CHECK(err.message.find("'exploded'") != std::string::npos);
}

TEST_CASE("a background child reports its answer to the parent once") {
  report_fixture f("bg");
  f.on("parent", 1, {spawn("child", "Audit routes", "check the routes"), say("Started an audit.")});
  f.on("child", 1, {say("All 14 routes answer.")});
  auto p = f.sync(f.host->create_session("parent", session_id("parent")));
  REQUIRE(p);
  REQUIRE(f.sync(f.host->prompt(*p, "audit the routes")));
  f.quiet();
  auto inbox = f.inbox("parent");
  REQUIRE(inbox.size() == 1);
  CHECK(inbox[0].body ==
        "<subagent sessionID=\"child\" state=\"completed\" description=\"Audit routes\">\n"
        "All 14 routes answer.\n"
        "</subagent>");
  CHECK(inbox[0].acked);
  auto msgs = f.host->store().messages(session_id("parent"));
  REQUIRE(msgs);
  int reports = 0;
  for (auto& m : *msgs) reports += (m.kind == "report" && m.text == inbox[0].body) ? 1 : 0;
  CHECK(reports == 1);
  auto jobs = f.host->store().outstanding_jobs();
  REQUIRE(jobs);
  CHECK(jobs->empty());  // the outbox row completed
}

TEST_CASE("a follow-up job that joins a running busy period is answered and reported once") {
  report_fixture f("joins");
  auto child = f.code("child");
  auto entered = runtime::one_shot<int>::make();
  auto gate = runtime::one_shot<int>::make();
  child->fn = [entered, gate](agent_context& ctx, drain_input in) -> boost::asio::awaitable<void> {
    for (auto& m : in.inputs) {
      if (m.text == "human") {
        entered->set(1);
        co_await gate->async_wait(boost::asio::use_awaitable);
      }
      co_await ctx.say("answered " + m.text);
    }
  };
  f.on("parent", 1, {spawn("child", "Audit routes", "first")});
  f.on("parent", 3, {spawn("child", "Audit routes", "follow-up")});
  f.parent_spawns("child");
  f.quiet();
  REQUIRE(f.inbox("parent").size() == 1);
  REQUIRE(f.sync(f.host->prompt(session_id("child"), "human")));
  f.sync(entered->async_wait(boost::asio::use_awaitable));
  REQUIRE(f.sync(f.host->prompt(session_id("parent"), "ask the child again")));
  f.sync(f.host->wait_idle(session_id("parent")));
  gate->set(1);
  f.quiet();
  auto inbox = f.inbox("parent");
  int follow_up = 0;
  for (auto& r : inbox) follow_up += r.body.find("answered follow-up") != std::string::npos ? 1 : 0;
  CHECK(follow_up == 1);
  auto jobs = f.host->store().outstanding_jobs();
  REQUIRE(jobs);
  CHECK(jobs->empty());
}
