// Job policies by kind of session (issue 9, item 6; docs/design.md, Policies):
// a subagent's turns default to report_now, so seed 002's figure 1 holds with
// owned jobs in a sandbox (report 1 at once with the still-running list,
// report 2 when the shell ends); a top-level session's turns default to
// withhold (seed 000); host::set_job_policy wins for either kind.
#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <thread>

#include "delivery_support.hpp"
#include "tether/protocol/scrub.hpp"

using namespace tether;
using namespace tether::test;
using protocol::transition;

namespace {

const std::string k_token = "ghp_aBcDeFgHiJkLmNoPqRsTuVwXyZ0123456789";

// A FIFO a job blocks on (`cat FIFO`) until release(). A guard thread
// releases it if the test has not within a bound, so a runtime that waits on
// the job where it should not makes the test fail (its checks of what happened
// while the job ran) instead of hang. Passing never depends on the bound: the
// test releases the FIFO itself, after the events it waits for.
class guarded_fifo {
 public:
  guarded_fifo(delivery_fixture& d, const std::string& name) : path(d.fifo(name)) {
    t_ = std::thread([this] {
      std::unique_lock lk(m_);
      if (cv_.wait_for(lk, std::chrono::minutes(2), [this] { return done_; })) return;
      fired_ = true;
      // O_RDWR never blocks on a FIFO: a job already reading it sees its end.
      int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
      if (fd >= 0) ::close(fd);
    });
  }
  ~guarded_fifo() { stop_guard(); }
  /// Lets the job's `cat` return (unless the guard did it already).
  void release() {
    if (!stop_guard()) release_fifo(path);
  }
  /// Whether the guard had to release it.
  bool fired() {
    std::lock_guard lk(m_);
    return fired_;
  }

  const std::string path;

 private:
  bool stop_guard() {
    {
      std::lock_guard lk(m_);
      done_ = true;
    }
    cv_.notify_all();
    if (t_.joinable()) t_.join();
    return fired();
  }
  std::mutex m_;
  std::condition_variable cv_;
  bool done_ = false;
  bool fired_ = false;
  std::thread t_;
};

// Seed 002, figure 1, as code: on its prompt the session starts a background
// shell (with a sandbox configured, a job its turn owns), waits for `hold` if
// given, answers and ends its drain; on the shell's notice it answers again.
struct route_audit {
  std::shared_ptr<runtime::one_shot<result<std::string>>> started =
      runtime::one_shot<result<std::string>>::make();
  std::shared_ptr<runtime::one_shot<int>> launched = runtime::one_shot<int>::make();
  std::shared_ptr<runtime::one_shot<int>> hold;  // set: the first drain waits for it

  void install(delivery_fixture& d, const std::string& s, std::string command) {
    d.f.code(s)->fn = [command, started = started, launched = launched, hold = hold](
                          agent_context& ctx, drain_input in) -> boost::asio::awaitable<void> {
      for (auto& i : in.inputs) {
        if (i.kind == "prompt") {
          auto id = co_await ctx.start_shell(command);
          launched->set(1);
          if (hold) co_await hold->async_wait(boost::asio::use_awaitable);
          co_await ctx.say("Started the route check in the background.");
          started->set(std::move(id));  // the last step of the drain
        } else if (i.kind == "notice") {
          co_await ctx.say("Route check finished: 14 routes checked, 0 broken.");
        }
      }
    };
  }
  std::string job(delivery_fixture& d) {
    auto r = d.sync(started->async_wait(boost::asio::use_awaitable));
    REQUIRE(r);
    return *r;
  }
};

// Each time a report was admitted into the parent's inbox: whether the
// child's job was still listed as running then.
struct admissions {
  std::mutex m;
  std::vector<bool> job_running;  // per admission: the child's job was still live
  std::shared_ptr<runtime::one_shot<int>> first = runtime::one_shot<int>::make();

  void watch(delivery_fixture& d, const std::string& parent, const std::string& child) {
    d.f.observer->on_admitted = [this, &d, parent, child](const session_id& p) {
      if (p.str() != parent) return;
      bool live = !d.host().jobs().running(session_id(child)).empty();
      std::lock_guard lk(m);
      job_running.push_back(live);
      first->set(1);
    };
  }
  std::vector<bool> seen() {
    std::lock_guard lk(m);
    return job_running;
  }
};

// Notices in `s`'s transcript that mention `text`, read off the test's
// thread (an observer hook), so it asserts nothing: -1 if the read failed.
int notices_now(delivery_fixture& d, const std::string& s, const std::string& text) {
  auto msgs = d.host().store().messages(session_id(s));
  if (!msgs) return -1;
  int n = 0;
  for (auto& m : *msgs) n += m.kind == "notice" && m.text.find(text) != std::string::npos;
  return n;
}

std::string policy_of(report_fixture& f, const std::string& s) {
  auto row = f.host->store().session(session_id(s));
  REQUIRE(row);
  REQUIRE(*row);
  return (*row)->job_policy;
}

}  // namespace

