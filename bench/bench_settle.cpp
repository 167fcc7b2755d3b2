// bench_settle: end-to-end durable reports per second through the real host
// (a busy period settles -> its settle commits, admitting the report into
// the parent's inbox in the same transaction -> the parent drains it), WAL
// and synchronous=FULL, with group commit next to the same run
// with one transaction per settle ("one_tx_per_settle": host_options.max_batch
// = 1, so every writer request, each settle included, commits alone), in the
// same binary and on the same disk.
//
// Figures: "group_commit" is the issue's shape, one parent x 1,000 children x
// up to 20 busy periods; "group_commit_100_parents" is the same 1,000
// children under 100 parents (a parent admits its reports one at a time, so
// the fan-in decides how much a transaction can carry); the ratios are of
// reports/s against one_tx_per_settle.
//
// A run: P parents, each spawning C background children, each child then
// having up to M busy periods, so up to P*C*M reports.
//   Phase 1 (spawn): every parent is prompted; its turn spawns its children in
//     the background (one after the other, as a model's tool calls would);
//     each child answers and its first busy period settles into a background
//     report. A parent stops spawning at the phase's deadline.
//   Phase 2 (settle): one driver per child prompts it again and again, each
//     time after it is idle (its settle and delivery done), so all children
//     settle side by side; each busy period ends in a none-mode report. A
//     driver starts no busy period after the phase's deadline, so a slow disk
//     shortens a run instead of stretching it; what was started still counts.
// The clock runs from the first prompt to quiescence (each parent has drained
// and acknowledged its inbox). Children are scripted agents. A parent's agent
// spawns on its prompt and takes no turn on a report; it still drains and
// acknowledges its inbox, which is part of the real path. It is not a scripted
// agent because a scripted agent counts its inputs (a count(*) over its
// transcript) on every input: on a parent receiving 20,000 reports that is a
// quadratic cost of the test agent, not of the runtime.
//
// Latency: from the settling hook (before the busy period is classified and
// its settle written) to the admitted hook (after the parent's admit
// committed), through host_options.observer. Also from just before the
// prompt of a phase-2 busy period to the inbox row's admitted_at (wall ms).
// cpu_us_per_report is the process CPU time over the run per report (the
// goal of 50,000 reports/s on 2 cores leaves 40 us). raw_sqlite_one_tx is a
// plain SQLite connection committing one report-sized row per transaction,
// measured here before and after, to show what the disk did meanwhile.
// reports_per_parent_drain: how many reports one acknowledgement of a
// parent's inbox (take_inbox, one writer request) carried.
//
// Checks, per run: the parent's inbox holds each (child, busy period) that ran
// exactly once, acknowledged and once in its transcript; the admitted hook
// fired once per row; the outbox (jobs table) is empty; no commit failed.
// Prints "ok" 1 or 0 (and exits 1 unless ok).
#include <SQLiteCpp/Database.h>
#include <SQLiteCpp/Statement.h>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <map>
#include <set>
#include <unordered_map>

#include "host_support.hpp"
#include "raw_admit.hpp"
#include "spawning_parent.hpp"
#include "support.hpp"
#include "tether/actors/host.hpp"
#include "tether/persistence/database.hpp"
#include "tether/persistence/task_store.hpp"
#include "tether/runtime/clock.hpp"
#include "tether/runtime/sync_wait.hpp"
#include "tether/testing/scripted_agent.hpp"

namespace {

using namespace tether;
namespace asio = boost::asio;
namespace bench = tether::bench;
using asio::awaitable;
using bench::clock;
using bench::sync;
using protocol::notification_id;
using protocol::session_id;
using testing::script_action;
using testing::script_turn;

constexpr char k_bench[] = "bench_settle";
constexpr std::size_t k_threads = 2;

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "bench_settle: %s\n", what.c_str());
  std::exit(1);
}

using bench::cpu_seconds;

clock::time_point after(double seconds) {
  return clock::now() +
         std::chrono::duration_cast<clock::duration>(std::chrono::duration<double>(seconds));
}

struct shape {
  std::size_t parents = 1;
  std::size_t children = 1000;  // per parent
  int periods = 20;             // busy periods per child, at most
  std::size_t max_batch = 1024;
  double spawn_budget = 10;  // seconds: no spawn after this
  double settle_budget = 8;  // seconds: no phase-2 busy period starts after this
};

