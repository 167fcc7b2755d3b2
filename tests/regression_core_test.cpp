// Regressions of the run coordinator and the job queue found by trying main
// adversarially (issue 10): failed writes that must be retried, not dropped;
// interrupts and cancels that must reach what they stop; follow-ups that
// must not cross an ownership line.
#include <atomic>

#include "delivery_support.hpp"

using namespace tether;
using namespace tether::test;
using protocol::transition;

// A turn that settles at once (report_now) and leaves its job blocked on a
// FIFO: when the FIFO is released, nothing else writes, so the COMMIT the
// trace hook makes fail is the one the test means.
job_id settled_turn_with_blocked_job(delivery_fixture& d, launcher& l, const std::string& gate,
                                     const std::string& output) {
  l.install(d, "s", job("cat " + gate + "; echo " + output));
  auto s = d.session("s");
  REQUIRE(d.sync(d.host().set_job_policy(s, true, "report_now")));
  REQUIRE(d.sync(d.host().prompt(s, "build it")));
  REQUIRE(d.sync(d.host().wait_idle(s)));
  return l.id(d);
}

TEST_CASE("a terminal write that fails is retried until the receipt commits and reaches its turn",
          "[regression][delivery]") {
  delivery_fixture d("finish-retry");
  // The next COMMIT after the completion arrived is the terminal CAS: it fails.
  d.f.jobs.trace = [&d](const job_id&, std::string_view stage) {
    if (stage == "completion") d.host().store().db_writer().inject_commit_failures(1);
  };
  d.f.restart();
  auto gate = d.fifo("gate");
  launcher l;
  auto j = settled_turn_with_blocked_job(d, l, gate, "written-after-a-retry");
  d.release(gate);
  d.sync(d.host().jobs().wait_idle());  // the job left the live set: its receipt committed
  d.f.quiet();
  CHECK(d.host().store().db_writer().stats().failed_commits == 1);
  CHECK(d.state_of(j) == owned_state::completed);
  CHECK(d.receipt_state_of(j, transition::completed) == "acked");
  CHECK(d.transcript_count("s", "notice", "written-after-a-retry") == 1);
  CHECK(warned(d.f, {j.str(), "was not written", "retried"}));
}

TEST_CASE("a receipt whose hand-over fails is handed over again while the host runs",
          "[regression][delivery]") {
  delivery_fixture d("deliver-retry");
  // The next COMMIT after the terminal one is the hand-over's admit: it fails.
  d.f.jobs.trace = [&d](const job_id&, std::string_view stage) {
    if (stage == "terminal") d.host().store().db_writer().inject_commit_failures(1);
  };
  d.f.restart();
  auto gate = d.fifo("gate");
  launcher l;
  auto j = settled_turn_with_blocked_job(d, l, gate, "handed-over-after-a-retry");
  d.release(gate);
  d.sync(d.host().jobs().wait_idle());
  d.f.quiet();
  CHECK(d.host().store().db_writer().stats().failed_commits == 1);
  // Prompted into its session now, not left pending for the next boot.
  CHECK(d.receipt_state_of(j, transition::completed) == "acked");
  CHECK(d.transcript_count("s", "notice", "handed-over-after-a-retry") == 1);
  CHECK(d.f.observer->started_of("s") == 2);
  CHECK(warned(d.f, {j.str(), "was not handed over", "retried"}));
}

