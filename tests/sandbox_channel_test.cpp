// The sandbox channel and its command routes (seed 000, the E2B adapter
// paragraph): a failing command channel is not a failing sandbox. The
// adapter route is retried while it fails, falls back to the platform route
// on the SAME sandbox after `max_failures` infrastructure failures in a row,
// never counts the daemon's own answers as such failures, and may extend the
// sandbox's lease but never shorten it. Every command is a real process in a
// real tether-sandboxd.
#include "tether/actors/sandbox_channel.hpp"

#include <atomic>
#include <fstream>
#include <set>
#include <thread>

#include "delivery_support.hpp"
#include "tether/runtime/clock.hpp"
#include "tether/runtime/executor_pool.hpp"
#include "tether/runtime/sync_wait.hpp"

using namespace tether;
using namespace tether::test;
using actors::command_route;
using actors::sandbox_channel;
using actors::sandbox_lease;
using protocol::transition;
using std::chrono::milliseconds;

namespace {

// What a fault route saw. Shared with the test, which may read it from
// another thread than the route's (the host's job queue runs on its own).
struct route_probe {
  std::atomic<int> exec_calls{0}, wait_calls{0}, kill_calls{0};
  std::atomic<int> injected{0};  // calls answered with the injected fault
  std::mutex m;
  std::optional<wire::hello_rep> hello;  // of the route's own connection

  int calls(const std::string& op) const {
    if (op == "exec") return exec_calls.load();
    if (op == "wait") return wait_calls.load();
    return kill_calls.load();
  }
  wire::hello_rep hello_rep() {
    std::lock_guard lk(m);
    REQUIRE(hello);
    return *hello;
  }
};

// A route over its own read_write connection to the daemon (a real
// client_route) that fails the next `fail_next` calls (or every call, with
// `fail_always`) with an infrastructure error, optionally only for some
// operations. With `lose_reply`, an injected exec failure happens after the
// daemon got the request (the reply is lost), so a retry really repeats it.
class fault_route : public command_route {
 public:
  fault_route(std::string name, std::unique_ptr<sandbox::client> c,
              std::shared_ptr<route_probe> probe)
      : name_(std::move(name)), probe_(std::move(probe)) {
    {
      std::lock_guard lk(probe_->m);
      probe_->hello = c->hello();
    }
    real_ = std::make_unique<actors::client_route>(name_ + "-inner", std::move(c));
  }

  std::string name() const override { return name_; }
  std::optional<milliseconds> timeout() const override { return timeout_; }

  awaitable<result<wire::started_rep>> exec(wire::exec_req r) override {
    ++probe_->exec_calls;
    if (on_call) on_call("exec");
    if (take_fault("exec")) {
      if (lose_reply) {
        auto lost = co_await real_->exec(std::move(r));
        (void)lost;
      }
      co_return injected();
    }
    co_return co_await real_->exec(std::move(r));
  }
  awaitable<result<protocol::shell_completion>> wait(job_id job) override {
    ++probe_->wait_calls;
    if (on_call) on_call("wait");
    if (take_fault("wait")) co_return injected();
    co_return co_await real_->wait(std::move(job));
  }
  awaitable<result<protocol::shell_completion>> kill(job_id job) override {
    ++probe_->kill_calls;
    if (on_call) on_call("kill");
    if (take_fault("kill")) co_return injected();
    co_return co_await real_->kill(std::move(job));
  }

  sandbox::client& client() { return real_->client(); }
  route_probe& probe() { return *probe_; }

  int fail_next = 0;
  bool fail_always = false;
  bool lose_reply = false;
  std::set<std::string> only;  // the operations that fail; empty: all of them
  std::optional<milliseconds> timeout_;
  std::function<void(const std::string& op)> on_call;  // before the call is answered

 private:
  bool take_fault(const std::string& op) {
    if (!only.empty() && !only.count(op)) return false;
    if (fail_always) return true;
    if (fail_next <= 0) return false;
    --fail_next;
    return true;
  }
  error injected() {
    ++probe_->injected;
    return error{errc::io, "injected fault"};
  }