using bench::child_name;
using bench::marker;
using bench::parent_agent;
using bench::parent_name;
using bench::spawn_state;

class bench_agents : public actors::agent_factory {
 public:
  bench_agents(const shape& s, spawn_state* st)
      : scripted_(std::make_shared<testing::scripted_agents>()), st_(st) {
    for (std::size_t p = 0; p < s.parents; ++p) {
      parents_[parent_name(p)] = {p, s.children};
      for (std::size_t c = 0; c < s.children; ++c) {
        auto name = child_name(p, c);
        for (int i = 1; i <= s.periods; ++i) {
          script_action say{script_action::kind::say, name + " answers " + marker(i)};
          scripted_->on_input(session_id(name), i, script_turn{{say}});
        }
      }
    }
  }

  std::shared_ptr<actors::agent> make(const persistence::session_row& row) override {
    auto it = parents_.find(row.id.str());
    if (it != parents_.end())
      return std::make_shared<parent_agent>(it->second.first, it->second.second, st_);
    return scripted_->make(row);
  }

 private:
  std::shared_ptr<testing::scripted_agents> scripted_;
  spawn_state* st_;
  std::map<std::string, std::pair<std::size_t, std::size_t>> parents_;  // name -> index, children
};

// Settle-to-admit latency of every report, through the run hooks.
class latency_observer : public actors::run_observer {
 public:
  void started(const session_id& s, std::int64_t) override {
    if (s.str().rfind("ses_parent", 0) == 0) ++parent_busy_periods_;
  }
  awaitable<void> settling(const session_id& s) override {
    auto now = clock::now();
    {
      std::lock_guard lk(m_);
      settling_[s.str()] = now;
    }
    co_return;
  }
  void settled(const session_id& s, std::optional<notification_id> report) override {
    if (!report) return;
    std::lock_guard lk(m_);
    owed_[report->str()] = settling_[s.str()];
  }
  void admitted(const session_id&, const notification_id& report) override {
    auto now = clock::now();
    std::lock_guard lk(m_);
    ++admitted_;
    auto it = owed_.find(report.str());
    if (it == owed_.end()) return;  // not settled in this run (boot)
    latency_ms_.push_back(std::chrono::duration<double, std::milli>(now - it->second).count());
    owed_.erase(it);
  }
  std::size_t admitted_count() {
    std::lock_guard lk(m_);
    return admitted_;
  }
  std::size_t parent_busy_periods() const { return parent_busy_periods_.load(); }
  std::vector<double> latencies() {
    std::lock_guard lk(m_);
    return latency_ms_;
  }

 private:
  std::mutex m_;
  std::unordered_map<std::string, clock::time_point> settling_;  // session -> its last settling
  std::unordered_map<std::string, clock::time_point> owed_;      // report -> its settling
  std::vector<double> latency_ms_;
  std::size_t admitted_ = 0;
  std::atomic<std::size_t> parent_busy_periods_{0};
};

struct outcome {
  std::size_t reports = 0;
  std::size_t spawned = 0;
  double spawn_seconds = 0;   // phase 1
  double settle_seconds = 0;  // phase 2
  double cpu = 0;             // process CPU seconds over both phases
  std::size_t parent_busy_periods = 0;
  std::size_t parent_drains = 0;  // each one acknowledges the inbox (take_inbox)
  std::vector<double> settle_to_admit_ms;
  std::vector<double> prompt_to_admit_ms;
  persistence::writer_stats stats;
  bool ok = false;
  double seconds() const { return spawn_seconds + settle_seconds; }
  double rate() const { return static_cast<double>(reports) / seconds(); }
};

// Prompts one child until it had `periods` busy periods or the deadline
// passed, each time after the last busy period settled and was delivered.
awaitable<void> drive_child(actors::host* h, session_id child, int periods,
                            clock::time_point deadline, std::int64_t* submitted_ms, int* done) {
  for (int i = 2; i <= periods && clock::now() < deadline; ++i) {
    submitted_ms[i] = runtime::now_ms();
    std::string text = "go on " + marker(i);
    auto p = co_await h->prompt(child, std::move(text));
    if (!p) die("prompt to " + child.str() + " failed: " + p.error().message);
    *done = i;
    auto w = co_await h->wait_idle(child);
    if (!w) die("wait_idle of " + child.str() + " failed: " + w.error().message);
  }
}