TEST_CASE("a failed settle commit keeps the report under its promised id", "[regression]") {
  report_fixture f("settle-retry");
  auto gate = runtime::one_shot<int>::make();
  f.code("child")->fn = [gate](agent_context& ctx, drain_input) -> boost::asio::awaitable<void> {
    co_await gate->async_wait(boost::asio::use_awaitable);
    co_await ctx.say("the answer");
  };
  // The settle's COMMIT fails once (nothing else writes then: the parent is idle).
  std::atomic<bool> injected{false};
  f.observer->on_settling = [&](const session_id& s) -> boost::asio::awaitable<void> {
    if (s.str() == "child" && !injected.exchange(true))
      f.host->store().db_writer().inject_commit_failures(1);
    co_return;
  };
  f.parent_spawns("child");
  REQUIRE(f.sync(f.host->wait_idle(session_id("parent"))));
  auto jobs = f.host->store().outstanding_jobs();
  REQUIRE(jobs);
  REQUIRE(jobs->size() == 1);
  auto promised = (*jobs)[0].nid;
  gate->set(1);
  f.quiet();
  CHECK(injected);
  CHECK(f.host->store().db_writer().stats().failed_commits == 1);
  auto inbox = f.inbox("parent");
  REQUIRE(inbox.size() == 1);
  CHECK(inbox[0].nid == promised);
  CHECK(inbox[0].body.find("the answer") != std::string::npos);
  CHECK(f.observer->settled_of("child") == 1);
  auto child = f.host->store().session(session_id("child"));
  REQUIRE(child);
  REQUIRE(*child);
  CHECK_FALSE((*child)->time_suspended);  // the claim was released by the retried settle
  jobs = f.host->store().outstanding_jobs();
  REQUIRE(jobs);
  CHECK(jobs->empty());
  CHECK(warned(f, {"child", "settle did not commit", "retried"}));
}

TEST_CASE("cancelling a foreground caller interrupts its child", "[regression]") {
  report_fixture f("fg-cancel");
  auto entered = runtime::one_shot<int>::make();
  auto answered = runtime::one_shot<result<std::string>>::make();
  f.code("parent")->fn = [answered](agent_context& ctx,
                                    drain_input in) -> boost::asio::awaitable<void> {
    if (in.inputs.empty() || in.inputs.front().kind != "prompt") co_return;
    actors::spawn_request req;
    req.child = session_id("child");
    req.description = "Audit routes";
    req.prompt = "go";
    auto r = co_await ctx.spawn_foreground(std::move(req));
    answered->set(r);
  };
  f.code("child")->fn = [entered](agent_context&, drain_input) -> boost::asio::awaitable<void> {
    entered->set(1);
    co_await until_cancelled();
  };
  auto p = f.sync(f.host->create_session("parent", session_id("parent")));
  REQUIRE(p);
  REQUIRE(f.sync(f.host->prompt(*p, "start")));
  f.sync(entered->async_wait(boost::asio::use_awaitable));
  f.host->interrupt(*p);
  REQUIRE(f.sync(f.host->wait_idle(*p)));
  // The child's run was cancelled with its caller: it settles, once, as cancelled.
  REQUIRE(f.sync(f.host->wait_idle(session_id("child"))));
  auto r = f.sync(answered->async_wait(boost::asio::use_awaitable));
  REQUIRE_FALSE(r);
  CHECK(r.error().code == errc::cancelled);
  CHECK(f.observer->settled_of("child") == 1);
  auto child = f.host->store().session(session_id("child"));
  REQUIRE(child);
  REQUIRE(*child);
  CHECK((*child)->idle_outcome == std::optional<std::string>("cancelled"));
  CHECK_FALSE((*child)->time_suspended);
  CHECK(f.inbox("parent").empty());  // foreground: no report in the inbox
  f.quiet();
}

namespace {

// A session whose every prompt sends one spawn request; the results are kept.
struct spawner {
  std::mutex m;
  std::vector<result<session_id>> results;
  actors::spawn_request req;

