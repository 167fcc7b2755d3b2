// bench_sop: SOP runs (issue 14, docs/sop.md) through the engine of a real
// host, WAL and synchronous=FULL (every COMMIT fsynced), with shell steps in a
// real tether-sandboxd; next to raw baselines measured in the same run, on the
// same disk and the same daemon.
//
// Two SOPs, written to a scratch `sops` directory:
//   noop3  three shell steps, each `true` (no retries), max_concurrent C;
//   gate   an approval by "bench", then one shell step `true`.
//
// Throughput (runs/s through noop3). N runs are admitted with start_run by 8
// submitters at once; the engine drives up to C of them at a time (its
// max_runs and the SOP's cap are both C). The span is the first start_run
// call to the engine's quiet() once every run is completed. A run is eight
// saves through the single writer: admit, claim, then per step its task's
// admission and its end (the last end carries the run's terminal
// compare-and-set), each durable before the next action of that run; the
// writer groups what is queued at once into one transaction.
// Figures: runs_per_s, admit_per_s (the admissions alone), cpu_us_per_run
// (this process, every thread), daemon_cpu_us_per_run, writer_transactions
// and writer_requests per run.
//
// Baselines for throughput, each measured in this run:
//   raw_exec_runs_per_s  the same 3N `true` commands through a raw
//       sandbox::client on the same daemon with the environment the engine
//       sends: C chains at once, each running its runs' three commands one
//       after the other (exec, wait) as the engine does; no persistence.
//       Measured before and after the engine; the figure is their mean.
//   raw_sql_runs_per_s   the rows the engine writes for the same N runs, by a
//       plain SQLite program on a copy of the host's fresh database (same
//       schema, same indexes, WAL, synchronous=FULL, prepared statements):
//       the same eight saves per run with the same statements' effects (the
//       run's row with the engine's own payload text, task_events rows,
//       the audit row, three step tasks, their terminal updates and receipts,
//       the run's terminal update and receipt), C runs in lock step so each
//       save of C runs is one transaction (8 transactions per C runs: the
//       best grouping the writer could find). It skips what the engine adds:
//       the claim's scan for candidates and its cap count, the revision
//       compare-and-set's read, JSON, the writer's queue, the actor hops.
//   ceiling_runs_per_s   min(raw_exec, raw_sql); runs_vs_ceiling the ratio.
//
// Approval round trip (gate, one run at a time, K samples): a run is started
// and left to park (waiting_approval, no claim); then approve() is called.
//   approve_call_p50/_p99     ms until approve() returns: the decision durable
//   approval_round_trip_p50/_p99   ms from the approve() call until the engine
//       is quiet again with the run completed: the decision, the claim, the
//       step's admission, `true` through the daemon, the step's end with the
//       run's terminal transition, and the loop's pass that finds nothing left.
//   raw_approval_round_trip_p50/_p99   the same sequence by the raw program on
//       its copy: four transactions (the decision with its event and audit
//       row; the claim; the step's admission; the step's end with the run's
//       terminal update and both receipts) and one exec + wait of `true` on a
//       raw client, one run at a time.
//
// Checks (exit 1 unless all hold; "ok" says it): every run of the engine is
// completed with three completed step tasks and one terminal receipt, no
// commit failed, the host logged no warning; the raw copy holds N completed
// runs and 3N completed steps; every gate run was parked before its approval
// and completed after it.
//
// Usage: bench_sop [--runs N] [--concurrency C] [--approvals K] [--quick]
//        defaults N = 1000, C = 16, K = 200; --quick: N = 200, K = 50.
// The database goes to a fresh directory under /tmp (on disk); the daemon's
// state directory to /dev/shm (see bench_delivery for why), unless
// BENCH_SOP_SANDBOX_ROOT names another directory.
#include <SQLiteCpp/Database.h>
#include <SQLiteCpp/Statement.h>
#include <unistd.h>

#include <atomic>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/json.hpp>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <string>
#include <vector>

#include "host_support.hpp"
#include "support.hpp"
#include "tether/actors/host.hpp"
#include "tether/protocol/json.hpp"
#include "tether/runtime/clock.hpp"
#include "tether/runtime/one_shot.hpp"
#include "tether/runtime/sync_wait.hpp"
#include "tether/sandbox/client.hpp"
#include "tether/sandbox/daemon_process.hpp"

