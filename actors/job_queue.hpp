#pragma once
// The job queue: the owner and registry of every background job, whichever
// channel launched it (a tool call, the CLI, the embedding API). It admits
// and launches jobs, checks ownership, runs recovery at boot and keeps the
// set of live jobs; each live job is a `job` actor (actors/job.hpp) that
// follows it, takes its cancel and writes its end, and every request to the
// sandbox goes through the queue's `sandbox_channel` (actors/sandbox_channel.hpp).
//
// A job's path (crash points in brackets):
//   admit: the owner scope is written before anything runs   [delivery.launch.after_admit]
//   dispatch: exec on the sandbox, idempotent by job id       [delivery.dispatch.after_exec]
//   running: the `started` receipt                             [delivery.started.after_commit]
//   terminal: compare-and-set with its pending receipt        [delivery.terminal.after_commit]
//   delivery: admitted into the owner's inbox under the receipt id while the
//     receipt is pending, then
//     busy session: acknowledged on acceptance, in that transaction [delivery.ack.after_commit]
//     idle session: woken with a prompt; acknowledged when its drain takes it
//                                                               [delivery.handover.after_admit]
//   cancel: the daemon's confirmed kill, then the CAS          [delivery.cancel.after_kill]
// Recovery (recover(), at boot; the daemon is read through a read-only
// connection and nobody is woken until boot's phases resume the sessions):
//   stale receipts dropped                                      [recover.drop.after_commit]
//   a job that ended, or that the daemon does not know, while
//     the host was down: the terminal CAS                       [recover.terminal.after_commit]
//   an admitted job the daemon runs: the `started` receipt      [recover.running.after_commit]
//   the daemon's record of a job settled here, expired          [recover.expire.after_commit]
// Then boot's sweep (host::boot) resends every pending receipt, these
// included, through the one delivery path (actors/delivery.hpp), waking
// nobody                                                        [recover.handover.after_admit]
// Delivery is at-least-once: a receipt stays pending until acknowledged, a
// resend carries the same id and the inbox drops the repeat.
//
// Ownership: every call names its caller's scope (tenant, thread, turn), which
// the runtime supplies. A caller that does not own a job is told "not found",
// exactly as for a job that does not exist.
//
// Threads: the queue's coroutines, its job actors and its sandbox channel
// (an actor too) run on the queue's executor; public calls hop onto it. The
// registry (the job actors by id, and their rows as their messages reported
// them) is touched only there. The queue talks to a job only by message
// (follow, cancel, finish, a waiter, sessions_resumed, stopping) and a job
// tells the queue by posting a copy of its row (job_note). Other threads
// (sessions asking turn_has_live_jobs, running or stop_turn) read an
// immutable snapshot of the live jobs' rows, republished on every change;
// the revision, the idle count and the held hand-overs are counters under a
// mutex.
#include <chrono>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "tether/actors/job.hpp"
#include "tether/actors/sandbox_channel.hpp"
#include "tether/persistence/task_store.hpp"
#include "tether/protocol/report.hpp"
#include "tether/runtime/actor.hpp"
#include "tether/runtime/gate.hpp"
#include "tether/runtime/one_shot.hpp"
#include "tether/runtime/retry.hpp"
#include "tether/sandbox/daemon_process.hpp"

