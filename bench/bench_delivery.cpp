// bench_delivery: many turns, each owning many short background jobs launched
// through the host's job queue into a real tether-sandboxd; how fast their
// terminal receipts are handed over to the owning turn, WAL and
// synchronous=FULL, against the same commands through a raw sandbox::client
// (exec + wait, no persistence) in the same run and on the same daemon.
//
// Shape (argv, all optional): bench_delivery [SESSIONS=32] [JOBS_PER_SESSION=32]
// [POLICY=both|report_now|withhold]. SESSIONS top-level sessions each get one
// prompt; the first drain of that turn launches its JOBS_PER_SESSION jobs
// ("true" and "echo x", alternating) with agent_context::launch_job, one after
// the other as a model's tool calls would, so up to SESSIONS launches are in
// flight at once. Both job policies are measured by default, each on its own
// fresh database, and every figure names its policy:
//   report_now: the turn settles as soon as its drain returns; each receipt
//     reaches an idle session as a prompt (acknowledged when a drain takes it)
//     or a busy one as a steer (acknowledged on acceptance).
//   withhold (a top-level session's default policy): the turn stays open until every
//     job it owns was handed over; every receipt is steered into the running
//     turn and acknowledged on acceptance.
//
// Timestamps come from job_queue_options.trace: "completion" when the queue
// got the daemon's completion, "handed_over" when the terminal receipt was
// admitted into the owner's inbox. Between the two: the terminal CAS commit
// (receipts row) and the inbox admit commit, each a synchronous=FULL
// transaction shared with whatever else the writer had queued (group commit).
//
// The daemon's state directory is on tmpfs (/dev/shm) unless
// BENCH_DELIVERY_SANDBOX_ROOT names another directory; the database is on
// disk (under /tmp). See main() for why.
//
// Figures, per policy P (prefix "P_"):
//   receipts_delivered_per_s   handed-over receipts / (first launch_job call
//                              -> last hand-over)
//   completion_to_delivery_p50/_p99/_max   ms, per job
//   launch_call_p50/_p99       ms a launch_job call took (admit commit, exec,
//                              started-receipt commit)
//   launch_to_delivery_p50/_p99   ms, from the launch_job call to hand-over
//   launch_phase_s             first launch_job call -> last one returned
//   deliver_wall_s             first launch_job call -> last hand-over
//   quiescent_s                first launch_job call -> every session idle
//                              with its notices in the transcript
//   writer_transactions, writer_requests, writer_requests_per_transaction
//                              (group commit), from the prompts to quiescence
//   cpu_us_per_job, daemon_cpu_us_per_job   CPU of this process and of the
//                              daemon over the same span
//   delivered_vs_raw_ratio     receipts_delivered_per_s / raw_jobs_per_s
// Baseline, before and after the host runs (same daemon, same commands, same
// count, same concurrency: SESSIONS coroutines on one client each exec'ing
// its jobs one after the other, a waiter per job, caller-chosen job ids):
//   raw_jobs_per_s_before/_after (first exec -> last completion), their
//   exec_call_p50/_p99, cpu_us_per_job, daemon_cpu_us_per_job, and
//   raw_jobs_per_s, the mean of the two.
//
// Checks, per policy: every launched job completed (exit 0), reported one
// completion and one hand-over through the trace, its terminal receipt is
// acknowledged, and its notice is exactly once in its own session's transcript
// (and nowhere else); the number of 'notice' messages per session equals the
// jobs it launched; no commit failed; the host logged no warning. Any failure
// aborts (exit 1) with a message naming what was wrong, stops the daemon and
// keeps the scratch directories.
#include <unistd.h>

#include <atomic>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <map>
#include <mutex>
#include <sstream>
#include <unordered_map>

#include "host_support.hpp"
#include "support.hpp"
#include "tether/actors/host.hpp"
#include "tether/runtime/sync_wait.hpp"
#include "tether/sandbox/client.hpp"
#include "tether/sandbox/daemon_process.hpp"

