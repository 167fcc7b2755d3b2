// Owned delivery of job receipts (seed 000): receipts bound to the owning
// turn, the delivery protocol, withholding, status reads, cancel with
// confirmation. Every job is a real process in a real tether-sandboxd.
#include <future>
#include <thread>

#include "delivery_support.hpp"
#include "tether/actors/command_route.hpp"

using namespace tether;
using namespace tether::test;
using protocol::transition;

namespace {

// A kill held in its route: `entered` once the kill reached it, which then
// waits for `release` before it goes to the daemon.
struct kill_hold {
  std::atomic<int> kills{0};
  std::shared_ptr<runtime::one_shot<int>> entered = runtime::one_shot<int>::make();
  std::shared_ptr<runtime::one_shot<int>> release = runtime::one_shot<int>::make();
};

// An adapter route over its own daemon connection whose kills are held.
class held_kill_route : public actors::command_route {
 public:
  held_kill_route(std::unique_ptr<sandbox::client> c, std::shared_ptr<kill_hold> hold)
      : real_("held-kill-inner", std::move(c)), hold_(std::move(hold)) {}
  std::string name() const override { return "held-kill"; }
  awaitable<result<wire::started_rep>> exec(wire::exec_req r) override {
    co_return co_await real_.exec(std::move(r));
  }
  awaitable<result<protocol::shell_completion>> wait(job_id job) override {
    co_return co_await real_.wait(std::move(job));
  }
  awaitable<result<protocol::shell_completion>> kill(job_id job) override {
    ++hold_->kills;
    hold_->entered->set(0);
    co_await hold_->release->async_wait(boost::asio::use_awaitable);
    co_return co_await real_.kill(std::move(job));
  }
  awaitable<result<std::vector<job_id>>> expire(job_id job) override {
    co_return co_await real_.expire(std::move(job));
  }
  void close() override { real_.close(); }

 private:
  actors::client_route real_;
  std::shared_ptr<kill_hold> hold_;
};

awaitable<result<std::shared_ptr<actors::command_route>>> make_held_kill_route(
    std::string socket, std::shared_ptr<kill_hold> hold) {
  auto c = co_await sandbox::client::connect(socket, wire::conn_mode::read_write, "held kill");
  if (!c) co_return c.error();
  co_return std::shared_ptr<actors::command_route>(
      std::make_shared<held_kill_route>(std::move(*c), std::move(hold)));
}

awaitable<void> cancel_into(actors::job_queue* q, protocol::owner_scope scope, job_id j,
                            std::shared_ptr<runtime::one_shot<result<job_view>>> out) {
  out->set(co_await q->cancel(std::move(scope), std::move(j)));
}

// `s` (its launcher installed) settles at once ("report_now") after a
// prompt that launched its job, which is still running: the session and the job.
std::pair<session_id, job_id> launched_and_settled(delivery_fixture& d, launcher& l) {
  auto s = d.session("s");
  REQUIRE(d.sync(d.host().set_job_policy(s, true, "report_now")));
  REQUIRE(d.sync(d.host().prompt(s, "go")));
  auto j = l.id(d);
  REQUIRE(d.sync(d.host().wait_idle(s)));
  return {s, j};
}

}  // namespace

TEST_CASE(
    "a job's completion is steered into the turn that owns it, which withholds its completion "
    "until then",
    "[delivery]") {
  delivery_fixture d("steer");
  launcher l;
  l.install(d, "s", job("echo hello-from-job"));
  auto s = d.session("s");
  REQUIRE(d.sync(d.host().prompt(s, "build it")));
  REQUIRE(d.sync(d.host().wait_idle(s)));
  auto j = l.id(d);
  // One busy period: the turn stayed open until its job's notice arrived in it.
  CHECK(d.f.observer->started_of("s") == 1);
  CHECK(d.f.observer->settled_of("s") == 1);
  CHECK(l.seen("notice") == 1);
  CHECK(d.transcript_count("s", "notice", j.str()) == 1);
  CHECK(d.transcript_count("s", "notice", "hello-from-job") == 1);
  CHECK(d.state_of(j) == owned_state::completed);
  CHECK(d.receipt_state_of(j, transition::started) == "acked");
  CHECK(d.receipt_state_of(j, transition::completed) == "acked");
  CHECK(d.receipts(j).size() == 2);
}

