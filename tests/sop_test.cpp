// SOP runs (docs/sop.md): the engine on the one task store, driven by a
// manual clock (no test waits for wall time), with real shell steps through
// the local sandbox daemon counting into a side-effect file.
#include "tether/actors/sop.hpp"

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <boost/asio/experimental/awaitable_operators.hpp>
#include <catch2/catch.hpp>
#include <fstream>
#include <sstream>

#include "report_support.hpp"
#include "tether/runtime/owner_identity.hpp"

using namespace tether;
using namespace tether::test;
using actors::sop_engine;
using actors::sop_options;
using actors::sop_run_view;
using protocol::job_id;
namespace asio = boost::asio;
namespace json = boost::json;

namespace {

constexpr std::int64_t T0 = 1'800'000'000'000;

struct sop_fixture {
  explicit sop_fixture(const std::string& tag, std::function<void(sop_options&)> tune_sop = {})
      : f(tag) {
    std::filesystem::create_directories(sops());
    opts.dir = sops();
    opts.clock = clock;
    opts.backoff = std::chrono::milliseconds(0);
    opts.backoff_max = std::chrono::milliseconds(0);
    if (tune_sop) tune_sop(opts);
    f.tune = [this](actors::host_options& o) { o.sop = opts; };
    f.code("agent:ops")->fn = [](actors::agent_context& ctx,
                                 actors::drain_input in) -> asio::awaitable<void> {
      for (auto& m : in.inputs)
        if (m.kind == "prompt") (void)co_await ctx.say("answered: " + m.text);
    };
  }

  std::string sops() const { return f.dir.file("sops"); }
  std::string side() const { return f.dir.file("side.txt"); }
  /// A shell step's command that appends `word` to the side-effect file.
  std::string count(const std::string& word) const { return "echo " + word + " >> " + side(); }
  void define(const std::string& name, const std::string& json_text) {
    std::ofstream(sops() + "/" + name + ".json") << json_text;
  }
  /// The host (re)started with the SOPs defined so far.
  void start() {
    f.close();
    f.open();
  }
  sop_engine& sop() { return *f.host->sop(); }
  job_id run(const std::string& sop, const std::string& input = "",
             const std::string& by = "test") {
    auto r = f.sync(sop_engine_ref().start_run(sop, input, by));
    REQUIRE(r);
    return *r;
  }
  sop_engine& sop_engine_ref() { return *f.host->sop(); }
  /// Everything due at time `t` done.
  void at(std::int64_t t) {
    clock->set(t);
    f.sync(sop().quiet(t));
  }
  void settle() { f.sync(sop().quiet(clock->now_ms())); }
  sop_run_view view(const job_id& id) {
    auto r = f.sync(sop().run(id));
    REQUIRE(r);
    REQUIRE(*r);
    return **r;
  }
  persistence::sop_run_row row(const job_id& id) {
    auto r = f.host->store().sop_run(id);
    REQUIRE(r);
    REQUIRE(*r);
    return **r;
  }
  std::vector<std::string> event_kinds(const job_id& id) {
    auto e = f.sync(sop().events(id));
    REQUIRE(e);
    std::vector<std::string> out;
    for (auto& x : *e) out.push_back(x.kind);
    return out;
  }
  std::vector<std::string> effects() {
    std::vector<std::string> out;
    std::istringstream in(file_bytes(side()));
    for (std::string l; std::getline(in, l);) out.push_back(l);
    return out;
  }

  std::shared_ptr<runtime::manual_clock> clock = std::make_shared<runtime::manual_clock>(T0);
  sop_options opts;
  report_fixture f;
};

/// A deploy: build (shell), approve (approval by alice), ship (shell).
std::string deploy_json(const sop_fixture& x, const std::string& extra_sop = "",
                        const std::string& approve_extra = "") {
  return R"({"name": "deploy", "agent": "ops", "approvers": ["alice"])" + extra_sop +
         R"(, "steps": [
    {"name": "build", "kind": "shell", "command": ")" +
         x.count("build") + R"(", "retries": 0},
    {"name": "approve", "kind": "approval")" +
         approve_extra + R"(},
    {"name": "ship", "kind": "shell", "command": ")" +
         x.count("ship") + R"(", "retries": 0}]})";
}

/// The identity of a process that has exited (a real pid, reaped).
std::string gone_identity() {
  auto id = runtime::current_process_identity();
  pid_t pid = ::fork();
  if (pid == 0) _exit(0);
  int st = 0;
  ::waitpid(pid, &st, 0);
  id.pid = pid;
  return runtime::to_string(id);
}