TEST_CASE(
    "a subagent's turn reports at once with its still-running job listed and reports again when "
    "the job ends",
    "[delivery][policy]") {
  delivery_fixture d("policy-figure1");
  guarded_fifo gate(d, "routes");
  route_audit audit;
  audit.install(d, "child",
                "cat " + gate.path + "; echo push " + k_token + "; echo routes: 14 checked");
  admissions adm;
  adm.watch(d, "parent", "child");
  d.f.parent_spawns("child");  // "parent" spawns "child" ("Audit routes") in the background
  auto job = audit.job(d);
  // Report 1: the child's turn ended while its job still blocks on the FIFO.
  d.sync(adm.first->async_wait(boost::asio::use_awaitable));
  d.sync(d.host().wait_quiescent(false));  // the parent took report 1; the job still runs
  CHECK(policy_of(d.f, "child") == "report_now");
  CHECK(d.f.observer->settled_of("child") == 1);
  CHECK(d.state_of(job_id(job)) == owned_state::running);
  auto inbox = d.f.inbox("parent");
  REQUIRE(inbox.size() == 1);
  CHECK(inbox[0].from == session_id("child"));
  CHECK_THAT(inbox[0].body,
             Catch::Contains("Started the route check in the background.\nBackground work still "
                             "running:\n- shell (" +
                             job + "): cat " + gate.path));
  // The still-running label is scrubbed: the token in the command is not shown.
  CHECK(inbox[0].body.find(k_token) == std::string::npos);
  CHECK(inbox[0].body.find(k_token.substr(0, 12)) == std::string::npos);
  CHECK_THAT(inbox[0].body, Catch::Contains(std::string(protocol::k_redacted)));
  CHECK(inbox[0].acked);

  // Report 2: the job ends, its notice wakes the child, whose second turn reports.
  gate.release();
  d.sync(d.host().jobs().wait_idle());
  d.f.quiet();
  CHECK_FALSE(gate.fired());
  CHECK(adm.seen() == std::vector<bool>{true, false});  // both, in order, each once
  inbox = d.f.inbox("parent");
  REQUIRE(inbox.size() == 2);
  CHECK(inbox[1].from == session_id("child"));
  CHECK(inbox[1].nid != inbox[0].nid);
  CHECK(inbox[1].body ==
        "<subagent sessionID=\"child\" state=\"completed\" description=\"Audit routes\">\n"
        "Route check finished: 14 routes checked, 0 broken.\n</subagent>");
  CHECK(inbox[1].acked);
  CHECK(d.transcript_count("parent", "report", "Started the route check") == 1);
  CHECK(d.transcript_count("parent", "report", "Route check finished") == 1);
  CHECK(d.f.observer->started_of("child") == 2);
  CHECK(d.f.observer->settled_of("child") == 2);
  CHECK(d.transcript_count("child", "notice", job) == 1);
  CHECK(d.receipt_state_of(job_id(job), transition::completed) == "acked");
  auto owed = d.host().store().outstanding_jobs();
  REQUIRE(owed);
  CHECK(owed->empty());  // both reports delivered: nothing owed
  // The tasks stay in the store, terminal, their terminal receipts acknowledged.
  auto tasks = d.host().store().jobs();
  REQUIRE(tasks);
  CHECK(tasks->size() == 2);
  for (auto& t : *tasks) {
    CHECK(t.status == persistence::job_status::completed);
    CHECK_FALSE(t.owed);
  }
}