  void install(report_fixture& f, const std::string& s) {
    f.code(s)->fn = [this](agent_context& ctx, drain_input in) -> boost::asio::awaitable<void> {
      for (auto& i : in.inputs) {
        if (i.kind != "prompt") continue;
        auto r = co_await ctx.spawn_background(req);
        std::lock_guard lk(m);
        results.push_back(r);
      }
    };
  }
  result<session_id> last() {
    std::lock_guard lk(m);
    REQUIRE_FALSE(results.empty());
    return results.back();
  }
};

void set_tenant(report_fixture& f, const std::string& s, const std::string& tenant) {
  f.close();
  {
    SQLite::Database db(f.dir.file("tether.db"), SQLite::OPEN_READWRITE);
    SQLite::Statement st(db, "UPDATE sessions SET tenant = ? WHERE id = ?");
    st.bind(1, tenant);
    st.bind(2, s);
    REQUIRE(st.exec() == 1);
  }
  f.open();
}

int transcript_mentions(report_fixture& f, const std::string& s, const std::string& text) {
  auto msgs = f.host->store().messages(session_id(s));
  REQUIRE(msgs);
  int n = 0;
  for (auto& m : *msgs) n += m.text.find(text) != std::string::npos ? 1 : 0;
  return n;
}

}  // namespace

TEST_CASE("a fork naming an existing session is refused and that session is not prompted",
          "[regression]") {
  report_fixture f("fork-existing");
  f.on("child", 1, {say("the audit is done")});
  f.parent_spawns("child");
  f.quiet();
  REQUIRE(f.inbox("parent").size() == 1);
  spawner a;
  a.req.child = session_id("child");
  a.req.fork = true;
  a.req.description = "hijack";
  a.req.prompt = "report this to your parent";
  a.install(f, "stranger");
  auto s = f.sync(f.host->create_session("stranger", session_id("stranger")));
  REQUIRE(s);
  REQUIRE(f.sync(f.host->prompt(*s, "go")));
  f.quiet();
  auto r = a.last();
  REQUIRE_FALSE(r);
  CHECK(r.error().code == errc::refused);
  CHECK(r.error().message.find("a fork creates a new session") != std::string::npos);
  CHECK(transcript_mentions(f, "child", "report this to your parent") == 0);
  CHECK(f.inbox("parent").size() == 1);  // nothing reached the child's parent
  auto jobs = f.host->store().outstanding_jobs();
  REQUIRE(jobs);
  CHECK(jobs->empty());
}

TEST_CASE("a follow-up reaches one's own child of one's own tenant and nothing else",
          "[regression]") {
  report_fixture f("follow-up-tenant");
  spawner p;
  p.req.child = session_id("child");
  p.req.description = "Audit routes";
  p.req.prompt = "check again";
  p.install(f, "parent");
  f.on("child", 1, {say("first check")});
  f.on("child", 2, {say("second check")});
  auto s = f.sync(f.host->create_session("parent", session_id("parent")));
  REQUIRE(s);
  set_tenant(f, "parent", "acme");
  // The child is created in the parent's tenant, so a follow-up reaches it.
  REQUIRE(f.sync(f.host->prompt(*s, "start")));
  f.quiet();
  REQUIRE(f.sync(f.host->prompt(*s, "again")));
  f.quiet();
  REQUIRE(p.last());
  auto child = f.host->store().session(session_id("child"));
  REQUIRE(child);
  REQUIRE(*child);
  CHECK((*child)->tenant.str() == "acme");
  CHECK(f.inbox("parent").size() == 2);
  // The same link across tenants is refused.
  set_tenant(f, "child", "other");
  REQUIRE(f.sync(f.host->prompt(*s, "once more")));
  f.quiet();
  auto r = p.last();
  REQUIRE_FALSE(r);
  CHECK(r.error().code == errc::refused);
  CHECK(transcript_mentions(f, "child", "check again") == 2);
  CHECK(f.inbox("parent").size() == 2);
}