namespace {

using namespace tether;
namespace asio = boost::asio;
namespace bench = tether::bench;
namespace fs = std::filesystem;
namespace json = boost::json;
namespace wire = protocol::sandbox;
using asio::awaitable;
using bench::clock;
using bench::cpu_seconds;
using bench::cpu_seconds_of;
using bench::number;
using bench::sync;
using protocol::job_id;

constexpr char k_bench[] = "bench_sop";
constexpr int k_submitters = 8;
constexpr int k_steps = 3;

std::mutex g_die_m;
std::optional<sandbox::daemon_handle> g_daemon;
std::string g_dir;

[[noreturn]] void die(const std::string& what) {
  std::lock_guard lk(g_die_m);
  std::fprintf(stderr, "bench_sop: %s\n", what.c_str());
  if (g_daemon) (void)sandbox::stop_daemon(*g_daemon);
  if (!g_dir.empty())
    std::fprintf(stderr, "bench_sop: scratch directories kept: %s\n", g_dir.c_str());
  std::fflush(stderr);
  std::_Exit(1);
}

double ms_between(clock::time_point a, clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

void write_sops(const std::string& dir, int concurrency) {
  fs::create_directories(dir);
  std::string steps;
  for (int i = 0; i < k_steps; ++i)
    steps += std::string(i ? "," : "") + R"({"name": "s)" + std::to_string(i) +
             R"(", "kind": "shell", "command": "true", "retries": 0})";
  std::ofstream(dir + "/noop3.json") << R"({"name": "noop3", "agent": "bench", "max_concurrent": )"
                                     << concurrency << R"(, "steps": [)" << steps << "]}";
  std::ofstream(dir + "/gate.json")
      << R"({"name": "gate", "agent": "bench", "approvers": ["bench"], "max_concurrent": 1,
  "approval_timeout_ms": 0, "steps": [
    {"name": "approve", "kind": "approval"},
    {"name": "ship", "kind": "shell", "command": "true", "retries": 0}]})";
}

// ---- the engine ------------------------------------------------------------------------------

struct engine_outcome {
  std::size_t runs = 0;
  double seconds = 0, admit_seconds = 0;
  double cpu_s = 0, daemon_cpu_s = 0;
  std::uint64_t transactions = 0, requests = 0;
  std::vector<double> approve_call_ms, round_trip_ms;
  std::string admitted_payload;  // a noop3 run's payload as admitted (for the raw side)
  std::string final_payload;     // and as completed
};

awaitable<void> submit(actors::sop_engine* e, std::size_t n, std::atomic<std::size_t>* admitted,
                       std::shared_ptr<runtime::one_shot<int>> done, std::size_t total) {
  for (std::size_t i = 0; i < n; ++i) {
    auto r = co_await e->start_run("noop3", "", "bench");
    if (!r) die("start_run: " + r.error().message);
    if (++*admitted == total) done->set(0);
  }
}