/// A run admitted straight into the store, as another process would.
void admit_direct(sop_fixture& x, const std::string& sop, const std::string& id) {
  auto defs = protocol::load_sop_dir(x.sops());
  REQUIRE(defs);
  persistence::sop_run_row r;
  r.id = job_id(id);
  r.sop = sop;
  r.scope.tenant = protocol::tenant_id("default");
  r.scope.thread = session_id("sop:" + sop);
  r.scope.turn = protocol::turn_id(id);
  std::size_t steps = 0;
  for (auto& d : *defs)
    if (d.name == sop) {
      r.progress["definition"] = protocol::to_json(d);
      steps = d.steps.size();
    }
  REQUIRE(steps > 0);
  r.progress["step"] = 0;
  r.progress["visits"] = json::array(steps, json::value(0));
  REQUIRE(x.f.sync(x.f.host->store().sop_admit(r, "test", "")));
}

bool has(const std::vector<std::string>& v, const std::string& s) {
  return std::find(v.begin(), v.end(), s) != v.end();
}

}  // namespace

TEST_CASE("an SOP run goes step by step, parks for approval without a claim, and completes once",
          "[sop]") {
  sop_fixture x("sop-basic");
  x.define("deploy", deploy_json(x));
  x.start();
  REQUIRE(x.f.boot.sop);
  CHECK(x.f.boot.sop->sops == std::vector<std::string>{"deploy"});
  CHECK(x.f.boot.sop->durable);
  auto id = x.run("deploy", "v1.2");
  x.settle();
  auto v = x.view(id);
  CHECK(v.state == "waiting_approval");
  CHECK(v.step == "approve");
  CHECK(v.claim.empty());  // a parked run holds no execution claim
  CHECK(x.effects() == std::vector<std::string>{"build"});
  // Not an approver: refused, nothing written.
  auto bad = x.f.sync(x.sop().approve(id, "mallory", ""));
  REQUIRE_FALSE(bad);
  CHECK(bad.error().code == errc::refused);
  CHECK(bad.error().message.find("mallory may not approve step 'approve'") != std::string::npos);
  CHECK(x.view(id).revision == v.revision);
  REQUIRE(x.f.sync(x.sop().approve(id, "alice", "looks good")));
  x.settle();
  v = x.view(id);
  CHECK(v.state == "completed");
  CHECK(x.effects() == std::vector<std::string>{"build", "ship"});
  auto kinds = x.event_kinds(id);
  CHECK(kinds.front() == "admitted");
  CHECK(has(kinds, "waiting_approval"));
  CHECK(has(kinds, "approved"));
  CHECK(kinds.back() == "completed");
  // The audit log names who approved, separately from the run store.
  auto audit = x.f.sync(x.sop().audit(id.str()));
  REQUIRE(audit);
  bool approved = false;
  for (auto& a : *audit)
    if (a.action == "sop.approve" && a.actor == "alice") approved = true;
  CHECK(approved);
  // Each working step was a child task of kind sop_step, terminal.
  auto row = x.row(id);
  CHECK(row.state == "completed");
  CHECK(row.owner.empty());
  // Approving again: the run is terminal.
  auto again = x.f.sync(x.sop().approve(id, "alice", ""));
  REQUIRE_FALSE(again);
  CHECK(again.error().code == errc::refused);
}

TEST_CASE("a rejection takes the approval step's failure transition", "[sop]") {
  sop_fixture x("sop-reject");
  x.define("deploy", deploy_json(x));
  x.start();
  auto id = x.run("deploy");
  x.settle();
  REQUIRE(x.f.sync(x.sop().reject(id, "alice", "not today")));
  x.settle();
  auto v = x.view(id);
  CHECK(v.state == "failed");
  CHECK(v.error.find("rejected by alice") != std::string::npos);
  CHECK(x.effects() == std::vector<std::string>{"build"});
}

TEST_CASE("a failing shell step is retried, then its on_failure step runs", "[sop]") {
  sop_fixture x("sop-failure");
  x.define("flaky", R"({"name": "flaky", "agent": "ops", "steps": [
    {"name": "try", "kind": "shell", "command": ")" +
                        x.count("try") + R"(; exit 3", "retries": 2, "on_failure": "cleanup"},
    {"name": "never", "kind": "shell", "command": ")" +
                        x.count("never") + R"(", "next": "end"},
    {"name": "cleanup", "kind": "shell", "command": ")" +
                        x.count("cleanup") + R"(", "next": "fail"}]})");
  x.start();
  auto id = x.run("flaky");
  x.settle();
  CHECK(x.effects() == std::vector<std::string>{"try", "try", "try", "cleanup"});
  auto v = x.view(id);
  CHECK(v.state == "failed");
  auto kinds = x.event_kinds(id);
  CHECK(std::count(kinds.begin(), kinds.end(), "attempt") == 2);
}