namespace tether::actors {

class host;
using persistence::owned_job;
using persistence::owned_state;
using protocol::owner_scope;

struct job_queue_options {
  std::string sandbox_dir;  // the daemon's state directory; empty: no sandbox
  /// Starts a daemon there if none serves it (only after recovery found no
  /// outstanding owner there, or there was none). Tests start their own.
  bool start_daemon = true;
  /// Empty: $TETHER_SANDBOXD if set, else tether-sandboxd next to the running executable.
  std::string daemon_binary;
  /// The sandbox is the host's own local daemon (no sandbox was configured):
  /// recovery starts it again when none answers, and a job its directory no
  /// longer knows (another identity there now) ends `lost` instead of
  /// stopping boot. Set by host::open.
  bool local = false;
  /// A daemon this queue starts exits after this long with no connection and
  /// no job (--idle-exit-ms); unset: never. The host's local daemon sets it.
  std::optional<std::chrono::milliseconds> daemon_idle_exit;
  /// Optional adapter route onto the same sandbox, and its fallback threshold.
  std::function<awaitable<result<std::shared_ptr<command_route>>>(std::string socket)> adapter;
  int adapter_failures = 3;
  std::string cwd;  // default working directory of commands; default: the host's
  /// Deadline and heartbeat of the queue's daemon connections (the platform
  /// route and recovery's read-only one): a wedged daemon is an error, not a hang.
  sandbox::client_options client = sandbox::client_options::from_env();
  /// Instrumentation (benches, tests): called on the queue's executor when a
  /// job's completion arrived ("completion"), when its terminal transition
  /// committed ("terminal") and when its terminal receipt was handed over to
  /// the owner's session ("handed_over"). Keep it short.
  std::function<void(const job_id&, std::string_view stage)> trace;
};

struct launch_request {
  std::string command;
  std::string cwd;                                       // empty: the queue's default
  std::vector<std::pair<std::string, std::string>> env;  // empty: the host's environment
  bool background = true;
  std::string channel = "api";  // tool | cli | api
  /// Idempotency key (a tool call id): the same turn launching the same key
  /// again (a turn replayed after a crash) gets the same job, never a second
  /// run. 1-64 of [A-Za-z0-9_.-].
  std::optional<std::string> key;
  /// Policy (docs/policy.md; a turn's context sets these from its session's
  /// policy, and the agent cannot loosen them): run inside bubblewrap, with
  /// or without the network, and only in a work directory under one of
  /// `writable` (nullopt: anywhere).
  bool isolate = false;
  bool allow_network = true;  // only with isolate
  std::optional<std::vector<std::string>> writable;
};

/// What an owner may know about its job.
struct job_view {
  job_id id;
  owned_state state = owned_state::admitted;
  std::optional<protocol::shell_completion> completion;
  std::string notice;  // the terminal receipt's body, once terminal
};

struct recovery_report {
  int reattached = 0;  // still running, followed again
  int finished_while_down = 0;
  int lost = 0;         // admitted but unknown to the daemon: not run again
  int redelivered = 0;  // pending receipts handed over by boot's sweep
  int dropped = 0;      // pending receipts of another scope or an older generation
  std::vector<std::string> warnings;
};

class job_queue {
 public:
  job_queue(runtime::executor ex, host& h, persistence::task_store& store, job_queue_options opts);
  ~job_queue();

  /// What recover() reads before it decides anything: the live owned jobs
  /// and the pending receipts of every kind but subagents'. Queued on the
  /// store's read threads when made (start_recovery_reads), so that boot
  /// reads them beside its validation; recover() waits for them.
  struct recovery_reads {
    std::shared_ptr<runtime::one_shot<result<std::vector<persistence::owned_job>>>> live;
    std::shared_ptr<
        runtime::one_shot<result<std::vector<std::pair<persistence::receipt, std::string>>>>>
        pending;
  };
  static recovery_reads start_recovery_reads(persistence::task_store& store);

  /// Boot: reattaches read-only to each recorded sandbox generation, settles
  /// what ended while the host was down, drops stale receipts and resends the
  /// pending ones. An outstanding owner that cannot be recovered is an error
  /// (and nothing new starts); so is persisted state that does not parse.
  /// `reads`: started by the caller before anything was written (otherwise
  /// recover() starts them itself).
  awaitable<result<recovery_report>> recover(std::optional<recovery_reads> reads = {});

  awaitable<result<job_id>> launch(owner_scope caller, launch_request req);
  /// A session's own tool call. Its actor knows its row (the scope's tenant
  /// and whether its turns take notifications), and no drain runs while the
  /// session is deleted, so the queue does not read the row again. Only the
  /// session actor calls this; every other caller goes through launch().
  awaitable<result<job_id>> launch_as_session(owner_scope caller, launch_request req, bool notify);
  /// Status now. A terminal result read this way is not delivered again.
  awaitable<result<job_view>> status(owner_scope caller, job_id job);
  /// Until the job is terminal; like status() it counts as reading the result.
  awaitable<result<job_view>> wait(owner_scope caller, job_id job);
  /// Confirmed kill, then the `cancelled` receipt (unless the job ended first:
  /// then its own terminal view). The caller reads the result here.
  awaitable<result<job_view>> cancel(owner_scope caller, job_id job);
  /// Cancels every live job the turn owns (confirmed); the receipts are delivered.
  awaitable<result<int>> stop_turn(owner_scope turn);
  /// Cancels every live job of a thread, whichever turn launched it
  /// (confirmed): its session is being deleted.
  awaitable<result<int>> stop_thread(protocol::tenant_id tenant, protocol::session_id thread);

  /// Boot's phases have resumed the sessions: hand-overs held since
  /// recover() go ahead (the queue tells each live job). Any thread.
  void sessions_resumed();
  /// How many hand-overs waited for sessions_resumed() (for boot's report).
  int held_handovers();

  /// Live (not yet handed over) jobs of a turn. Any thread: reads the
  /// immutable snapshot of the live jobs.
  bool turn_has_live_jobs(const protocol::session_id& thread, const protocol::turn_id& turn);
  /// Background jobs still running under a thread, for the report's running
  /// list. Any thread: reads the same snapshot.
  std::vector<protocol::running_item> running(const protocol::session_id& thread);
  /// Bumped by every change of the set of live jobs. Any thread.
  std::uint64_t revision();
  /// Resolves once the revision is past `seen`.
  std::shared_ptr<runtime::one_shot<std::uint64_t>> revision_after(std::uint64_t seen);
  /// Resolves once no job is live and no delivery is in flight.
  awaitable<void> wait_idle();

