// Scheduled work (docs/cron.md): the scheduler on the one task store, driven
// by a manual clock (no test waits for wall time), with real shell commands
// through the local sandbox daemon counting into a side-effect file.
#include "tether/actors/cron.hpp"

#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <fstream>
#include <set>
#include <sstream>

#include "report_support.hpp"
#include "tether/runtime/owner_identity.hpp"

using namespace tether;
using namespace tether::test;
using actors::cron_options;
using actors::cron_scheduler;
using persistence::cron_job_row;
using persistence::cron_run_row;
using protocol::cron_job_spec;
namespace asio = boost::asio;

namespace {

constexpr std::int64_t T0 = 1'800'000'000'000;  // 2027-01-15T08:00:00Z
constexpr std::int64_t MIN = 60'000;

protocol::schedule every_minute() {
  return protocol::every_schedule{MIN, T0};
}

struct cron_fixture {
  explicit cron_fixture(const std::string& tag, std::function<void(cron_options&)> tune_cron = {})
      : f(tag) {
    opts.clock = clock;
    opts.overdue_grace = std::chrono::milliseconds(0);
    opts.jitter_seed = 7;
    if (tune_cron) tune_cron(opts);
    f.tune = [this](actors::host_options& o) { o.cron = opts; };
    f.code("agent:worker")->fn = [](actors::agent_context& ctx,
                                    actors::drain_input in) -> asio::awaitable<void> {
      for (auto& m : in.inputs)
        if (m.kind == "prompt") (void)co_await ctx.say("answered: " + m.text);
    };
    f.restart();  // the fixture opened a host without a scheduler
  }

  cron_scheduler& cron() { return *f.host->cron(); }
  std::string side() const { return f.dir.file("side.txt"); }
  /// A shell job that appends its occurrence to the side-effect file.
  cron_job_spec counting(const std::string& name, protocol::schedule when,
                         const std::string& extra = "") {
    cron_job_spec s;
    s.name = name;
    s.agent = "ops";
    s.when = std::move(when);
    s.command = extra + "echo \"$TETHER_CRON_JOB $TETHER_CRON_OCCURRENCE\" >> " + side();
    s.retries = 0;
    s.backoff_ms = 0;
    return s;
  }
  cron_job_row add(cron_job_spec s) {
    auto r = f.sync(cron().add(std::move(s)));
    REQUIRE(r);
    return *r;
  }
  /// The clock at `t`, and the scheduler done with everything due by then.
  void at(std::int64_t t) {
    clock->set(t);
    f.sync(cron().quiet_at(t));
  }
  cron_job_row job(const std::string& name) {
    auto r = f.host->store().cron_job(name);
    REQUIRE(r);
    REQUIRE(*r);
    return **r;
  }
  bool exists(const std::string& name) {
    auto r = f.host->store().cron_job(name);
    REQUIRE(r);
    return r->has_value();
  }
  std::vector<cron_run_row> runs(const std::string& name) {
    auto r = f.host->store().cron_runs(name);
    REQUIRE(r);
    return *r;
  }
  /// The side-effect file's lines.
  std::vector<std::string> effects() {
    std::vector<std::string> out;
    std::istringstream in(file_bytes(side()));
    for (std::string l; std::getline(in, l);) out.push_back(l);
    return out;
  }
  std::string effect(const std::string& job, std::int64_t occ) {
    return job + " " + std::to_string(occ);
  }
  void restart() {
    f.close();
    f.open();
  }

  std::shared_ptr<runtime::manual_clock> clock = std::make_shared<runtime::manual_clock>(T0);
  cron_options opts;
  report_fixture f;
};

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

}  // namespace