namespace {

using namespace tether;
namespace asio = boost::asio;
namespace bench = tether::bench;
namespace wire = protocol::sandbox;
using asio::awaitable;
using bench::clock;
using bench::sync;
using protocol::job_id;
using protocol::session_id;

constexpr char k_bench[] = "bench_delivery";

const std::vector<std::string> k_commands = {"true", "echo x"};

// For die(): the daemon to stop and the scratch directory to mention.
std::mutex g_die_m;
std::optional<sandbox::daemon_handle> g_daemon;
std::string g_dir;

[[noreturn]] void die(const std::string& what) {
  std::lock_guard lk(g_die_m);
  std::fprintf(stderr, "bench_delivery: %s\n", what.c_str());
  if (g_daemon) (void)sandbox::stop_daemon(*g_daemon);
  if (!g_dir.empty())
    std::fprintf(stderr, "bench_delivery: scratch directories kept: %s\n", g_dir.c_str());
  std::fflush(stderr);
  std::_Exit(1);
}

using bench::cpu_seconds;

using bench::cpu_seconds_of;

double ms_between(clock::time_point a, clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

struct shape {
  int sessions = 32;
  int jobs = 32;  // per session
  std::vector<std::string> policies = {"report_now", "withhold"};
  int total() const { return sessions * jobs; }
};

std::string session_name(int i) {
  return "ses_bench" + std::to_string(i);
}

// ---- what happened to each job --------------------------------------------------------

struct job_times {
  std::string session;  // empty: never seen launched
  clock::time_point call, returned, completion, handed_over;
  int completions = 0, handovers = 0;
};

class tracker {
 public:
  // job_queue_options.trace: runs on the queue's executor.
  void trace(const job_id& j, std::string_view stage) {
    auto now = clock::now();
    std::lock_guard lk(m_);
    auto& t = jobs_[j.str()];
    if (stage == "completion") {
      if (t.completions++ == 0) t.completion = now;
    } else if (stage == "handed_over") {
      if (t.handovers++ == 0) t.handed_over = now;
    } else if (stage != "terminal") {  // the terminal commit is not timed here
      unknown_stages_.emplace_back(stage);
    }
  }
  void launched(const session_id& s, const job_id& j, clock::time_point call,
                clock::time_point returned) {
    std::lock_guard lk(m_);
    auto& t = jobs_[j.str()];
    t.session = s.str();
    t.call = call;
    t.returned = returned;
    order_.push_back(j.str());
  }
  std::mutex m_;
  std::unordered_map<std::string, job_times> jobs_;
  std::vector<std::string> order_;  // launched jobs, in launch order
  std::vector<std::string> unknown_stages_;
};

struct launch_state {
  launch_state(int sessions, int jobs, tracker* t)
      : jobs_per_session(jobs), left(sessions), tr(t) {}
  int jobs_per_session;
  std::atomic<int> left;  // sessions whose launching drain has not finished
  std::shared_ptr<runtime::one_shot<int>> all_launched = runtime::one_shot<int>::make();
  tracker* tr;
  std::mutex m;
  std::string first_error;

  void session_done() {
    if (--left == 0) all_launched->set(0);
  }
  void failed(const std::string& e) {
    std::lock_guard lk(m);
    if (first_error.empty()) first_error = e;
  }
};

// The turn's agent: its first prompt launches the session's jobs one after
// the other; later drains (receipts as notices, prompts or steers) do nothing
// beyond what the runtime does for them (acknowledge, move into the transcript).
class launcher_agent : public actors::agent {
 public:
  explicit launcher_agent(launch_state* st) : st_(st) {}

  awaitable<void> drain(actors::agent_context& ctx, actors::drain_input in) override {
    bool prompted = false;
    for (auto& m : in.inputs) prompted |= m.kind == "prompt";
    if (!prompted || launched_) co_return;
    launched_ = true;
    for (int i = 0; i < st_->jobs_per_session; ++i) {
      actors::launch_request req;
      req.command = k_commands[static_cast<std::size_t>(i) % k_commands.size()];
      auto call = clock::now();
      auto r = co_await ctx.launch_job(std::move(req));
      auto returned = clock::now();
      if (!r) {
        st_->failed("launch_job in " + ctx.self().str() + " failed: " + r.error().message);
        break;
      }
      st_->tr->launched(ctx.self(), *r, call, returned);
    }
    st_->session_done();
    std::string text = "launched";
    co_await ctx.say(std::move(text));
  }

 private:
  launch_state* st_;
  bool launched_ = false;  // one drain at a time per session
};

class launcher_agents : public actors::agent_factory {
 public:
  explicit launcher_agents(launch_state* st) : st_(st) {}
  std::shared_ptr<actors::agent> make(const persistence::session_row&) override {
    return std::make_shared<launcher_agent>(st_);
  }

 private:
  launch_state* st_;
};

// ---- the host run -----------------------------------------------------------------------

struct host_outcome {
  std::vector<double> completion_to_delivery_ms, launch_call_ms, launch_to_delivery_ms;
  double deliver_wall_s = 0;  // first launch call -> last hand-over
  double launch_phase_s = 0;  // first launch call -> last launch returned
  double quiescent_s = 0;     // first launch call -> quiescent
  std::size_t delivered = 0;
  double cpu_s = 0, daemon_cpu_s = 0;
  persistence::writer_stats stats;
  double rate() const { return static_cast<double>(delivered) / deliver_wall_s; }
};

awaitable<void> prompt_one(actors::host* h, session_id s) {
  std::string text = "launch your jobs";
  auto r = co_await h->prompt(s, std::move(text));
  if (!r) die("prompting " + s.str() + " failed: " + r.error().message);
}

// All prompts at once, so every turn starts launching at about the same time.
awaitable<void> prompt_all(actors::host* h, std::vector<session_id> ss) {
  auto done = runtime::one_shot<int>::make();
  auto left = std::make_shared<std::atomic<std::size_t>>(ss.size());
  for (auto& s : ss) {
    auto task = prompt_one(h, s);
    asio::co_spawn(h->pool().next(), std::move(task), [left, done](std::exception_ptr e) {
      if (e) die("a prompt threw: " + runtime::detail::describe(e));
      if (--*left == 0) done->set(0);
    });
  }
  co_await done->async_wait(asio::use_awaitable);
}

host_outcome run_host(const std::string& dir, const std::string& state_dir, pid_t daemon_pid,
                      const shape& s, const std::string& policy) {
  tracker tr;
  launch_state st(s.sessions, s.jobs, &tr);
  std::mutex warn_m;
  std::vector<std::string> warnings;

  actors::host_options o;
  o.db_path = dir + "/" + policy + ".db";
  o.sync = persistence::sync_mode::full;
  o.agents = std::make_shared<launcher_agents>(&st);
  o.jobs.sandbox_dir = state_dir;
  o.jobs.start_daemon = false;
  o.jobs.cwd = dir + "/work";
  o.jobs.trace = [&tr](const job_id& j, std::string_view stage) { tr.trace(j, stage); };
  o.log = [&warn_m, &warnings](const std::string& w) {
    std::fprintf(stderr, "bench_delivery: host: %s\n", w.c_str());
    std::lock_guard lk(warn_m);
    warnings.push_back(w);
  };
  auto opened = actors::host::open(o);
  if (!opened) die("host::open failed: " + opened.error().message);
  auto& host = **opened;
  if (auto b = sync(host, host.boot()); !b) die("boot failed: " + b.error().message);

  std::vector<session_id> sessions;
  for (int i = 0; i < s.sessions; ++i) {
    auto r = sync(
        host, host.create_session("bench turn " + std::to_string(i), session_id(session_name(i))));
    if (!r) die("create_session failed: " + r.error().message);
    auto p = sync(host, host.set_job_policy(*r, true, policy));
    if (!p) die("set_job_policy failed: " + p.error().message);
    sessions.push_back(*r);
  }

  auto before = host.store().db_writer().stats();
  double cpu0 = cpu_seconds(), dcpu0 = cpu_seconds_of(daemon_pid);
  sync(host, prompt_all(&host, sessions));
  // Every launching drain returned (jobs().wait_idle() alone could resolve
  // before the first launch was admitted).
  sync(host, st.all_launched->async_wait(asio::use_awaitable));
  if (!st.first_error.empty()) die(st.first_error);
  sync(host, host.jobs().wait_idle());
  sync(host, host.wait_quiescent());
  auto quiet = clock::now();
  double cpu1 = cpu_seconds(), dcpu1 = cpu_seconds_of(daemon_pid);
  auto after = host.store().db_writer().stats();

  host_outcome out;
  out.cpu_s = cpu1 - cpu0;
  out.daemon_cpu_s = dcpu1 - dcpu0;
  out.stats.transactions = after.transactions - before.transactions;
  out.stats.requests = after.requests - before.requests;
  out.stats.failed_commits = after.failed_commits - before.failed_commits;

  // ---- checks ----
  auto fail = [&](const std::string& what) { die(policy + ": check failed: " + what); };
  std::unique_lock lk(tr.m_);
  if (!tr.unknown_stages_.empty())
    fail("the trace reported an unknown stage '" + tr.unknown_stages_[0] + "'");
  if (tr.order_.size() != static_cast<std::size_t>(s.total()))
    fail(std::to_string(tr.order_.size()) + " jobs launched, expected " +
         std::to_string(s.total()));
  if (tr.jobs_.size() != tr.order_.size())
    fail("the trace saw " + std::to_string(tr.jobs_.size() - tr.order_.size()) +
         " jobs that no turn launched");
  std::map<std::string, std::vector<std::string>> by_session;
  clock::time_point first_call = clock::time_point::max(), last_handover = clock::time_point::min(),
                    last_return = clock::time_point::min();
  for (auto& id : tr.order_) {
    auto& t = tr.jobs_.at(id);
    if (t.completions != 1)
      fail("job " + id + " reported " + std::to_string(t.completions) + " completions");
    if (t.handovers != 1)
      fail("job " + id + " was handed over " + std::to_string(t.handovers) + " times");
    by_session[t.session].push_back(id);
    first_call = std::min(first_call, t.call);
    last_return = std::max(last_return, t.returned);
    last_handover = std::max(last_handover, t.handed_over);
    out.completion_to_delivery_ms.push_back(ms_between(t.completion, t.handed_over));
    out.launch_call_ms.push_back(ms_between(t.call, t.returned));
    out.launch_to_delivery_ms.push_back(ms_between(t.call, t.handed_over));
    auto j = host.store().job(job_id(id));
    if (!j || !*j) fail("job " + id + " has no row");
    if ((*j)->state != persistence::owned_state::completed)
      fail("job " + id + " ended " + std::string(persistence::to_string((*j)->state)));
    auto r = host.store().receipt_by_id(
        protocol::make_event_id(job_id(id), protocol::transition::completed));
    if (!r || !*r) fail("job " + id + " has no completed receipt");
    if ((*r)->state != persistence::receipt_state::acked)
      fail("the completed receipt of job " + id + " is " +
           std::string(persistence::to_string((*r)->state)));
  }
  for (auto& sid : sessions) {
    auto msgs = host.store().messages(sid);
    if (!msgs) fail("reading the transcript of " + sid.str() + ": " + msgs.error().message);
    auto& mine = by_session[sid.str()];
    std::map<std::string, int> seen;
    int notices = 0;
    for (auto& m : *msgs) {
      if (m.kind != "notice") continue;
      ++notices;
      int matched = 0;
      for (auto& id : mine)
        if (m.text.find(id) != std::string::npos) ++seen[id], ++matched;
      if (matched != 1)
        fail("a notice in " + sid.str() + " names " + std::to_string(matched) +
             " of its jobs: " + m.text);
    }
    if (notices != static_cast<int>(mine.size()))
      fail(sid.str() + " has " + std::to_string(notices) + " notices in its transcript for " +
           std::to_string(mine.size()) + " jobs launched");
    for (auto& id : mine)
      if (seen[id] != 1)
        fail("job " + id + "'s notice is " + std::to_string(seen[id]) + " times in " + sid.str() +
             "'s transcript");
  }
  if (out.stats.failed_commits != 0)
    fail(std::to_string(out.stats.failed_commits) + " commits failed");
  {
    std::lock_guard wl(warn_m);
    if (!warnings.empty())
      fail(std::to_string(warnings.size()) + " host warnings, first: " + warnings[0]);
  }

  out.delivered = tr.order_.size();
  out.deliver_wall_s = std::chrono::duration<double>(last_handover - first_call).count();
  out.launch_phase_s = std::chrono::duration<double>(last_return - first_call).count();
  out.quiescent_s = std::chrono::duration<double>(quiet - first_call).count();
  lk.unlock();
  host.shutdown();
  return out;
}

// ---- the raw baseline ----------------------------------------------------------------

struct raw_outcome {
  double rate = 0;              // jobs/s, first exec -> last completion
  std::vector<double> exec_ms;  // how long each exec call took
  double cpu_s = 0, daemon_cpu_s = 0;
};

struct raw_state {
  std::size_t expected = 0;
  std::atomic<std::size_t> finished{0};
  std::shared_ptr<runtime::one_shot<int>> all_done = runtime::one_shot<int>::make();
  std::vector<double> exec_ms;  // one thread: the io_context's
};

awaitable<void> raw_wait(sandbox::client* c, job_id j, raw_state* st) {
  auto done = co_await c->wait(j);
  c->forget(j);
  if (!done) die("raw wait for " + j.str() + " failed: " + done.error().message);
  if (done->status.exit_code != 0)
    die("raw job " + j.str() + " failed: " + protocol::render_notice(*done));
  if (++st->finished == st->expected) st->all_done->set(0);
}

// The i-th command of the mix, as a raw exec request.
wire::exec_req raw_request(int i, const std::string& cwd,
                           const std::vector<std::pair<std::string, std::string>>& env) {
  wire::exec_req r;
  r.command = k_commands[static_cast<std::size_t>(i) % k_commands.size()];
  r.cwd = cwd;
  r.env = env;
  return r;
}

awaitable<void> raw_turn(sandbox::client* c, int jobs, std::string cwd,
                         std::vector<std::pair<std::string, std::string>> env, raw_state* st) {
  auto ex = co_await asio::this_coro::executor;
  for (int i = 0; i < jobs; ++i) {
    auto r = raw_request(i, cwd, env);
    r.job = job_id(protocol::mint("job"));  // as the queue does: a caller-chosen id
    auto call = clock::now();
    auto started = co_await c->exec(std::move(r));
    if (!started) die("raw exec failed: " + started.error().message);
    st->exec_ms.push_back(ms_between(call, clock::now()));
    auto w = raw_wait(c, started->job, st);
    asio::co_spawn(ex, std::move(w), asio::detached);
  }
}

// s.total() jobs: s.sessions coroutines on one client, each exec'ing its
// jobs one after the other (a waiter per job), like the turns.
awaitable<raw_outcome> raw_run(std::string socket, std::string cwd, shape s, int warmup,
                               pid_t daemon_pid) {
  auto c = co_await sandbox::client::connect(socket, wire::conn_mode::read_write, k_bench);
  if (!c) die("connect: " + c.error().message);
  auto* client = c->get();
  auto env = sandbox::current_environment();
  auto ex = co_await asio::this_coro::executor;
  for (int i = 0; i < warmup; ++i) {
    auto r = raw_request(i, cwd, env);
    auto started = co_await client->exec(std::move(r));
    if (!started) die("raw warm-up exec failed: " + started.error().message);
    auto done = co_await client->wait(started->job);
    client->forget(started->job);
    if (!done) die("raw warm-up wait failed: " + done.error().message);
  }
  raw_state st;
  st.expected = static_cast<std::size_t>(s.total());
  double cpu0 = cpu_seconds(), dcpu0 = cpu_seconds_of(daemon_pid);
  auto t0 = clock::now();
  for (int k = 0; k < s.sessions; ++k) {
    auto task = raw_turn(client, s.jobs, cwd, env, &st);
    asio::co_spawn(ex, std::move(task), asio::detached);
  }
  co_await st.all_done->async_wait(asio::use_awaitable);
  raw_outcome out;
  out.rate = static_cast<double>(s.total()) / bench::seconds_since(t0);
  out.cpu_s = cpu_seconds() - cpu0;
  out.daemon_cpu_s = cpu_seconds_of(daemon_pid) - dcpu0;
  out.exec_ms = std::move(st.exec_ms);
  client->close();
  co_return out;
}

raw_outcome raw_pass(const std::string& socket, const std::string& cwd, const shape& s, int warmup,
                     pid_t daemon_pid) {
  asio::io_context io;
  auto task = raw_run(socket, cwd, s, warmup, daemon_pid);
  return runtime::run_to_completion(io, std::move(task));
}

void emit_raw(const std::string& p, raw_outcome& o, int jobs) {
  auto n = static_cast<double>(jobs);
  bench::emit(k_bench, p, o.rate, "jobs/s");
  bench::emit(k_bench, p + "_exec_call_p50", bench::percentile(o.exec_ms, 50), "ms");
  bench::emit(k_bench, p + "_exec_call_p99", bench::percentile(o.exec_ms, 99), "ms");
  bench::emit(k_bench, p + "_cpu_us_per_job", o.cpu_s * 1e6 / n, "us");
  bench::emit(k_bench, p + "_daemon_cpu_us_per_job", o.daemon_cpu_s * 1e6 / n, "us");
}

void emit_host(const std::string& p, host_outcome& o) {
  auto n = static_cast<double>(o.delivered);
  bench::emit(k_bench, p + "_receipts_delivered_per_s", o.rate(), "receipts/s");
  bench::emit(k_bench, p + "_completion_to_delivery_p50",
              bench::percentile(o.completion_to_delivery_ms, 50), "ms");
  bench::emit(k_bench, p + "_completion_to_delivery_p99",
              bench::percentile(o.completion_to_delivery_ms, 99), "ms");
  bench::emit(k_bench, p + "_completion_to_delivery_max",
              bench::percentile(o.completion_to_delivery_ms, 100), "ms");
  bench::emit(k_bench, p + "_launch_call_p50", bench::percentile(o.launch_call_ms, 50), "ms");
  bench::emit(k_bench, p + "_launch_call_p99", bench::percentile(o.launch_call_ms, 99), "ms");
  bench::emit(k_bench, p + "_launch_to_delivery_p50",
              bench::percentile(o.launch_to_delivery_ms, 50), "ms");
  bench::emit(k_bench, p + "_launch_to_delivery_p99",
              bench::percentile(o.launch_to_delivery_ms, 99), "ms");
  bench::emit(k_bench, p + "_launch_phase_s", o.launch_phase_s, "s");
  bench::emit(k_bench, p + "_deliver_wall_s", o.deliver_wall_s, "s");
  bench::emit(k_bench, p + "_quiescent_s", o.quiescent_s, "s");
  bench::emit(k_bench, p + "_writer_transactions", static_cast<double>(o.stats.transactions),
              "transactions");
  bench::emit(k_bench, p + "_writer_requests", static_cast<double>(o.stats.requests), "requests");
  bench::emit(k_bench, p + "_writer_requests_per_transaction",
              static_cast<double>(o.stats.requests) / static_cast<double>(o.stats.transactions),
              "requests/tx");
  bench::emit(k_bench, p + "_cpu_us_per_job", o.cpu_s * 1e6 / n, "us");
  bench::emit(k_bench, p + "_daemon_cpu_us_per_job", o.daemon_cpu_s * 1e6 / n, "us");
}

}  // namespace

int main(int argc, char** argv) {
  shape s;
  if (argc > 1) s.sessions = std::atoi(argv[1]);
  if (argc > 2) s.jobs = std::atoi(argv[2]);
  if (argc > 3 && std::string(argv[3]) != "both") s.policies = {argv[3]};
  if (s.sessions < 1 || s.jobs < 1)
    die("usage: bench_delivery [SESSIONS>=1] [JOBS_PER_SESSION>=1] [both|report_now|withhold]");
  for (auto& p : s.policies)
    if (p != "report_now" && p != "withhold")
      die("unknown policy '" + p + "' (report_now, withhold or both)");

  char tmpl[] = "/tmp/tether-bench-delivery-XXXXXX";
  if (!::mkdtemp(tmpl)) die("mkdtemp failed");
  std::string dir = tmpl;
  std::filesystem::create_directories(dir + "/work");
  {
    std::lock_guard lk(g_die_m);
    g_dir = dir;
  }
  // The daemon's state directory: on tmpfs (/dev/shm) unless
  // BENCH_DELIVERY_SANDBOX_ROOT names another place (e.g. /tmp, to put it on
  // the same disk as the database). The daemon creates six inodes per job and
  // deletes them after its grace period; on the ext4 without a journal this
  // was written on, inode allocation skips every recently deleted inode
  // (recently_deleted() in find_inode_bit), so the daemon's own file churn
  // made each exec slower over a run and stalled the daemon for 20-36 s. The
  // database, and so every synchronous=FULL commit, stays on disk in `dir`.
  std::string sandbox_root = "/dev/shm";
  if (const char* e = std::getenv("BENCH_DELIVERY_SANDBOX_ROOT"); e && *e) sandbox_root = e;
  std::error_code root_ec;
  if (!std::filesystem::is_directory(sandbox_root, root_ec)) sandbox_root = dir;
  std::string sbx_tmpl = sandbox_root + "/tether-bench-delivery-sbx-XXXXXX";
  if (!::mkdtemp(sbx_tmpl.data())) die("mkdtemp in " + sandbox_root + " failed");
  std::string sbx_dir = sbx_tmpl;
  {
    std::lock_guard lk(g_die_m);
    g_dir += " and " + sbx_dir;
  }

  sandbox::daemon_options d;
  d.state_dir = sbx_dir + "/state";
  d.binary = std::string(TETHER_BIN_DIR) + "/tether-sandboxd";
  d.detach = false;
  // The daemon's default grace (20 s) for finished jobs. bench_jobs' 5 s is
  // too short here: with SESSIONS execs queued ahead of it in the daemon, a
  // raw waiter's attach was seen to reach the daemon more than 5 s after its
  // job ended (on a loaded 2-core machine), and the job was already forgotten.
  auto daemon = sandbox::ensure_daemon(d);
  if (!daemon) die("starting the daemon: " + daemon.error().message);
  {
    std::lock_guard lk(g_die_m);
    g_daemon = *daemon;
  }

  bench::emit(k_bench, "sessions", s.sessions, "sessions");
  bench::emit(k_bench, "jobs_per_session", s.jobs, "jobs");
  bench::emit(k_bench, "jobs", s.total(), "jobs");
  bench::emit(k_bench, "sandbox_state_on_tmpfs", sbx_dir.rfind("/dev/shm/", 0) == 0 ? 1 : 0,
              "bool");

  auto raw_before = raw_pass(daemon->socket_path, dir + "/work", s, 50, daemon->pid);
  emit_raw("raw_jobs_per_s_before", raw_before, s.total());
  std::vector<std::pair<std::string, host_outcome>> runs;
  for (auto& p : s.policies) {
    runs.emplace_back(p, run_host(dir, d.state_dir, daemon->pid, s, p));
    emit_host(p, runs.back().second);
  }
  auto raw_after = raw_pass(daemon->socket_path, dir + "/work", s, 0, daemon->pid);
  emit_raw("raw_jobs_per_s_after", raw_after, s.total());
  double raw = (raw_before.rate + raw_after.rate) / 2;
  bench::emit(k_bench, "raw_jobs_per_s", raw, "jobs/s");
  for (auto& [p, o] : runs)
    bench::emit(k_bench, p + "_delivered_vs_raw_ratio", o.rate() / raw, "delivered/raw");

  {
    std::lock_guard lk(g_die_m);
    g_daemon.reset();
  }
  if (auto st = sandbox::stop_daemon(*daemon); !st)
    std::fprintf(stderr, "bench_delivery: stopping the daemon: %s\n", st.error().message.c_str());
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  std::filesystem::remove_all(sbx_dir, ec);
  return 0;
}
