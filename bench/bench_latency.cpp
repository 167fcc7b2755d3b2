// bench_latency: settle -> admitted latency under load, not only at
// saturation, through the real host (WAL, synchronous=FULL): the same run
// first measures the maximum rate closed loop, then offers an open-loop load
// at a fraction of it (50% by default) and reports the latency there, next to
// the closed-loop latency. Targets (the issue): at 50% of the maximum rate,
// settle -> admitted p50 <= 1 ms and p99 <= 5 ms.
//
// A run: P parents (default 1), each spawning C background children (default
// 1,000), all on one host of 2 executors, one database.
//   Phase 0 (raw floor): a plain SQLite connection on the same disk commits
//     one report-sized row per transaction for a second (WAL, FULL); its
//     commit latency is what one durable step costs at least. The settle ->
//     admitted path holds two of them (the settle's commit, then the admit's).
//   Phase 1 (spawn): every parent is prompted; its turn spawns its children in
//     the background, one after the other; each child's first busy period
//     settles into a background report. As bench_settle's phase 1.
//   Phase A (closed loop, the baseline): one driver per child prompts it
//     again as soon as it is idle (its settle and delivery done), for A
//     seconds (default 5), as bench_settle's phase 2. max_rate is the
//     reports admitted per second in the steady window (from 1 s after the
//     start to the deadline: the ramp and the drain tail left out).
//   Phase B (open loop): arrivals on a schedule fixed in advance: Poisson at
//     load x max_rate (exponential gaps from a fixed seed), for B seconds
//     (default 10). A pacer on its own thread (an io_context of this
//     program's main thread, off the host's executors) waits on a
//     steady_timer for each arrival's scheduled time; the schedule never
//     depends on when earlier reports were admitted (a pacer that fell behind
//     dispatches what is due at once, and its lag is reported). An arrival
//     takes an idle child (first in, first out) and prompts it once; the
//     child is idle again after its report was admitted. An arrival due when
//     no child is idle is skipped and counted (late_arrivals); 1,000
//     children leave most of them idle at 50% load unless busy periods
//     queue (busy_children_max says how many were ever busy at once).
//   Phase C (closed loop again, 2 s): the maximum rate after the open loop
//     (max_rate_after, steady window from 0.5 s), to show whether the
//     capacity the open loop ran against was still the one it was sized
//     from (a parent's inbox only grows over the run);
//     load_vs_max_after = offered rate / max_rate_after.
//   Last (the open loop's commits on the bare disk): a plain connection
//     commits transactions that each write as many pages (WAL frames) as the
//     open loop's transactions wrote on average, for a second; their COMMIT
//     latency is what a commit the size of the runtime's costs this disk. A
//     settle waits for the commit in flight and then commits in the next,
//     so its latency is at least about one and a half of these.
// Between phases the host is quiescent, so each busy period belongs to one
// phase. The default run takes about 22 s.
//
// Children are agents that answer each prompt with one completed message
// echoing its "[period N]" marker (no transcript read: bench_settle's
// scripted agent counts its inputs on every input, which costs CPU before
// the settle but does not lie on the settle -> admitted path). A parent's
// agent spawns on its prompt and takes no turn on a report; it still drains
// and acknowledges its inbox, which is part of the real path (and of the
// writer's load).
//
// Latency: from the settling hook (before the busy period is classified and
// its settle written) to the admitted hook (after the parent's admit
// committed), through host_options.observer, split at the settled hook
// (after the settle committed): settle_commit (settling -> settled) and
// delivery (settled -> admitted). A report owed to a parent that is there is
// admitted by its settle's own commit, so its delivery part is only the
// hooks' hand-off; a report the plain path delivers has the delivery path
// and the admit's commit there.
// prompt_to_admit: from just before a prompt to the inbox row's admitted_at
// (wall ms). cpu_us_per_report: the process CPU time over a phase (pacer
// included) per report of that phase. The writer's transactions and
// requests per transaction over each phase show the group commits' size;
// wal_frames_per_report, the pages its commits wrote and synced per report
// (each a WAL frame: what a commit costs beyond its sync).
//
// Checks: the parent's inbox holds each (child, busy period) that ran exactly
// once, acknowledged and once in its transcript; the admitted hook fired once
// per row, and each report has its latency sample, of the phase its busy
// period ran in; the outbox (jobs table) is empty; no commit failed. Prints
// "ok" 1 or 0 (and exits 1 unless ok).
//
// The last line is one JSON object {"bench":"latency",...}: p50_ms, p99_ms
// and max_ms are phase B's settle -> admitted, closed_loop_* phase A's;
// open_loop_pages_per_transaction and raw_commit_p50_ms_at_those_pages are
// the last measurement's;
// p50_target_met (p50 <= 1 ms) and p99_target_met (p99 <= 5 ms) are phase B's.
#include <SQLiteCpp/Database.h>
#include <SQLiteCpp/Statement.h>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <cstdlib>
#include <ctime>
#include <deque>
#include <filesystem>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <unordered_map>