TEST_CASE(
    "a top-level session's turn withholds its completion by default until the job it owns ends",
    "[delivery][policy]") {
  delivery_fixture d("policy-top-withholds");
  guarded_fifo gate(d, "routes");
  route_audit audit;
  audit.install(d, "s", "cat " + gate.path + "; echo routes: 14 checked");
  // At its settle: how many notices the turn had taken.
  std::atomic<int> notices_at_settle{-2};  // -2: not settled yet
  d.f.observer->on_settling = [&](const session_id& s) -> boost::asio::awaitable<void> {
    if (s.str() == "s" && notices_at_settle.load() == -2)
      notices_at_settle = notices_now(d, "s", "routes: 14 checked");
    co_return;
  };
  auto s = d.session("s");
  CHECK(policy_of(d.f, "s") == "withhold");
  REQUIRE(d.sync(d.host().prompt(s, "Audit the routes.")));
  auto job = audit.job(d);  // the drain has answered and is ending; the job blocks
  gate.release();
  REQUIRE(d.sync(d.host().wait_idle(s)));
  d.sync(d.host().jobs().wait_idle());
  d.f.quiet();
  // One busy period: it stayed open until the notice was steered into it.
  CHECK(notices_at_settle == 1);
  CHECK(d.f.observer->started_of("s") == 1);
  CHECK(d.f.observer->settled_of("s") == 1);
  CHECK(d.transcript_count("s", "notice", job) == 1);
  CHECK(d.receipt_state_of(job_id(job), transition::completed) == "acked");
}

TEST_CASE("a subagent set to withhold reports once, after the job its turn owns ended",
          "[delivery][policy]") {
  delivery_fixture d("policy-child-withholds");
  guarded_fifo gate(d, "routes");
  route_audit audit;
  audit.hold = runtime::one_shot<int>::make();
  audit.install(d, "child", "cat " + gate.path + "; echo routes: 14 checked");
  std::atomic<int> notices_at_settle{-2};  // -2: not settled yet
  d.f.observer->on_settling = [&](const session_id& s) -> boost::asio::awaitable<void> {
    if (s.str() == "child" && notices_at_settle.load() == -2)
      notices_at_settle = notices_now(d, "child", "routes: 14 checked");
    co_return;
  };
  d.f.parent_spawns("child");
  // The child's drain waits on `hold` until its policy is set: the override is
  // in place before the turn decides whether to withhold.
  d.sync(audit.launched->async_wait(boost::asio::use_awaitable));
  REQUIRE(d.sync(d.host().set_job_policy(session_id("child"), true, "withhold")));
  audit.hold->set(1);
  auto job = audit.job(d);
  gate.release();
  d.sync(d.host().jobs().wait_idle());
  d.f.quiet();
  CHECK(policy_of(d.f, "child") == "withhold");
  CHECK(notices_at_settle == 1);
  CHECK(d.f.observer->started_of("child") == 1);
  CHECK(d.f.observer->settled_of("child") == 1);
  auto inbox = d.f.inbox("parent");
  REQUIRE(inbox.size() == 1);  // one report, with nothing left running
  CHECK(inbox[0].body.find("Background work still running") == std::string::npos);
  CHECK_THAT(inbox[0].body, Catch::Contains("Route check finished"));
  CHECK(d.transcript_count("child", "notice", job) == 1);
}

TEST_CASE(
    "a top-level session set to report_now settles at once, and its job's notice starts a turn "
    "of its own",
    "[delivery][policy]") {
  delivery_fixture d("policy-top-report-now");
  guarded_fifo gate(d, "routes");
  route_audit audit;
  audit.install(d, "s", "cat " + gate.path + "; echo routes: 14 checked");
  auto s = d.session("s");
  REQUIRE(d.sync(d.host().set_job_policy(s, true, "report_now")));
  REQUIRE(d.sync(d.host().prompt(s, "Audit the routes.")));
  REQUIRE(d.sync(d.host().wait_idle(s)));  // settled while the job blocks on the FIFO
  auto job = audit.job(d);
  CHECK(d.state_of(job_id(job)) == owned_state::running);
  CHECK(d.f.observer->settled_of("s") == 1);
  gate.release();
  d.sync(d.host().jobs().wait_idle());
  d.f.quiet();
  CHECK_FALSE(gate.fired());
  CHECK(policy_of(d.f, "s") == "report_now");
  CHECK(d.f.observer->started_of("s") == 2);
  CHECK(d.transcript_count("s", "notice", job) == 1);
}