TEST_CASE("an interrupt does not swallow the wake of a report admitted while the parent was busy",
          "[regression]") {
  report_fixture f("interrupt-report");
  auto parked = runtime::one_shot<int>::make();
  auto later = std::make_shared<std::vector<std::string>>();  // kinds in later drains
  auto m = std::make_shared<std::mutex>();
  f.code("parent")->fn = [parked, later, m](agent_context& ctx,
                                            drain_input in) -> boost::asio::awaitable<void> {
    bool first = !in.inputs.empty() && in.inputs.front().kind == "prompt";
    if (!first) {
      std::lock_guard lk(*m);
      for (auto& i : in.inputs) later->push_back(i.kind);
      co_return;
    }
    actors::spawn_request req;
    req.child = session_id("child");
    req.description = "Audit routes";
    req.prompt = "go";
    (void)co_await ctx.spawn_background(std::move(req));
    parked->set(1);
    co_await until_cancelled();
  };
  auto gate = runtime::one_shot<int>::make();
  f.code("child")->fn = [gate](agent_context& ctx, drain_input) -> boost::asio::awaitable<void> {
    co_await gate->async_wait(boost::asio::use_awaitable);
    co_await ctx.say("the child's answer");
  };
  auto p = f.sync(f.host->create_session("parent", session_id("parent")));
  REQUIRE(p);
  REQUIRE(f.sync(f.host->prompt(*p, "start")));
  f.sync(parked->async_wait(boost::asio::use_awaitable));
  gate->set(1);
  // The child's settle admitted its report and told the busy parent to wake.
  REQUIRE(f.sync(f.host->wait_idle(session_id("child"))));
  f.host->interrupt(*p);
  f.quiet();
  auto inbox = f.inbox("parent");
  REQUIRE(inbox.size() == 1);
  CHECK(inbox[0].acked);  // taken by a drain after the interrupted settle
  CHECK(transcript_mentions(f, "parent", "the child's answer") == 1);
  CHECK(f.observer->started_of("parent") == 2);
  std::lock_guard lk(*m);
  CHECK(*later == std::vector<std::string>{"report"});
}

namespace {

// An adapter route over its own connection to the daemon that answers the
// first `refusals` kills with a refusal (an answer, so no fallback): the kill
// is not confirmed.
class refusing_kill_route : public actors::command_route {
 public:
  refusing_kill_route(std::unique_ptr<sandbox::client> c,
                      std::shared_ptr<std::atomic<int>> refusals)
      : real_("refusing-inner", std::move(c)), refusals_(std::move(refusals)) {}
  std::string name() const override { return "refusing-adapter"; }
  awaitable<result<wire::started_rep>> exec(wire::exec_req r) override {
    co_return co_await real_.exec(std::move(r));
  }
  awaitable<result<protocol::shell_completion>> wait(job_id job) override {
    co_return co_await real_.wait(std::move(job));
  }
  awaitable<result<protocol::shell_completion>> kill(job_id job) override {
    if (refusals_->fetch_sub(1) > 0)
      co_return error{errc::refused, "injected: the kill was refused", true};
    co_return co_await real_.kill(std::move(job));
  }
  void close() override { real_.close(); }

 private:
  actors::client_route real_;
  std::shared_ptr<std::atomic<int>> refusals_;
};

awaitable<result<std::shared_ptr<actors::command_route>>> refusing_adapter(
    std::string socket, std::shared_ptr<std::atomic<int>> refusals) {
  auto c = co_await sandbox::client::connect(socket, wire::conn_mode::read_write, "refusing");
  if (!c) co_return c.error();
  co_return std::shared_ptr<actors::command_route>(
      std::make_shared<refusing_kill_route>(std::move(*c), std::move(refusals)));
}

}  // namespace

TEST_CASE("a turn whose stop is not confirmed stays open until its jobs are confirmed stopped",
          "[regression][delivery]") {
  delivery_fixture d("stop-retry");
  auto refusals = std::make_shared<std::atomic<int>>(1);
  d.f.jobs.adapter = [refusals](std::string socket) {
    return refusing_adapter(std::move(socket), refusals);
  };
  d.f.restart();
  launcher l;
  l.install(d, "s", job("sleep 30"));
  auto s = d.session("s");
  REQUIRE(d.sync(d.host().prompt(s, "go")));
  auto j = l.id(d);
  d.host().interrupt(s);
  REQUIRE(d.sync(d.host().wait_idle(s)));
  // The first kill was refused; the turn closed only after a confirmed one.
  CHECK(refusals->load() < 0);
  CHECK(d.state_of(j) == owned_state::cancelled);
  CHECK(warned(d.f, {"stopping turn", "injected: the kill was refused", "retried"}));
  d.sync(d.host().jobs().wait_idle());
}