#include "host_support.hpp"
#include "spawning_parent.hpp"
#include "support.hpp"
#include "tether/actors/host.hpp"
#include "tether/persistence/database.hpp"
#include "tether/persistence/task_store.hpp"
#include "tether/runtime/clock.hpp"
#include "tether/runtime/one_shot.hpp"
#include "tether/runtime/sync_wait.hpp"

namespace {

using namespace tether;
namespace asio = boost::asio;
namespace bench = tether::bench;
using asio::awaitable;
using bench::clock;
using bench::sync;
using protocol::notification_id;
using protocol::session_id;

constexpr char k_bench[] = "bench_latency";
constexpr std::size_t k_threads = 2;
constexpr std::uint64_t k_seed = 20240611;  // the arrival schedule's

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "bench_latency: %s\n", what.c_str());
  std::exit(1);
}

using bench::cpu_seconds;

clock::duration secs(double s) {
  return std::chrono::duration_cast<clock::duration>(std::chrono::duration<double>(s));
}
double ms_between(clock::time_point a, clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

struct shape {
  std::size_t parents = 1;
  std::size_t children = 1000;  // per parent
  double spawn_budget = 10;     // seconds: no spawn after this
  double closed_seconds = 5;    // phase A: no busy period starts after this
  double warmup = 1;            // phase A: left out of max_rate
  double open_seconds = 10;     // phase B: the schedule's length
  double load = 0.5;            // phase B: offered rate / max_rate
  double after_seconds = 2;     // phase C
  double after_warmup = 0.5;    // phase C: left out of max_rate_after
};

// Which phase a busy period ran in.
enum phase : std::uint8_t {
  spawn_phase = 0,
  closed_phase = 1,  // A
  open_phase = 2,    // B
  after_phase = 3,   // C
  k_phases = 4
};
const char* phase_name(int p) {
  static const char* names[] = {"spawn", "closed_loop", "open_loop", "closed_loop_after"};
  return names[p];
}

using bench::child_name;
using bench::marker;
using bench::parent_agent;
using bench::parent_name;
using bench::spawn_state;

// A child: answers each prompt with one completed message carrying the
// prompt's "[period N]" marker (the report's body then names its period).
class child_agent : public actors::agent {
 public:
  awaitable<void> drain(actors::agent_context& ctx, actors::drain_input in) override {
    for (auto& m : in.inputs) {
      if (m.kind != "prompt") continue;
      auto at = m.text.find("[period ");
      std::string text = ctx.self().str() + " answers " +
                         (at == std::string::npos ? std::string("[period ?]") : m.text.substr(at));
      auto r = co_await ctx.say(std::move(text));
      if (!r) throw error_exception(r.error());
    }
  }
};

class bench_agents : public actors::agent_factory {
 public:
  bench_agents(const shape& s, spawn_state* st) : st_(st) {
    for (std::size_t p = 0; p < s.parents; ++p) parents_[parent_name(p)] = {p, s.children};
  }

  std::shared_ptr<actors::agent> make(const persistence::session_row& row) override {
    auto it = parents_.find(row.id.str());
    if (it != parents_.end())
      return std::make_shared<parent_agent>(it->second.first, it->second.second, st_);
    return std::make_shared<child_agent>();
  }

 private:
  spawn_state* st_;
  std::map<std::string, std::pair<std::size_t, std::size_t>> parents_;  // name -> index, children
};

// One report's way from its settling hook to its admitted hook.
struct sample {
  std::uint8_t phase = 0;
  clock::time_point settling;
  clock::time_point settled;
  clock::time_point admitted;
  double total_ms() const { return ms_between(settling, admitted); }
  double settle_commit_ms() const { return ms_between(settling, settled); }
  double delivery_ms() const { return ms_between(settled, admitted); }
};

// Settle-to-admit latency of every report, through the run hooks; each
// sample is tagged with the phase that was current at its settling hook.
class latency_observer : public actors::run_observer {
 public:
  void set_phase(phase p) { phase_.store(p); }

  void started(const session_id& s, std::int64_t) override {
    if (s.str().rfind("ses_parent", 0) == 0) ++parent_busy_periods_;
  }
  awaitable<void> settling(const session_id& s) override {
    sample x;
    x.settling = clock::now();
    x.phase = phase_.load();
    {
      std::lock_guard lk(m_);
      settling_[s.str()] = x;
    }
    co_return;
  }
  void settled(const session_id& s, std::optional<notification_id> report) override {
    if (!report) return;
    auto now = clock::now();
    std::lock_guard lk(m_);
    auto x = settling_[s.str()];
    x.settled = now;
    owed_[report->str()] = x;
  }
  void admitted(const session_id&, const notification_id& report) override {
    auto now = clock::now();
    std::lock_guard lk(m_);
    ++admitted_;
    auto it = owed_.find(report.str());
    if (it == owed_.end()) {
      ++unmatched_;
      return;
    }
    it->second.admitted = now;
    samples_.push_back(it->second);
    owed_.erase(it);
  }
  std::size_t admitted_count() {
    std::lock_guard lk(m_);
    return admitted_;
  }
  std::size_t unmatched() {
    std::lock_guard lk(m_);
    return unmatched_;
  }
  std::size_t parent_busy_periods() const { return parent_busy_periods_.load(); }
  std::vector<sample> samples() {
    std::lock_guard lk(m_);
    return samples_;
  }

 private:
  std::atomic<std::uint8_t> phase_{spawn_phase};
  std::mutex m_;
  std::unordered_map<std::string, sample> settling_;  // session -> its last settling
  std::unordered_map<std::string, sample> owed_;      // report -> its settling, settled
  std::vector<sample> samples_;
  std::size_t admitted_ = 0;
  std::size_t unmatched_ = 0;
  std::atomic<std::size_t> parent_busy_periods_{0};
};

// One child and its busy periods. Driven by one coroutine at a time (a
// closed-loop driver, or the open-loop arrival that took it from the idle
// list); read by the checks once everything is quiescent.
struct child_state {
  session_id id;
  int done = 1;                            // last busy period run (1: the spawn's)
  std::vector<std::int64_t> submitted_ms;  // per period (index 0 unused, 1 unknown)
  std::vector<std::uint8_t> phase_of;      // per period
};

// Prompts one child once as busy period `done + 1` of phase `ph` and waits
// until it is idle again (its settle committed and its report admitted).
awaitable<void> run_period(actors::host* h, child_state* c, phase ph) {
  int i = c->done + 1;
  c->submitted_ms.push_back(runtime::now_ms());
  c->phase_of.push_back(ph);
  std::string text = "go on " + marker(i);
  auto p = co_await h->prompt(c->id, std::move(text));
  if (!p) die("prompt to " + c->id.str() + " failed: " + p.error().message);
  c->done = i;
  auto w = co_await h->wait_idle(c->id);
  if (!w) die("wait_idle of " + c->id.str() + " failed: " + w.error().message);
}

// Phase A: prompts one child again and again, each time after it is idle,
// until the deadline.
awaitable<void> drive_closed(actors::host* h, child_state* c, clock::time_point deadline,
                             phase ph) {
  while (clock::now() < deadline) co_await run_period(h, c, ph);
}

// Counts coroutines still running; `done` is set when the last one ends
// (the starter holds one share until it has started them all).
struct join_counter {
  std::atomic<std::size_t> left{1};
  std::shared_ptr<runtime::one_shot<int>> done = runtime::one_shot<int>::make();
  void add() { ++left; }
  void release() {
    if (--left == 0) done->set(0);
  }
};

awaitable<void> wait_joined(actors::host* h, join_counter* j) {
  co_await j->done->async_wait(asio::use_awaitable);
  co_await h->wait_quiescent(false);
}

void spawn_counted(actors::host* h, awaitable<void> task, join_counter* j) {
  j->add();
  asio::co_spawn(h->pool().next(), std::move(task), [j](std::exception_ptr e) {
    if (e) die("a driver threw: " + runtime::detail::describe(e));
    j->release();
  });
}

// Phase B's state: the idle children, the schedule's bookkeeping.
struct open_loop {
  actors::host* h = nullptr;
  std::vector<child_state>* children = nullptr;
  double rate = 0;  // arrivals per second
  double seconds = 0;
  join_counter joined;
  std::mutex m;
  std::deque<std::size_t> idle;  // under m: children not busy
  std::size_t busy_max = 0;      // under m
  std::size_t arrivals = 0;      // scheduled within the window
  std::size_t late = 0;          // due while no child was idle: skipped
  std::vector<double> lag_ms;    // dispatch time - scheduled time, per arrival
  clock::time_point start;
};

// One arrival: its child's busy period, then the child is idle again.
awaitable<void> serve_arrival(open_loop* ol, std::size_t k) {
  co_await run_period(ol->h, &(*ol->children)[k], open_phase);
  std::lock_guard lk(ol->m);
  ol->idle.push_back(k);
}

// The pacer: Poisson arrivals at ol->rate for ol->seconds, their gaps drawn
// from a fixed seed; no arrival's time depends on how the run progresses.
// Runs on its own io_context (this program's main thread), off the host's
// executors.
awaitable<void> pace(open_loop* ol) {
  asio::steady_timer timer(co_await asio::this_coro::executor);
  std::mt19937_64 rng(k_seed);
  std::exponential_distribution<double> gap(ol->rate);
  double at = gap(rng);
  ol->start = clock::now();
  const std::size_t total = ol->idle.size();  // every child is idle at first
  while (at < ol->seconds) {
    auto due = ol->start + secs(at);
    if (clock::now() < due) {
      timer.expires_at(due);
      co_await timer.async_wait(asio::use_awaitable);
    }
    auto now = clock::now();
    ++ol->arrivals;
    ol->lag_ms.push_back(ms_between(due, now));
    std::optional<std::size_t> k;
    {
      std::lock_guard lk(ol->m);
      if (!ol->idle.empty()) {
        k = ol->idle.front();
        ol->idle.pop_front();
        ol->busy_max = std::max(ol->busy_max, total - ol->idle.size());
      } else {
        ++ol->late;
      }
    }
    if (k) spawn_counted(ol->h, serve_arrival(ol, *k), &ol->joined);
    at += gap(rng);
  }
}

struct phase_figures {
  double seconds = 0;  // from the first prompt to quiescence
  double cpu = 0;      // process CPU seconds
  std::size_t periods = 0;
  persistence::writer_stats stats;
  std::vector<double> total_ms, settle_commit_ms, delivery_ms, prompt_to_admit_ms;
};

struct outcome {
  std::size_t spawned = 0;
  std::size_t reports = 0;
  double spawn_seconds = 0;
  double max_rate = 0;         // phase A, steady window
  double max_rate_after = 0;   // phase C, steady window
  double offered_rate = 0;     // load x max_rate
  std::size_t arrivals = 0;    // phase B, scheduled
  std::size_t late = 0;        // phase B, skipped
  std::size_t busy_max = 0;    // phase B
  std::vector<double> lag_ms;  // phase B, pacer lag
  double open_window = 0;      // phase B, the schedule's length
  phase_figures ph[k_phases];
  std::size_t parent_busy_periods = 0;
  std::size_t parent_drains = 0;
  bool ok = false;
};

persistence::writer_stats stats_since(const persistence::writer_stats& a,
                                      const persistence::writer_stats& b) {
  persistence::writer_stats d;
  d.transactions = b.transactions - a.transactions;
  d.requests = b.requests - a.requests;
  d.failed_commits = b.failed_commits - a.failed_commits;
  d.frames_written = b.frames_written - a.frames_written;
  return d;
}

// Every busy period that ran is exactly once in its parent's inbox,
// acknowledged and once in the transcript; the outbox is empty; every
// report has its latency sample, of the phase its busy period ran in.
bool check(const std::string& path, const shape& s, const spawn_state& st,
           const std::vector<child_state>& kids, latency_observer& obs,
           const std::vector<sample>& samples, outcome& o) {
  SQLite::Database db(path, SQLite::OPEN_READONLY);
  bool ok = true;
  auto fail = [&](const std::string& what) {
    std::fprintf(stderr, "bench_latency: check failed: %s\n", what.c_str());
    ok = false;
  };
  auto outstanding = persistence::task_reader(path).outstanding_jobs();
  auto jobs = outstanding ? static_cast<std::int64_t>(outstanding->size()) : -1;
  if (jobs != 0) fail(std::to_string(jobs) + " tasks still running or owing their report");
  std::size_t total = 0, expected = 0;
  std::size_t want_phase[k_phases] = {};
  for (std::size_t p = 0; p < s.parents; ++p) {
    std::string parent = parent_name(p);
    std::size_t spawned = st.spawned[p].load();
    std::map<std::string, std::size_t> index;  // child name -> index in kids
    std::size_t want = 0;
    for (std::size_t c = 0; c < spawned; ++c) {
      std::size_t k = p * s.children + c;
      index[kids[k].id.str()] = k;
      want += static_cast<std::size_t>(kids[k].done);
      for (int i = 1; i <= kids[k].done; ++i)
        ++want_phase[kids[k].phase_of[static_cast<std::size_t>(i)]];
    }
    std::set<std::pair<std::size_t, int>> seen;
    SQLite::Statement q(db,
                        "SELECT from_session, body, state, admitted_at FROM inbox "
                        "WHERE session_id = ?");
    q.bind(1, parent);
    while (q.executeStep()) {
      ++total;
      std::string from = q.getColumn(0).getString();
      std::string body = q.getColumn(1).getString();
      auto at = body.find("[period ");
      auto it = index.find(from);
      if (it == index.end() || at == std::string::npos) {
        fail("an inbox row of " + parent + " from '" + from + "' is not one of ours");
        continue;
      }
      const auto& kid = kids[it->second];
      int period = std::atoi(body.c_str() + at + 8);
      if (period < 1 || period > kid.done) {
        fail("report " + from + " " + marker(period) + " is of a busy period that never ran");
        continue;
      }
      if (!seen.insert({it->second, period}).second)
        fail("report " + from + " " + marker(period) + " admitted twice");
      if (q.getColumn(2).getString() != "acked")
        fail("report " + from + " " + marker(period) + " not acknowledged");
      if (period >= 2) {
        auto pp = static_cast<std::size_t>(period);
        o.ph[kid.phase_of[pp]].prompt_to_admit_ms.push_back(
            static_cast<double>(q.getColumn(3).getInt64() - kid.submitted_ms[pp]));
      }
    }
    if (seen.size() != want)
      fail(parent + " has " + std::to_string(seen.size()) + " distinct reports, expected " +
           std::to_string(want));
    SQLite::Statement t(db,
                        "SELECT count(*) FROM messages WHERE session_id = ? AND kind = 'report'");
    t.bind(1, parent);
    t.executeStep();
    if (static_cast<std::size_t>(t.getColumn(0).getInt64()) != seen.size())
      fail(parent + "'s transcript holds " + std::to_string(t.getColumn(0).getInt64()) +
           " reports, its inbox " + std::to_string(seen.size()));
    expected += want;
    o.spawned += spawned;
  }
  o.reports = total;
  if (total != expected)
    fail(std::to_string(total) + " inbox rows, expected " + std::to_string(expected));
  if (obs.admitted_count() != total)
    fail("the admitted hook fired " + std::to_string(obs.admitted_count()) + " times for " +
         std::to_string(total) + " inbox rows");
  if (obs.unmatched() != 0)
    fail(std::to_string(obs.unmatched()) + " admitted reports had no settle hook");
  std::size_t got_phase[k_phases] = {};
  for (auto& x : samples) ++got_phase[x.phase];
  for (int p = 0; p < k_phases; ++p) {
    o.ph[p].periods = want_phase[p];
    if (got_phase[p] != want_phase[p])
      fail(std::string(phase_name(p)) + ": " + std::to_string(got_phase[p]) +
           " latency samples for " + std::to_string(want_phase[p]) + " busy periods");
  }
  return ok;
}

// One report-sized row per transaction on a plain connection (WAL, FULL), for
// `seconds`: each commit's latency in ms.
std::vector<double> raw_commit_ms(const std::string& path, double seconds) {
  SQLite::Database db(path, SQLite::OPEN_READWRITE | SQLite::OPEN_CREATE);
  db.exec("PRAGMA journal_mode = WAL");
  db.exec("PRAGMA synchronous = FULL");
  db.exec("CREATE TABLE IF NOT EXISTS r(nid TEXT PRIMARY KEY, body TEXT NOT NULL)");
  SQLite::Statement ins(db, "INSERT INTO r(nid, body) VALUES (?, ?)");
  std::string body(160, 'r');
  std::vector<double> ms;
  auto deadline = clock::now() + secs(seconds);
  std::size_t serial = 0;
  while (clock::now() < deadline) {
    auto t0 = clock::now();
    db.exec("BEGIN");
    ins.reset();
    ins.bind(1, "msg_" + std::to_string(++serial));
    ins.bind(2, body);
    ins.exec();
    db.exec("COMMIT");
    ms.push_back(ms_between(t0, clock::now()));
  }
  return ms;
}

// The disk's cost of a commit the size of the runtime's: transactions that
// each rewrite `pages` distinct rows, chosen at random, of a table laid out
// one row per page (a 3,000-byte row in a 4 KiB page), each with fresh random
// bytes (SQLite skips a rewrite that leaves a page's bytes unchanged). An
// in-place update of a row of the same size dirties its leaf alone, so each
// COMMIT appends and syncs `pages` WAL frames, as a runtime transaction that
// wrote that many does. Returns each COMMIT's latency in ms, for `seconds`
// (at least 20). The WAL is copied back and truncated outside the timing,
// every 1,000 frames: the runtime's checkpoints run off its commit path too.
std::vector<double> raw_commit_pages_ms(const std::string& path, int pages, double seconds) {
  SQLite::Database db(path, SQLite::OPEN_READWRITE | SQLite::OPEN_CREATE);
  db.exec("PRAGMA journal_mode = WAL");
  db.exec("PRAGMA synchronous = FULL");
  db.exec("PRAGMA wal_autocheckpoint = 0");
  db.exec("CREATE TABLE IF NOT EXISTS p(id INTEGER PRIMARY KEY, pad BLOB NOT NULL)");
  const int rows = std::max(4096, pages * 16);
  {
    SQLite::Statement fill(db,
                           "WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c WHERE "
                           "i < ?) INSERT INTO p SELECT i, randomblob(3000) FROM c");
    fill.bind(1, rows);
    db.exec("BEGIN");
    fill.exec();
    db.exec("COMMIT");
    db.exec("PRAGMA wal_checkpoint(TRUNCATE)");
  }
  SQLite::Statement up(db, "UPDATE p SET pad = randomblob(3000) WHERE id = ?");
  std::mt19937 rng(20261205);
  std::uniform_int_distribution<int> pick(1, rows);
  std::vector<double> ms;
  int frames = 0;
  auto deadline = clock::now() + secs(seconds);
  while (ms.size() < 20 || clock::now() < deadline) {
    std::set<int> ids;
    while (static_cast<int>(ids.size()) < pages) ids.insert(pick(rng));
    db.exec("BEGIN");
    for (int id : ids) {
      up.reset();
      up.bind(1, id);
      up.exec();
    }
    auto t0 = clock::now();
    db.exec("COMMIT");
    ms.push_back(ms_between(t0, clock::now()));
    if ((frames += pages) >= 1000) {
      db.exec("PRAGMA wal_checkpoint(TRUNCATE)");
      frames = 0;
    }
  }
  return ms;
}

// A closed-loop phase: one driver per live child, prompting it again as soon
// as it is idle, until `seconds` passed; then quiescence. Returns the reports
// admitted per second in the steady window (from `warmup` after the start to
// the deadline).
double closed_loop(actors::host& host, latency_observer& observer, std::vector<child_state>& kids,
                   const std::vector<std::size_t>& live, phase ph, double seconds, double warmup,
                   phase_figures& f) {
  auto& writer = host.store().db_writer();
  observer.set_phase(ph);
  auto w0 = writer.stats();
  double cpu0 = cpu_seconds();
  auto t0 = clock::now();
  auto deadline = t0 + secs(seconds);
  join_counter j;
  for (auto k : live) spawn_counted(&host, drive_closed(&host, &kids[k], deadline, ph), &j);
  j.release();
  sync(host, wait_joined(&host, &j));
  f.seconds = bench::seconds_since(t0);
  f.cpu = cpu_seconds() - cpu0;
  f.stats = stats_since(w0, writer.stats());
  auto from = t0 + secs(std::min(warmup, seconds / 2));
  std::size_t n = 0;
  for (auto& x : observer.samples())
    if (x.phase == ph && x.admitted >= from && x.admitted < deadline) ++n;
  double rate = static_cast<double>(n) / std::chrono::duration<double>(deadline - from).count();
  if (!(rate > 0)) die(std::string(phase_name(ph)) + " admitted nothing in its steady window");
  return rate;
}

outcome run(const std::string& dir, const shape& s) {
  std::string path = dir + "/latency.db";
  spawn_state st(s.parents);
  auto observer = std::make_shared<latency_observer>();
  actors::host_options opts;
  opts.db_path = path;
  opts.sync = persistence::sync_mode::full;
  opts.threads = k_threads;
  opts.agents = std::make_shared<bench_agents>(s, &st);
  opts.observer = observer;
  opts.log = [](const std::string& w) {
    std::fprintf(stderr, "bench_latency: host: %s\n", w.c_str());
  };
  auto h = actors::host::open(opts);
  if (!h) die("host::open failed: " + h.error().message);
  auto& host = **h;
  if (auto b = sync(host, host.boot()); !b) die("boot failed: " + b.error().message);
  for (std::size_t p = 0; p < s.parents; ++p) {
    auto r = sync(host, host.create_session("bench parent", session_id(parent_name(p))));
    if (!r) die("create_session failed: " + r.error().message);
  }
  std::vector<child_state> kids(s.parents * s.children);
  for (std::size_t p = 0; p < s.parents; ++p)
    for (std::size_t c = 0; c < s.children; ++c) {
      auto& k = kids[p * s.children + c];
      k.id = session_id(child_name(p, c));
      k.submitted_ms.assign(2, 0);
      k.phase_of.assign(2, spawn_phase);
    }
  std::vector<std::size_t> live;  // indices of the children that were spawned
  outcome o;
  auto& writer = host.store().db_writer();

  // Phase 1: the parents spawn their children.
  {
    auto& f = o.ph[spawn_phase];
    auto w0 = writer.stats();
    double cpu0 = cpu_seconds();
    auto t0 = clock::now();
    st.deadline = (t0 + secs(s.spawn_budget)).time_since_epoch().count();
    for (std::size_t p = 0; p < s.parents; ++p) {
      auto r = sync(host, host.prompt(session_id(parent_name(p)), "spawn your children"));
      if (!r) die("prompting a parent failed: " + r.error().message);
    }
    sync(host, host.wait_quiescent(false));
    f.seconds = bench::seconds_since(t0);
    f.cpu = cpu_seconds() - cpu0;
    f.stats = stats_since(w0, writer.stats());
    o.spawn_seconds = f.seconds;
    for (std::size_t p = 0; p < s.parents; ++p)
      for (std::size_t c = 0; c < st.spawned[p].load(); ++c) live.push_back(p * s.children + c);
    if (live.empty()) die("no child was spawned");
  }

  // Phase A: closed loop, one driver per child; the maximum rate.
  o.max_rate = closed_loop(host, *observer, kids, live, closed_phase, s.closed_seconds, s.warmup,
                           o.ph[closed_phase]);

  // Phase B: open loop at load x max_rate.
  {
    auto& f = o.ph[open_phase];
    observer->set_phase(open_phase);
    open_loop ol;
    ol.h = &host;
    ol.children = &kids;
    ol.rate = s.load * o.max_rate;
    ol.seconds = s.open_seconds;
    ol.idle.assign(live.begin(), live.end());
    auto w0 = writer.stats();
    double cpu0 = cpu_seconds();
    auto t0 = clock::now();
    asio::io_context io;
    asio::co_spawn(io, pace(&ol), [](std::exception_ptr e) {
      if (e) die("the pacer threw: " + runtime::detail::describe(e));
    });
    io.run();
    ol.joined.release();
    sync(host, wait_joined(&host, &ol.joined));
    f.seconds = bench::seconds_since(t0);
    f.cpu = cpu_seconds() - cpu0;
    f.stats = stats_since(w0, writer.stats());
    o.offered_rate = ol.rate;
    o.arrivals = ol.arrivals;
    o.late = ol.late;
    o.busy_max = ol.busy_max;
    o.lag_ms = std::move(ol.lag_ms);
    o.open_window = ol.seconds;
  }

  // Phase C: closed loop again, the maximum rate after the open loop.
  o.max_rate_after = closed_loop(host, *observer, kids, live, after_phase, s.after_seconds,
                                 s.after_warmup, o.ph[after_phase]);

  host.shutdown();
  h->reset();
  auto samples = observer->samples();
  for (auto& x : samples) {
    auto& f = o.ph[x.phase];
    f.total_ms.push_back(x.total_ms());
    f.settle_commit_ms.push_back(x.settle_commit_ms());
    f.delivery_ms.push_back(x.delivery_ms());
  }
  o.parent_busy_periods = observer->parent_busy_periods();
  o.parent_drains = st.parent_drains.load();
  bool failed_commits = false;
  for (auto& f : o.ph)
    if (f.stats.failed_commits != 0) failed_commits = true;
  if (failed_commits) std::fprintf(stderr, "bench_latency: check failed: a commit failed\n");
  o.ok = check(path, s, st, kids, *observer, samples, o) && !failed_commits;
  return o;
}

void emit_phase(const std::string& f, phase_figures& p) {
  bench::emit(k_bench, f + "_reports", static_cast<double>(p.periods), "reports");
  bench::emit(k_bench, f + "_seconds", p.seconds, "s");
  bench::emit(k_bench, f + "_achieved", static_cast<double>(p.periods) / p.seconds, "reports/s");
  bench::emit(k_bench, f + "_p50", bench::percentile(p.total_ms, 50), "ms");
  bench::emit(k_bench, f + "_p99", bench::percentile(p.total_ms, 99), "ms");
  bench::emit(k_bench, f + "_max", bench::percentile(p.total_ms, 100), "ms");
  bench::emit(k_bench, f + "_settle_commit_p50", bench::percentile(p.settle_commit_ms, 50), "ms");
  bench::emit(k_bench, f + "_settle_commit_p99", bench::percentile(p.settle_commit_ms, 99), "ms");
  bench::emit(k_bench, f + "_delivery_p50", bench::percentile(p.delivery_ms, 50), "ms");
  bench::emit(k_bench, f + "_delivery_p99", bench::percentile(p.delivery_ms, 99), "ms");
  bench::emit(k_bench, f + "_prompt_to_admit_p50", bench::percentile(p.prompt_to_admit_ms, 50),
              "ms");
  bench::emit(k_bench, f + "_prompt_to_admit_p99", bench::percentile(p.prompt_to_admit_ms, 99),
              "ms");
  bench::emit(k_bench, f + "_cpu_us_per_report",
              p.cpu * 1e6 / static_cast<double>(std::max<std::size_t>(1, p.periods)), "us");
  bench::emit(k_bench, f + "_transactions_per_s",
              static_cast<double>(p.stats.transactions) / p.seconds, "transactions/s");
  bench::emit(k_bench, f + "_requests_per_transaction",
              static_cast<double>(p.stats.requests) /
                  static_cast<double>(std::max<std::uint64_t>(1, p.stats.transactions)),
              "requests/transaction");
  bench::emit(k_bench, f + "_requests_per_report",
              static_cast<double>(p.stats.requests) /
                  static_cast<double>(std::max<std::size_t>(1, p.periods)),
              "requests/report");
  bench::emit(k_bench, f + "_wal_frames_per_report",
              static_cast<double>(p.stats.frames_written) /
                  static_cast<double>(std::max<std::size_t>(1, p.periods)),
              "pages/report");
}

}  // namespace