TEST_CASE("a loop between steps ends at the step's max_visits", "[sop]") {
  sop_fixture x("sop-visits");
  x.define("loop", R"({"name": "loop", "agent": "ops", "steps": [
    {"name": "again", "kind": "shell", "command": ")" +
                       x.count("again") + R"(", "next": "again", "max_visits": 3}]})");
  x.start();
  auto id = x.run("loop");
  x.settle();
  CHECK(x.effects().size() == 3);
  auto v = x.view(id);
  CHECK(v.state == "failed");
  CHECK(v.error.find("max_visits") != std::string::npos);
}

TEST_CASE("an input larger than the SOP's max_payload_bytes starts no run", "[sop]") {
  sop_fixture x("sop-payload");
  x.define("deploy", deploy_json(x, R"(, "max_payload_bytes": 8)"));
  x.start();
  auto r = x.f.sync(x.sop().start_run("deploy", std::string(9, 'x'), "test"));
  REQUIRE_FALSE(r);
  CHECK(r.error().code == errc::invalid);
  CHECK(r.error().message.find("9 bytes") != std::string::npos);
  auto none = x.f.sync(x.sop().start_run("nosuch", "", "test"));
  REQUIRE_FALSE(none);
  CHECK(none.error().message.find("loaded: deploy") != std::string::npos);
  auto all = x.f.sync(x.sop().runs());
  REQUIRE(all);
  CHECK(all->empty());
}

TEST_CASE("an approval timeout escalates, keeps waiting and never approves by itself", "[sop]") {
  std::vector<actors::sop_escalation> escalations;
  sop_fixture x("sop-escalate", [&](sop_options& o) {
    o.on_escalate = [&](const actors::sop_escalation& e) { escalations.push_back(e); };
  });
  x.define("deploy", deploy_json(x, R"(, "approval_timeout_ms": 1000)"));
  x.start();
  auto id = x.run("deploy");
  x.settle();
  x.at(T0 + 999);
  CHECK(escalations.empty());
  x.at(T0 + 1000);
  REQUIRE(escalations.size() == 1);
  CHECK(escalations[0].run == id);
  CHECK(escalations[0].step == "approve");
  CHECK(escalations[0].approvers == std::vector<std::string>{"alice"});
  auto v = x.view(id);
  CHECK(v.state == "waiting_approval");
  CHECK(v.claim.empty());
  // Long after: still waiting, escalated once, never approved.
  x.at(T0 + 100'000'000);
  CHECK(escalations.size() == 1);
  CHECK(x.view(id).state == "waiting_approval");
  auto kinds = x.event_kinds(id);
  CHECK(std::count(kinds.begin(), kinds.end(), "escalated") == 1);
  CHECK_FALSE(has(kinds, "approved"));
  CHECK(x.effects() == std::vector<std::string>{"build"});
  // The approval still ends it.
  REQUIRE(x.f.sync(x.sop().approve(id, "alice", "")));
  x.settle();
  CHECK(x.view(id).state == "completed");
}

TEST_CASE("an approval timeout with on_timeout cancel ends the run", "[sop]") {
  sop_fixture x("sop-timeout-cancel");
  x.define("deploy", deploy_json(x, R"(, "approval_timeout_ms": 1000, "on_timeout": "cancel")"));
  x.start();
  auto id = x.run("deploy");
  x.settle();
  x.at(T0 + 1000);
  auto v = x.view(id);
  CHECK(v.state == "cancelled");
  CHECK(has(x.event_kinds(id), "approval_timed_out"));
  CHECK(x.effects() == std::vector<std::string>{"build"});
}

TEST_CASE("auto_approve is only what a definition names, and the events say so", "[sop]") {
  sop_fixture x("sop-auto");
  x.define("deploy",
           deploy_json(x, R"(, "approval_timeout_ms": 1000, "on_timeout": "auto_approve")"));
  x.start();
  auto id = x.run("deploy");
  x.settle();
  x.at(T0 + 1000);
  CHECK(x.view(id).state == "completed");
  auto e = x.f.sync(x.sop().events(id));
  REQUIRE(e);
  bool said = false;
  for (auto& ev : *e)
    if (ev.kind == "approved" && ev.actor == "auto_approve (configured)" &&
        ev.detail.find("on_timeout auto_approve") != std::string::npos)
      said = true;
  CHECK(said);
}