engine_outcome run_engine(const std::string& dir, const std::string& state_dir, pid_t daemon_pid,
                          std::size_t n, int c, int k, const std::string& schema_copy) {
  std::mutex warn_m;
  std::vector<std::string> warnings;
  actors::host_options o;
  o.db_path = dir + "/tether.db";
  o.create_db = true;
  o.sync = persistence::sync_mode::full;
  o.agents = std::make_shared<bench::idle_agents>();
  o.jobs.sandbox_dir = state_dir;
  o.jobs.start_daemon = false;
  o.jobs.cwd = dir + "/work";
  actors::sop_options so;
  so.dir = dir + "/sops";
  so.cwd = dir + "/work";
  so.max_runs = c;
  o.sop = so;
  o.log = [&warn_m, &warnings](const std::string& w) {
    std::fprintf(stderr, "bench_sop: host: %s\n", w.c_str());
    std::lock_guard lk(warn_m);
    warnings.push_back(w);
  };
  auto opened = actors::host::open(o);
  if (!opened) die("host::open failed: " + opened.error().message);
  auto& host = **opened;
  auto booted = sync(host, host.boot());
  if (!booted) die("boot failed: " + booted.error().message);
  if (!booted->sop || booted->sop->sops.size() != 2) die("the engine did not load both SOPs");
  auto& engine = *host.sop();
  {
    // The raw side's database: this one, fresh (schema only).
    SQLite::Database src(o.db_path, SQLite::OPEN_READONLY);
    src.exec("VACUUM INTO '" + schema_copy + "'");
  }

  engine_outcome out;
  out.runs = n;
  auto before = host.store().db_writer().stats();
  double cpu0 = cpu_seconds(), dcpu0 = cpu_seconds_of(daemon_pid);
  auto t0 = clock::now();
  auto admitted_all = runtime::one_shot<int>::make();
  std::atomic<std::size_t> admitted{0};
  for (int s = 0; s < k_submitters; ++s) {
    auto share = n / k_submitters + (static_cast<std::size_t>(s) < n % k_submitters ? 1 : 0);
    if (share == 0) continue;
    auto task = submit(&engine, share, &admitted, admitted_all, n);
    asio::co_spawn(host.pool().next(), std::move(task), asio::detached);
  }
  sync(host, admitted_all->async_wait(asio::use_awaitable));
  out.admit_seconds = bench::seconds_since(t0);
  sync(host, engine.quiet());
  out.seconds = bench::seconds_since(t0);
  out.cpu_s = cpu_seconds() - cpu0;
  out.daemon_cpu_s = cpu_seconds_of(daemon_pid) - dcpu0;
  auto after = host.store().db_writer().stats();
  out.transactions = after.transactions - before.transactions;
  out.requests = after.requests - before.requests;
  if (after.failed_commits != before.failed_commits) die("a commit failed during the runs");

  // Checks, and the payload texts the raw side writes.
  {
    SQLite::Database db(o.db_path, SQLite::OPEN_READONLY);
    auto count = [&db](const std::string& sql) { return db.execAndGet(sql).getInt64(); };
    auto runs = count("SELECT count(*) FROM tasks WHERE kind = 'sop_run' AND state = 'completed'");
    auto steps =
        count("SELECT count(*) FROM tasks WHERE kind = 'sop_step' AND state = 'completed'");
    auto receipts = count(
        "SELECT count(*) FROM receipts r JOIN tasks t ON t.id = r.task_id WHERE t.kind = "
        "'sop_run'");
    if (static_cast<std::size_t>(runs) != n || static_cast<std::size_t>(steps) != k_steps * n ||
        static_cast<std::size_t>(receipts) != n)
      die("check failed: " + std::to_string(runs) + " completed runs, " + std::to_string(steps) +
          " completed steps, " + std::to_string(receipts) + " run receipts; expected " +
          std::to_string(n) + ", " + std::to_string(k_steps * n) + ", " + std::to_string(n));
    out.final_payload =
        db.execAndGet("SELECT payload FROM tasks WHERE kind = 'sop_run' ORDER BY id LIMIT 1")
            .getString();
    auto p = protocol::parse_json(out.final_payload);
    if (!p || !p->is_object()) die("a run's payload is not a JSON object");
    auto admitted_p = p->as_object();
    admitted_p["phase"] = "pending";
    admitted_p.erase("last");
    admitted_p.erase("visits");
    admitted_p["step"] = 0;
    out.admitted_payload = protocol::to_text(admitted_p);
  }

  // Approval round trips, one run at a time.
  for (int i = 0; i < k; ++i) {
    auto id = sync(host, engine.start_run("gate", "", "bench"));
    if (!id) die("start_run(gate): " + id.error().message);
    sync(host, engine.quiet());
    auto v = sync(host, engine.run(*id));
    if (!v || !*v || (*v)->state != "waiting_approval" || !(*v)->claim.empty())
      die("gate run " + id->str() + " did not park without a claim");
    auto a0 = clock::now();
    auto ok = sync(host, engine.approve(*id, "bench", ""));
    auto a1 = clock::now();
    if (!ok) die("approve: " + ok.error().message);
    sync(host, engine.quiet());
    auto a2 = clock::now();
    v = sync(host, engine.run(*id));
    if (!v || !*v || (*v)->state != "completed")
      die("gate run " + id->str() + " did not complete after its approval");
    out.approve_call_ms.push_back(ms_between(a0, a1));
    out.round_trip_ms.push_back(ms_between(a0, a2));
  }
  host.shutdown();
  std::lock_guard lk(warn_m);
  if (!warnings.empty()) die("the host warned: " + warnings.front());
  return out;
}

// ---- the raw exec baseline -------------------------------------------------------------------

struct raw_exec_state {
  std::atomic<int> chains_left{0};
  std::shared_ptr<runtime::one_shot<int>> done = runtime::one_shot<int>::make();
};