// Usage: bench_latency                  1 parent x 1000 children, 5 s closed
//                                       loop, 10 s open loop at 50%, 2 s
//                                       closed loop again (~22 s)
//        bench_latency P C [S [LOAD]]   P parents x C children; S seconds of
//                                       open loop (closed loop: S/2, at least
//                                       2 s); LOAD the open loop's fraction
//                                       of the maximum rate (default 0.5)
int main(int argc, char** argv) {
  shape s;
  if (argc >= 3) {
    s.parents = std::strtoul(argv[1], nullptr, 10);
    s.children = std::strtoul(argv[2], nullptr, 10);
    if (s.parents == 0 || s.children == 0) die("usage: bench_latency [P C [S [LOAD]]]");
  }
  if (argc >= 4) {
    s.open_seconds = std::atof(argv[3]);
    if (!(s.open_seconds > 0)) die("S must be positive");
    s.closed_seconds = std::max(2.0, s.open_seconds / 2);
  }
  if (argc >= 5) {
    s.load = std::atof(argv[4]);
    if (!(s.load > 0)) die("LOAD must be positive");
  }
  std::string dir = bench::make_temp_dir("bench-latency");

  // The disk's floor: one durable commit on a plain connection.
  auto raw = raw_commit_ms(dir + "/raw.db", 1.0);
  double raw_p50 = bench::percentile(raw, 50), raw_p99 = bench::percentile(raw, 99);
  bench::emit(k_bench, "raw_sqlite_commit_p50", raw_p50, "ms");
  bench::emit(k_bench, "raw_sqlite_commit_p99", raw_p99, "ms");

  auto o = run(dir, s);
  auto& a = o.ph[closed_phase];
  auto& b = o.ph[open_phase];
  auto& c = o.ph[after_phase];
  bench::emit(k_bench, "parents", static_cast<double>(s.parents), "parents");
  bench::emit(k_bench, "children", static_cast<double>(o.spawned), "children");
  bench::emit(k_bench, "spawn_phase_seconds", o.spawn_seconds, "s");
  bench::emit(k_bench, "max_rate", o.max_rate, "reports/s");
  emit_phase("closed_loop", a);
  bench::emit(k_bench, "load", s.load, "fraction of max_rate");
  bench::emit(k_bench, "offered_rate", o.offered_rate, "reports/s");
  bench::emit(k_bench, "scheduled_arrivals", static_cast<double>(o.arrivals), "arrivals");
  bench::emit(k_bench, "late_arrivals", static_cast<double>(o.late), "arrivals");
  bench::emit(k_bench, "busy_children_max", static_cast<double>(o.busy_max), "children");
  bench::emit(k_bench, "arrival_lag_p50", bench::percentile(o.lag_ms, 50), "ms");
  bench::emit(k_bench, "arrival_lag_p99", bench::percentile(o.lag_ms, 99), "ms");
  emit_phase("open_loop", b);
  bench::emit(
      k_bench, "parent_inbox_rows_before_open_loop",
      static_cast<double>(o.ph[spawn_phase].periods + a.periods) / static_cast<double>(s.parents),
      "rows/parent");
  bench::emit(k_bench, "max_rate_after", o.max_rate_after, "reports/s");
  bench::emit(k_bench, "load_vs_max_after", o.offered_rate / o.max_rate_after,
              "fraction of max_rate_after");
  emit_phase("closed_loop_after", c);
  bench::emit(k_bench, "parent_busy_periods", static_cast<double>(o.parent_busy_periods),
              "busy periods");
  bench::emit(k_bench, "reports_per_parent_drain",
              static_cast<double>(o.reports) /
                  static_cast<double>(std::max<std::size_t>(1, o.parent_drains)),
              "reports/drain");
  // The open loop's commits on the bare disk: a raw transaction writing as
  // many pages as the open loop's transactions wrote on average.
  double open_frames_per_tx = static_cast<double>(b.stats.frames_written) /
                              static_cast<double>(std::max<std::uint64_t>(1, b.stats.transactions));
  int raw_pages = std::max(1, static_cast<int>(open_frames_per_tx + 0.5));
  auto raw_at = raw_commit_pages_ms(dir + "/raw_pages.db", raw_pages, 1.0);
  double raw_at_p50 = bench::percentile(raw_at, 50);
  bench::emit(k_bench, "open_loop_wal_frames_per_transaction", open_frames_per_tx,
              "pages/transaction");
  bench::emit(k_bench, "raw_commit_at_open_loop_pages_p50", raw_at_p50, "ms");
  bench::emit(k_bench, "raw_commit_at_open_loop_pages_p99", bench::percentile(raw_at, 99), "ms");
  bench::emit(k_bench, "ok", o.ok ? 1 : 0, "bool");

  double p50 = bench::percentile(b.total_ms, 50);
  double p99 = bench::percentile(b.total_ms, 99);
  double offered = static_cast<double>(o.arrivals) / o.open_window;
  double achieved = static_cast<double>(b.periods) / b.seconds;
  auto cpu_per = [](const phase_figures& p) {
    return p.cpu * 1e6 / static_cast<double>(std::max<std::size_t>(1, p.periods));
  };
  std::printf(
      "{\"bench\":\"latency\",\"sync\":\"full\",\"parents\":%zu,\"children\":%zu,"
      "\"max_rate_per_s\":%s,\"load\":%s,\"offered_per_s\":%s,\"achieved_per_s\":%s,"
      "\"max_rate_after_per_s\":%s,\"load_vs_max_after\":%s,"
      "\"late_arrivals\":%zu,\"p50_ms\":%s,\"p99_ms\":%s,\"max_ms\":%s,"
      "\"closed_loop_p50_ms\":%s,\"closed_loop_p99_ms\":%s,\"closed_loop_max_ms\":%s,"
      "\"raw_commit_p50_ms\":%s,\"open_loop_pages_per_transaction\":%s,"
      "\"raw_commit_p50_ms_at_those_pages\":%s,"
      "\"cpu_us_per_report\":%s,\"closed_loop_cpu_us_per_report\":%s,"
      "\"p50_target_met\":%s,\"p99_target_met\":%s,\"ok\":%s}\n",
      s.parents, o.spawned, bench::number(o.max_rate).c_str(), bench::number(s.load).c_str(),
      bench::number(offered).c_str(), bench::number(achieved).c_str(),
      bench::number(o.max_rate_after).c_str(), bench::number(offered / o.max_rate_after).c_str(),
      o.late, bench::number(p50).c_str(), bench::number(p99).c_str(),
      bench::number(bench::percentile(b.total_ms, 100)).c_str(),
      bench::number(bench::percentile(a.total_ms, 50)).c_str(),
      bench::number(bench::percentile(a.total_ms, 99)).c_str(),
      bench::number(bench::percentile(a.total_ms, 100)).c_str(), bench::number(raw_p50).c_str(),
      bench::number(open_frames_per_tx).c_str(), bench::number(raw_at_p50).c_str(),
      bench::number(cpu_per(b)).c_str(), bench::number(cpu_per(a)).c_str(),
      p50 <= 1.0 ? "true" : "false", p99 <= 5.0 ? "true" : "false", o.ok ? "true" : "false");
  std::fflush(stdout);
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  return o.ok ? 0 : 1;
}