TEST_CASE("an approval timeout of 0 disables the timeout", "[sop]") {
  std::vector<actors::sop_escalation> escalations;
  sop_fixture x("sop-timeout-off", [&](sop_options& o) {
    o.on_escalate = [&](const actors::sop_escalation& e) { escalations.push_back(e); };
  });
  x.define("deploy", deploy_json(x, R"(, "approval_timeout_ms": 0, "on_timeout": "cancel")"));
  x.start();
  auto id = x.run("deploy");
  x.settle();
  auto wake = x.f.host->store().sop_next_wake(x.sop().claimant());
  REQUIRE(wake);
  CHECK_FALSE(wake->has_value());  // nothing to wake for
  x.at(T0 + 1'000'000'000);
  CHECK(x.view(id).state == "waiting_approval");
  CHECK(escalations.empty());
}

TEST_CASE("a checkpoint parks the run until it is resumed", "[sop]") {
  sop_fixture x("sop-checkpoint");
  x.define("cp", R"({"name": "cp", "agent": "ops", "steps": [
    {"name": "one", "kind": "shell", "command": ")" +
                     x.count("one") + R"("},
    {"name": "hold", "kind": "checkpoint"},
    {"name": "two", "kind": "shell", "command": ")" +
                     x.count("two") + R"("}]})");
  x.start();
  auto id = x.run("cp");
  x.settle();
  auto v = x.view(id);
  CHECK(v.state == "paused_checkpoint");
  CHECK(v.claim.empty());
  auto wrong = x.f.sync(x.sop().approve(id, "alice", ""));
  REQUIRE_FALSE(wrong);  // paused, not waiting for approval
  REQUIRE(x.f.sync(x.sop().resume(id, "bob")));
  x.settle();
  CHECK(x.view(id).state == "completed");
  CHECK(x.effects() == std::vector<std::string>{"one", "two"});
}

TEST_CASE("a parked run survives a restart without a claim and completes after approval", "[sop]") {
  sop_fixture x("sop-restart-parked");
  x.define("deploy", deploy_json(x));
  x.start();
  auto id = x.run("deploy");
  x.settle();
  REQUIRE(x.view(id).state == "waiting_approval");
  x.start();  // a restart
  x.settle();
  auto v = x.view(id);
  CHECK(v.state == "waiting_approval");
  CHECK(v.claim.empty());
  REQUIRE(x.f.sync(x.sop().approve(id, "alice", "")));
  x.settle();
  CHECK(x.view(id).state == "completed");
  CHECK(x.effects() == std::vector<std::string>{"build", "ship"});
}

TEST_CASE("claims never exceed max_concurrent, and the cap holds across a restart", "[sop]") {
  sop_fixture x("sop-cap");
  x.define("one", R"({"name": "one", "agent": "ops", "max_concurrent": 1, "steps": [
    {"name": "work", "kind": "shell", "command": ")" +
                      x.count("work") + R"("}]})");
  x.start();
  x.f.close();
  // As a crash leaves it: six runs admitted, one claimed by a process that is gone.
  x.f.tune = [](actors::host_options&) {};  // a host without the engine
  x.f.open();
  auto& st = x.f.host->store();
  for (int i = 0; i < 6; ++i) admit_direct(x, "one", "sop-one-" + std::to_string(i));
  auto gone = gone_identity();
  auto claimed = x.f.sync(st.sop_claim(gone, T0, T0 + 3'600'000, 100));
  REQUIRE(claimed);
  CHECK(claimed->size() == 1);  // a single winner under the cap
  auto other = x.f.sync(st.sop_claim("another-claimant", T0, T0 + 3'600'000, 100));
  REQUIRE(other);
  CHECK(other->empty());  // the cap is full while that claim's lease is live
  x.f.close();
  x.f.tune = [&x](actors::host_options& o) { o.sop = x.opts; };
  x.f.open();
  CHECK(x.f.boot.sop->claims_cleared == 1);
  x.settle();
  auto all = x.f.host->store().sop_runs(false);
  REQUIRE(all);
  REQUIRE(all->size() == 6);
  for (auto& r : *all) CHECK(r.state == "completed");
  CHECK(x.effects().size() == 6);
}

