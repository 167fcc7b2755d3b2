#pragma once
// The host wires the runtime together and boots it: it owns the executors,
// the single writer and the task store, the job queue (every background shell
// is an owned job of it), the registry of session actors (each with its inbox
// actor), the session directory (actors/directory.hpp) and the count of work
// in flight (runtime/quiescence.hpp). Its calls forward to those actors by
// message; its own state is the registry (which actor serves which session,
// which ones are being deleted), under one mutex. Boot runs in the seed's
// three phases.
//
// A report's path (crash points in brackets): owed to a parent that is
// there, the child's settle goes through the parent's inbox actor and admits
// the report in its own transaction, its terminal receipt written
// acknowledged [report.settle.after_commit] [report.admit.after_commit]; the
// parent is woken (unless a revert is staged) [report.wake.after_tell]; the
// parent's drain moves it into the transcript and acknowledges it in one
// transaction [report.drain.after_ack]. A parent that is not there when the
// child settles leaves the settle alone (its receipt pending, the outbox)
// [report.settle.after_commit], and the one delivery path
// (actors/delivery.hpp) drops it or, at boot, hands it over.
// A crash anywhere is repaired at boot from what is on disk.
#include <boost/asio/steady_timer.hpp>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "tether/actors/agent.hpp"
#include "tether/actors/cron.hpp"
#include "tether/actors/delegates.hpp"
#include "tether/actors/delivery.hpp"
#include "tether/actors/directory.hpp"
#include "tether/actors/job_queue.hpp"
#include "tether/actors/session.hpp"
#include "tether/actors/sop.hpp"
#include "tether/persistence/task_store.hpp"
#include "tether/persistence/writer.hpp"
#include "tether/protocol/scrub.hpp"
#include "tether/runtime/action_budget.hpp"
#include "tether/runtime/executor_pool.hpp"
#include "tether/runtime/gate.hpp"
#include "tether/runtime/quiescence.hpp"
#include "tether/runtime/sync_wait.hpp"

namespace tether::actors {

/// Whether `p` names a job policy: "withhold" or "report_now".
inline bool is_job_policy(std::string_view p) {
  return p == "withhold" || p == "report_now";
}

/// The job policy a new session starts with, by kind of session (seed 000 and
/// seed 002, figure 1; docs/design.md, Policies). host::set_job_policy changes
/// one session's policy later; spawn_request::job_policy picks a new child's.
struct job_policy_defaults {
  /// A top-level session (and a fork, which has no parent): its turn withholds
  /// its completion until the jobs it owns end, so the user sees one answer.
  std::string top_level = "withhold";
  /// A subagent: its turn settles at once, so its parent gets report 1 with
  /// the still-running list, and a later report when the jobs end.
  std::string subagent = "report_now";
};

struct host_options {
  std::string db_path;
  persistence::sync_mode sync = persistence::sync_mode::full;
  /// The caller is creating a database (see persistence::db_options::create):
  /// only then does an existing empty file become a new database.
  bool create_db = false;
  std::size_t max_batch = 1024;  // writer requests per transaction (1 = no group commit)
  std::size_t threads = 0;       // 0 = one per core
  int resume_budget = 3;         // resumes of a child before its job reports an error
  /// Boot reads its outbox a page at a time, delivering each page while it
  /// reads the next: the first page's rows (at least 1); every later page
  /// is four times that.
  std::size_t boot_outbox_page = 4096;
  std::shared_ptr<agent_factory> agents;
  std::shared_ptr<run_observer> observer;  // optional
  /// Owned background jobs (every shell a turn starts): the sandbox they run
  /// in and its routes. With no `jobs.sandbox_dir` the host runs them in a
  /// local, unisolated tether-sandboxd in <db_path>.sandbox (or, for a long
  /// path, sandbox::local_state_dir_for's fallback), started on
  /// demand (detached, so a restarted host finds its jobs again) and leaving
  /// by itself once idle (`jobs.daemon_idle_exit`, default 60 s).
  job_queue_options jobs;
  /// The job policy of a session at its creation (each one "withhold" or
  /// "report_now"; anything else and no host is opened).
  job_policy_defaults job_policies;
  /// Retention of finished work: a terminal task that owes nothing (its
  /// report or notice delivered, read or dropped) is deleted with its
  /// receipts once it has not changed for this long, at each boot and by
  /// expire_tasks(). nullopt keeps every task for good.
  std::optional<std::chrono::milliseconds> task_retention = std::chrono::hours(24 * 7);
  /// How often a booted host runs that retention sweep while it is up (the
  /// first one runs at boot).
  std::chrono::milliseconds retention_sweep_every = std::chrono::hours(1);
  /// Instrumentation (tests): called after each retention sweep, at boot
  /// and periodically, with how many tasks it deleted. Keep it short.
  std::function<void(int)> on_retention_sweep;
  /// Delegated tasks (docs/delegation.md): limits, lease, recovery period.
  delegate_options delegation;
  /// What runs a delegated task. Default: the named agent in a fresh
  /// top-level session of the caller's tenant, prompted once; its last answer
  /// is the output.
  delegate_runner run_delegate;
  /// The policy of a top-level session created without one of its own
  /// (docs/policy.md); children inherit and may only narrow it.
  protocol::session_policy default_policy;
  /// One action budget per tree of sessions (its top-level session, its
  /// subagents, forks and delegates): shells, spawns, delegates and host
  /// tools (agent_context::act) count against it. max_actions 0: none.
  runtime::budget_options action_budget;
  /// Scheduled work (docs/cron.md): set, the host runs a cron scheduler,
  /// started at the end of boot (after the other phases) and stopped first
  /// at shutdown. Its default clock is the system's; shell runs go through
  /// the job queue's sandbox channel; a prompt job runs in a fresh session
  /// of its agent (`isolated`, named after the attempt) or in the agent's
  /// main session (`main-<agent>`, created if missing).
  std::optional<cron_options> cron;
  /// SOP runs (docs/sop.md): set, the host runs an SOP engine, started after
  /// the cron scheduler and stopped first at shutdown. Shell steps go through
  /// the job queue's sandbox channel; a prompt step runs in a fresh session
  /// of the SOP's agent named after the attempt.
  std::optional<sop_options> sop;
  /// Where warnings go (boot: id conflicts, cleared rows). Default: stderr.
  std::function<void(const std::string&)> log;
};

struct boot_report {
  delegate_recovery delegation;  // what the delegate recovery pass settled
  int delivered = 0;             // terminal rows delivered in phase 1 (repeats dropped included)
  int cleared = 0;               // rows cleared: deleted parent or silent child
  int kept = 0;                  // rows kept after a conflict
  int exhausted = 0;             // running rows whose child ran out of resumes
  int resumed_top = 0;           // phase 2
  int resumed_children = 0;      // phase 3
  int expired = 0;               // finished tasks past options().task_retention, deleted
  std::optional<cron_startup> cron;  // the scheduler's start (host_options::cron)
  std::optional<sop_startup> sop;    // the SOP engine's start (host_options::sop)
  recovery_report jobs;  // owned jobs: reattached, settled while down, lost, receipts resent
  std::vector<std::string> warnings;
};

class host {
 public:
  static result<std::unique_ptr<host>> open(host_options opts);
  ~host();
  host(const host&) = delete;
  host& operator=(const host&) = delete;