wire::exec_req noop_request(const std::string& cwd,
                            const std::vector<std::pair<std::string, std::string>>& env,
                            const std::string& run, int step) {
  wire::exec_req r;
  r.command = "true";
  r.cwd = cwd;
  r.env = env;
  r.env.push_back({"TETHER_SOP", "noop3"});
  r.env.push_back({"TETHER_SOP_RUN", run});
  r.env.push_back({"TETHER_SOP_STEP", "s" + std::to_string(step)});
  r.env.push_back({"TETHER_SOP_INPUT", ""});
  r.tail_lines = 10000;
  r.tail_bytes = 65536;
  r.job = job_id(run + "-s" + std::to_string(step) + "-v1-a0");
  return r;
}

awaitable<void> exec_true(sandbox::client* c, wire::exec_req r) {
  auto started = co_await c->exec(std::move(r));
  if (!started) die("raw exec failed: " + started.error().message);
  auto done = co_await c->wait(started->job);
  c->forget(started->job);
  if (!done) die("raw wait failed: " + done.error().message);
  if (done->status.exit_code != 0)
    die("raw `true` exited " + std::to_string(done->status.exit_code));
}

awaitable<void> raw_chain(sandbox::client* c, std::string cwd,
                          std::vector<std::pair<std::string, std::string>> env, std::string prefix,
                          std::size_t runs, raw_exec_state* st) {
  for (std::size_t i = 0; i < runs; ++i)
    for (int s = 0; s < k_steps; ++s)
      co_await exec_true(c, noop_request(cwd, env, prefix + std::to_string(i), s));
  if (--st->chains_left == 0) st->done->set(0);
}

struct raw_exec_outcome {
  double seconds = 0, cpu_s = 0, daemon_cpu_s = 0;
};

awaitable<raw_exec_outcome> raw_exec_run(std::string socket, std::string cwd, std::size_t n, int c,
                                         std::string tag, pid_t daemon_pid) {
  auto cl = co_await sandbox::client::connect(socket, wire::conn_mode::read_write, k_bench);
  if (!cl) die("connect: " + cl.error().message);
  auto* client = cl->get();
  auto env = sandbox::current_environment();
  auto ex = co_await asio::this_coro::executor;
  raw_exec_state st;
  int chains = 0;
  for (int k = 0; k < c; ++k)
    if (n / c + (static_cast<std::size_t>(k) < n % c ? 1 : 0)) ++chains;
  st.chains_left = chains;
  double cpu0 = cpu_seconds(), dcpu0 = cpu_seconds_of(daemon_pid);
  auto t0 = clock::now();
  for (int k = 0; k < c; ++k) {
    auto share = n / c + (static_cast<std::size_t>(k) < n % c ? 1 : 0);
    if (!share) continue;
    auto prefix = "raw-" + tag + "-" + std::to_string(k) + "-";
    asio::co_spawn(ex, raw_chain(client, cwd, env, prefix, share, &st), asio::detached);
  }
  co_await st.done->async_wait(asio::use_awaitable);
  raw_exec_outcome out;
  out.seconds = bench::seconds_since(t0);
  out.cpu_s = cpu_seconds() - cpu0;
  out.daemon_cpu_s = cpu_seconds_of(daemon_pid) - dcpu0;
  client->close();
  co_return out;
}

raw_exec_outcome raw_exec_pass(const std::string& socket, const std::string& cwd, std::size_t n,
                               int c, const std::string& tag, pid_t daemon_pid) {
  asio::io_context io;
  return runtime::run_to_completion(io, raw_exec_run(socket, cwd, n, c, tag, daemon_pid));
}

// ---- the raw SQL baseline --------------------------------------------------------------------

// The statements, prepared once; each write has the effect of the store's.
struct raw_sql {
  SQLite::Database db;
  SQLite::Statement admit, event, audit, claim, save, step_admit, terminal, receipt, read_rev;
  std::string scope_text, admitted_payload, final_payload;