TEST_CASE("a single claim winner under the cap when two claimants race", "[sop]") {
  sop_fixture x("sop-race");
  x.define("deploy", deploy_json(x, R"(, "max_concurrent": 2)"));
  x.start();
  x.f.close();
  x.f.tune = [](actors::host_options&) {};
  x.f.open();
  auto& st = x.f.host->store();
  // Runs admitted straight into the store (no engine claims them).
  for (int i = 0; i < 10; ++i) admit_direct(x, "deploy", "sop-deploy-" + std::to_string(i));
  // Two claimants ask at once; the writer orders them: 2 claims in all.
  auto both = [&st]() -> asio::awaitable<std::pair<result<std::vector<persistence::sop_run_row>>,
                                                   result<std::vector<persistence::sop_run_row>>>> {
    using namespace asio::experimental::awaitable_operators;
    auto a = st.sop_claim("claimant-a", T0, T0 + 1000, 10);
    auto b = st.sop_claim("claimant-b", T0, T0 + 1000, 10);
    auto [ra, rb] = co_await (std::move(a) && std::move(b));
    co_return std::pair{std::move(ra), std::move(rb)};
  };
  auto [ra, rb] = x.f.sync(both());
  REQUIRE(ra);
  REQUIRE(rb);
  CHECK(ra->size() + rb->size() == 2);
  // The lease lapses: the next claimant takes over, still within the cap.
  auto rc = x.f.sync(st.sop_claim("claimant-c", T0 + 1000, T0 + 2000, 10));
  REQUIRE(rc);
  CHECK(rc->size() == 2);
  auto ev = st.task_events((*rc)[0].id);
  REQUIRE(ev);
  CHECK(ev->back().detail.find("taken over from claimant-") != std::string::npos);
}