  /// The seed's three phases: (1) deliver terminal job rows without a model
  /// turn and count running rows against resume budgets, (2) resume suspended
  /// top-level sessions, (3) then resume children.
  awaitable<result<boot_report>> boot();

  /// Creates a top-level session in `tenant`; its children are in the same
  /// tenant. Its job policy is options().job_policies.top_level.
  /// `policy`: its own (checked; an invalid one is refused), else
  /// options().default_policy.
  awaitable<result<session_id>> create_session(
      std::string description, std::optional<session_id> id = {}, std::string agent = "general",
      protocol::tenant_id tenant = protocol::tenant_id("default"),
      std::optional<protocol::session_policy> policy = {});
  /// A session with no parent made from `row` as given (tenant, policy,
  /// depth, budget root): a delegate runner's session. Its job policy is
  /// options().job_policies.top_level.
  awaitable<result<session_id>> create_session_row(persistence::session_row row);
  /// Appends a prompt (or steer) durably, then wakes the session.
  awaitable<result<std::int64_t>> prompt(session_id s, std::string text, bool steer = false);
  void interrupt(const session_id& s);
  /// A wake with no input (a control-only busy period if the session is idle).
  void nudge(const session_id& s, wake_scope scope = wake_scope::input);
  awaitable<result<void>> stage_revert(session_id s, bool staged);
  /// Turns a child's foreground job into a background one; refused while settling.
  awaitable<result<notification_id>> background(session_id child);
  /// Resolves once the session is idle (after its settle).
  awaitable<result<void>> wait_idle(session_id s);