TEST_CASE("a new session's job policy follows its kind and the host's configured defaults",
          "[policy]") {
  report_fixture f("policy-defaults");
  // "parent" spawns a subagent, a fork, and a subagent that asks for withhold.
  auto req = [](std::string child, bool fork, std::optional<std::string> policy) {
    actors::spawn_request r;
    r.child = session_id(child);
    r.description = child;
    r.prompt = "go";
    r.fork = fork;
    r.job_policy = std::move(policy);
    return r;
  };
  auto spawned = std::make_shared<std::vector<result<session_id>>>();
  f.code("parent")->fn = [spawned, req](agent_context& ctx,
                                        drain_input in) -> boost::asio::awaitable<void> {
    bool prompted = false;  // the children's reports wake it again: they do nothing
    for (auto& i : in.inputs) prompted = prompted || i.kind == "prompt";
    if (!prompted) co_return;
    auto a = req("sub", false, std::nullopt);
    spawned->push_back(co_await ctx.spawn_background(std::move(a)));
    auto b = req("forked", true, std::nullopt);
    spawned->push_back(co_await ctx.spawn_background(std::move(b)));
    auto c = req("sub-withhold", false, std::string("withhold"));
    spawned->push_back(co_await ctx.spawn_background(std::move(c)));
    auto bad = req("sub-bad", false, std::string("later"));
    spawned->push_back(co_await ctx.spawn_background(std::move(bad)));
    auto follow = req("sub", false, std::string("withhold"));  // "sub" is report_now
    spawned->push_back(co_await ctx.spawn_background(std::move(follow)));
  };
  auto p = f.sync(f.host->create_session("parent", session_id("parent")));
  REQUIRE(p);
  REQUIRE(f.sync(f.host->prompt(*p, "start")));
  f.quiet();
  REQUIRE(spawned->size() == 5);
  CHECK((*spawned)[0].has_value());
  CHECK((*spawned)[1].has_value());
  CHECK((*spawned)[2].has_value());
  REQUIRE_FALSE((*spawned)[3]);
  CHECK((*spawned)[3].error().code == errc::invalid);
  CHECK_THAT((*spawned)[3].error().message, Catch::Contains("not one of withhold, report_now"));
  REQUIRE_FALSE((*spawned)[4]);
  CHECK((*spawned)[4].error().code == errc::refused);
  CHECK_THAT((*spawned)[4].error().message, Catch::Contains("keeps the job policy"));
  CHECK(policy_of(f, "parent") == "withhold");
  CHECK(policy_of(f, "sub") == "report_now");
  CHECK(policy_of(f, "forked") == "withhold");  // a fork has no parent: a top-level default
  CHECK(policy_of(f, "sub-withhold") == "withhold");
  auto bad = f.host->store().session(session_id("sub-bad"));
  REQUIRE(bad);
  CHECK_FALSE(bad->has_value());  // nothing was created

  // The host's configured defaults replace the seed's.
  f.close();
  actors::host_options o;
  o.db_path = f.dir.file("tether.db");
  o.agents = f.agents;
  o.job_policies.top_level = "report_now";
  o.job_policies.subagent = "withhold";
  auto h = actors::host::open(o);
  REQUIRE(h);
  REQUIRE(runtime::sync_wait((*h)->pool().at(0), (*h)->boot()));
  auto top = runtime::sync_wait((*h)->pool().at(0), (*h)->create_session("t", session_id("t")));
  REQUIRE(top);
  auto row = (*h)->store().session(*top);
  REQUIRE(row);
  REQUIRE(*row);
  CHECK((*row)->job_policy == "report_now");
  (*h)->shutdown();
  o.job_policies.subagent = "sometimes";
  auto refused = actors::host::open(o);
  REQUIRE_FALSE(refused);
  CHECK(refused.error().code == errc::invalid);
  CHECK_THAT(refused.error().message,
             Catch::Contains("host_options.job_policies.subagent 'sometimes' is not one of"));
}

TEST_CASE(
    "a job whose terminal receipt was written is no longer listed as still running, while its "
    "turn still waits for it",
    "[delivery][policy]") {
  // At the hand-over (after the terminal commit, before the wake it sends and
  // before the job's live entry ends): what a report settled now would list.
  std::mutex m;
  std::optional<std::size_t> listed;
  std::optional<bool> turn_waits;
  delivery_fixture d("policy-terminal-not-running");
  d.f.jobs.trace = [&](const job_id&, std::string_view stage) {
    if (stage != "handed_over") return;
    auto s = d.host().store().session(session_id("s"));
    std::lock_guard lk(m);
    listed = d.host().jobs().running(session_id("s")).size();
    if (s && *s && (*s)->turn)
      turn_waits = d.host().jobs().turn_has_live_jobs(session_id("s"), *(*s)->turn);
  };
  d.f.restart();
  launcher l;
  l.install(d, "s", job("echo ended"));
  auto s = d.session("s");
  REQUIRE(d.sync(d.host().prompt(s, "build it")));
  REQUIRE(d.sync(d.host().wait_idle(s)));
  d.sync(d.host().jobs().wait_idle());
  std::lock_guard lk(m);
  REQUIRE(listed);
  CHECK(*listed == 0);
  REQUIRE(turn_waits);
  CHECK(*turn_waits);  // withholding still waits for the hand-over
}