TEST_CASE("a claim passes over a full SOP's backlog to another SOP's run, and stops at its limit",
          "[sop]") {
  sop_fixture x("sop-claim-walk");
  x.define("one", R"({"name": "one", "agent": "ops", "max_concurrent": 1, "steps": [
    {"name": "work", "kind": "shell", "command": "true"}]})");
  x.define("two", R"({"name": "two", "agent": "ops", "max_concurrent": 3, "steps": [
    {"name": "work", "kind": "shell", "command": "true"}]})");
  x.start();
  x.f.close();
  x.f.tune = [](actors::host_options&) {};  // a host without the engine
  x.f.open();
  auto& st = x.f.host->store();
  // Oldest first: five runs of `one` (cap 1), then four of `two` (cap 3).
  for (int i = 0; i < 5; ++i) admit_direct(x, "one", "sop-one-" + std::to_string(i));
  for (int i = 0; i < 4; ++i) admit_direct(x, "two", "sop-two-" + std::to_string(i));
  auto ids = [](const std::vector<persistence::sop_run_row>& v) {
    std::vector<std::string> out;
    for (auto& r : v) out.push_back(r.id.str());
    return out;
  };
  // A limit of 2: the oldest run of `one`, then (its SOP now full) the
  // oldest of `two`; the walk ends there.
  auto a = x.f.sync(st.sop_claim("claimant-a", T0, T0 + 60'000, 2));
  REQUIRE(a);
  CHECK(ids(*a) == std::vector<std::string>{"sop-one-0", "sop-two-0"});
  // No limit to speak of: `one` is full, so only `two` up to its cap of 3.
  auto b = x.f.sync(st.sop_claim("claimant-b", T0, T0 + 60'000, 100));
  REQUIRE(b);
  CHECK(ids(*b) == std::vector<std::string>{"sop-two-1", "sop-two-2"});
  auto c = x.f.sync(st.sop_claim("claimant-c", T0, T0 + 60'000, 100));
  REQUIRE(c);
  CHECK(c->empty());
  // The next wake is the earliest lease of another claimant's run.
  auto wake = st.sop_next_wake("claimant-c");
  REQUIRE(wake);
  REQUIRE(*wake);
  CHECK(**wake == T0 + 60'000);
  // Once the leases lapse, the next claimant takes one run of `one` (the
  // oldest, taken over) and three of `two`.
  auto d = x.f.sync(st.sop_claim("claimant-d", T0 + 60'000, T0 + 120'000, 100));
  REQUIRE(d);
  CHECK(ids(*d) == std::vector<std::string>{"sop-one-0", "sop-two-0", "sop-two-1", "sop-two-2"});
}

TEST_CASE("the timeout sweep reads only approval waits that are due and have not fired", "[sop]") {
  sop_fixture x("sop-due-waits");
  x.define("deploy", deploy_json(x, R"(, "approval_timeout_ms": 1000)"));
  x.start();
  auto early = x.run("deploy");
  x.settle();
  x.at(T0 + 500);
  auto late = x.run("deploy");
  x.settle();
  CHECK(x.view(early).state == "waiting_approval");
  CHECK(x.view(late).state == "waiting_approval");
  auto& st = x.f.host->store();
  auto due = [&st](std::int64_t now) {
    auto r = st.sop_due_waits(now);
    REQUIRE(r);
    std::vector<std::string> out;
    for (auto& w : *r) out.push_back(w.id.str());
    return out;
  };
  CHECK(due(T0 + 999).empty());
  CHECK(due(T0 + 1000) == std::vector<std::string>{early.str()});
  CHECK(due(T0 + 1500) == std::vector<std::string>{early.str(), late.str()});
  auto wake = st.sop_next_wake(x.sop().claimant());
  REQUIRE(wake);
  REQUIRE(*wake);
  CHECK(**wake == T0 + 1000);
  // The first escalates (fired): it is no longer due, and the wake moves on.
  x.at(T0 + 1000);
  CHECK(due(T0 + 1500) == std::vector<std::string>{late.str()});
  wake = st.sop_next_wake(x.sop().claimant());
  REQUIRE(wake);
  REQUIRE(*wake);
  CHECK(**wake == T0 + 1500);
  CHECK(x.view(early).state == "waiting_approval");  // escalation never approves
}

TEST_CASE("a divergent save at the same revision is refused and writes nothing", "[sop]") {
  sop_fixture x("sop-revision");
  x.define("deploy", deploy_json(x));
  x.start();
  auto id = x.run("deploy");
  x.settle();
  auto r = x.row(id);
  auto& st = x.f.host->store();
  persistence::sop_save s1;
  s1.run = id;
  s1.revision = r.revision;
  s1.progress = r.progress;
  s1.progress["note"] = "first";
  s1.event = "note";
  s1.actor = "a";
  auto s2 = s1;
  s2.progress["note"] = "second";
  auto w1 = x.f.sync(st.sop_save_run(s1));
  REQUIRE(w1);
  CHECK(*w1 == r.revision + 1);
  auto w2 = x.f.sync(st.sop_save_run(s2));
  REQUIRE_FALSE(w2);
  CHECK(w2.error().code == errc::conflict);
  CHECK(w2.error().message.find("divergent save") != std::string::npos);
  auto after = x.row(id);
  CHECK(after.revision == r.revision + 1);
  CHECK(after.progress.at("note").as_string() == "first");
}

TEST_CASE("cancel ends a run in each state that is not terminal", "[sop]") {
  sop_fixture x("sop-cancel");
  std::string fifo = x.f.dir.file("started.fifo");
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  x.define("deploy", deploy_json(x));
  x.define("cp",
           R"({"name": "cp", "agent": "ops", "steps": [{"name": "hold", "kind": "checkpoint"}]})");
  x.define("slow", R"({"name": "slow", "agent": "ops", "steps": [
    {"name": "block", "kind": "shell", "command": "echo started > )" +
                       fifo + R"(; exec sleep 600", "timeout_ms": 0}]})");
  x.define("slow1", R"({"name": "slow1", "agent": "ops", "max_concurrent": 1, "steps": [
    {"name": "block", "kind": "shell", "command": "echo started > )" +
                        fifo + R"(; exec sleep 600", "timeout_ms": 0}]})");
  x.start();
  SECTION("waiting for approval") {
    auto id = x.run("deploy");
    x.settle();
    REQUIRE(x.f.sync(x.sop().cancel(id, "ops", "changed my mind")));
    CHECK(x.view(id).state == "cancelled");
  }
  SECTION("paused at a checkpoint") {
    auto id = x.run("cp");
    x.settle();
    REQUIRE(x.f.sync(x.sop().cancel(id, "ops", "")));
    CHECK(x.view(id).state == "cancelled");
  }
  SECTION("running a step: the command is stopped, confirmed, before the CAS") {
    auto id = x.run("slow");
    {
      std::ifstream in(fifo);  // opens once the command runs
      std::string word;
      in >> word;
      REQUIRE(word == "started");
    }
    CHECK(x.view(id).state == "running");
    REQUIRE(x.f.sync(x.sop().cancel(id, "ops", "too slow")));
    auto v = x.view(id);
    CHECK(v.state == "cancelled");
    auto e = x.f.sync(x.sop().events(id));
    REQUIRE(e);
    CHECK(e->back().detail.find("its command stopped") != std::string::npos);
  }
  SECTION("pending behind the cap, and running") {
    auto a = x.run("slow1");
    {
      std::ifstream in(fifo);  // opens once the command runs
      std::string word;
      in >> word;
      REQUIRE(word == "started");
    }
    auto b = x.run("slow1");
    CHECK(x.view(b).state == "pending");  // the cap (1) is held by a's claim
    REQUIRE(x.f.sync(x.sop().cancel(b, "ops", "")));
    CHECK(x.view(b).state == "cancelled");
    REQUIRE(x.f.sync(x.sop().cancel(a, "ops", "")));
    CHECK(x.view(a).state == "cancelled");
    x.settle();
    CHECK(x.view(b).state == "cancelled");
  }
  // Terminal: a second cancel is refused and keeps the state.
  auto all = x.f.sync(x.sop().runs());
  REQUIRE(all);
  for (auto& v : *all)
    if (v.state == "cancelled") {
      auto again = x.f.sync(x.sop().cancel(v.id, "ops", ""));
      REQUIRE_FALSE(again);
      CHECK(again.error().message.find("already cancelled") != std::string::npos);
    }
}

TEST_CASE("a step in flight when its process died is lost unless idempotent, never run twice",
          "[sop]") {
  sop_fixture x("sop-inflight");
  x.define("once", R"({"name": "once", "agent": "ops", "steps": [
    {"name": "effect", "kind": "shell", "command": ")" +
                       x.count("effect") + R"(", "on_failure": "recover"},
    {"name": "done", "kind": "shell", "command": ")" +
                       x.count("done") + R"(", "next": "end"},
    {"name": "recover", "kind": "shell", "command": ")" +
                       x.count("recover") + R"(", "next": "fail"}]})");
  x.define("again", R"({"name": "again", "agent": "ops", "steps": [
    {"name": "effect", "kind": "shell", "command": ")" +
                        x.count("again") + R"(", "idempotent": true}]})");
  x.start();
  x.f.close();
  // As a crash leaves it: claimed by a gone process, the step's task admitted
  // and its attempt recorded, the command never sent.
  x.f.tune = [](actors::host_options&) {};
  x.f.open();
  auto& st = x.f.host->store();
  auto gone = gone_identity();
  auto admit = [&](const std::string& sop, const std::string& id) {
    admit_direct(x, sop, id);
    auto c = x.f.sync(st.sop_claim(gone, T0, T0 + 3'600'000, 10));
    REQUIRE(c);
    auto row = x.row(job_id(id));
    persistence::sop_save s;
    s.run = row.id;
    s.revision = row.revision;
    s.owner = gone;
    s.progress = row.progress;
    s.progress["visits"].as_array()[0] = 1;
    s.progress["inflight"] = json::object{{"task", id + "-s0-v1"}, {"attempt", 0}};
    s.step_admit = job_id(id + "-s0-v1");
    s.event = "step_started";
    s.actor = gone;
    REQUIRE(x.f.sync(st.sop_save_run(s)));
  };
  admit("once", "sop-once-crashed");
  admit("again", "sop-again-crashed");
  x.f.close();
  x.f.tune = [&x](actors::host_options& o) { o.sop = x.opts; };
  x.f.open();
  CHECK(x.f.boot.sop->claims_cleared == 2);
  x.settle();
  // Not idempotent: the daemon has no record of it, so it is lost and the
  // failure transition runs; the step itself never ran.
  auto once = x.view(job_id("sop-once-crashed"));
  CHECK(once.state == "failed");
  auto step = x.f.host->store().task_kind(job_id("sop-once-crashed-s0-v1"));
  REQUIRE(step);
  CHECK(*step == "sop_step");
  // Idempotent: attempted again.
  CHECK(x.view(job_id("sop-again-crashed")).state == "completed");
  auto fx = x.effects();
  CHECK(std::count(fx.begin(), fx.end(), "effect") == 0);
  CHECK(std::count(fx.begin(), fx.end(), "recover") == 1);
  CHECK(std::count(fx.begin(), fx.end(), "again") == 1);
}