TEST_CASE(
    "a busy period whose observer throws ends, is logged, and its report comes after a restart",
    "[regression]") {
  report_fixture f("observer-throws");
  f.on("child", 1, {say("the answer")});
  std::atomic<bool> thrown{false};
  f.observer->on_settling = [&](const session_id& s) -> boost::asio::awaitable<void> {
    if (s.str() == "child" && !thrown.exchange(true))
      throw std::runtime_error("the observer broke");
    co_return;
  };
  f.parent_spawns("child");
  f.quiet();  // the busy period ended: nothing is left counted as active
  CHECK(thrown);
  CHECK(warned(f, {"child", "busy period failed", "the observer broke"}));
  CHECK_FALSE(f.host->is_busy(session_id("child")));
  auto jobs = f.host->store().outstanding_jobs();
  REQUIRE(jobs);
  REQUIRE(jobs->size() == 1);  // the running row stays for the next boot
  auto promised = (*jobs)[0].nid;
  f.restart();  // the shutdown does not hang on the failed busy period
  f.quiet();
  auto inbox = f.inbox("parent");
  REQUIRE(inbox.size() == 1);
  CHECK(inbox[0].nid == promised);
  CHECK(inbox[0].body.find("the answer") != std::string::npos);
}

TEST_CASE(
    "a follow of a job that throws ends its live entry, is logged, and the next boot settles it",
    "[regression][delivery]") {
  delivery_fixture d("watch-throws");
  std::atomic<bool> thrown{false};
  d.f.jobs.trace = [&thrown](const job_id&, std::string_view stage) {
    if (stage == "completion" && !thrown.exchange(true))
      throw std::runtime_error("the trace hook broke");
  };
  d.f.restart();
  launcher l;
  l.install(d, "s", job("echo followed-after-a-restart"));
  auto s = d.session("s");
  REQUIRE(d.sync(d.host().prompt(s, "build it")));
  REQUIRE(d.sync(d.host().wait_idle(s)));  // the withholding turn was not left waiting
  auto j = l.id(d);
  d.sync(d.host().jobs().wait_idle());
  CHECK(thrown);
  CHECK(warned(d.f, {j.str(), "following it failed", "the trace hook broke"}));
  CHECK(d.state_of(j) == owned_state::running);  // as it is on disk
  d.f.restart();                                 // recovery finds the job ended and settles it once
  d.sync(d.host().jobs().wait_idle());
  d.f.quiet();
  CHECK(d.state_of(j) == owned_state::completed);
  CHECK(d.transcript_count("s", "notice", "followed-after-a-restart") == 1);
}