  std::string name_;
  std::shared_ptr<route_probe> probe_;
  std::unique_ptr<actors::client_route> real_;
};

// For tests that run on the test thread (REQUIREs are fine here).
awaitable<std::shared_ptr<fault_route>> open_route(std::string name, std::string socket) {
  auto c = co_await connect(std::move(socket));
  co_return std::make_shared<fault_route>(std::move(name), std::move(c),
                                          std::make_shared<route_probe>());
}

struct adapter_config {
  bool fail_always = false;
  bool lose_reply = false;
  std::optional<milliseconds> timeout;
};

// The host's adapter factory: runs on the job queue's executor, so no REQUIREs.
awaitable<result<std::shared_ptr<command_route>>> make_fault_adapter(
    std::string socket, std::shared_ptr<route_probe> probe, adapter_config cfg) {
  auto c = co_await sandbox::client::connect(socket, wire::conn_mode::read_write, "fault adapter");
  if (!c) co_return c.error();
  auto r = std::make_shared<fault_route>("fault-adapter", std::move(*c), std::move(probe));
  r->fail_always = cfg.fail_always;
  r->lose_reply = cfg.lose_reply;
  r->timeout_ = cfg.timeout;
  co_return std::shared_ptr<command_route>(std::move(r));
}

// Checks a result, naming its error if it has one.
#define CHECK_OK(r)                                                      \
  do {                                                                   \
    INFO(#r << ": " << ((r) ? std::string("ok") : (r).error().message)); \
    CHECK((r).has_value());                                              \
  } while (0)

int lines_in(const std::string& path) {
  std::ifstream f(path);
  int n = 0;
  for (std::string line; std::getline(f, line);) ++n;
  return n;
}

// The executor the test's coroutine runs on: the channel is pinned to it.
awaitable<runtime::executor> here() {
  auto ex = co_await boost::asio::this_coro::executor;
  co_return *ex.target<runtime::executor>();
}

bool same_sandbox(const wire::hello_rep& a, const wire::hello_rep& b) {
  return a.sandbox == b.sandbox && a.generation == b.generation && a.pid == b.pid;
}

}  // namespace

TEST_CASE("only connection-level failures count as infrastructure failures, daemon answers do not",
          "[route]") {
  for (auto c : {errc::io, errc::closed, errc::timeout, errc::stopped, errc::dropped, errc::failed})
    CHECK(actors::is_infrastructure_failure(error{c, "x"}));
  for (auto c : {errc::invalid, errc::not_found, errc::refused, errc::conflict, errc::corrupt,
                 errc::cancelled})
    CHECK_FALSE(actors::is_infrastructure_failure(error{c, "x"}));
}

TEST_CASE("an adapter that fails twice is retried and runs the job on the third try, exactly once",
          "[route]") {
  sandbox_daemon d("route-retry");
  auto cwd = d.dir().path().string();
  auto side = d.dir().file("side-effect");
  auto body = [&]() -> awaitable<void> {
    auto platform = co_await open_route("platform", d.socket());
    auto adapter = co_await open_route("adapter", d.socket());
    adapter->fail_next = 2;
    adapter->lose_reply = true;  // the failed attempts reached the daemon
    int fallbacks = 0;
    auto on_fallback = [&](const std::string&) { ++fallbacks; };
    auto ex = co_await here();
    auto ch = std::make_shared<sandbox_channel>(ex, platform, adapter, 3,
                                                std::make_shared<sandbox_lease>(), on_fallback);
    std::vector<int> row_at_call;  // failures_in_a_row() as each adapter exec began
    adapter->on_call = [&](const std::string& op) {
      if (op == "exec") row_at_call.push_back(ch->failures_in_a_row());
    };

    auto r = command("echo ran >> " + side, cwd);
    r.job = job_id("job-route-retry");
    auto s = co_await ch->exec(std::move(r));
    INFO("exec: " << (s ? std::string("ok") : s.error().message));
    REQUIRE(s.has_value());
    CHECK(s->job == job_id("job-route-retry"));
    CHECK(s->existing);  // the daemon had it from the first, lost attempt
    CHECK(adapter->probe().exec_calls.load() == 3);
    CHECK(adapter->probe().injected.load() == 2);
    CHECK(row_at_call == std::vector<int>{0, 1, 2});
    CHECK(platform->probe().exec_calls.load() == 0);
    CHECK(ch->failures_in_a_row() == 0);
    CHECK_FALSE(ch->fell_back());
    CHECK(ch->route_name() == "adapter");

    auto done = co_await ch->wait(s->job);
    INFO("wait: " << (done ? std::string("ok") : done.error().message));
    REQUIRE(done.has_value());
    CHECK(done->status.state == protocol::job_state::exited);
    CHECK(done->status.exit_code == 0);
    CHECK(adapter->probe().wait_calls.load() == 1);
    CHECK(platform->probe().wait_calls.load() == 0);
    CHECK(fallbacks == 0);
  };
  run(body());
  CHECK(lines_in(side) == 1);
}

TEST_CASE(
    "after three infrastructure failures in a row the channel falls back to the platform "
    "route on the same sandbox, and the job runs once",
    "[route]") {
  sandbox_daemon d("route-fallback");
  auto cwd = d.dir().path().string();
  auto side = d.dir().file("side-effect");
  auto body = [&]() -> awaitable<void> {
    auto observer = co_await connect(d.socket());
    auto before = observer->hello();
    auto platform = co_await open_route("platform", d.socket());
    auto adapter = co_await open_route("adapter", d.socket());
    adapter->fail_always = true;
    adapter->lose_reply = true;
    // The default threshold, as job_queue_options has it.
    std::vector<std::string> warnings;
    auto on_fallback = [&](const std::string& w) { warnings.push_back(w); };
    auto ex = co_await here();
    auto ch = std::make_shared<sandbox_channel>(ex, platform, adapter,
                                                actors::job_queue_options{}.adapter_failures,
                                                std::make_shared<sandbox_lease>(), on_fallback);
    std::vector<int> row_at_call;
    adapter->on_call = [&](const std::string&) {
      CHECK_FALSE(ch->fell_back());
      row_at_call.push_back(ch->failures_in_a_row());
    };

    auto r = command("echo ran >> " + side, cwd);
    r.job = job_id("job-route-fallback");
    auto s = co_await ch->exec(std::move(r));
    INFO("exec: " << (s ? std::string("ok") : s.error().message));
    REQUIRE(s.has_value());
    CHECK(s->existing);  // started by the adapter's first (lost) attempt, not again
    CHECK(ch->fell_back());
    CHECK(ch->route_name() == "platform");
    CHECK(adapter->probe().exec_calls.load() == 3);
    CHECK(row_at_call == std::vector<int>{0, 1, 2});
    CHECK(platform->probe().exec_calls.load() == 1);
    REQUIRE(warnings.size() == 1);
    CHECK_THAT(warnings[0], Catch::Contains("'adapter'") && Catch::Contains("'platform'") &&
                                Catch::Contains("3 times") && Catch::Contains("injected fault") &&
                                Catch::Contains("same sandbox"));

    // Everything after the fallback goes to the platform; the adapter is not tried again.
    auto done = co_await ch->wait(s->job);
    INFO("wait: " << (done ? std::string("ok") : done.error().message));
    REQUIRE(done.has_value());
    CHECK(done->status.state == protocol::job_state::exited);
    CHECK(done->status.exit_code == 0);
    auto killed = co_await ch->kill(s->job);  // idempotent: it had ended on its own
    REQUIRE(killed.has_value());
    CHECK(killed->status.exit_code == 0);
    CHECK(adapter->probe().calls("exec") + adapter->probe().calls("wait") +
              adapter->probe().calls("kill") ==
          3);
    CHECK(platform->probe().wait_calls.load() == 1);
    CHECK(platform->probe().kill_calls.load() == 1);
    CHECK(warnings.size() == 1);

    // The same sandbox, the same generation, the same daemon process: the
    // failing route replaced nothing.
    auto again = co_await connect(d.socket());
    auto after = again->hello();
    CHECK(same_sandbox(before, after));
    CHECK(same_sandbox(before, adapter->probe().hello_rep()));
    CHECK(same_sandbox(before, platform->probe().hello_rep()));
  };
  run(body());
  CHECK(lines_in(side) == 1);
}

TEST_CASE("the fallback threshold is configurable, and below one it is one", "[route]") {
  sandbox_daemon d("route-threshold");
  auto cwd = d.dir().path().string();
  auto body = [&]() -> awaitable<void> {
    std::vector<std::pair<int, int>> thresholds;  // configured, effective
    thresholds.emplace_back(5, 5);
    thresholds.emplace_back(0, 1);
    for (auto [configured, effective] : thresholds) {
      INFO("max_failures " << configured);
      auto side = d.dir().file("side-effect-" + std::to_string(configured));
      auto platform = co_await open_route("platform", d.socket());
      auto adapter = co_await open_route("adapter", d.socket());
      adapter->fail_always = true;
      adapter->lose_reply = true;
      int fallbacks = 0;
      std::string warning;
      auto on_fallback = [&](const std::string& w) {
        ++fallbacks;
        warning = w;
      };
      auto ex = co_await here();
      auto ch = std::make_shared<sandbox_channel>(ex, platform, adapter, configured,
                                                  std::make_shared<sandbox_lease>(), on_fallback);
      std::vector<int> row_at_call;
      adapter->on_call = [&](const std::string&) {
        CHECK_FALSE(ch->fell_back());
        row_at_call.push_back(ch->failures_in_a_row());
      };
      auto r = command("echo ran >> " + side, cwd);
      r.job = job_id("job-threshold-" + std::to_string(configured));
      auto s = co_await ch->exec(std::move(r));
      REQUIRE(s.has_value());
      std::vector<int> expected;
      for (int i = 0; i < effective; ++i) expected.push_back(i);
      CHECK(row_at_call == expected);
      CHECK(adapter->probe().exec_calls.load() == effective);
      CHECK(platform->probe().exec_calls.load() == 1);
      CHECK(ch->fell_back());
      CHECK(fallbacks == 1);
      CHECK_THAT(warning, Catch::Contains(std::to_string(effective) + " times"));
      auto done = co_await ch->wait(s->job);
      REQUIRE(done.has_value());
      CHECK(done->status.exit_code == 0);
      CHECK(lines_in(side) == 1);
    }
  };
  run(body());
}

TEST_CASE("a route failing only waits falls back on the wait, the exec went through the adapter",
          "[route]") {
  sandbox_daemon d("route-only-wait");
  auto cwd = d.dir().path().string();
  auto side = d.dir().file("side-effect");
  auto body = [&]() -> awaitable<void> {
    auto platform = co_await open_route("platform", d.socket());
    auto adapter = co_await open_route("adapter", d.socket());
    adapter->fail_always = true;
    adapter->only = {"wait"};
    std::vector<std::string> warnings;
    auto on_fallback = [&](const std::string& w) { warnings.push_back(w); };
    auto ex = co_await here();
    auto ch = std::make_shared<sandbox_channel>(ex, platform, adapter, 3,
                                                std::make_shared<sandbox_lease>(), on_fallback);

    auto r = command("echo ran >> " + side + "; echo out-of-job", cwd);
    r.job = job_id("job-only-wait");
    auto s = co_await ch->exec(std::move(r));
    REQUIRE(s.has_value());
    CHECK_FALSE(s->existing);
    CHECK_FALSE(ch->fell_back());
    CHECK(adapter->probe().exec_calls.load() == 1);
    CHECK(platform->probe().exec_calls.load() == 0);

    auto done = co_await ch->wait(s->job);
    REQUIRE(done.has_value());
    CHECK(done->status.exit_code == 0);
    CHECK(done->tail == "out-of-job\n");
    CHECK(adapter->probe().wait_calls.load() == 3);
    CHECK(platform->probe().wait_calls.load() == 1);
    CHECK(ch->fell_back());
    CHECK(warnings.size() == 1);
  };
  run(body());
  CHECK(lines_in(side) == 1);
}

TEST_CASE(
    "daemon answers such as a missing cwd or an unknown job are returned as is and do not "
    "count towards the fallback",
    "[route]") {
  sandbox_daemon d("route-answers");
  auto cwd = d.dir().path().string();
  auto side = d.dir().file("side-effect");
  auto body = [&]() -> awaitable<void> {
    auto platform = co_await open_route("platform", d.socket());
    auto adapter = co_await open_route("adapter", d.socket());
    int fallbacks = 0;
    auto on_fallback = [&](const std::string&) { ++fallbacks; };
    auto ex = co_await here();
    auto ch = std::make_shared<sandbox_channel>(ex, platform, adapter, 3,
                                                std::make_shared<sandbox_lease>(), on_fallback);

    // Refusals straight from the daemon: not retried, not counted, not rewritten.
    for (int i = 0; i < 4; ++i) {
      auto bad = co_await ch->exec(command("true", "/nonexistent/tether-dir"));
      REQUIRE_FALSE(bad.has_value());
      CHECK(bad.error().code == errc::invalid);
      CHECK_THAT(bad.error().message, Catch::Contains("cwd '/nonexistent/tether-dir'"));
      CHECK(ch->failures_in_a_row() == 0);
    }
    CHECK(adapter->probe().exec_calls.load() == 4);
    auto unknown_wait = co_await ch->wait(job_id("job-nobody-knows"));
    REQUIRE_FALSE(unknown_wait.has_value());
    CHECK(unknown_wait.error().code == errc::not_found);
    auto unknown_kill = co_await ch->kill(job_id("job-nobody-knows"));
    REQUIRE_FALSE(unknown_kill.has_value());
    CHECK(unknown_kill.error().code == errc::not_found);
    CHECK(adapter->probe().wait_calls.load() == 1);
    CHECK(adapter->probe().kill_calls.load() == 1);
    CHECK(ch->failures_in_a_row() == 0);

    // An answer also breaks a row of infrastructure failures: 2 faults, an
    // answer, 2 faults, an answer is four faults but never three in a row.
    adapter->fail_next = 2;
    auto bad = co_await ch->exec(command("true", "/nonexistent/tether-dir"));
    REQUIRE_FALSE(bad.has_value());
    CHECK(bad.error().code == errc::invalid);
    CHECK(ch->failures_in_a_row() == 0);
    adapter->fail_next = 2;
    auto r = command("echo ran >> " + side, cwd);
    r.job = job_id("job-after-answers");
    auto s = co_await ch->exec(std::move(r));
    REQUIRE(s.has_value());
    CHECK(adapter->probe().injected.load() == 4);
    CHECK(ch->failures_in_a_row() == 0);
    CHECK_FALSE(ch->fell_back());
    CHECK(fallbacks == 0);
    CHECK(platform->probe().exec_calls.load() + platform->probe().wait_calls.load() +
              platform->probe().kill_calls.load() ==
          0);
    auto done = co_await ch->wait(s->job);
    REQUIRE(done.has_value());
    CHECK(done->status.exit_code == 0);
  };
  run(body());
  CHECK(lines_in(side) == 1);
}

TEST_CASE("a lease is only ever extended", "[route]") {
  sandbox_lease none;
  CHECK(none.until_ms() == 0);
  sandbox_lease l(1000);
  CHECK_FALSE(l.extend_to(999));
  CHECK(l.until_ms() == 1000);
  CHECK_FALSE(l.extend_to(1000));
  CHECK(l.until_ms() == 1000);
  CHECK(l.extend_to(1001));
  CHECK(l.until_ms() == 1001);
  CHECK_FALSE(l.extend_to(-5));
  CHECK(l.until_ms() == 1001);
}

TEST_CASE(
    "an adapter's timeout extends the sandbox's lease when it is longer, and never shortens it",
    "[route]") {
  sandbox_daemon d("route-lease");
  auto cwd = d.dir().path().string();
  auto body = [&]() -> awaitable<void> {
    auto platform = co_await open_route("platform", d.socket());
    auto adapter = co_await open_route("adapter", d.socket());
    const std::int64_t hour = 3600 * 1000;
    const std::int64_t initial = runtime::now_ms() + hour;
    auto lease = std::make_shared<sandbox_lease>(initial);
    auto ex = co_await here();
    auto ch = std::make_shared<sandbox_channel>(ex, platform, adapter, 3, lease);

    // Shorter than what is left of the lease: unchanged.
    adapter->timeout_ = milliseconds(10 * 60 * 1000);
    auto a = command("true", cwd);
    a.job = job_id("job-lease-short");
    auto sa = co_await ch->exec(std::move(a));
    CHECK_OK(sa);
    CHECK(lease->until_ms() == initial);
    auto wa = co_await ch->wait(job_id("job-lease-short"));
    CHECK_OK(wa);
    CHECK(lease->until_ms() == initial);

    // Longer: the lease covers the request from when it was sent.
    adapter->timeout_ = milliseconds(2 * hour);
    auto b = command("true", cwd);
    b.job = job_id("job-lease-long");
    auto t0 = runtime::now_ms();
    auto sb = co_await ch->exec(std::move(b));
    auto t1 = runtime::now_ms();
    CHECK_OK(sb);
    auto extended = lease->until_ms();
    CHECK(extended >= t0 + 2 * hour);
    CHECK(extended <= t1 + 2 * hour);

    // Shorter again, after the extension: still never shortened.
    adapter->timeout_ = milliseconds(1000);
    auto wb = co_await ch->wait(job_id("job-lease-long"));
    CHECK_OK(wb);
    CHECK(lease->until_ms() == extended);

    // No timeout at all: nothing changes either.
    adapter->timeout_.reset();
    auto c = command("true", cwd);
    c.job = job_id("job-lease-none");
    auto sc = co_await ch->exec(std::move(c));
    CHECK_OK(sc);
    auto wc = co_await ch->wait(job_id("job-lease-none"));
    CHECK_OK(wc);
    CHECK(lease->until_ms() == extended);
    CHECK_FALSE(ch->fell_back());
    CHECK(platform->probe().exec_calls.load() == 0);
  };
  run(body());
}

TEST_CASE(
    "through the host, a job launched over a failing adapter runs once on the platform route "
    "of the same sandbox and its receipt is delivered once",
    "[route]") {
  delivery_fixture d("route-host");
  auto probe = std::make_shared<route_probe>();
  adapter_config cfg;
  cfg.fail_always = true;
  cfg.lose_reply = true;
  cfg.timeout = milliseconds(3600 * 1000);
  d.f.jobs.adapter = [probe, cfg](std::string socket) {
    return make_fault_adapter(std::move(socket), probe, cfg);
  };
  d.f.jobs.adapter_failures = 3;
  d.f.restart();

  auto daemon_hello = run([](std::string socket) -> awaitable<wire::hello_rep> {
    auto c = co_await connect(std::move(socket));
    co_return c->hello();
  }(d.daemon.socket()));

  auto side = d.work + "/side-effect";
  launcher l;
  l.install(d, "s", job("echo ran >> " + side + "; echo routed-job-output"));
  auto s = d.session("s");
  auto t0 = runtime::now_ms();
  REQUIRE(d.sync(d.host().prompt(s, "build it")));
  REQUIRE(d.sync(d.host().wait_idle(s)));
  auto j = l.id(d);
  d.sync(d.host().jobs().wait_idle());
  d.f.quiet();
  auto t1 = runtime::now_ms();

  // The job completed and its receipt reached the owning turn once.
  CHECK(d.state_of(j) == owned_state::completed);
  CHECK(d.receipt_state_of(j, transition::completed) == "acked");
  CHECK(d.receipts(j).size() == 2);
  CHECK(l.seen("notice") == 1);
  CHECK(d.transcript_count("s", "notice", j.str()) == 1);
  CHECK(d.transcript_count("s", "notice", "routed-job-output") == 1);
  CHECK(lines_in(side) == 1);

  // The channel fell back after three failed execs; the adapter saw nothing after.
  auto& ch = d.host().jobs().channel();
  CHECK(ch.fell_back());
  CHECK(ch.route_name() == "platform");
  CHECK(probe->exec_calls.load() == 3);
  CHECK(probe->wait_calls.load() == 0);
  CHECK(probe->kill_calls.load() == 0);
  CHECK(probe->injected.load() == 3);

  // The same sandbox and generation as the daemon's, which the adapter reached too.
  auto sb = d.host().jobs().sandbox();
  REQUIRE(sb);
  CHECK(sb->first == daemon_hello.sandbox);
  CHECK(sb->second == daemon_hello.generation);
  CHECK(same_sandbox(daemon_hello, probe->hello_rep()));
  auto now_hello = run([](std::string socket) -> awaitable<wire::hello_rep> {
    auto c = co_await connect(std::move(socket));
    co_return c->hello();
  }(d.daemon.socket()));
  CHECK(same_sandbox(daemon_hello, now_hello));

  // The adapter's hour-long timeout extended the lease.
  auto until = d.host().jobs().lease().until_ms();
  CHECK(until >= t0 + 3600 * 1000);
  CHECK(until <= t1 + 3600 * 1000);

  // The host warned once, naming both routes.
  std::vector<std::string> fallback_warnings;
  {
    std::lock_guard lk(d.f.m);
    for (auto& w : d.f.warnings)
      if (w.find("falling back") != std::string::npos) fallback_warnings.push_back(w);
  }
  REQUIRE(fallback_warnings.size() == 1);
  CHECK_THAT(fallback_warnings[0], Catch::Contains("'fault-adapter'") &&
                                       Catch::Contains("'platform'") && Catch::Contains("3 times"));
}

TEST_CASE(
    "requests in flight when the channel falls back move over without counting or warning "
    "again",
    "[route]") {
  sandbox_daemon d("route-inflight");
  auto cwd = d.dir().path().string();
  auto body = [&]() -> awaitable<void> {
    auto platform = co_await open_route("platform", d.socket());
    auto adapter = co_await open_route("adapter", d.socket());
    int fallbacks = 0;
    auto on_fallback = [&](const std::string&) { ++fallbacks; };
    auto ex = co_await here();
    auto ch = std::make_shared<sandbox_channel>(ex, platform, adapter, 3,
                                                std::make_shared<sandbox_lease>(), on_fallback);
    std::vector<job_id> jobs;
    for (int i = 0; i < 4; ++i) {
      auto r = command("sleep 1", cwd);
      r.job = job_id("job-inflight-" + std::to_string(i));
      auto s = co_await ch->exec(std::move(r));
      REQUIRE(s.has_value());
      jobs.push_back(s->job);
    }
    auto all = runtime::one_shot<int>::make();
    auto done = std::make_shared<int>(0);
    auto ok = std::make_shared<int>(0);
    for (auto& j : jobs) {
      // Four waits in flight on the adapter when its connection drops.
      auto w = [&ch, done, ok, all, j]() -> awaitable<void> {
        auto c = co_await ch->wait(j);
        if (c) ++*ok;
        if (++*done == 4) all->set(0);
      };
      boost::asio::co_spawn(ex, w, boost::asio::detached);
    }
    auto listed = co_await platform->client().list();  // the waits are sent meanwhile
    (void)listed;
    adapter->client().close();
    co_await all->async_wait(boost::asio::use_awaitable);
    CHECK(*ok == 4);  // each wait moved over to the platform and got its completion
    CHECK(ch->fell_back());
    CHECK(fallbacks == 1);
  };
  run(body());
}

TEST_CASE("a daemon's own I/O error answer is not a route failure: no retry, no fallback",
          "[route]") {
  sandbox_daemon d("route-daemon-io");
  auto cwd = d.dir().path().string();
  auto jobs_dir = d.options().state_dir + "/jobs";
  auto body = [&]() -> awaitable<void> {
    auto platform = co_await open_route("platform", d.socket());
    auto adapter = co_await open_route("adapter", d.socket());
    auto ex = co_await here();
    auto ch = std::make_shared<sandbox_channel>(ex, platform, adapter, 3,
                                                std::make_shared<sandbox_lease>());
    // The daemon cannot create the job's directory: it answers "io".
    std::filesystem::remove_all(jobs_dir);
    {
      std::ofstream f(jobs_dir);
      f << "not a directory";
    }
    auto r = command("true", cwd);
    r.job = job_id("job-daemon-io");
    auto s = co_await ch->exec(std::move(r));
    std::filesystem::remove(jobs_dir);
    std::filesystem::create_directories(jobs_dir);
    REQUIRE_FALSE(s.has_value());
    CHECK(s.error().answered);
    CHECK(adapter->probe().exec_calls.load() == 1);  // an answer: not retried
    CHECK(platform->probe().exec_calls.load() == 0);
    CHECK_FALSE(ch->fell_back());
  };
  run(body());
}

TEST_CASE("an adapter that cannot attach leaves the platform route serving the same sandbox",
          "[route]") {
  delivery_fixture d("route-no-attach");
  d.f.jobs.adapter = [](std::string) -> awaitable<result<std::shared_ptr<command_route>>> {
    co_return error{errc::io, "adapter endpoint unreachable"};
  };
  d.f.restart();
  launcher l;
  l.install(d, "s", job("echo hi"));
  auto s = d.session("s");
  REQUIRE(d.sync(d.host().prompt(s, "go")));
  REQUIRE(d.sync(d.host().wait_idle(s)));
  auto r = d.sync(l.launched->async_wait(boost::asio::use_awaitable));
  INFO((r ? std::string("ok") : r.error().message));
  REQUIRE(r.has_value());
  CHECK(d.state_of(*r) == owned_state::completed);
  bool warned = false;
  for (auto& w : d.f.warnings)
    warned |= w.find("adapter endpoint unreachable") != std::string::npos;
  CHECK(warned);
}

namespace {

awaitable<result<std::pair<std::shared_ptr<fault_route>, std::shared_ptr<fault_route>>>>
open_two_routes(std::string socket) {
  auto p = co_await sandbox::client::connect(socket, wire::conn_mode::read_write, "platform");
  if (!p) co_return p.error();
  auto a = co_await sandbox::client::connect(socket, wire::conn_mode::read_write, "adapter");
  if (!a) co_return a.error();
  auto platform =
      std::make_shared<fault_route>("platform", std::move(*p), std::make_shared<route_probe>());
  auto adapter =
      std::make_shared<fault_route>("adapter", std::move(*a), std::make_shared<route_probe>());
  co_return std::make_pair(platform, adapter);
}

awaitable<std::thread::id> thread_here() {
  co_return std::this_thread::get_id();
}

}  // namespace

TEST_CASE(
    "exec requests from many threads are decided one message at a time by the channel's "
    "mailbox: one fallback after three failures in a row, every route call on the channel's "
    "executor, every job run once",
    "[route]") {
  sandbox_daemon d("route-many-threads");
  auto cwd = d.dir().path().string();
  auto side = d.dir().file("side-effect");
  runtime::executor_pool home(1);     // the channel's executor
  runtime::executor_pool callers(2);  // the askers' executors
  auto ex = home.at(0);
  auto channel_thread = runtime::sync_wait(ex, thread_here());
  auto opened = runtime::sync_wait(ex, open_two_routes(d.socket()));
  INFO((opened ? std::string("ok") : opened.error().message));
  REQUIRE(opened);
  auto [platform, adapter] = *opened;
  adapter->fail_always = true;  // every adapter call fails before it reaches the daemon

  std::mutex m;
  std::vector<std::thread::id> call_threads;
  std::vector<std::string> warnings;
  auto record = [&](const std::string&) {
    std::lock_guard lk(m);
    call_threads.push_back(std::this_thread::get_id());
  };
  adapter->on_call = record;
  platform->on_call = record;
  auto on_warn = [&](const std::string& w) {
    std::lock_guard lk(m);
    warnings.push_back(w);
  };
  auto ch = std::make_shared<sandbox_channel>(ex, platform, adapter, 3,
                                              std::make_shared<sandbox_lease>(), on_warn);

  constexpr int n = 8;
  std::vector<result<wire::started_rep>> got(n, error{errc::failed, "not sent"});
  std::vector<std::thread> threads;
  for (int i = 0; i < n; ++i)
    threads.emplace_back([&, i] {
      auto r = command("echo ran >> " + side, cwd);
      r.job = job_id("job-many-" + std::to_string(i));
      got[i] = runtime::sync_wait(callers.at(i), ch->exec(std::move(r)));
    });
  for (auto& t : threads) t.join();

  for (int i = 0; i < n; ++i) {
    INFO("exec " << i << ": " << (got[i] ? std::string("ok") : got[i].error().message));
    REQUIRE(got[i]);
    CHECK_FALSE(got[i]->existing);  // the failed adapter calls never reached the daemon
    auto done = runtime::sync_wait(callers.at(i), ch->wait(got[i]->job));
    REQUIRE(done);
    CHECK(done->status.exit_code == 0);
  }
  CHECK(lines_in(side) == n);
  CHECK(platform->probe().exec_calls.load() == n);
  CHECK(adapter->probe().exec_calls.load() >= 3);  // calls in flight at the fallback moved over
  CHECK(ch->fell_back());
  CHECK(ch->failures_in_a_row() == 3);
  {
    std::lock_guard lk(m);
    REQUIRE(warnings.size() == 1);
    CHECK_THAT(warnings[0], Catch::Contains("3 times"));
    for (auto& id : call_threads) CHECK(id == channel_thread);
    CHECK(call_threads.size() ==
          static_cast<std::size_t>(adapter->probe().exec_calls.load() + 2 * n));
  }

  // Stopped, the mailbox refuses: a request after stop() says the host is shutting down.
  runtime::sync_wait(callers.at(0), ch->stop());
  runtime::sync_wait(callers.at(1), ch->stop());  // idempotent
  auto late = runtime::sync_wait(callers.at(0), ch->exec(command("true", cwd)));
  REQUIRE_FALSE(late);
  CHECK(late.error().code == errc::stopped);
  // The executors stop before the routes' connections are destroyed on this thread.
  callers.stop();
  home.stop();
}