TEST_CASE("once a job's terminal receipt is written its host expires the daemon's record",
          "[delivery]") {
  delivery_fixture d("expire");
  launcher l;
  l.install(d, "s", job("echo short-job"));
  auto s = d.session("s");
  REQUIRE(d.sync(d.host().prompt(s, "build it")));
  REQUIRE(d.sync(d.host().wait_idle(s)));
  d.sync(d.host().jobs().wait_idle());
  auto j = l.id(d);
  CHECK(d.receipt_state_of(j, transition::completed) == "acked");
  auto listed = [&]() -> boost::asio::awaitable<std::vector<wire::job_summary>> {
    auto c = co_await connect(d.daemon.socket(), wire::conn_mode::read_only);
    auto l = co_await c->list();
    REQUIRE(l.has_value());
    co_return l->jobs;
  };
  CHECK(run(listed()).empty());  // not kept for hours: its host has the receipt
}

TEST_CASE("with report_now a turn settles at once and the receipt arrives later as a prompt",
          "[delivery]") {
  delivery_fixture d("report-now");
  auto gate = d.fifo("gate");
  launcher l;
  l.install(d, "s", job("cat " + gate + "; echo done-later"));
  auto s = d.session("s");
  REQUIRE(d.sync(d.host().set_job_policy(s, true, "report_now")));
  REQUIRE(d.sync(d.host().prompt(s, "build it")));
  REQUIRE(d.sync(d.host().wait_idle(s)));  // returns while the job still blocks on the FIFO
  auto j = l.id(d);
  CHECK(d.state_of(j) == owned_state::running);
  CHECK(d.f.observer->settled_of("s") == 1);
  d.release(gate);
  d.sync(d.host().jobs().wait_idle());
  d.f.quiet();
  CHECK(d.f.observer->started_of("s") == 2);  // the receipt prompted a second busy period
  CHECK(d.transcript_count("s", "notice", "done-later") == 1);
  CHECK(d.receipt_state_of(j, transition::completed) == "acked");
}

TEST_CASE("a failing pipeline stage makes the receipt 'failed', whatever the last stage said",
          "[delivery]") {
  delivery_fixture d("failed");
  launcher l;
  l.install(d, "s", job("false | cat"));
  auto s = d.session("s");
  REQUIRE(d.sync(d.host().prompt(s, "test it")));
  REQUIRE(d.sync(d.host().wait_idle(s)));
  auto j = l.id(d);
  CHECK(d.state_of(j) == owned_state::failed);
  CHECK(d.receipt_state_of(j, transition::failed) == "acked");
  CHECK(d.receipt_state_of(j, transition::completed) == "none");
  CHECK(d.transcript_count("s", "notice", "failed") == 1);
}

TEST_CASE("a terminal result read through a status call is not notified again", "[delivery]") {
  delivery_fixture d("status-read");
  launcher l;
  std::shared_ptr<runtime::one_shot<result<job_view>>> read =
      runtime::one_shot<result<job_view>>::make();
  l.install(d, "s", job("echo read-by-wait"),
            [read](agent_context& ctx, job_id j) -> boost::asio::awaitable<void> {
              auto v = co_await ctx.wait_job(j);
              read->set(v);
            });
  auto s = d.session("s");
  REQUIRE(d.sync(d.host().prompt(s, "run and wait")));
  REQUIRE(d.sync(d.host().wait_idle(s)));
  auto j = l.id(d);
  auto v = d.sync(read->async_wait(boost::asio::use_awaitable));
  REQUIRE(v);
  CHECK(v->state == owned_state::completed);
  CHECK(v->notice.find("read-by-wait") != std::string::npos);
  CHECK(d.receipt_state_of(j, transition::completed) == "read");
  CHECK(d.transcript_count("s", "notice", j.str()) == 0);
  CHECK(l.seen("notice") == 0);
}