TEST_CASE(
    "a due job runs once per occurrence, recorded as a cron_run task, rescheduled from its "
    "schedule",
    "[cron]") {
  cron_fixture x("cron-basic");
  auto row = x.add(x.counting("tick", every_minute()));
  CHECK(row.next_run == T0);
  x.at(T0);
  auto runs = x.runs("tick");
  REQUIRE(runs.size() == 1);
  CHECK(runs[0].id.str() == "cron-tick-" + std::to_string(T0));
  CHECK(runs[0].state == "completed");
  CHECK(runs[0].status == "ok");
  CHECK(runs[0].exit == 0);
  CHECK(runs[0].occurrence == T0);
  auto j = x.job("tick");
  CHECK(j.next_run == T0 + MIN);
  CHECK(j.last_status == "ok");
  CHECK(j.last_run == T0);
  CHECK(j.claim_owner.empty());
  CHECK(j.fence == 1);
  // Nothing more until the next occurrence, however often the loop looks.
  x.at(T0 + MIN - 1);
  CHECK(x.runs("tick").size() == 1);
  x.at(T0 + MIN);
  CHECK(x.runs("tick").size() == 2);
  CHECK(x.effects() == std::vector<std::string>{x.effect("tick", T0), x.effect("tick", T0 + MIN)});
  // The run is a task of the one store, in the lifecycle's vocabulary.
  auto kind = x.f.host->store().task_kind(runs[0].id);
  REQUIRE(kind);
  CHECK(*kind == "cron_run");
}

TEST_CASE(
    "the claim is a compare-and-set: of two claimants of one store only one gets a due job, "
    "and a claimed job is not due to anyone else",
    "[cron]") {
  cron_fixture x("cron-claim", [](cron_options& o) { o.max_runs = 0; });  // the loop claims none
  x.add(x.counting("solo", every_minute()));
  auto& store = x.f.host->store();
  // Both claims go to the writer at once (one group commit at most).
  auto both = [&store]() -> asio::awaitable<std::pair<int, int>> {
    auto a = store.cron_claim_due(T0, "claimant-a", T0 + MIN, 8);
    auto b = store.cron_claim_due(T0, "claimant-b", T0 + MIN, 8);
    auto ra = co_await std::move(a);
    auto rb = co_await std::move(b);
    REQUIRE(ra);
    REQUIRE(rb);
    co_return std::pair<int, int>(static_cast<int>(ra->size()), static_cast<int>(rb->size()));
  };
  auto [a, b] = x.f.sync(both());
  CHECK(a + b == 1);
  auto j = x.job("solo");
  CHECK((j.claim_owner == "claimant-a" || j.claim_owner == "claimant-b"));
  CHECK(j.fence == 1);
  CHECK(j.claim_until == T0 + MIN);
  // While the lease holds, the job is not due to a third claimant.
  auto third = x.f.sync(store.cron_claim_due(T0 + MIN - 1, "claimant-c", T0 + 2 * MIN, 8));
  REQUIRE(third);
  CHECK(third->empty());
}

TEST_CASE(
    "an expired lease is reclaimed with a new fencing token, and the old claimant's "
    "completion is refused by its stale token",
    "[cron]") {
  cron_fixture x("cron-lease", [](cron_options& o) { o.max_runs = 0; });
  x.add(x.counting("leased", every_minute()));
  auto& store = x.f.host->store();
  auto first = x.f.sync(store.cron_claim_due(T0, "worker-1", T0 + 1000, 8));
  REQUIRE(first);
  REQUIRE(first->size() == 1);
  auto old = first->front();
  CHECK(old.fence == 1);
  CHECK_FALSE(old.reclaimed);
  REQUIRE(x.f.sync(store.cron_attempt("leased", old.fence, "worker-1", old.task, 0)));
  // worker-1 stalls past its lease: worker-2 takes the same occurrence over.
  auto second = x.f.sync(store.cron_claim_due(T0 + 1000, "worker-2", T0 + 5000, 8));
  REQUIRE(second);
  REQUIRE(second->size() == 1);
  CHECK(second->front().fence == 2);
  CHECK(second->front().reclaimed);
  CHECK(second->front().task == old.task);
  CHECK(second->front().occurrence == T0);
  // The stale claimant's attempt and completion write nothing.
  auto stale_attempt = x.f.sync(store.cron_attempt("leased", old.fence, "worker-1", old.task, 1));
  REQUIRE(stale_attempt);
  CHECK_FALSE(*stale_attempt);
  persistence::cron_completion c;
  c.job = "leased";
  c.task = old.task;
  c.fence = old.fence;
  c.owner = "worker-1";
  c.state = "completed";
  c.status = "ok";
  c.next_run = T0 + MIN;
  auto refused = x.f.sync(store.cron_complete(c));
  REQUIRE_FALSE(refused);
  CHECK(refused.error().code == errc::conflict);
  CHECK(refused.error().message.find("stale") != std::string::npos);
  CHECK(x.job("leased").next_run == T0);
  CHECK(x.runs("leased").front().state == "running");
  // The new claimant's completion commits.
  c.fence = 2;
  c.owner = "worker-2";
  auto ok = x.f.sync(store.cron_complete(c));
  REQUIRE(ok);
  CHECK(*ok);
  CHECK(x.job("leased").next_run == T0 + MIN);
  CHECK(x.runs("leased").front().state == "completed");
}