TEST_CASE("runs survive a reopen with their events and revisions", "[sop]") {
  sop_fixture x("sop-reopen");
  x.define("deploy", deploy_json(x));
  x.start();
  auto id = x.run("deploy");
  x.settle();
  auto before = x.row(id);
  auto events_before = x.event_kinds(id);
  x.start();
  x.settle();
  auto after = x.row(id);
  CHECK(after.revision == before.revision);
  CHECK(after.phase == "waiting_approval");
  CHECK(x.event_kinds(id) == events_before);
}

TEST_CASE("the in-memory run store is explicit, and a fallback to it shows in every status",
          "[sop]") {
  SECTION("memory on request") {
    sop_fixture x("sop-memory",
                  [](sop_options& o) { o.persistence = actors::sop_persistence::memory; });
    x.define("deploy", deploy_json(x));
    x.start();
    CHECK_FALSE(x.f.boot.sop->durable);
    auto id = x.run("deploy");
    x.settle();
    auto v = x.view(id);
    CHECK_FALSE(v.durable);
    CHECK(v.state == "waiting_approval");
    // Not in the host's database.
    auto host_row = x.f.host->store().sop_run(id);
    REQUIRE(host_row);
    CHECK_FALSE(host_row->has_value());
    x.start();  // gone after a restart
    auto gone = x.f.sync(x.sop().run(id));
    REQUIRE(gone);
    CHECK_FALSE(gone->has_value());
  }
  SECTION("durable by default: a store that cannot be opened refuses the start") {
    sop_fixture x("sop-refuse", [](sop_options& o) { o.db = "/nonexistent-dir/runs.db"; });
    x.define("deploy", deploy_json(x));
    x.f.close();
    actors::host_options o;
    o.db_path = x.f.dir.file("tether.db");
    o.agents = x.f.agents;
    o.sop = x.opts;
    o.log = [](const std::string&) {};
    auto h = actors::host::open(o);
    REQUIRE(h);
    auto b = runtime::sync_wait((*h)->pool().at(0), (*h)->boot());
    REQUIRE_FALSE(b);
    CHECK(b.error().message.find("/nonexistent-dir/runs.db could not be opened") !=
          std::string::npos);
    CHECK(b.error().message.find("durable_or_memory") != std::string::npos);
    (*h)->shutdown();
  }
  SECTION("durable_or_memory: a warning, then memory, said everywhere") {
    sop_fixture x("sop-fallback", [](sop_options& o) {
      o.db = "/nonexistent-dir/runs.db";
      o.persistence = actors::sop_persistence::durable_or_memory;
    });
    x.define("deploy", deploy_json(x));
    x.start();
    CHECK_FALSE(x.f.boot.sop->durable);
    bool warned = false;
    for (auto& w : x.f.boot.sop->warnings)
      if (w.find("kept in memory only") != std::string::npos) warned = true;
    CHECK(warned);
    auto id = x.run("deploy");
    x.settle();
    CHECK_FALSE(x.view(id).durable);
  }
}