TEST_CASE("a background launch is refused when the turn has notifications disabled", "[delivery]") {
  delivery_fixture d("no-notify");
  launcher l;
  l.install(d, "s", job("echo never"));
  auto s = d.session("s");
  REQUIRE(d.sync(d.host().set_job_policy(s, false, "withhold")));
  REQUIRE(d.sync(d.host().prompt(s, "go")));
  REQUIRE(d.sync(d.host().wait_idle(s)));
  auto r = d.sync(l.launched->async_wait(boost::asio::use_awaitable));
  REQUIRE_FALSE(r);
  CHECK(r.error().code == errc::refused);
  CHECK(r.error().message.find("notifications disabled") != std::string::npos);
  CHECK(r.error().message.find("nothing was started") != std::string::npos);
  auto live = d.host().store().live_jobs();
  REQUIRE(live);
  CHECK(live->empty());
}

// A session's own tool call passes what its actor knows of its row; any other
// caller's launch is checked against the row on disk.
TEST_CASE(
    "a launch from outside a session's turn is checked against its row: another tenant's thread "
    "is not found, and a thread without notifications refuses a background job",
    "[delivery]") {
  delivery_fixture d("outside-launch");
  auto s = d.session("s", "acme");
  protocol::owner_scope caller;
  caller.tenant = protocol::tenant_id("other");
  caller.thread = s;
  caller.turn = protocol::turn_id("t1");
  auto foreign = d.sync(d.host().jobs().launch(caller, job("echo never")));
  REQUIRE_FALSE(foreign);
  CHECK(foreign.error().code == errc::not_found);
  CHECK(foreign.error().message.find("nothing was started") != std::string::npos);

  caller.tenant = protocol::tenant_id("acme");
  REQUIRE(d.sync(d.host().set_job_policy(s, false, "withhold")));
  auto quiet = d.sync(d.host().jobs().launch(caller, job("echo never")));
  REQUIRE_FALSE(quiet);
  CHECK(quiet.error().code == errc::refused);
  CHECK(quiet.error().message.find("notifications disabled") != std::string::npos);
  auto live = d.host().store().live_jobs();
  REQUIRE(live);
  CHECK(live->empty());
}

TEST_CASE(
    "cancel is a confirmed kill before the cancelled receipt, and the completion after it is "
    "dropped",
    "[delivery]") {
  delivery_fixture d("cancel");
  auto marker = d.work + "/after-sleep";
  launcher l;
  l.install(d, "s", job("sleep 30; touch " + marker));
  auto [s, j] = launched_and_settled(d, l);
  auto scope = d.host().scope_of(s);
  REQUIRE(scope);
  auto v = d.sync(d.host().jobs().cancel(*scope, j));
  REQUIRE(v);
  CHECK(v->state == owned_state::cancelled);
  REQUIRE(v->completion);
  CHECK(v->completion->status.state == protocol::job_state::killed);
  // Exactly one terminal receipt, and it is the cancel's.
  auto rs = d.receipts(j);
  REQUIRE(rs.size() == 2);
  CHECK(rs[1].transition == transition::cancelled);
  // A second cancel and a status read change nothing.
  auto again = d.sync(d.host().jobs().cancel(*scope, j));
  REQUIRE(again);
  CHECK(again->state == owned_state::cancelled);
  CHECK(d.receipts(j).size() == 2);
  CHECK_FALSE(std::filesystem::exists(marker));
}