  raw_sql(const std::string& path, std::string admitted, std::string final_p)
      : db(path, SQLite::OPEN_READWRITE),
        admit(db,
              "INSERT OR IGNORE INTO tasks (id, kind, state, tenant, thread, turn, scope, "
              "payload, revision, created_at, updated_at) VALUES (?, 'sop_run', 'admitted', "
              "'default', ?, ?, ?, ?, 1, ?, ?)"),
        event(db,
              "INSERT INTO task_events (task_id, seq, at, revision, kind, actor, detail) VALUES "
              "(?, (SELECT coalesce(max(seq), 0) + 1 FROM task_events WHERE task_id = ?), ?, ?, "
              "?, ?, ?)"),
        audit(db,
              "INSERT INTO audit_log (at, actor, action, subject, detail) VALUES (?, ?, ?, ?, ?)"),
        claim(db,
              "UPDATE tasks SET state = 'running', owner = ?, lease_until = ?, revision = "
              "revision + 1, payload = json_set(payload, '$.phase', 'running'), updated_at = ? "
              "WHERE id = ?"),
        save(db,
             "UPDATE tasks SET payload = ?, revision = revision + 1, owner = CASE WHEN ? THEN "
             "NULL ELSE owner END, lease_until = CASE WHEN ? THEN NULL ELSE lease_until END, "
             "updated_at = ? WHERE id = ?"),
        step_admit(db,
                   "INSERT INTO tasks (id, kind, state, tenant, thread, turn, scope, parent_id, "
                   "payload, created_at, updated_at) VALUES (?, 'sop_step', 'running', 'default', "
                   "?, ?, ?, ?, ?, ?, ?)"),
        terminal(db,
                 "UPDATE tasks SET state = ?, completion = coalesce(?, completion), updated_at = "
                 "? WHERE id = ? AND state IN ('admitted','running')"),
        receipt(db,
                "INSERT OR IGNORE INTO receipts (id, task_id, transition, scope, body, state, "
                "created_at, updated_at) VALUES (?, ?, ?, ?, ?, 'dropped', ?, ?)"),
        read_rev(db, "SELECT state, revision, coalesce(owner, '') FROM tasks WHERE id = ?"),
        admitted_payload(std::move(admitted)),
        final_payload(std::move(final_p)) {
    db.setBusyTimeout(5000);
    db.exec("PRAGMA journal_mode = WAL");
    db.exec("PRAGMA synchronous = FULL");
    db.exec("PRAGMA foreign_keys = ON");
    protocol::owner_scope s;
    s.tenant = protocol::tenant_id("default");
    s.thread = protocol::session_id("sop:noop3");
    scope_text = protocol::to_text(protocol::to_json(s));
  }

  template <class S>
  static void run(S& st) {
    st.exec();
    st.reset();
  }
  void write_event(const std::string& task, std::int64_t rev, const char* kind,
                   const std::string& detail) {
    event.bind(1, task);
    event.bind(2, task);
    event.bind(3, runtime::now_ms());
    event.bind(4, rev);
    event.bind(5, kind);
    event.bind(6, "bench-raw");
    event.bind(7, detail);
    run(event);
  }
  void do_admit(const std::string& id, const std::string& sop) {
    auto now = runtime::now_ms();
    admit.bind(1, id);
    admit.bind(2, "sop:" + sop);
    admit.bind(3, id);
    admit.bind(4, scope_text);
    admit.bind(5, admitted_payload);
    admit.bind(6, now);
    admit.bind(7, now);
    run(admit);
    write_event(id, 1, "admitted", "admitted by bench");
    audit.bind(1, now);
    audit.bind(2, "bench");
    audit.bind(3, "sop.start");
    audit.bind(4, id);
    audit.bind(5, "");
    run(audit);
  }
  void do_claim(const std::string& id, std::int64_t rev) {
    auto now = runtime::now_ms();
    claim.bind(1, "bench-raw");
    claim.bind(2, now + 3600000);
    claim.bind(3, now);
    claim.bind(4, id);
    run(claim);
    write_event(id, rev, "claimed", "execution claim taken");
  }
  void do_save(const std::string& id, std::int64_t rev, const char* kind, bool release) {
    // The compare-and-set's read, as the store does before its update.
    read_rev.bind(1, id);
    (void)read_rev.executeStep();
    read_rev.reset();
    save.bind(1, final_payload);
    save.bind(2, release ? 1 : 0);
    save.bind(3, release ? 1 : 0);
    save.bind(4, runtime::now_ms());
    save.bind(5, id);
    run(save);
    write_event(id, rev, kind, std::string("step ") + kind);
  }
  void do_step_admit(const std::string& run_id, const std::string& step) {
    auto now = runtime::now_ms();
    step_admit.bind(1, step);
    step_admit.bind(2, "sop:noop3");
    step_admit.bind(3, run_id);
    step_admit.bind(4, scope_text);
    step_admit.bind(5, run_id);
    step_admit.bind(6, protocol::to_text(json::object{{"run", run_id}, {"preview", "true"}}));
    step_admit.bind(7, now);
    step_admit.bind(8, now);
    run(step_admit);
  }
  void do_terminal(const std::string& task, const std::string& transition, const char* completion) {
    auto now = runtime::now_ms();
    terminal.bind(1, "completed");
    if (completion)
      terminal.bind(2, completion);
    else
      terminal.bind(2);
    terminal.bind(3, now);
    terminal.bind(4, task);
    run(terminal);
    receipt.bind(1, task + "/" + transition);
    receipt.bind(2, task);
    receipt.bind(3, transition);
    receipt.bind(4, scope_text);
    receipt.bind(5, task + ": completed");
    receipt.bind(6, now);
    receipt.bind(7, now);
    run(receipt);
  }
};