  // --- goals (docs/policy.md) ---
  /// A goal owned by session `owner` (a task of kind `goal`): subagents and
  /// delegates that any session of `owner`'s tree starts may join it
  /// (spawn_request::goal, delegate_request::goal); their terminal states and
  /// model usage roll up to it.
  awaitable<result<job_id>> create_goal(session_id owner, std::string description);
  /// The goal, its member tasks and their summed usage, for a session of
  /// its tree (anyone else: not found, as a missing goal).
  awaitable<result<persistence::goal_record>> goal(session_id caller, job_id id);
  /// Closes the goal (completed, failed or cancelled) through the terminal
  /// compare-and-set; its owner gets a notice with the roll-up. A goal
  /// already closed is left as it is (errc::conflict says how it ended).
  awaitable<result<persistence::goal_record>> close_goal(session_id caller, job_id id,
                                                         std::string state);
  /// The notice a goal's owner reads when it closes (scrubbed, bounded).
  std::string goal_notice(const persistence::goal_record& g, const std::string& state) const;
  /// Deletes the finished tasks past options().task_retention (in batches,
  /// each one transaction); how many went. Boot runs it; a long-running
  /// host may call it on its own schedule. 0 when retention is off.
  awaitable<result<int>> expire_tasks();
  /// What delete_session did.
  struct deleted {
    int jobs_cancelled = 0;    // its live owned jobs, killed with confirmation
    int receipts_dropped = 0;  // what was still owed to it (reports, notices)
  };
  /// Deletes a session: its busy period is interrupted and settles (a
  /// child's parent gets its `cancelled` report), its live jobs are
  /// cancelled with confirmation, then its row, transcript and inbox are
  /// deleted in one transaction that drops every receipt still owed to it.
  /// Its tasks stay as history; its children stay, their later reports owed
  /// to nobody (dropped). From the start nothing new reaches it: it cannot be
  /// loaded, prompted or delivered to. errc::not_found if it does not exist.
  /// A failure leaves it on disk (jobs already cancelled stay cancelled):
  /// delete it again.
  awaitable<result<deleted>> delete_session(session_id s);
  /// Resolves once nothing runs: no busy period, wake or delivery in flight,
  /// and (unless `jobs` is false) no owned job live or its receipt in flight.
  awaitable<void> wait_quiescent(bool jobs = true);

  /// Graceful shutdown: keeps claims and running rows, sends no cancelled
  /// report. Idempotent.
  void shutdown();

  persistence::task_store& store() { return *store_; }
  /// The one queue that owns every background job's lifecycle.
  job_queue& jobs() { return *jobs_; }
  /// The registry of delegated tasks (start, run, result, wait, list, cancel).
  actors::delegates& delegation() { return *delegates_; }
  /// The cron scheduler, or nullptr when host_options::cron is not set.
  actors::cron_scheduler* cron() { return cron_.get(); }
  /// The SOP engine, or nullptr when host_options::sop is not set.
  actors::sop_engine* sop() { return sop_.get(); }
  /// The scope of `s`'s current (or last) turn, as the runtime supplies it to
  /// a job launched on its behalf.
  result<owner_scope> scope_of(const session_id& s);
  /// Sets whether `s`'s turns may launch background jobs and whether a turn
  /// withholds its completion while its jobs run ("withhold") or settles now
  /// and gets the receipts later ("report_now"), for a top-level session and a
  /// subagent alike; it wins over the default the session was created with.
  awaitable<result<void>> set_job_policy(session_id s, bool notify, std::string policy);
  bool is_busy(const session_id& s);
  runtime::executor_pool& pool() { return *pool_; }
  const host_options& options() const { return opts_; }
  run_observer* observer() const { return opts_.observer.get(); }

  // --- used by sessions ---
  /// The session's actor, loaded from its row on first use. get() reads that
  /// row on the calling thread; a coroutine on an executor co_awaits load(),
  /// which reads it off the executor.
  result<std::shared_ptr<session>> get(const session_id& s);
  /// `known`: the row as the caller's own transaction just wrote it
  /// (task_store::spawn returns it), used instead of reading it.
  awaitable<result<std::shared_ptr<session>>> load(
      session_id s, std::optional<persistence::session_row> known = std::nullopt);
  /// The one delivery path (actors/delivery.hpp): every pending receipt of
  /// every kind, live and at boot.
  actors::delivery& delivery() { return *delivery_; }
  /// Owned jobs and subagents still running under `s` (its own jobs included).
  std::vector<protocol::running_item> outstanding(const session_id& s);
  void note_phase(const session_id& s, bool busy, bool settling, bool foreground);
  void note_child(const session_id& parent, const session_id& child);
  std::int64_t next_generation();
  /// Counts work in flight for wait_quiescent: a session's (busy period,
  /// wake), or with `job` the job queue's (a live job, a receipt handed over).
  void activity(int delta, bool job = false);
  /// Tells `s` to wake; counted as activity until handled, so quiescence
  /// cannot be observed while a wake is in a mailbox.
  /// `admitted_here`: the report went through the session's admit, so a wake
  /// that finds it already drained is dropped instead of opening an empty period.
  void wake(session& s, wake_scope scope, bool report, bool admitted_here = false);
  /// Asks `s`'s inbox actor to steer or wake it for what it admitted;
  /// counted as activity like wake().
  void hand_over(session& s, wake_scope scope, bool admitted_here);
  bool shutting_down() const { return shutting_down_.load(); }
  /// The action budget of the tree `s` belongs to; nullptr when the host
  /// has none (options().action_budget.max_actions 0).
  std::shared_ptr<runtime::action_budget> budget_of(const persistence::session_row& s) {
    if (budgets_.options().max_actions <= 0) return nullptr;
    return budgets_.of(s.tree_root().str());
  }
  /// The scrubber of texts the runtime itself writes for a model (refusals,
  /// goal notices), from the host's environment.
  const protocol::scrubber& scrubber() const { return scrub_; }
  void warn(const std::string& w);