  /// The platform's sandbox, once a route is open (the channel's snapshot).
  std::optional<std::pair<protocol::sandbox_id, std::uint64_t>> sandbox() const;
  /// The queue's one sandbox channel: every request to the sandbox goes through it.
  sandbox_channel& channel() { return *channel_; }
  std::shared_ptr<sandbox_channel> channel_ptr() { return channel_; }
  sandbox_lease& lease() { return channel_->lease(); }

  /// Refuses new work, stops each job actor (its waiters resume, a held
  /// hand-over gives up), then the sandbox channel (its connections end), and
  /// waits until every coroutine of the queue and of its jobs has finished
  /// (its gate), so nothing of the queue is left on an executor. Jobs stay as
  /// they are on disk and in the daemon; the next boot recovers them. Run
  /// before the executors stop. Idempotent.
  awaitable<void> stop();

 private:
  using live_map = std::map<job_id, owned_job>;
  /// One thread's live jobs, as an immutable snapshot.
  using thread_view = std::shared_ptr<const std::vector<owned_job>>;

  /// The channel's bind hook: refuses a generation older than the bound
  /// one (read off the executor), then binds it through the writer.
  awaitable<result<void>> bind_route(protocol::sandbox_id sb, std::uint64_t generation);
  /// `notify`: the caller's session's setting, when its actor gave it;
  /// otherwise the session's row is read (and must be the caller's tenant's).
  awaitable<result<job_id>> launch_on(owner_scope caller, launch_request req,
                                      std::optional<bool> notify);
  awaitable<result<job_view>> status_on(owner_scope caller, job_id job);
  awaitable<result<job_view>> cancel_on(owner_scope caller, job_id job, bool read);
  /// Cancels each job in the scope given with it (confirmed); how many ended
  /// cancelled, or the first error other than "not found" (the rest are still tried).
  awaitable<result<int>> cancel_each(std::vector<std::pair<job_id, owner_scope>> jobs);
  awaitable<result<recovery_report>> recover_on(std::optional<recovery_reads> reads);
  /// 1: `w` waits for the live job's end; 0: the job is not live here; -1: stopping.
  awaitable<int> add_waiter(job_id job, std::shared_ptr<runtime::one_shot<int>> w);
  /// Runs `task` on the queue's executor, shielded from the caller's cancellation.
  template <class T>
  awaitable<T> on_queue(awaitable<T> task);
  bool closing();
  static error stopping_error();
  /// The owned job, or "not found" for a stranger.
  awaitable<result<owned_job>> owned(owner_scope caller, job_id job);
  awaitable<result<job_view>> view_of(owned_job j);

  // The registry, on the queue's executor.
  /// A job actor for a live job, registered.
  std::shared_ptr<job> add_live(owned_job j);
  /// A job's message (posted onto the queue's executor): its row changed, or
  /// it is no longer live and the registry forgets it.
  void on_job_note(job_note_t n);
  /// Publishes `thread`'s live rows afresh (only that thread's: a change
  /// costs the jobs of its thread, not every live job).
  void publish_live(const protocol::session_id& thread);
  /// The live rows of one thread (never null). Keep the pointer in a named
  /// local while reading the rows: `for (auto& r : *live_view(t))` lets the
  /// temporary go at once, and a concurrent change may free the rows.
  thread_view live_view(const protocol::session_id& thread) const;
  void bump();
  void busy(int delta);
  /// A job's hand-over waits for sessions_resumed().
  void held_handover();

  runtime::executor ex_;
  host& host_;
  persistence::task_store& store_;
  job_queue_options opts_;
  std::shared_ptr<sandbox_channel> channel_;

  runtime::gate gate_;                            // every coroutine of the queue and of its jobs
  runtime::retry_pauses pauses_;                  // the jobs' retried writes and hand-overs
  std::shared_ptr<const job_services> services_;  // what each job is handed
  std::map<job_id, std::shared_ptr<job>> jobs_;   // live jobs (executor only)
  // Their rows, as their messages reported them, by thread (executor only).
  std::map<protocol::session_id, live_map> index_;
  // Boot's phases resumed the sessions (executor only): a job made now is
  // told so at construction, a live one by message when it changes.
  bool resumed_ = true;

  mutable std::mutex m_;
  // Each thread's latest immutable copy of its index_ rows.
  std::map<protocol::session_id, thread_view> live_view_;
  std::uint64_t revision_ = 0;
  long busy_ = 0;  // live jobs plus deliveries in flight
  std::vector<std::pair<std::uint64_t, std::shared_ptr<runtime::one_shot<std::uint64_t>>>>
      revision_waiters_;
  std::vector<std::shared_ptr<runtime::one_shot<int>>> idle_waiters_;
  bool stopped_ = false;
  int held_handovers_ = 0;
};

}  // namespace tether::actors