TEST_CASE(
    "a crashed worker's claim is taken over when its lease expires, without a restart "
    "(zeroclaw PR 9320)",
    "[cron]") {
  cron_fixture x("cron-9320");
  // Its first occurrence is a minute away: the scheduler leaves it alone
  // while a claimant that then died claims it (its lease: 30 s).
  constexpr std::int64_t A = T0 + MIN;
  x.add(x.counting("nightly", protocol::every_schedule{MIN, A}));
  REQUIRE(x.f.sync(x.f.host->store().cron_claim_due(A, "dead-worker", A + 30'000, 8)));
  x.at(A + 29'999);
  CHECK(x.runs("nightly").front().state == "admitted");
  CHECK(x.effects().empty());
  x.at(A + 30'000);
  auto runs = x.runs("nightly");
  REQUIRE(runs.size() == 1);
  CHECK(runs[0].state == "completed");
  CHECK(x.effects() == std::vector<std::string>{x.effect("nightly", A)});
  CHECK(x.job("nightly").fence == 2);
}

TEST_CASE("claims of provably gone claimants are cleared at startup, then there are none",
          "[cron]") {
  cron_fixture x("cron-stale", [](cron_options& o) { o.max_runs = 0; });
  x.add(x.counting("orphan", every_minute()));
  auto gone = gone_identity();
  REQUIRE(x.f.sync(x.f.host->store().cron_claim_due(T0, gone, T0 + 3'600'000, 8)));
  CHECK(x.job("orphan").claim_owner == gone);
  x.restart();
  REQUIRE(x.f.boot.cron);
  CHECK(x.f.boot.cron->claims_cleared == 1);
  CHECK(x.job("orphan").claim_owner.empty());
  CHECK(x.runs("orphan").front().state == "admitted");  // kept, for the next claim
  x.restart();
  REQUIRE(x.f.boot.cron);
  CHECK(x.f.boot.cron->claims_cleared == 0);
}

TEST_CASE(
    "catch-up off: an overdue one-shot is disabled with a skipped run record, and a "
    "recurring job advances to its next future occurrence with none (zeroclaw 7250)",
    "[cron]") {
  cron_fixture x("cron-7250", [](cron_options& o) { o.catch_up = false; });
  x.add(x.counting("once", protocol::at_schedule{T0 + MIN}));
  x.add(x.counting("often", every_minute()));
  x.at(T0);  // "often" ran at T0
  REQUIRE(x.runs("often").size() == 1);
  // Down for ten minutes.
  x.f.close();
  x.clock->set(T0 + 10 * MIN + 30'000);
  x.f.open();
  REQUIRE(x.f.boot.cron);
  CHECK(x.f.boot.cron->skipped == 2);
  auto once = x.job("once");
  CHECK_FALSE(once.spec.enabled);
  CHECK_FALSE(once.next_run);
  CHECK(once.last_status == "skipped");
  auto once_runs = x.runs("once");
  REQUIRE(once_runs.size() == 1);
  CHECK(once_runs[0].status == "skipped");
  CHECK(once_runs[0].state == "cancelled");
  CHECK(x.job("often").next_run == T0 + 11 * MIN);
  CHECK(x.runs("often").size() == 1);  // no record for the skipped occurrences
  x.f.sync(x.cron().quiet_at(x.clock->now_ms()));
  CHECK(x.effects() == std::vector<std::string>{x.effect("often", T0)});
}

TEST_CASE(
    "catch-up on: overdue jobs run once each (their newest missed occurrence), within the "
    "cap, beyond it they are skipped with a warning naming them",
    "[cron]") {
  cron_fixture x("cron-catchup", [](cron_options& o) { o.catch_up_cap = 2; });
  x.add(x.counting("a", every_minute()));
  x.add(x.counting("b", every_minute()));
  x.add(x.counting("c", every_minute()));
  x.at(T0);
  CHECK(x.effects().size() == 3);
  x.f.close();
  std::int64_t back = T0 + 10 * MIN + 30'000;
  x.clock->set(back);
  x.f.open();
  REQUIRE(x.f.boot.cron);
  CHECK(x.f.boot.cron->caught_up == 2);
  CHECK(x.f.boot.cron->skipped == 1);
  x.f.sync(x.cron().quiet_at(back));
  auto lines = x.effects();
  REQUIRE(lines.size() == 5);  // 3 at T0, then one per caught-up job
  std::multiset<std::string> late(lines.begin() + 3, lines.end());
  CHECK(late ==
        std::multiset<std::string>{x.effect("a", T0 + 10 * MIN), x.effect("b", T0 + 10 * MIN)});
  CHECK(x.job("c").next_run == T0 + 11 * MIN);
  CHECK(warned(x.f, {"cron job 'c'", "catch-up cap"}));
  for (auto n : {"a", "b", "c"}) CHECK(x.job(n).next_run == T0 + 11 * MIN);
}

TEST_CASE("a run's output is bounded and ends with the truncation marker", "[cron]") {
  cron_fixture x("cron-bound");
  auto s = x.counting("loud", every_minute());
  s.command = "head -c 200000 /dev/zero | tr '\\0' x";
  s.max_output_bytes = 1024;
  x.add(s);
  x.at(T0);
  auto runs = x.runs("loud");
  REQUIRE(runs.size() == 1);
  CHECK(runs[0].status == "ok");
  CHECK(runs[0].output.size() <= 1024);
  CHECK(runs[0].output.ends_with("...[truncated]"));
}

TEST_CASE("history is pruned to the newest runs", "[cron]") {
  cron_fixture x("cron-prune", [](cron_options& o) { o.keep_runs = 3; });
  x.add(x.counting("pruned", every_minute()));
  for (int i = 0; i < 5; ++i) x.at(T0 + i * MIN);
  auto runs = x.runs("pruned");
  REQUIRE(runs.size() == 3);
  CHECK(runs[0].occurrence == T0 + 4 * MIN);
  CHECK(runs[2].occurrence == T0 + 2 * MIN);
  CHECK(x.effects().size() == 5);
}

TEST_CASE(
    "a failed result transaction keeps the job's state, and the scheduler's retry commits "
    "it once",
    "[cron]") {
  cron_fixture* xp = nullptr;
  int completes = 0;
  cron_fixture x("cron-failtx", [&xp, &completes](cron_options& o) {
    o.on_step = [&xp, &completes](std::string_view step) {
      if (step == "complete" && completes++ == 0)
        xp->f.host->store().db_writer().inject_commit_failures(1);
    };
  });
  xp = &x;
  x.add(x.counting("flaky", every_minute()));
  x.at(T0);
  CHECK(completes == 2);
  auto runs = x.runs("flaky");
  REQUIRE(runs.size() == 1);
  CHECK(runs[0].state == "completed");
  CHECK(x.job("flaky").next_run == T0 + MIN);
  CHECK(x.effects().size() == 1);

  // At the store: a completion whose COMMIT fails leaves everything as it was.
  auto& store = x.f.host->store();
  auto claims = x.f.sync(store.cron_claim_due(T0 + MIN, "tx-test", T0 + 2 * MIN, 8));
  REQUIRE(claims);
  REQUIRE(claims->size() == 1);
  persistence::cron_completion c;
  c.job = "flaky";
  c.task = claims->front().task;
  c.fence = claims->front().fence;
  c.owner = "tx-test";
  c.state = "completed";
  c.status = "ok";
  c.next_run = T0 + 2 * MIN;
  store.db_writer().inject_commit_failures(1);
  auto failed = x.f.sync(store.cron_complete(c));
  REQUIRE_FALSE(failed);
  auto j = x.job("flaky");
  CHECK(j.next_run == T0 + MIN);
  CHECK(j.claim_owner == "tx-test");
  CHECK(x.runs("flaky").front().state == "admitted");
  REQUIRE(x.f.sync(store.cron_complete(c)));
  CHECK(x.job("flaky").next_run == T0 + 2 * MIN);
}

TEST_CASE(
    "a one-shot that succeeds is deleted when it asks to be, and one that fails is disabled, "
    "neither runs again (zeroclaw 3868, 1297)",
    "[cron]") {
  cron_fixture x("cron-oneshot");
  auto ok = x.counting("remind", protocol::at_schedule{T0 + 1000});
  ok.delete_after_run = true;
  x.add(ok);
  auto bad = x.counting("broken", protocol::at_schedule{T0 + 1000}, "false; ");
  bad.command = "echo \"$TETHER_CRON_JOB $TETHER_CRON_OCCURRENCE\" >> " + x.side() + "; exit 3";
  x.add(bad);
  x.at(T0 + 1000);
  CHECK_FALSE(x.exists("remind"));
  auto b = x.job("broken");
  CHECK_FALSE(b.spec.enabled);
  CHECK(b.last_status == "error");
  auto br = x.runs("broken");
  REQUIRE(br.size() == 1);
  CHECK(br[0].state == "failed");
  CHECK(br[0].exit == 3);
  // Every 15 s for ten minutes: nothing runs again.
  for (std::int64_t t = T0 + 16'000; t < T0 + 10 * MIN; t += 15'000) x.at(t);
  CHECK(x.effects().size() == 2);
  CHECK(x.runs("remind").size() == 1);  // its history stays
}

TEST_CASE("a delete that keeps failing after a one-shot's run becomes a disable", "[cron]") {
  cron_fixture* xp = nullptr;
  int completes = 0;
  cron_fixture x("cron-delfail", [&xp, &completes](cron_options& o) {
    o.delete_attempts = 2;
    o.on_step = [&xp, &completes](std::string_view step) {
      // Both tries that delete fail; the third, a disable, commits.
      if (step == "complete" && completes++ < 2)
        xp->f.host->store().db_writer().inject_commit_failures(1);
    };
  });
  xp = &x;
  auto s = x.counting("stubborn", protocol::at_schedule{T0 + 1000});
  s.delete_after_run = true;
  x.add(s);
  x.at(T0 + 1000);
  REQUIRE(x.exists("stubborn"));
  auto j = x.job("stubborn");
  CHECK_FALSE(j.spec.enabled);
  CHECK(j.last_status == "ok");
  CHECK(warned(x.f, {"cron job 'stubborn'", "disabled instead"}));
  CHECK(completes == 3);
  CHECK(x.effects().size() == 1);
}

TEST_CASE("a run past its timeout is killed and recorded timed_out", "[cron]") {
  cron_fixture x("cron-timeout");
  auto s = x.counting("slow", every_minute());
  s.command = "sleep 60";
  s.timeout_ms = 200;
  x.add(s);
  x.at(T0);
  auto runs = x.runs("slow");
  REQUIRE(runs.size() == 1);
  CHECK(runs[0].state == "timed_out");
  CHECK(runs[0].status == "timed_out");
  CHECK(runs[0].error.find("timed out after 200 ms") != std::string::npos);
  CHECK(x.job("slow").next_run == T0 + MIN);
}

TEST_CASE("a failing run is retried, and recorded failed once its retries are exhausted",
          "[cron]") {
  cron_fixture x("cron-retry");
  auto s = x.counting("retried", every_minute());
  s.command = "echo \"$TETHER_CRON_RUN\" >> " + x.side() + "; exit 7";
  s.retries = 2;
  s.backoff_ms = 1;
  s.backoff_max_ms = 4;
  x.add(s);
  x.at(T0);
  auto runs = x.runs("retried");
  REQUIRE(runs.size() == 1);
  CHECK(runs[0].state == "failed");
  CHECK(runs[0].attempt == 2);
  CHECK(runs[0].exit == 7);
  auto id = "cron-retried-" + std::to_string(T0);
  CHECK(x.effects() == std::vector<std::string>{id + "-a0", id + "-a1", id + "-a2"});
}

TEST_CASE("a wall-clock step forward catches up once, a step back runs nothing again", "[cron]") {
  cron_fixture x("cron-jump");
  x.add(x.counting("tick", every_minute()));
  x.at(T0);
  // Forward by an hour: one run, of the newest missed occurrence.
  x.clock->jump(T0 + 60 * MIN + 10'000);
  x.f.sync(x.cron().quiet_at(T0 + 60 * MIN + 10'000));
  CHECK(x.effects() ==
        std::vector<std::string>{x.effect("tick", T0), x.effect("tick", T0 + 60 * MIN)});
  CHECK(x.job("tick").next_run == T0 + 61 * MIN);
  // Back by two hours: nothing runs again, the next run stays where it was.
  x.clock->jump(T0 - 60 * MIN);
  x.f.sync(x.cron().quiet_at(T0 - 60 * MIN));
  CHECK(x.effects().size() == 2);
  CHECK(x.job("tick").next_run == T0 + 61 * MIN);
}

TEST_CASE("a job with no owning agent is skipped with a warning that names it", "[cron]") {
  cron_fixture x("cron-owner");
  auto s = x.counting("ownerless", every_minute());
  s.agent.clear();
  x.add(s);
  x.at(T0);
  CHECK(x.effects().empty());
  auto runs = x.runs("ownerless");
  REQUIRE(runs.size() == 1);
  CHECK(runs[0].status == "skipped");
  CHECK(warned(x.f, {"cron job 'ownerless' has no owning agent"}));
  CHECK(x.job("ownerless").next_run == T0 + MIN);
}

TEST_CASE(
    "a run takes its owning agent's policy: a shell job of an agent without shells fails "
    "and runs nothing",
    "[cron]") {
  cron_fixture x("cron-policy", [](cron_options& o) {
    protocol::session_policy p;
    p.shells = false;
    o.agent_policies["ops"] = p;
  });
  x.add(x.counting("forbidden", every_minute()));
  x.at(T0);
  CHECK(x.effects().empty());
  auto runs = x.runs("forbidden");
  REQUIRE(runs.size() == 1);
  CHECK(runs[0].state == "failed");
  CHECK(runs[0].error.find("policy of agent 'ops' does not allow shells") != std::string::npos);
}

TEST_CASE("a daily job's slow run moves it to the next day, never to a repeat (zeroclaw 6037)",
          "[cron]") {
  cron_job_spec daily;
  daily.name = "daily";
  daily.agent = "ops";
  auto expr = protocol::parse_cron("0 8 * * *");
  REQUIRE(expr);
  daily.when = protocol::cron_schedule{*expr, "UTC"};
  daily.command = "true";
  // The run of T0 (08:00) ended three minutes late: the next run is tomorrow's.
  auto next = cron_scheduler::next_run_after(daily, T0, T0 + 3 * MIN, true);
  REQUIRE(next);
  CHECK(*next == T0 + 24 * 60 * MIN);
  // A run that outlasted a whole period catches up once, at the newest missed occurrence.
  next = cron_scheduler::next_run_after(daily, T0, T0 + 50 * 60 * MIN, true);
  REQUIRE(next);
  CHECK(*next == T0 + 48 * 60 * MIN);
  next = cron_scheduler::next_run_after(daily, T0, T0 + 50 * 60 * MIN, false);
  REQUIRE(next);
  CHECK(*next == T0 + 72 * 60 * MIN);

  cron_fixture x("cron-6037");
  auto s = x.counting("daily", daily.when);
  x.add(s);
  x.at(T0);
  for (std::int64_t t = T0 + 1000; t <= T0 + 3 * MIN; t += 9'000) x.at(t);
  CHECK(x.effects() == std::vector<std::string>{x.effect("daily", T0)});
  CHECK(x.job("daily").next_run == T0 + 24 * 60 * MIN);
}

TEST_CASE("a reminder due to two schedulers of one store fires once (zeroclaw 2220)", "[cron]") {
  cron_fixture x("cron-2220");
  auto other_clock = std::make_shared<runtime::manual_clock>(T0);
  cron_options o;
  o.clock = other_clock;
  o.claimant = "second-scheduler";
  o.overdue_grace = std::chrono::milliseconds(0);
  auto second = std::make_shared<cron_scheduler>(
      x.f.host->pool().at(1), x.f.host->store(), o, x.f.host->jobs().channel_ptr(),
      actors::cron_prompt_runner{}, protocol::session_policy{}, [](const std::string&) {});
  REQUIRE(x.f.sync(second->start()));
  for (int i = 0; i < 3; ++i) {
    auto s = x.counting("remind" + std::to_string(i), protocol::at_schedule{T0 + 5000});
    x.add(s);
  }
  other_clock->set(T0 + 5000);
  x.clock->set(T0 + 5000);
  x.f.sync(second->quiet_at(T0 + 5000));
  x.f.sync(x.cron().quiet_at(T0 + 5000));
  x.f.sync(second->quiet_at(T0 + 5000));
  auto lines = x.effects();
  CHECK(lines.size() == 3);
  CHECK(std::set<std::string>(lines.begin(), lines.end()).size() == 3);
  for (int i = 0; i < 3; ++i) CHECK(x.runs("remind" + std::to_string(i)).size() == 1);
  x.f.sync(second->shutdown());
}

TEST_CASE("a prompt job runs its agent in a session of its own and records the answer", "[cron]") {
  cron_fixture x("cron-prompt");
  cron_job_spec s;
  s.name = "summary";
  s.agent = "worker";
  s.when = every_minute();
  s.kind = protocol::cron_action_kind::prompt;
  s.prompt = "summarise the night";
  x.add(s);
  x.at(T0);
  auto runs = x.runs("summary");
  REQUIRE(runs.size() == 1);
  CHECK(runs[0].status == "ok");
  CHECK(runs[0].output == "answered: summarise the night");
}

TEST_CASE(
    "the schedule file is reconciled at start: added, changed and removed, runtime jobs "
    "untouched, a malformed file is refused whole",
    "[cron]") {
  scratch_dir files("cron-file-src");
  auto path = files.file("jobs.json");
  auto write = [&path](const std::string& text) { std::ofstream(path) << text; };
  write(R"({"jobs": [
    {"name": "keep", "agent": "ops", "schedule": {"every_ms": 60000, "anchor_ms": 1800000000000},
     "command": "true"},
    {"name": "change", "agent": "ops", "schedule": {"every_ms": 60000, "anchor_ms": 1800000000000},
     "command": "true"},
    {"name": "drop", "agent": "ops", "schedule": {"every_ms": 60000, "anchor_ms": 1800000000000},
     "command": "true"}]})");
  cron_fixture x("cron-file", [&path](cron_options& o) { o.file = path; });
  REQUIRE(x.f.boot.cron);
  CHECK(x.f.boot.cron->file.added.size() == 3);
  x.add(x.counting("runtime-job", every_minute()));
  write(R"({"jobs": [
    {"name": "keep", "agent": "ops", "schedule": {"every_ms": 60000, "anchor_ms": 1800000000000},
     "command": "true"},
    {"name": "change", "agent": "ops", "schedule": {"every_ms": 120000, "anchor_ms": 1800000000000},
     "command": "true"},
    {"name": "new", "agent": "ops", "schedule": {"every_ms": 60000, "anchor_ms": 1800000000000},
     "command": "true"}]})");
  x.restart();
  REQUIRE(x.f.boot.cron);
  CHECK(x.f.boot.cron->file.added == std::vector<std::string>{"new"});
  CHECK(x.f.boot.cron->file.changed == std::vector<std::string>{"change"});
  CHECK(x.f.boot.cron->file.removed == std::vector<std::string>{"drop"});
  CHECK(x.exists("runtime-job"));
  CHECK(x.exists("keep"));
  CHECK_FALSE(x.exists("drop"));
  // A malformed file: the host does not start, and every job is kept.
  write(R"({"jobs": [{"name": "keep", "agent": "ops", "schedule": {"cron": "61 * * * *"},
     "command": "true"}]})");
  x.f.close();
  actors::host_options o;
  o.db_path = x.f.dir.file("tether.db");
  o.agents = x.f.agents;
  o.cron = x.opts;
  o.log = [](const std::string&) {};
  auto h = actors::host::open(o);
  REQUIRE(h);
  auto b = runtime::sync_wait((*h)->pool().at(0), (*h)->boot());
  (*h)->shutdown();
  REQUIRE_FALSE(b);
  CHECK(b.error().message.find("schedule file " + path) != std::string::npos);
  CHECK(b.error().message.find("minute") != std::string::npos);
  CHECK(b.error().message.find("nothing of it was applied") != std::string::npos);
  h->reset();
  x.opts.file.clear();
  x.f.open();
  for (auto n : {"keep", "change", "new", "runtime-job"}) CHECK(x.exists(n));
}

TEST_CASE(
    "an agent's tool call schedules a job it owns, whatever owner the call names, and a "
    "policy without the cron tool refuses it",
    "[cron]") {
  cron_fixture x("cron-tool");
  auto answers = std::make_shared<std::vector<std::string>>();
  x.f.code("planner")->fn = [answers, side = x.side()](
                                actors::agent_context& ctx,
                                actors::drain_input in) -> asio::awaitable<void> {
    for (auto& m : in.inputs) {
      if (m.kind != "prompt") continue;
      cron_job_spec s;
      s.name = "from-" + m.text;
      s.agent = "somebody-else";  // the model's claim: ignored
      s.when = protocol::every_schedule{MIN, T0};
      s.command = "echo \"$TETHER_CRON_JOB\" >> " + side;
      auto added = co_await ctx.cron_add(s);
      answers->push_back(added ? "added " + added->spec.agent : "refused " + added.error().message);
    }
  };
  REQUIRE(x.f.sync(x.f.host->create_session("planner", session_id("planner"), "ops")));
  REQUIRE(x.f.sync(x.f.host->prompt(session_id("planner"), "turn")));
  REQUIRE(x.f.sync(x.f.host->wait_idle(session_id("planner"))));
  REQUIRE(answers->size() == 1);
  CHECK(answers->at(0) == "added ops");
  CHECK(x.job("from-turn").spec.agent == "ops");
  x.at(T0);
  CHECK(x.effects() == std::vector<std::string>{"from-turn"});

  protocol::session_policy no_cron;
  no_cron.tools = std::set<std::string>{"shell"};
  REQUIRE(x.f.sync(x.f.host->create_session("planner", session_id("planner2"), "ops",
                                            protocol::tenant_id("default"), no_cron)));
  x.f.code("planner2")->fn = x.f.agents->code["planner"]->fn;
  REQUIRE(x.f.sync(x.f.host->prompt(session_id("planner2"), "again")));
  REQUIRE(x.f.sync(x.f.host->wait_idle(session_id("planner2"))));
  REQUIRE(answers->size() == 2);
  CHECK(answers->at(1).find("refused") == 0);
  CHECK(answers->at(1).find("'cron' is not allowed") != std::string::npos);
  CHECK_FALSE(x.exists("from-again"));
}

TEST_CASE(
    "the system wall clock wakes at its wall-clock deadline, and an interrupt ends a sleep "
    "at once, even one that had not begun",
    "[cron]") {
  auto clock = runtime::system_wall_clock();
  boost::asio::io_context io;
  auto deadline = clock->now_ms() + 20;
  auto woke = runtime::run_to_completion(io, clock->sleep_until(io.get_executor(), deadline));
  CHECK(woke == runtime::wall_clock::wake::due);
  CHECK(clock->now_ms() >= deadline);
  clock->interrupt();  // nobody sleeps: the next sleep ends at once
  woke = runtime::run_to_completion(
      io, clock->sleep_until(io.get_executor(), clock->now_ms() + 3'600'000));
  CHECK(woke == runtime::wall_clock::wake::interrupted);
}