 private:
  /// The actor for a session row read by get() or load(): the one already
  /// loaded, or a new one.
  result<std::shared_ptr<session>> adopt(const session_id& s,
                                         result<std::optional<persistence::session_row>> row);
  explicit host(host_options opts);
  /// Boot's deliverSafe: one parent's owed reports in order, in chunks; a
  /// failure keeps the rows and never aborts the sweep.
  awaitable<void> deliver_owed(session_id parent, std::vector<persistence::job_row> rows,
                               std::shared_ptr<boot_report> rep, std::shared_ptr<std::mutex> m);
  /// One entry of an owner's outbox at boot: a pending notice (the receipt
  /// of any kind of task but a subagent) or an owed report (a subagent
  /// task's terminal row, its receipt pending).
  using outbox_entry = std::variant<persistence::receipt, persistence::job_row>;
  /// Boot's sweep, phase 1, for one owner and one page of the outbox: its
  /// entries in order (by each receipt's creation, then id), once the
  /// owner's entries of the page before (`after`, if any) are delivered;
  /// runs of reports go through deliver_owed, notices one at a time, waking
  /// nobody. A failure keeps what failed pending and goes on. False, with
  /// nothing delivered, when the owner's entries of the page before stopped
  /// short (an exception): these must not overtake them.
  awaitable<bool> deliver_outbox(session_id owner, std::vector<outbox_entry> entries,
                                 std::shared_ptr<runtime::one_shot<int>> after,
                                 std::shared_ptr<boot_report> rep, std::shared_ptr<std::mutex> m);
  /// Boot's read of its outbox and the deliveries it started (host.cpp).
  struct boot_pages;
  /// Boot's sweep, phase 1: reads the outbox up to st->last a page at a
  /// time (the first page host_options::boot_outbox_page rows, every later
  /// one four times that; each page's read queued as soon as the page before
  /// came back) and starts each page's deliveries, owner by owner
  /// (deliver_outbox). Returns once the read
  /// is done; st->all_done is set once the deliveries are too and the caller
  /// gave up the read's own count (boot_pages::finish_one). A page that
  /// cannot be read stops the read with a warning (what is left stays
  /// pending); a row that does not decode stops it in st->corrupt.
  awaitable<void> page_outbox(std::shared_ptr<boot_pages> st);
  void outbox_warning(boot_pages& st, const error& e);
  /// Boot, for a claimed child whose period was woken by its inbox: counts
  /// the resume; true when it may run again, false when its claim was kept
  /// (a failed write) or it ran out of resumes (an error report was settled
  /// and delivered in its place).
  awaitable<bool> resume_inbox_period(persistence::session_row s, boot_report& rep);
  /// The periodic retention sweep, started by boot (on pool_->at(0)); ends
  /// when shutdown cancels its timer.
  awaitable<void> retention_sweeps(runtime::gate::holder held);

  host_options opts_;
  std::unique_ptr<runtime::executor_pool> pool_;
  std::unique_ptr<persistence::writer> writer_;
  std::unique_ptr<persistence::task_store> store_;
  std::unique_ptr<actors::delivery> delivery_;
  std::unique_ptr<job_queue> jobs_;
  std::shared_ptr<actors::delegates> delegates_;
  std::shared_ptr<actors::cron_scheduler> cron_;
  std::shared_ptr<actors::sop_engine> sop_;
  runtime::action_budgets budgets_;
  const protocol::scrubber scrub_;  // texts the host itself writes for a model

  std::mutex m_;
  std::map<session_id, std::shared_ptr<session>> sessions_;
  bool closed_ = false;            // under m_: shutdown took its snapshot
  std::set<session_id> deleting_;  // under m_: being deleted, not loadable
  std::atomic<std::int64_t> generation_{0};
  /// The session tree and phases as the sessions publish them; labels
  /// scrubbed with the rules of the host's environment.
  session_directory directory_;
  runtime::quiescence quiet_;  // work in flight, for wait_quiescent
  std::atomic<bool> shutting_down_{false};
  runtime::gate sweeps_;                                    // the retention sweep in flight
  std::shared_ptr<boost::asio::steady_timer> sweep_timer_;  // on pool_->at(0)
};

}  // namespace tether::actors