TEST_CASE("a follow-up to a busy child joins its live generation: one report, no empty one",
          "[regression]") {
  report_fixture f("join-live");
  auto parked = runtime::one_shot<int>::make();
  auto gate = runtime::one_shot<int>::make();
  f.code("child")->fn = [parked, gate](agent_context& ctx,
                                       drain_input in) -> boost::asio::awaitable<void> {
    for (auto& i : in.inputs) {
      if (i.text == "first") {
        parked->set(1);
        co_await gate->async_wait(boost::asio::use_awaitable);
      }
      co_await ctx.say("answered " + i.text);
    }
  };
  spawner p;
  p.req.child = session_id("child");
  p.req.description = "Audit routes";
  p.install(f, "parent");
  auto s = f.sync(f.host->create_session("parent", session_id("parent")));
  REQUIRE(s);
  p.req.prompt = "first";
  REQUIRE(f.sync(f.host->prompt(*s, "start")));
  f.sync(parked->async_wait(boost::asio::use_awaitable));
  REQUIRE(f.sync(f.host->wait_idle(*s)));
  p.req.prompt = "follow-up";
  REQUIRE(f.sync(f.host->prompt(*s, "again")));  // the child is still busy with "first"
  REQUIRE(f.sync(f.host->wait_idle(*s)));
  REQUIRE(p.last());
  auto jobs = f.host->store().outstanding_jobs();
  REQUIRE(jobs);
  CHECK(jobs->size() == 1);  // joined: no job row of its own
  gate->set(1);
  f.quiet();
  auto inbox = f.inbox("parent");
  REQUIRE(inbox.size() == 1);
  CHECK(inbox[0].body.find("answered follow-up") != std::string::npos);
  for (auto& r : inbox) CHECK(r.body.find(protocol::k_no_text_response) == std::string::npos);
  CHECK(f.observer->settled_of("child") == 1);
  jobs = f.host->store().outstanding_jobs();
  REQUIRE(jobs);
  CHECK(jobs->empty());
}

TEST_CASE("a job followed since recovery that ends during boot wakes nobody before boot's phases",
          "[regression][delivery]") {
  delivery_fixture d("held-handover");
  auto terminal = runtime::one_shot<int>::make();
  auto armed = std::make_shared<std::atomic<bool>>(false);
  d.f.jobs.trace = [terminal, armed](const job_id&, std::string_view stage) {
    if (stage == "terminal" && *armed) terminal->set(1);
  };
  d.f.restart();
  auto gate = d.fifo("gate");
  launcher l;
  auto j = settled_turn_with_blocked_job(d, l, gate, "ended-during-boot");
  d.f.close();
  // A host whose boot stopped right after recovery: its sessions are not resumed yet.
  *armed = true;
  actors::host_options o;
  o.db_path = d.f.dir.file("tether.db");
  o.threads = 2;
  o.agents = d.f.agents;
  o.observer = d.f.observer;
  o.jobs = d.f.jobs;
  o.log = [](const std::string&) {};
  auto opened = actors::host::open(o);
  REQUIRE(opened);
  auto& h = **opened;
  auto ex = h.pool().at(0);  // the queue's executor
  auto rec = runtime::sync_wait(ex, h.jobs().recover());
  REQUIRE(rec);
  CHECK(rec->reattached == 1);
  d.release(gate);
  runtime::sync_wait(ex, terminal->async_wait(boost::asio::use_awaitable));
  // Behind the terminal commit on the queue's executor: the hand-over waits.
  auto held = [](actors::host* hp) -> boost::asio::awaitable<int> {
    co_return hp->jobs().held_handovers();
  };
  CHECK(runtime::sync_wait(ex, held(&h)) == 1);
  auto pending = h.store().receipt_by_id(protocol::make_event_id(j, transition::completed));
  REQUIRE(pending);
  REQUIRE(*pending);
  CHECK((*pending)->state == receipt_state::pending);
  auto inbox = h.store().inbox(session_id("s"));
  REQUIRE(inbox);
  CHECK(inbox->empty());
  // Boot's phases are done: the receipt is handed over and prompts its session.
  h.jobs().sessions_resumed();
  runtime::sync_wait(ex, h.jobs().wait_idle());
  runtime::sync_wait(ex, h.wait_quiescent());
  auto after = h.store().receipt_by_id(protocol::make_event_id(j, transition::completed));
  REQUIRE(after);
  REQUIRE(*after);
  CHECK((*after)->state == receipt_state::acked);
  auto msgs = h.store().messages(session_id("s"));
  REQUIRE(msgs);
  int notices = 0;
  for (auto& m : *msgs) notices += m.text.find("ended-during-boot") != std::string::npos ? 1 : 0;
  CHECK(notices == 1);
  h.shutdown();
}