struct drivers {
  std::vector<std::vector<std::int64_t>> submitted_ms;  // per child, per period
  std::vector<int> done;                                // per child: last period run
};

awaitable<void> drive_all(actors::host* h, const shape* s, const spawn_state* st, drivers* d) {
  std::size_t n = 0;
  for (std::size_t p = 0; p < s->parents; ++p) n += st->spawned[p].load();
  auto all_done = runtime::one_shot<int>::make();
  auto left = std::make_shared<std::atomic<std::size_t>>(n + 1);
  auto finish = [left, all_done](std::exception_ptr e) {
    if (e) die("a driver threw: " + runtime::detail::describe(e));
    if (--*left == 0) all_done->set(0);
  };
  auto deadline = after(s->settle_budget);
  for (std::size_t p = 0; p < s->parents; ++p)
    for (std::size_t c = 0; c < st->spawned[p].load(); ++c) {
      std::size_t k = p * s->children + c;
      auto task = drive_child(h, session_id(child_name(p, c)), s->periods, deadline,
                              d->submitted_ms[k].data(), &d->done[k]);
      asio::co_spawn(h->pool().next(), std::move(task), finish);
    }
  finish(nullptr);
  co_await all_done->async_wait(asio::use_awaitable);
  co_await h->wait_quiescent(false);
}

awaitable<void> prompt_parents(actors::host* h, const shape* s) {
  for (std::size_t p = 0; p < s->parents; ++p) {
    session_id parent(parent_name(p));
    std::string text = "spawn your children";
    auto r = co_await h->prompt(parent, std::move(text));
    if (!r) die("prompting a parent failed: " + r.error().message);
  }
  co_await h->wait_quiescent(false);
}