TEST_CASE("a malformed SOP file refuses the engine's start, naming the file and the field",
          "[sop]") {
  sop_fixture x("sop-malformed");
  x.define("good", deploy_json(x));
  x.define("bad",
           R"({"name": "bad", "agent": "ops", "steps": [{"name": "s", "kind": "teleport"}]})");
  x.f.close();
  actors::host_options o;
  o.db_path = x.f.dir.file("tether.db");
  o.agents = x.f.agents;
  o.sop = x.opts;
  o.log = [](const std::string&) {};
  auto h = actors::host::open(o);
  REQUIRE(h);
  auto b = runtime::sync_wait((*h)->pool().at(0), (*h)->boot());
  REQUIRE_FALSE(b);
  CHECK(b.error().message.find("bad.json") != std::string::npos);
  CHECK(b.error().message.find("kind") != std::string::npos);
  CHECK(b.error().message.find("none was loaded") != std::string::npos);
  (*h)->shutdown();
}

TEST_CASE("a prompt step asks the SOP's agent in a fresh session, and its answer is recorded",
          "[sop]") {
  sop_fixture x("sop-prompt");
  x.define("ask", R"({"name": "ask", "agent": "ops", "steps": [
    {"name": "q", "kind": "prompt", "prompt": "summarise"}]})");
  x.start();
  auto id = x.run("ask", "the input");
  x.settle();
  auto r = x.row(id);
  CHECK(r.state == "completed");
  auto last = r.progress.at("last").as_object();
  CHECK(std::string(last.at("output").as_string()).find("answered: summarise") !=
        std::string::npos);
}