constexpr const char* k_step_completion =
    R"({"step":"s0","status":"ok","attempts":1,"output":"","error":"","exit":0})";

std::string step_id(const std::string& run, int s) {
  return run + "-s" + std::to_string(s) + "-v1";
}

// N runs of noop3's rows, C at a time in lock step: 8 transactions per group.
double raw_sql_runs(raw_sql& r, std::size_t n, int c) {
  auto t0 = clock::now();
  for (std::size_t lo = 0; lo < n; lo += static_cast<std::size_t>(c)) {
    auto hi = std::min(n, lo + static_cast<std::size_t>(c));
    std::vector<std::string> ids;
    for (auto i = lo; i < hi; ++i) ids.push_back("sop-raw-" + std::to_string(i));
    auto txn = [&r](auto&& body) {
      r.db.exec("BEGIN IMMEDIATE");
      body();
      r.db.exec("COMMIT");
    };
    txn([&] {
      for (auto& id : ids) r.do_admit(id, "noop3");
    });
    txn([&] {
      for (auto& id : ids) r.do_claim(id, 2);
    });
    for (int s = 0; s < k_steps; ++s) {
      txn([&] {
        for (auto& id : ids) {
          r.do_save(id, 3 + 2 * s, "step_started", false);
          r.do_step_admit(id, step_id(id, s));
        }
      });
      txn([&] {
        for (auto& id : ids) {
          bool last = s == k_steps - 1;
          r.do_save(id, 4 + 2 * s, last ? "completed" : "step_ended", last);
          r.do_terminal(step_id(id, s), "completed", k_step_completion);
          if (last) r.do_terminal(id, "completed", nullptr);
        }
      });
    }
  }
  return bench::seconds_since(t0);
}

// The gate's rows and exec, one run at a time: the runs are admitted and
// parked first (untimed), then each round trip is timed.
awaitable<std::vector<double>> raw_approvals(raw_sql* r, std::string socket, std::string cwd,
                                             int k) {
  auto cl = co_await sandbox::client::connect(socket, wire::conn_mode::read_write, k_bench);
  if (!cl) die("connect: " + cl.error().message);
  auto env = sandbox::current_environment();
  std::vector<std::string> ids;
  r->db.exec("BEGIN IMMEDIATE");
  for (int i = 0; i < k; ++i) {
    ids.push_back("sop-raw-gate-" + std::to_string(i));
    r->do_admit(ids.back(), "gate");
  }
  r->db.exec("COMMIT");
  std::vector<double> out;
  for (auto& id : ids) {
    auto t0 = clock::now();
    r->db.exec("BEGIN IMMEDIATE");  // the decision
    r->do_save(id, 2, "approved", false);
    r->audit.bind(1, runtime::now_ms());
    r->audit.bind(2, "bench");
    r->audit.bind(3, "sop.approve");
    r->audit.bind(4, id);
    r->audit.bind(5, "");
    raw_sql::run(r->audit);
    r->db.exec("COMMIT");
    r->db.exec("BEGIN IMMEDIATE");  // the claim
    r->do_claim(id, 3);
    r->db.exec("COMMIT");
    r->db.exec("BEGIN IMMEDIATE");  // the step's admission
    r->do_save(id, 4, "step_started", false);
    r->do_step_admit(id, step_id(id, 1));
    r->db.exec("COMMIT");
    co_await exec_true(cl->get(), noop_request(cwd, env, id, 1));
    r->db.exec("BEGIN IMMEDIATE");  // the step's end and the run's terminal transition
    r->do_save(id, 5, "completed", true);
    r->do_terminal(step_id(id, 1), "completed", k_step_completion);
    r->do_terminal(id, "completed", nullptr);
    r->db.exec("COMMIT");
    out.push_back(ms_between(t0, clock::now()));
  }
  (*cl)->close();
  co_return out;
}