TEST_CASE(
    "a job's mailbox answers a second cancel while the first one's kill and the job's follow "
    "are both in flight, and only the first writes its receipt",
    "[delivery][jobs]") {
  delivery_fixture d("cancel-mailbox");
  auto hold = std::make_shared<kill_hold>();
  d.f.jobs.adapter = [hold](std::string socket) {
    return make_held_kill_route(std::move(socket), hold);
  };
  d.f.restart();
  launcher l;
  l.install(d, "s", job("sleep 30"));
  auto [s, j] = launched_and_settled(d, l);
  auto scope = d.host().scope_of(s);
  REQUIRE(scope);

  // The first cancel runs on another executor until its kill is held in the route.
  auto first = runtime::one_shot<result<job_view>>::make();
  boost::asio::co_spawn(d.host().pool().at(1), cancel_into(&d.host().jobs(), *scope, j, first),
                        boost::asio::detached);
  d.sync(hold->entered->async_wait(boost::asio::use_awaitable));

  // A mailbox blocked by the first cancel (or by the follow) would not answer
  // this one until the kill is released: the guard releases it after a
  // bound that only a blocked mailbox reaches, so the test ends either way.
  std::promise<void> answered;
  auto answered_f = answered.get_future();
  std::atomic<bool> released_by_guard{false};
  std::thread guard([&] {
    if (answered_f.wait_for(std::chrono::seconds(120)) == std::future_status::timeout) {
      released_by_guard = true;
      hold->release->set(0);
    }
  });
  auto second = d.sync(d.host().jobs().cancel(*scope, j));
  answered.set_value();
  guard.join();
  CHECK_FALSE(released_by_guard.load());
  REQUIRE_FALSE(second);
  CHECK(second.error().code == errc::conflict);
  CHECK_THAT(second.error().message, Catch::Contains("being cancelled already"));
  // Meanwhile the job is live and running: nothing was written for it.
  CHECK(d.host().jobs().running(s).size() == 1);
  CHECK(d.state_of(j) == owned_state::running);
  CHECK(d.receipts(j).size() == 1);

  hold->release->set(0);
  auto v = d.sync(first->async_wait(boost::asio::use_awaitable));
  INFO((v ? std::string("ok") : v.error().message));
  REQUIRE(v);
  CHECK(v->state == owned_state::cancelled);
  CHECK(hold->kills.load() == 1);  // the second cancel sent no kill
  auto rs = d.receipts(j);
  REQUIRE(rs.size() == 2);
  CHECK(rs[1].transition == transition::cancelled);
  d.sync(d.host().jobs().wait_idle());
  CHECK(d.host().jobs().running(s).empty());
}

TEST_CASE("stopping a turn cancels exactly the jobs it owns", "[delivery]") {
  delivery_fixture d("stop-turn");
  launcher a, b;
  a.install(d, "a", job("sleep 30"));
  b.install(d, "b", job("sleep 30"));
  auto sa = d.session("a");
  auto sb = d.session("b");
  REQUIRE(d.sync(d.host().prompt(sa, "go")));
  REQUIRE(d.sync(d.host().prompt(sb, "go")));
  auto ja = a.id(d);
  auto jb = b.id(d);
  d.host().interrupt(sa);
  REQUIRE(d.sync(d.host().wait_idle(sa)));
  CHECK(d.state_of(ja) == owned_state::cancelled);
  CHECK(d.state_of(jb) == owned_state::running);
  auto scope = d.host().scope_of(sb);
  REQUIRE(scope);
  auto v = d.sync(d.host().jobs().status(*scope, jb));
  REQUIRE(v);
  CHECK(v->state == owned_state::running);
  REQUIRE(d.sync(d.host().jobs().cancel(*scope, jb)));
  REQUIRE(d.sync(d.host().wait_idle(sb)));
}

TEST_CASE("with a sandbox configured, a shell the agent starts is a job owned by its turn",
          "[delivery]") {
  delivery_fixture d("shell-is-job");
  auto started = runtime::one_shot<result<std::string>>::make();
  d.f.code("s")->fn = [started](agent_context& ctx, drain_input) -> boost::asio::awaitable<void> {
    if (started->ready()) co_return;
    auto r = co_await ctx.start_shell("echo via-start-shell");
    started->set(r);
  };
  auto s = d.session("s");
  REQUIRE(d.sync(d.host().prompt(s, "go")));
  REQUIRE(d.sync(d.host().wait_idle(s)));
  auto r = d.sync(started->async_wait(boost::asio::use_awaitable));
  REQUIRE(r);
  job_id j(*r);
  CHECK(d.state_of(j) == owned_state::completed);
  CHECK(d.receipt_state_of(j, transition::completed) == "acked");
  CHECK(d.transcript_count("s", "notice", "via-start-shell") == 1);
  auto job = d.host().store().job(j);
  REQUIRE(job);
  REQUIRE(*job);
  CHECK((*job)->channel == "tool");
  CHECK((*job)->scope.thread == s);
}