// Every busy period that ran is exactly once in its parent's inbox,
// acknowledged and once in the transcript; the outbox is empty.
bool check(const std::string& path, const shape& s, const spawn_state& st, const drivers& d,
           std::size_t admitted_hooks, outcome& o) {
  SQLite::Database db(path, SQLite::OPEN_READONLY);
  bool ok = true;
  auto fail = [&](const std::string& what) {
    std::fprintf(stderr, "bench_settle: check failed: %s\n", what.c_str());
    ok = false;
  };
  // Delivered tasks stay, terminal; none may still be running or owe its
  // report (a pending terminal receipt).
  auto outstanding = persistence::task_reader(path).outstanding_jobs();
  auto jobs = outstanding ? static_cast<std::int64_t>(outstanding->size()) : -1;
  if (jobs != 0) fail(std::to_string(jobs) + " tasks still running or owing their report");
  std::size_t total = 0, expected = 0;
  for (std::size_t p = 0; p < s.parents; ++p) {
    std::string parent = parent_name(p);
    std::size_t spawned = st.spawned[p].load();
    std::map<std::string, std::size_t> index;  // child name -> driver index
    std::size_t want = 0;
    for (std::size_t c = 0; c < spawned; ++c) {
      index[child_name(p, c)] = p * s.children + c;
      want += static_cast<std::size_t>(d.done[p * s.children + c]);
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
      int period = std::atoi(body.c_str() + at + 8);
      if (period < 1 || period > d.done[it->second])
        fail("report " + from + " " + marker(period) + " is of a busy period that never ran");
      else if (!seen.insert({it->second, period}).second)
        fail("report " + from + " " + marker(period) + " admitted twice");
      if (q.getColumn(2).getString() != "acked")
        fail("report " + from + " " + marker(period) + " not acknowledged");
      if (period >= 2 && period <= d.done[it->second])
        o.prompt_to_admit_ms.push_back(
            static_cast<double>(q.getColumn(3).getInt64() - d.submitted_ms[it->second][period]));
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
  if (admitted_hooks != total)
    fail("the admitted hook fired " + std::to_string(admitted_hooks) + " times for " +
         std::to_string(total) + " inbox rows");
  return ok;
}

outcome run(const std::string& dir, const std::string& tag, const shape& s) {
  std::string path = dir + "/" + tag + ".db";
  spawn_state st(s.parents);
  auto observer = std::make_shared<latency_observer>();
  actors::host_options opts;
  opts.db_path = path;
  opts.sync = persistence::sync_mode::full;
  opts.max_batch = s.max_batch;
  opts.threads = k_threads;
  opts.agents = std::make_shared<bench_agents>(s, &st);
  opts.observer = observer;
  opts.log = [](const std::string& w) {
    std::fprintf(stderr, "bench_settle: host: %s\n", w.c_str());
  };
  auto h = actors::host::open(opts);
  if (!h) die("host::open failed: " + h.error().message);
  auto& host = **h;
  if (auto b = sync(host, host.boot()); !b) die("boot failed: " + b.error().message);
  for (std::size_t p = 0; p < s.parents; ++p) {
    auto r = sync(host, host.create_session("bench parent", session_id(parent_name(p))));
    if (!r) die("create_session failed: " + r.error().message);
  }
  drivers d;
  d.submitted_ms.assign(s.parents * s.children,
                        std::vector<std::int64_t>(static_cast<std::size_t>(s.periods) + 1));
  d.done.assign(s.parents * s.children, 1);
  auto before = host.store().db_writer().stats();

  outcome o;
  double cpu0 = cpu_seconds();
  auto t0 = clock::now();
  st.deadline = after(s.spawn_budget).time_since_epoch().count();
  sync(host, prompt_parents(&host, &s));
  o.spawn_seconds = bench::seconds_since(t0);
  auto t1 = clock::now();
  sync(host, drive_all(&host, &s, &st, &d));
  o.settle_seconds = bench::seconds_since(t1);
  o.cpu = cpu_seconds() - cpu0;

  auto after_stats = host.store().db_writer().stats();
  o.stats.transactions = after_stats.transactions - before.transactions;
  o.stats.requests = after_stats.requests - before.requests;
  o.stats.frames_written = after_stats.frames_written - before.frames_written;
  o.stats.failed_commits = after_stats.failed_commits - before.failed_commits;
  host.shutdown();
  h->reset();
  o.settle_to_admit_ms = observer->latencies();
  o.parent_busy_periods = observer->parent_busy_periods();
  o.parent_drains = st.parent_drains.load();
  o.ok = check(path, s, st, d, observer->admitted_count(), o) && o.stats.failed_commits == 0;
  return o;
}

void emit_run(const std::string& f, const shape& s, outcome& o) {
  bench::emit(k_bench, f, o.rate(), "reports/s");
  bench::emit(k_bench, f + "_reports", static_cast<double>(o.reports), "reports");
  bench::emit(k_bench, f + "_children", static_cast<double>(o.spawned), "children");
  bench::emit(k_bench, f + "_parents", static_cast<double>(s.parents), "parents");
  bench::emit(k_bench, f + "_seconds", o.seconds(), "s");
  bench::emit(k_bench, f + "_spawn_phase_seconds", o.spawn_seconds, "s");
  bench::emit(k_bench, f + "_settle_phase",
              static_cast<double>(o.reports - o.spawned) / o.settle_seconds, "reports/s");
  bench::emit(k_bench, f + "_p50", bench::percentile(o.settle_to_admit_ms, 50), "ms");
  bench::emit(k_bench, f + "_p99", bench::percentile(o.settle_to_admit_ms, 99), "ms");
  bench::emit(k_bench, f + "_prompt_to_admit_p50", bench::percentile(o.prompt_to_admit_ms, 50),
              "ms");
  bench::emit(k_bench, f + "_prompt_to_admit_p99", bench::percentile(o.prompt_to_admit_ms, 99),
              "ms");
  bench::emit(k_bench, f + "_cpu_us_per_report",
              o.cpu * 1e6 / static_cast<double>(std::max<std::size_t>(1, o.reports)), "us");
  bench::emit(k_bench, f + "_reports_per_parent_busy_period",
              static_cast<double>(o.reports) /
                  static_cast<double>(std::max<std::size_t>(1, o.parent_busy_periods)),
              "reports/busy period");
  bench::emit(k_bench, f + "_reports_per_parent_drain",
              static_cast<double>(o.reports) /
                  static_cast<double>(std::max<std::size_t>(1, o.parent_drains)),
              "reports/drain");
  bench::emit(k_bench, f + "_transactions", static_cast<double>(o.stats.transactions),
              "transactions");
  bench::emit(k_bench, f + "_transactions_per_s",
              static_cast<double>(o.stats.transactions) / o.seconds(), "transactions/s");
  bench::emit(k_bench, f + "_requests_per_report",
              static_cast<double>(o.stats.requests) /
                  static_cast<double>(std::max<std::size_t>(1, o.reports)),
              "requests/report");
  bench::emit(k_bench, f + "_requests_per_transaction",
              static_cast<double>(o.stats.requests) /
                  static_cast<double>(std::max<std::uint64_t>(1, o.stats.transactions)),
              "requests/transaction");
  bench::emit(k_bench, f + "_wal_frames_per_report",
              static_cast<double>(o.stats.frames_written) /
                  static_cast<double>(std::max<std::size_t>(1, o.reports)),
              "pages/report");
  bench::emit(k_bench, f + "_ok", o.ok ? 1 : 0, "bool");
}

// One report-sized row per transaction on a plain connection, for `seconds`.
double raw_sqlite_one_tx(const std::string& path, double seconds) {
  SQLite::Database db(path, SQLite::OPEN_READWRITE | SQLite::OPEN_CREATE);
  db.exec("PRAGMA journal_mode = WAL");
  db.exec("PRAGMA synchronous = FULL");
  db.exec("CREATE TABLE IF NOT EXISTS r(nid TEXT PRIMARY KEY, body TEXT NOT NULL)");
  SQLite::Statement ins(db, "INSERT INTO r(nid, body) VALUES (?, ?)");
  std::string body(160, 'r');
  std::size_t n = 0;
  auto t0 = clock::now();
  auto deadline = after(seconds);
  static std::size_t serial = 0;
  while (clock::now() < deadline) {
    db.exec("BEGIN");
    ins.reset();
    ins.bind(1, "msg_" + std::to_string(++serial));
    ins.bind(2, body);
    ins.exec();
    db.exec("COMMIT");
    ++n;
  }
  return static_cast<double>(n) / bench::seconds_since(t0);
}

// The raw same-rows baseline (issue 15, target 1): a plain program on the
// runtime's own schema and connection settings (persistence::open_for_write:
// WAL, synchronous=FULL, the same migrations), with prepared statements,
// writing exactly the rows and reads the runtime's busy periods write, in
// the order the runtime writes them, `batch` busy periods per transaction:
//   child prompt: sessions.seq + 1, a messages row (append)
//   claim: sessions busy, turn, time_suspended (begin_busy)
//   child answer: sessions.seq + 1, a messages row (append)
//   settle: sessions idle; the report's task row; the receipt's scope
//     lookups (started receipt, parent's tenant and turn); its pending
//     terminal receipt (settle, mint_none)
//   parent admit: the parent's seq and last admission order; the inbox row;
//     the receipt pending -> acked (admit_in_tx)
//   parent drain: per report, the receipt lookup, inbox row acked,
//     sessions.seq + 1 and a messages row (take_inbox); once per
//     transaction, the pending-inbox read and the parent's claim and
//     release (its busy period).
// What it leaves out is what only a runtime does: actors, mailboxes,
// coroutines, the writer's queue and group commit, rendering and scrubbing.
struct raw_figures {
  double periods_per_s = 0;
  double cpu_us_per_period = 0;
  std::size_t transactions = 0;
};

raw_figures raw_same_rows(const std::string& path, std::size_t children, std::size_t periods,
                          std::size_t batch) {
  persistence::db_options o;
  o.path = path;
  o.create = true;
  auto opened = persistence::open_for_write(o);
  if (!opened) die("raw baseline: " + opened.error().message);
  SQLite::Database& db = **opened;
  auto now = [] { return runtime::now_ms(); };
  const std::string parent = "raw_parent";
  SQLite::Statement mk(db,
                       "INSERT INTO sessions (id, parent_id, description, agent, status, "
                       "created_at, tenant, job_notify, job_policy, depth) VALUES (?, ?, "
                       "'Audit routes', 'general', 'idle', ?, 'default', 1, ?, ?)");
  auto make_session = [&](const std::string& id, const std::string* par) {
    mk.reset();
    mk.bind(1, id);
    if (par)
      mk.bind(2, *par);
    else
      mk.bind(2);
    mk.bind(3, now());
    mk.bind(4, par ? "report_now" : "withhold");
    mk.bind(5, par ? 1 : 0);
    mk.exec();
  };
  db.exec("BEGIN");
  make_session(parent, nullptr);
  std::vector<std::string> kids;
  for (std::size_t c = 0; c < children; ++c) {
    kids.push_back("raw_child_" + std::to_string(c));
    make_session(kids.back(), &parent);
  }
  db.exec("UPDATE sessions SET turn = 'turn_raw' WHERE id = 'raw_parent'");
  db.exec("COMMIT");

  SQLite::Statement bump(db, "UPDATE sessions SET seq = seq + 1 WHERE id = ? RETURNING seq");
  SQLite::Statement msg(db,
                        "INSERT INTO messages (session_id, seq, role, kind, status, payload) "
                        "VALUES (?, ?, ?, ?, 'completed', ?)");
  SQLite::Statement claim(db,
                          "UPDATE sessions SET status = 'busy', turn = CASE WHEN time_suspended "
                          "IS NULL OR turn IS NULL THEN ? ELSE turn END, time_suspended = "
                          "coalesce(time_suspended, ?) WHERE id = ? RETURNING seq, "
                          "input_cursor, turn");
  SQLite::Statement idle(db,
                         "UPDATE sessions SET status = 'idle', time_suspended = NULL, "
                         "resume_attempts = 0, idle_outcome = 'completed', time_idle = ?, "
                         "input_cursor = max(input_cursor, ?) WHERE id = ?");
  SQLite::Statement task(db,
                         "INSERT INTO tasks (id, notification_id, kind, mode, parent_id, "
                         "child_id, generation, state, body, payload, created_at, updated_at, "
                         "goal_id) VALUES (?, ?, 'subagent', 'none', ?, ?, 0, 'completed', ?, "
                         "?, ?, ?, NULL)");
  SQLite::Statement started(db,
                            "SELECT scope FROM receipts WHERE task_id = ? AND transition = "
                            "'started'");
  SQLite::Statement scope(db, "SELECT tenant, turn FROM sessions WHERE id = ?");
  SQLite::Statement receipt(db,
                            "INSERT OR IGNORE INTO receipts (id, task_id, transition, scope, "
                            "body, state, created_at, updated_at) VALUES (?, ?, 'completed', ?, "
                            "?, 'pending', ?, ?)");
  bench::raw_admit admits(db);
  SQLite::Statement pending(db,
                            "SELECT notification_id, body FROM inbox WHERE session_id = ? AND "
                            "state = 'pending' ORDER BY admitted_ord, notification_id");
  SQLite::Statement receipt_state(db, "SELECT state FROM receipts WHERE id = ?");
  SQLite::Statement inbox_ack(db,
                              "UPDATE inbox SET state = 'acked' WHERE session_id = ? AND "
                              "notification_id = ?");

  auto append = [&](const std::string& session, const char* role, const char* kind,
                    const std::string& payload) {
    bump.reset();
    bump.bind(1, session);
    if (!bump.executeStep()) die("raw baseline: no session " + session);
    auto seq = bump.getColumn(0).getInt64();
    bump.reset();
    msg.reset();
    msg.bind(1, session);
    msg.bind(2, seq);
    msg.bind(3, role);
    msg.bind(4, kind);
    msg.bind(5, payload);
    msg.exec();
    return seq;
  };
  const std::string prompt = R"({"text":"again"})";
  const std::string answer = R"({"text":"final answer"})";
  const std::string body(160, 'r');  // a rendered report's size, about
  const std::string job_payload = R"({"description":"Audit routes"})";
  std::size_t serial = 0, admitted_rows = 0, transcript_rows = 0;
  raw_figures f;
  double cpu0 = cpu_seconds();
  auto t0 = clock::now();
  for (std::size_t done = 0; done < periods;) {
    std::size_t n = std::min(batch, periods - done);
    db.exec("BEGIN");
    for (std::size_t i = 0; i < n; ++i) {
      const auto& child = kids[(done + i) % kids.size()];
      auto nid = "msg_raw_" + std::to_string(++serial);
      append(child, "user", "prompt", prompt);
      claim.reset();
      claim.bind(1, "turn_" + std::to_string(serial));
      claim.bind(2, now());
      claim.bind(3, child);
      if (!claim.executeStep()) die("raw baseline: no claim");
      auto cursor = claim.getColumn(0).getInt64();
      claim.reset();
      append(child, "assistant", "answer", answer);
      auto t = now();
      idle.reset();
      idle.bind(1, t);
      idle.bind(2, cursor + 1);
      idle.bind(3, child);
      idle.exec();
      task.reset();
      task.bind(1, nid);
      task.bind(2, nid);
      task.bind(3, parent);
      task.bind(4, child);
      task.bind(5, body);
      task.bind(6, job_payload);
      task.bind(7, t);
      task.bind(8, t);
      task.exec();
      started.reset();
      started.bind(1, nid);
      (void)started.executeStep();
      started.reset();
      scope.reset();
      scope.bind(1, parent);
      if (!scope.executeStep()) die("raw baseline: no parent scope");
      auto scope_json = R"({"tenant":")" + scope.getColumn(0).getString() + R"(","thread":")" +
                        parent + R"(","turn":")" + scope.getColumn(1).getString() + R"("})";
      scope.reset();
      receipt.reset();
      receipt.bind(1, nid + "/completed");
      receipt.bind(2, nid);
      receipt.bind(3, scope_json);
      receipt.bind(4, body);
      receipt.bind(5, t);
      receipt.bind(6, t);
      receipt.exec();
      std::int64_t at_seq = 0, ord = 0;
      if (!admits.position(parent, at_seq, ord)) die("raw baseline: no parent");
      std::size_t acknowledged = 0;
      admitted_rows += static_cast<std::size_t>(
          admits.admit(parent, nid, child, body, at_seq, t, ord + 1, acknowledged));
      if (acknowledged != 1) die("raw baseline: the receipt was not acknowledged");
    }
    // The parent's busy period: claim, drain what is pending, release.
    claim.reset();
    claim.bind(1, "turn_raw_parent");
    claim.bind(2, now());
    claim.bind(3, parent);
    if (!claim.executeStep()) die("raw baseline: no parent claim");
    auto parent_cursor = claim.getColumn(0).getInt64();
    claim.reset();
    std::vector<std::pair<std::string, std::string>> items;
    pending.reset();
    pending.bind(1, parent);
    while (pending.executeStep())
      items.emplace_back(pending.getColumn(0).getString(), pending.getColumn(1).getString());
    pending.reset();
    for (auto& [nid, text] : items) {
      receipt_state.reset();
      receipt_state.bind(1, nid);
      (void)receipt_state.executeStep();
      receipt_state.reset();
      inbox_ack.reset();
      inbox_ack.bind(1, parent);
      inbox_ack.bind(2, nid);
      inbox_ack.exec();
      append(parent, "user", "report", R"({"text":")" + text + R"("})");
      ++transcript_rows;
    }
    idle.reset();
    idle.bind(1, now());
    idle.bind(2, parent_cursor + static_cast<std::int64_t>(items.size()));
    idle.bind(3, parent);
    idle.exec();
    db.exec("COMMIT");
    ++f.transactions;
    done += n;
  }
  double secs = bench::seconds_since(t0);
  double cpu = cpu_seconds() - cpu0;
  if (admitted_rows != periods || transcript_rows != periods)
    die("raw baseline: " + std::to_string(admitted_rows) + " admitted and " +
        std::to_string(transcript_rows) + " transcript rows for " + std::to_string(periods) +
        " busy periods");
  f.periods_per_s = static_cast<double>(periods) / secs;
  f.cpu_us_per_period = cpu * 1e6 / static_cast<double>(periods);
  return f;
}

}  // namespace