void check_raw(const std::string& path, std::size_t n, int k) {
  SQLite::Database db(path, SQLite::OPEN_READONLY);
  auto runs =
      db.execAndGet("SELECT count(*) FROM tasks WHERE kind = 'sop_run' AND state = 'completed'")
          .getInt64();
  auto steps =
      db.execAndGet("SELECT count(*) FROM tasks WHERE kind = 'sop_step' AND state = 'completed'")
          .getInt64();
  auto want_runs = static_cast<std::int64_t>(n) + k;
  auto want_steps = static_cast<std::int64_t>(k_steps * n) + k;
  if (runs != want_runs || steps != want_steps)
    die("raw check failed: " + std::to_string(runs) + " completed runs and " +
        std::to_string(steps) + " steps, expected " + std::to_string(want_runs) + " and " +
        std::to_string(want_steps));
}

}  // namespace

int main(int argc, char** argv) {
  std::size_t n = 1000;
  int c = 16, k = 200;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--quick") {
      n = 200;
      k = 50;
    } else if (a == "--runs" && i + 1 < argc) {
      n = std::strtoul(argv[++i], nullptr, 10);
    } else if (a == "--concurrency" && i + 1 < argc) {
      c = std::atoi(argv[++i]);
    } else if (a == "--approvals" && i + 1 < argc) {
      k = std::atoi(argv[++i]);
    } else {
      die("usage: bench_sop [--runs N] [--concurrency C] [--approvals K] [--quick]");
    }
  }
  if (n < 1 || c < 1 || c > 10000 || k < 1)
    die("--runs and --approvals must be at least 1, --concurrency 1..10000");

  char tmpl[] = "/tmp/tether-bench-sop-XXXXXX";
  if (!::mkdtemp(tmpl)) die("mkdtemp under /tmp failed");
  std::string dir = tmpl;
  fs::create_directories(dir + "/work");
  write_sops(dir + "/sops", c);
  {
    std::lock_guard lk(g_die_m);
    g_dir = dir;
  }
  std::string sandbox_root = "/dev/shm";
  if (const char* e = std::getenv("BENCH_SOP_SANDBOX_ROOT"); e && *e) sandbox_root = e;
  std::error_code root_ec;
  if (!fs::is_directory(sandbox_root, root_ec)) sandbox_root = dir;
  std::string sbx = sandbox_root + "/tether-bench-sop-sbx-XXXXXX";
  if (!::mkdtemp(sbx.data())) die("mkdtemp in " + sandbox_root + " failed");
  {
    std::lock_guard lk(g_die_m);
    g_dir += " and " + sbx;
  }
  sandbox::daemon_options d;
  d.state_dir = sbx + "/state";
  d.binary = std::string(TETHER_BIN_DIR) + "/tether-sandboxd";
  d.detach = false;
  auto daemon = sandbox::ensure_daemon(d);
  if (!daemon) die("starting the daemon: " + daemon.error().message);
  {
    std::lock_guard lk(g_die_m);
    g_daemon = *daemon;
  }

  bench::emit_text(k_bench, "sync_mode", "full", "mode");
  bench::emit(k_bench, "runs", static_cast<double>(n), "runs");
  bench::emit(k_bench, "concurrency", c, "runs");
  bench::emit(k_bench, "steps_per_run", k_steps, "steps");
  bench::emit(k_bench, "approvals", k, "runs");

  auto work = dir + "/work";
  // Warm-up of the daemon (not timed), then the raw exec baseline.
  (void)raw_exec_pass(daemon->socket_path, work, static_cast<std::size_t>(c), c, "warm",
                      daemon->pid);
  auto exec_before = raw_exec_pass(daemon->socket_path, work, n, c, "before", daemon->pid);
  bench::emit(k_bench, "raw_exec_runs_per_s_before", static_cast<double>(n) / exec_before.seconds,
              "runs/s");

  auto copy = dir + "/raw.db";
  auto e = run_engine(dir, d.state_dir, daemon->pid, n, c, k, copy);
  auto runs_per_s = static_cast<double>(n) / e.seconds;
  auto nd = static_cast<double>(n);
  bench::emit(k_bench, "runs_per_s", runs_per_s, "runs/s");
  bench::emit(k_bench, "admit_per_s", nd / e.admit_seconds, "runs/s");
  bench::emit(k_bench, "cpu_us_per_run", e.cpu_s * 1e6 / nd, "us");
  bench::emit(k_bench, "daemon_cpu_us_per_run", e.daemon_cpu_s * 1e6 / nd, "us");
  bench::emit(k_bench, "writer_transactions_per_run", static_cast<double>(e.transactions) / nd,
              "transactions");
  bench::emit(k_bench, "writer_requests_per_run", static_cast<double>(e.requests) / nd, "requests");
  auto ac50 = bench::percentile(e.approve_call_ms, 50),
       ac99 = bench::percentile(e.approve_call_ms, 99);
  auto rt50 = bench::percentile(e.round_trip_ms, 50), rt99 = bench::percentile(e.round_trip_ms, 99);
  bench::emit(k_bench, "approve_call_p50", ac50, "ms");
  bench::emit(k_bench, "approve_call_p99", ac99, "ms");
  bench::emit(k_bench, "approval_round_trip_p50", rt50, "ms");
  bench::emit(k_bench, "approval_round_trip_p99", rt99, "ms");

  auto exec_after = raw_exec_pass(daemon->socket_path, work, n, c, "after", daemon->pid);
  bench::emit(k_bench, "raw_exec_runs_per_s_after", nd / exec_after.seconds, "runs/s");
  auto raw_exec = (nd / exec_before.seconds + nd / exec_after.seconds) / 2;
  bench::emit(k_bench, "raw_exec_runs_per_s", raw_exec, "runs/s");
  bench::emit(k_bench, "raw_exec_cpu_us_per_run",
              (exec_before.cpu_s + exec_after.cpu_s) * 1e6 / (2 * nd), "us");
  bench::emit(k_bench, "raw_exec_daemon_cpu_us_per_run",
              (exec_before.daemon_cpu_s + exec_after.daemon_cpu_s) * 1e6 / (2 * nd), "us");

  double raw_sql_rate = 0;
  std::vector<double> raw_rt;
  {
    raw_sql r(copy, e.admitted_payload, e.final_payload);
    double cpu0 = cpu_seconds();
    raw_sql_rate = nd / raw_sql_runs(r, n, c);
    bench::emit(k_bench, "raw_sql_runs_per_s", raw_sql_rate, "runs/s");
    bench::emit(k_bench, "raw_sql_cpu_us_per_run", (cpu_seconds() - cpu0) * 1e6 / nd, "us");
    asio::io_context io;
    raw_rt = runtime::run_to_completion(io, raw_approvals(&r, daemon->socket_path, work, k));
  }
  check_raw(copy, n, k);
  auto rr50 = bench::percentile(raw_rt, 50), rr99 = bench::percentile(raw_rt, 99);
  bench::emit(k_bench, "raw_approval_round_trip_p50", rr50, "ms");
  bench::emit(k_bench, "raw_approval_round_trip_p99", rr99, "ms");
  auto ceiling = std::min(raw_exec, raw_sql_rate);
  bench::emit(k_bench, "ceiling_runs_per_s", ceiling, "runs/s");
  bench::emit(k_bench, "runs_vs_ceiling", runs_per_s / ceiling, "ratio");
  bench::emit(k_bench, "round_trip_p50_vs_raw", rt50 / rr50, "ratio");
  bench::emit(k_bench, "ok", 1, "bool");

  std::printf(
      "{\"bench\":\"sop\",\"sync\":\"full\",\"runs\":%zu,\"concurrency\":%d,\"steps\":%d,"
      "\"runs_per_s\":%s,\"raw_exec_runs_per_s\":%s,\"raw_sql_runs_per_s\":%s,"
      "\"runs_vs_ceiling\":%s,\"cpu_us_per_run\":%s,\"writer_transactions_per_run\":%s,"
      "\"approvals\":%d,\"approve_call_ms\":{\"p50\":%s,\"p99\":%s},"
      "\"approval_round_trip_ms\":{\"p50\":%s,\"p99\":%s},"
      "\"raw_approval_round_trip_ms\":{\"p50\":%s,\"p99\":%s},\"ok\":true}\n",
      n, c, k_steps, number(runs_per_s).c_str(), number(raw_exec).c_str(),
      number(raw_sql_rate).c_str(), number(runs_per_s / ceiling).c_str(),
      number(e.cpu_s * 1e6 / nd).c_str(), number(static_cast<double>(e.transactions) / nd).c_str(),
      k, number(ac50).c_str(), number(ac99).c_str(), number(rt50).c_str(), number(rt99).c_str(),
      number(rr50).c_str(), number(rr99).c_str());
  std::fflush(stdout);

  {
    std::lock_guard lk(g_die_m);
    g_daemon.reset();
  }
  if (auto st = sandbox::stop_daemon(*daemon); !st)
    std::fprintf(stderr, "bench_sop: stopping the daemon: %s\n", st.error().message.c_str());
  std::error_code ec;
  fs::remove_all(dir, ec);
  fs::remove_all(sbx, ec);
  return 0;
}