TEST_CASE("an interrupt while the turn waits on its job stops the turn and cancels the job",
          "[delivery]") {
  delivery_fixture d("interrupt-wait");
  auto waiting = runtime::one_shot<job_id>::make();
  auto waited = runtime::one_shot<result<job_view>>::make();
  d.f.code("s")->fn = [waiting, waited](agent_context& ctx,
                                        drain_input) -> boost::asio::awaitable<void> {
    if (waiting->ready()) co_return;
    auto j = co_await ctx.launch_job(job("sleep 30"));
    if (!j) throw std::runtime_error(j.error().message);
    waiting->set(*j);
    auto v = co_await ctx.wait_job(*j);
    waited->set(v);
  };
  auto s = d.session("s");
  REQUIRE(d.sync(d.host().prompt(s, "run the long job and wait")));
  auto j = d.sync(waiting->async_wait(boost::asio::use_awaitable));
  d.host().interrupt(s);
  REQUIRE(d.sync(d.host().wait_idle(s)));
  // The turn's stop killed the job (confirmed) instead of waiting 30 s for it.
  CHECK(d.state_of(j) == owned_state::cancelled);
  if (waited->ready()) {
    auto v = d.sync(waited->async_wait(boost::asio::use_awaitable));
    CHECK_FALSE(v);  // the wait was cut short, not answered with a result
  }
  d.sync(d.host().jobs().wait_idle());
}

TEST_CASE(
    "an interrupt in the middle of launching leaves every job launched terminal and "
    "nothing live",
    "[delivery]") {
  delivery_fixture d("interrupt-launch");
  auto first = runtime::one_shot<int>::make();
  auto launched = std::make_shared<std::vector<job_id>>();
  auto m = std::make_shared<std::mutex>();
  d.f.code("s")->fn = [first, launched, m](agent_context& ctx,
                                           drain_input) -> boost::asio::awaitable<void> {
    if (first->ready()) co_return;
    for (int i = 0; i < 6; ++i) {
      auto j = co_await ctx.launch_job(job("sleep 30"));
      if (j) {
        std::lock_guard lk(*m);
        launched->push_back(*j);
      }
      first->set(0);
    }
  };
  auto s = d.session("s");
  REQUIRE(d.sync(d.host().prompt(s, "launch many")));
  d.sync(first->async_wait(boost::asio::use_awaitable));
  d.host().interrupt(s);
  REQUIRE(d.sync(d.host().wait_idle(s)));
  d.sync(d.host().jobs().wait_idle());  // nothing stays live
  auto all = d.host().store().all_jobs();
  REQUIRE(all);
  CHECK_FALSE(all->empty());
  for (auto& j : *all) {
    INFO("job " << j.id.str() << " is " << persistence::to_string(j.state));
    CHECK(j.state == owned_state::cancelled);
  }
}

TEST_CASE("a dropped connection to the daemon is not a failed job: the queue follows it again",
          "[delivery]") {
  delivery_fixture d("reconnect");
  auto gate = d.fifo("gate");
  launcher l;
  l.install(d, "s", job("cat " + gate + "; echo after-reconnect"));
  auto [s, j] = launched_and_settled(d, l);
  // Cut the queue's connections (the channel does it on its executor, where they live).
  d.sync(d.host().jobs().channel().drop_connections());
  d.release(gate);
  d.sync(d.host().jobs().wait_idle());
  d.f.quiet();
  CHECK(d.state_of(j) == owned_state::completed);
  CHECK(d.transcript_count("s", "notice", "after-reconnect") == 1);
  auto sbx = d.host().jobs().sandbox();
  REQUIRE(sbx);
  CHECK(sbx->second >= 1);  // the same sandbox generation, reattached
}