// Usage: bench_settle                 the figures (about a minute)
//        bench_settle P C M [BATCH]   one run of P parents x C children x M periods
int main(int argc, char** argv) {
  std::string dir = bench::make_temp_dir("bench-settle");
  bool ok = true;
  if (argc >= 4) {
    shape s;
    s.parents = std::strtoul(argv[1], nullptr, 10);
    s.children = std::strtoul(argv[2], nullptr, 10);
    s.periods = std::atoi(argv[3]);
    if (argc >= 5) s.max_batch = std::strtoul(argv[4], nullptr, 10);
    s.spawn_budget = s.settle_budget = 1e9;
    auto o = run(dir, "custom", s);
    emit_run("custom", s, o);
    ok = o.ok;
  } else {
    std::string raw = dir + "/raw.db";
    bench::emit(k_bench, "raw_sqlite_one_tx_before", raw_sqlite_one_tx(raw, 1.0), "commits/s");
    shape group;           // 1 parent x 1000 children x 20 busy periods
    shape one_tx = group;  // every writer request (so every settle) commits alone
    one_tx.max_batch = 1;
    one_tx.spawn_budget = 6;
    one_tx.settle_budget = 6;
    shape spread = group;  // the same 1000 children under 100 parents
    spread.parents = 100;
    spread.children = 10;
    auto g = run(dir, "group_commit", group);
    auto b = run(dir, "one_tx_per_settle", one_tx);
    auto sp = run(dir, "group_commit_100_parents", spread);
    emit_run("group_commit", group, g);
    emit_run("one_tx_per_settle", one_tx, b);
    emit_run("group_commit_100_parents", spread, sp);
    bench::emit(k_bench, "group_commit_ratio", g.rate() / b.rate(), "group/one_tx_per_settle");
    bench::emit(k_bench, "group_commit_100_parents_ratio", sp.rate() / b.rate(),
                "group/one_tx_per_settle");
    bench::emit(k_bench, "raw_sqlite_one_tx_after", raw_sqlite_one_tx(raw, 1.0), "commits/s");
    // The raw same-rows baseline, batches of 1, 10, 100 and 1,000 busy
    // periods per transaction, each on a fresh database of the same schema.
    std::map<std::size_t, raw_figures> raws;
    for (auto [batch, periods] :
         {std::pair<std::size_t, std::size_t>{1, 400}, {10, 4000}, {100, 20000}, {1000, 40000}}) {
      auto path = dir + "/raw_rows_" + std::to_string(batch) + ".db";
      auto r = raw_same_rows(path, group.children, periods, batch);
      auto f = "raw_same_rows_batch" + std::to_string(batch);
      bench::emit(k_bench, f, r.periods_per_s, "periods/s");
      bench::emit(k_bench, f + "_cpu_us_per_period", r.cpu_us_per_period, "us");
      raws[batch] = r;
    }
    const auto& ceiling = raws[1000];
    double rate_ratio = g.rate() / ceiling.periods_per_s;
    double cpu_per_report = g.cpu * 1e6 / static_cast<double>(std::max<std::size_t>(1, g.reports));
    double cpu_ratio = cpu_per_report / ceiling.cpu_us_per_period;
    bench::emit(k_bench, "group_commit_vs_raw_same_rows", rate_ratio, "reports/s / periods/s");
    bench::emit(k_bench, "group_commit_cpu_vs_raw_same_rows", cpu_ratio, "us / us");
    std::printf(
        "{\"bench\":\"settle\",\"sync\":\"full\",\"reports_per_s\":%s,"
        "\"raw_same_rows_per_s\":{\"1\":%s,\"10\":%s,\"100\":%s,\"1000\":%s},"
        "\"vs_raw_1000\":%s,\"cpu_us_per_report\":%s,\"raw_cpu_us_per_period_1000\":%s,"
        "\"cpu_vs_raw_1000\":%s,\"p50_ms\":%s,\"p99_ms\":%s,\"rate_target_met\":%s,"
        "\"cpu_target_met\":%s,\"ok\":%s}\n",
        bench::number(g.rate()).c_str(), bench::number(raws[1].periods_per_s).c_str(),
        bench::number(raws[10].periods_per_s).c_str(),
        bench::number(raws[100].periods_per_s).c_str(),
        bench::number(ceiling.periods_per_s).c_str(), bench::number(rate_ratio).c_str(),
        bench::number(cpu_per_report).c_str(), bench::number(ceiling.cpu_us_per_period).c_str(),
        bench::number(cpu_ratio).c_str(),
        bench::number(bench::percentile(g.settle_to_admit_ms, 50)).c_str(),
        bench::number(bench::percentile(g.settle_to_admit_ms, 99)).c_str(),
        rate_ratio >= 1.0 ? "true" : "false", cpu_ratio <= 1.5 ? "true" : "false",
        g.ok ? "true" : "false");
    std::fflush(stdout);
    ok = g.ok && b.ok && sp.ok;
  }
  bench::emit(k_bench, "ok", ok ? 1 : 0, "bool");
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  return ok ? 0 : 1;
}
