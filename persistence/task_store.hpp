#pragma once
// The task store: every named operation on the runtime's one SQLite file.
// Sessions, their transcript and inbox, and the tasks of every kind with their
// receipts: a subagent's busy period (its report is its task's terminal
// receipt, written in the settle transaction with the child's idle state)
// and an owned shell job (admitted, running, then one terminal
// compare-and-set with its pending receipt). Receipts are the only outbox.
//
// Writes go through the single writer (one request each, so each is one
// atomic unit inside a group commit); reads go through the reader pool and
// never wait on the writer. All SQL is in persistence/: a second backend is a
// new folder, not a rewrite.
//
// Persisted state that does not parse is refused with an error naming the
// table, the key and the problem; it is never skipped or deleted.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "tether/persistence/database.hpp"
#include "tether/persistence/writer.hpp"
#include "tether/protocol/cron.hpp"
#include "tether/protocol/ids.hpp"
#include "tether/protocol/notice.hpp"
#include "tether/protocol/policy.hpp"
#include "tether/protocol/report.hpp"
#include "tether/protocol/scope.hpp"

namespace tether::persistence {

using protocol::event_id;
using protocol::job_id;
using protocol::notification_id;
using protocol::owner_scope;
using protocol::session_id;

enum class owned_state { admitted, running, completed, failed, cancelled, lost };
std::string_view to_string(owned_state s);
bool is_terminal(owned_state s);
/// The transition a terminal state is reached by.
protocol::transition transition_of(owned_state terminal);

struct owned_job {
  job_id id;
  owner_scope scope;  // supplied by the runtime at admission, never by the model
  owned_state state = owned_state::admitted;
  std::string preview;                                   // the scrubbed command preview
  std::string channel = "api";                           // how it was launched: tool | cli | api
  std::optional<protocol::shell_completion> completion;  // once terminal
};

enum class receipt_state { pending, acked, read, dropped };
std::string_view to_string(receipt_state s);

struct receipt {
  event_id id;  // "<job>/<transition>"
  job_id job;
  protocol::transition transition = protocol::transition::started;
  owner_scope scope;
  std::string body;  // the notice the owner reads
  receipt_state state = receipt_state::pending;
  std::int64_t created_at = 0;
};

struct session_row {
  session_id id;
  std::optional<session_id> parent;
  std::optional<bool> notify;  // nullopt = default (on)
  std::string description;
  std::string agent = "general";
  bool busy = false;
  std::optional<std::int64_t> time_suspended;  // the claim
  int resume_attempts = 0;
  std::int64_t seq = 0;
  bool revert_staged = false;
  std::int64_t input_cursor = 0;
  std::optional<std::string> idle_outcome;
  // Owned jobs (schema v2).
  protocol::tenant_id tenant{"default"};
  std::optional<protocol::turn_id> turn;  // the current (or last) turn
  bool job_notify = true;                 // its turns may launch background jobs
  std::string job_policy = "withhold";    // withhold | report_now
  // Policy (schema v9, docs/policy.md).
  std::optional<protocol::session_policy> policy;  // nullopt: the host's default
  int depth = 0;                                   // 0: a top-level session
  std::optional<session_id> budget_root;           // whose action budget; nullopt: its own
  std::optional<job_id> task_id;                   // the delegated task it runs, if any
  /// The root of its tree: whose action budget it spends and whose goals it
  /// may join.
  const session_id& tree_root() const { return budget_root ? *budget_root : id; }
};

/// What boot reads of every session: its entry in the session directory
/// and whether its link to its parent delivers. The rest of a session's row
/// is read when it loads.
struct session_link {
  session_id id;
  std::optional<session_id> parent;
  std::optional<bool> notify;  // nullopt = default (on)
  std::string description;
  std::string agent;
};

struct message_row {
  std::int64_t seq = 0;
  std::string role;    // user | assistant
  std::string kind;    // prompt | steer | report | notice | answer | control
  std::string status;  // completed | error
  std::string text;
};

enum class job_status { running, completed, error, cancelled };
std::string_view to_string(job_status s);
/// The task store's word for a report-path row's state (persistence/schema.cpp,
/// step 4), in the one state vocabulary of every task (an errored row is `failed`).
std::string task_state_word(job_status s);

struct job_row {
  job_id id;
  notification_id nid;
  std::string kind = "subagent";
  std::string mode = "background";
  std::optional<session_id> parent;  // who is owed the report
  std::optional<session_id> child;   // whose busy period it reports
  std::int64_t generation = 0;
  std::optional<job_id> goal;  // the goal it belongs to (must be running)
  job_status status = job_status::running;
  std::optional<std::string> body;  // the rendered report, once terminal
  std::string description;          // the subagent's description
  /// Terminal with its terminal receipt pending: the report is owed to the
  /// parent. A delivered (or dropped) report's row stays, terminal, not owed.
  bool owed = false;
};

/// Where a pending receipt stands in the outbox's order: its creation, then
/// its id (receipts_pending's key).
struct outbox_key {
  std::int64_t created_at = 0;
  std::string id;
};

/// One pending receipt of boot's outbox with its task's kind ("" if there is
/// no such task) and, if it is a subagent task's terminal receipt and the
/// task is terminal, the task row whose report it owes (`owed` set, its
/// body the report, its description left empty). A subagent task's receipt
/// comes without its body: the report is the row's.
struct outbox_row {
  receipt r;
  std::string kind;
  std::optional<job_row> owed;
};

struct inbox_row {
  session_id session;
  notification_id nid;
  std::optional<session_id> from;
  std::string body;
  bool acked = false;
};

/// A report or a notice on its way into an inbox.
struct report_item {
  notification_id nid;
  std::optional<session_id> from;
  std::string body;
  /// A notice's receipt, keyed apart from its inbox id: the notice is
  /// admitted only while its receipt is pending.
  std::optional<event_id> receipt;
};

/// How an admit settles its items' receipts, in its own transaction.
enum class admit_receipts {
  /// Subagent reports: each task's terminal receipt (its outbox) is
  /// acknowledged, a repeat's included: the parent's inbox is what reads it.
  reports,
  /// Notices: one whose receipt is no longer pending (read by a status call,
  /// handed over already, dropped) is not admitted; the drain that takes the
  /// rest acknowledges them.
  notices,
  /// Notices steered into a busy turn: as `notices`, and each receipt is
  /// acknowledged now (accepted into the running turn's queue).
  notices_acked,
};

/// What an admit did with one item.
enum class admit_outcome {
  added,        // new in the inbox
  repeat,       // its inbox id was there already: dropped
  not_pending,  // a notice whose receipt was settled: not admitted
};

/// What settle commits in one transaction.
struct settle_request {
  session_id child;
  protocol::report_state outcome = protocol::report_state::completed;
  std::int64_t input_cursor = 0;
  // Exactly one of these decides the job row:
  std::optional<job_id> background_job;      // make this running row terminal
  std::optional<notification_id> mint_none;  // insert a none-mode terminal row
  bool drop_background = false;              // silent link: delete the background row
  std::optional<session_id> parent;          // for the none-mode row
  std::string body;                          // the rendered report
  std::string description;
  /// Leave resume_attempts as it is (a settle for an exhausted budget);
  /// otherwise the settle resets it.
  bool keep_resume_attempts = false;
};

struct settle_result {
  bool row_written = false;  // a terminal row now owes a report
};

/// What a settle folded with its report's admit committed, in one
/// transaction (task_store::settle_admit_submit).
struct settle_admit_result {
  settle_result settled;
  /// The report's admit, when the settle wrote one and its parent is there.
  std::optional<admit_outcome> admitted;
  /// The parent was gone: the report's receipt was written dropped.
  bool parent_gone = false;
};

/// A task row of a kind that no store operation handles any more (a
/// `local_shell` an earlier build wrote, history since schema step 6), as
/// tools like `tether inspect` list it: its columns as written, not decoded.
struct history_task {
  std::string id;
  std::string kind;
  std::string state;
  std::optional<session_id> owner;  // the session it reported to (child_id)
  std::string mode;
  std::int64_t created_at = 0;
};

// ---- delegated tasks (docs/delegation.md) ----

enum class delegate_state { running, completed, failed, cancelled, lost, timed_out };
std::string_view to_string(delegate_state s);
bool parse(std::string_view s, delegate_state& out);

/// A delegated task's row: the single authority for its lifecycle.
struct delegate_task {
  job_id id;
  owner_scope scope;      // the originator: its tenant, session (thread) and turn
  std::string agent;      // the agent that runs it
  std::string preview;    // the scrubbed, bounded prompt
  std::string workspace;  // the directory its artifact goes into
  int depth = 1;
  std::optional<job_id> goal;    // the goal it belongs to (must be running)
  std::string owner;             // the owning process (runtime::to_string(process_identity))
  std::int64_t lease_until = 0;  // ms since the epoch; a heartbeat moves it on
  delegate_state state = delegate_state::running;
  // Once terminal: the artifact's reference and digest (never its content)
  // and the error of a task that did not complete.
  std::optional<std::string> artifact, digest, error;
  std::int64_t bytes = 0;
  std::int64_t created_at = 0, updated_at = 0;
};

/// What a settlement is about to publish, persisted before the artifact's
/// bytes are written.
struct settlement_intent {
  job_id task;
  std::string owner;  // must still be the task's owner when it is promoted
  delegate_state state = delegate_state::completed;  // completed or failed
  std::string artifact;  // the artifact's path ("" for a failure without one)
  std::string digest;    // "sha256:<hex>" of its exact bytes
  std::string error;     // the terminal error of a failure
  std::int64_t bytes = 0;
  std::int64_t created_at = 0;
};

/// How a promotion ended.
struct promotion {
  bool promoted = false;               // the intent's state was recorded
  std::optional<receipt> terminal;     // its pending receipt, if promoted
  std::optional<delegate_state> kept;  // not promoted: the state that won first
};

// ---- goals (docs/policy.md) ----

enum class goal_state { running, completed, failed, cancelled };
std::string_view to_string(goal_state s);
bool parse(std::string_view s, goal_state& out);

/// A task that belongs to a goal, as the goal's view shows it.
struct goal_member {
  job_id id;
  std::string kind;
  std::string state;
  std::int64_t input_tokens = 0, output_tokens = 0;
};

/// A goal (a task of kind `goal`) and what rolled up to it.
struct goal_record {
  job_id id;
  owner_scope scope;  // the session that created it
  session_id root;    // the tree whose sessions may add tasks to it
  std::string description;
  std::string state;                                 // running, completed, failed or cancelled
  std::vector<goal_member> members;                  // oldest first
  std::int64_t input_tokens = 0, output_tokens = 0;  // summed over its members
};

// ---- scheduled work (docs/cron.md) ----

/// A scheduled job (`cron_jobs`): its definition, where it came from, its
/// next occurrence and the claim on it. A claim is the right to run the
/// occurrence `next_run`: its claimant, its lease, and the fencing token
/// the claim incremented; only a completion carrying that token commits.
struct cron_job_row {
  protocol::cron_job_spec spec;          // spec.name is the key
  std::string source = "runtime";        // config (a schedule file) | runtime (API, tool call)
  std::optional<std::int64_t> next_run;  // ms; nullopt: no occurrence left
  std::string claim_owner;               // "" = unclaimed
  std::int64_t claim_until = 0;          // the claim's lease (ms)
  std::int64_t fence = 0;                // incremented by every claim
  std::string last_status;               // ok | error | degraded | skipped | timed_out | ""
  std::optional<std::int64_t> last_run;  // the occurrence of the last run recorded
  std::int64_t created_at = 0, updated_at = 0;
};

/// A claim taken by cron_claim_due(): run `occurrence` of `spec` as task
/// `task`, starting at attempt `attempt` (a reclaimed run resumes the attempt
/// its previous claimant recorded).
struct cron_claim {
  protocol::cron_job_spec spec;
  std::int64_t occurrence = 0;
  std::int64_t fence = 0;
  job_id task;
  int attempt = 0;
  bool reclaimed = false;  // the run task existed: an earlier claim of this occurrence lapsed
  /// -1: the occurrence already has a terminal run (the claim was released
  /// at once; it is never run again and the job is to be moved on).
};

/// One run of a job (a task of kind `cron_run`), as its history shows it.
struct cron_run_row {
  job_id id;
  std::string job;
  std::int64_t occurrence = 0;
  std::string state;   // the task state (admitted, running, completed, failed, ...)
  std::string status;  // once terminal: ok | error | degraded | skipped | timed_out
  int attempt = 0;     // the attempt running or last run (0 = the first)
  std::optional<int> exit;
  std::int64_t duration_ms = 0;
  std::string output;  // scrubbed, bounded
  std::string error;
  std::string owner;  // the claimant that ran it
  std::int64_t created_at = 0, updated_at = 0;
};

/// What a run's completion does to its job, in the same transaction.
enum class cron_after { reschedule, remove, disable };

/// A run's completion: the run record, the history bound, then the job's
/// next step. Commits only if the job's claim still carries `fence` and
/// `owner` (errc::conflict otherwise: a stale claimant, nothing written).
struct cron_completion {
  std::string job;
  job_id task;
  std::int64_t fence = 0;
  std::string owner;
  std::string state;   // the run task's terminal state word
  std::string status;  // ok | error | degraded | skipped | timed_out
  std::optional<int> exit;
  std::int64_t duration_ms = 0;
  int attempts = 1;
  std::string output;  // already scrubbed and bounded
  std::string error;
  cron_after after = cron_after::reschedule;
  std::optional<std::int64_t> next_run;  // reschedule: the next occurrence (nullopt: none)
  std::size_t keep_runs = 50;            // history bound: the newest runs kept per job
};

/// The task id of a job's occurrence: one task per due occurrence, so a
/// second claim of the same occurrence finds the first's task.
job_id cron_run_id(const std::string& job, std::int64_t occurrence);

// ---- SOP runs (docs/sop.md) ----

/// An SOP run (a task of kind `sop_run`, thread `sop:<sop>`) as the run store
/// holds it. Its progression is its payload (`progress`): the definition it
/// was started with, its phase, step, visits, attempt, input and wait.
struct sop_run_row {
  job_id id;
  std::string sop;
  std::string state;  // the task state: admitted, running, completed, failed, cancelled
  std::string phase;  // pending, running, waiting_approval, paused_checkpoint
  std::int64_t revision = 0;
  std::string owner;  // the execution claim's holder; "" = no claim
  std::int64_t lease_until = 0;
  owner_scope scope;             // who started it
  boost::json::object progress;  // the payload
  std::int64_t created_at = 0, updated_at = 0;
  /// The run's state as every surface names it: its phase while it is not
  /// terminal, its terminal state after.
  std::string status() const;
};

/// One event of a task (`task_events`), in the order they were written.
struct task_event {
  job_id task;
  std::int64_t seq = 0, at = 0, revision = 0;
  std::string kind, actor, detail;
};

/// One entry of the audit log: who did what to which subject, when. An
/// observability surface only: never read to decide a run's state.
struct audit_entry {
  std::int64_t id = 0, at = 0;
  std::string actor, action, subject, detail;
};

/// One save of a run: a compare-and-set on its revision (and, when `owner`
/// is set, on its claim), writing revision + 1, the new progress, an event
/// and, in the same transaction, what else the step did: an audit entry, a
/// step's child task admitted or made terminal, the claim released, or the
/// run's own terminal transition (the compare-and-set every kind shares).
struct sop_save {
  job_id run;
  std::int64_t revision = 0;  // the revision the caller read
  std::string owner;          // non-empty: the run must be claimed by this owner
  boost::json::object progress;
  bool release_claim = false;
  std::optional<std::string> terminal;  // completed | failed | cancelled
  std::string event, actor, detail;     // the event written (kind, who, what)
  std::optional<std::string> audit;     // an audit action (by actor, on the run, with detail)
  std::optional<job_id> step_admit;     // a child task of kind sop_step, running
  std::string step_preview;             // its scrubbed, bounded preview
  std::optional<job_id> step_finish;    // a child task's terminal transition
  std::string step_state;               // its terminal state word
  std::string step_completion;          // its completion (JSON text)
};

/// The reads of the store, through read-only connections that never wait on
/// the writer. On its own it serves tools like `tether inspect`, and never
/// creates, migrates or writes the file; check_readable() it first.
class task_reader {
 public:
  explicit task_reader(std::string path) : readers_(std::move(path)) {}

  result<std::optional<session_row>> session(const session_id& s);
  /// session(), read off the caller's executor (offload): how an actor reads a row.
  awaitable<result<std::optional<session_row>>> load_session(session_id s);
  result<std::vector<session_row>> sessions();
  /// Every session's link, in no order (boot's directory): five columns and
  /// no sort, not the whole row in creation order. Its policy is decoded as
  /// sessions() decodes it, so a policy that does not decode is refused here
  /// too (boot's validation checks only that it is JSON).
  result<std::vector<session_link>> session_links();
  /// The sessions boot's phases 2 and 3 may resume, in sessions()' order:
  /// mid-turn (suspended), with a pending inbox row, or the child of a live
  /// subagent task. Every other session is idle with nothing owed to it,
  /// and is not read (100,000 idle children: not decoded a second time).
  result<std::vector<session_row>> sessions_to_resume();
  /// Every subagent task, delivered ones included, oldest first.
  result<std::vector<job_row>> jobs();
  /// Every task of a kind no store operation handles (history), oldest first.
  result<std::vector<history_task>> history_tasks();
  /// The subagent rows running or owing their report: the owed ones in
  /// outbox order, then the running ones, in one read transaction (boot
  /// reads running_jobs and outbox_page instead).
  result<std::vector<job_row>> outstanding_jobs();
  result<std::vector<message_row>> messages(const session_id& s, std::int64_t after = 0);
  /// The session's messages after `after`, up to and including `upto`:
  /// how many are user messages, and the seq of the last one there is
  /// (`after` if none). After = 0: `count` is the ordinal of the input at upto.
  struct input_count {
    std::int64_t count = 0;
    std::int64_t last = 0;
  };
  result<input_count> user_inputs(const session_id& s, std::int64_t after, std::int64_t upto);
  result<std::vector<inbox_row>> inbox(const session_id& s);
  /// Sessions with at least one report admitted and not yet acknowledged.
  result<std::vector<session_id>> sessions_with_pending_inbox();
  /// The newest completed, error-free assistant message with seq > after,
  /// paging backwards 20 rows at a time.
  result<std::optional<message_row>> last_assistant_after(const session_id& s, std::int64_t after);

  // Owned jobs and their receipts.

  /// Every owned job, oldest first.
  result<std::vector<owned_job>> all_jobs();
  /// Every receipt, oldest first.
  result<std::vector<receipt>> all_receipts();
  result<std::optional<owned_job>> job(const job_id& id);
  /// Jobs not yet terminal (admitted or running), oldest first, read through
  /// the live tasks' index (not a scan of every task's row). A row whose
  /// state word is unknown is not read here but refused by boot's
  /// validation, which passes before the job queue's recovery uses this.
  result<std::vector<owned_job>> live_jobs();
  /// Every job of one turn, oldest first.
  result<std::vector<owned_job>> jobs_of_turn(const protocol::session_id& thread,
                                              const protocol::turn_id& turn);
  /// Receipts owed (pending), oldest first; an unknown state word is refused.
  result<std::vector<receipt>> pending_receipts();
  /// The pending receipts of every kind's task but a subagent's (whose
  /// report the report path delivers), each with the kind of its task (""
  /// if there is no such task), in one read: what the job queue's recovery
  /// checks for staleness, without a read per receipt. Read through the
  /// receipts' pending index, in outbox order, without a sort: a receipt
  /// whose state word is unknown is not read here but refused by boot's
  /// validation, which passes before the job queue's recovery uses this.
  result<std::vector<std::pair<receipt, std::string>>> pending_receipts_but_subagent();
  /// The newest pending receipt's key, if any: where boot's read of the
  /// outbox (outbox_page) stops, so what is written after it starts is not
  /// read.
  result<std::optional<outbox_key>> outbox_end();
  /// Boot's outbox a page at a time: up to `limit` pending receipts after
  /// `after` and up to `end`, in the outbox's order, each with its kind and
  /// the row it owes (outbox_row). One read through the receipts' pending
  /// index and one probe of each receipt's task (the kind and an owed row
  /// together), without a sort. A receipt whose state word is unknown is not
  /// read here but refused by boot's validation, which passes first.
  result<std::vector<outbox_row>> outbox_page(const outbox_key& after, const outbox_key& end,
                                              std::size_t limit);
  /// The subagent rows still running (admitted or running), oldest first,
  /// through the live tasks' index: boot's bindings.
  result<std::vector<job_row>> running_jobs();
  result<std::optional<receipt>> receipt_by_id(const event_id& id);
  result<std::vector<receipt>> receipts_of(const job_id& job);
  /// The generation this host is bound to for `sandbox`, if any.
  result<std::optional<std::uint64_t>> bound_generation(const protocol::sandbox_id& sandbox);

  // Delegated tasks.

  result<std::optional<delegate_task>> delegate(const job_id& id);
  /// Every delegated task, oldest first.
  result<std::vector<delegate_task>> delegates();
  /// Every settlement intent left unpromoted, oldest first.
  result<std::vector<settlement_intent>> settlement_intents();
  /// The kind of a task ("" if there is none).
  result<std::string> task_kind(const job_id& id);
  /// A goal with its members and their summed usage.
  result<std::optional<goal_record>> goal(const job_id& id);

  // Scheduled work.

  /// Every scheduled job, by name.
  result<std::vector<cron_job_row>> cron_jobs();
  result<std::optional<cron_job_row>> cron_job(const std::string& name);
  /// A job's runs, newest first.
  result<std::vector<cron_run_row>> cron_runs(const std::string& job);
  /// The earliest time the scheduler has something to do: an enabled,
  /// unclaimed job's next run, or a claim's lease expiry. nullopt: nothing.
  result<std::optional<std::int64_t>> cron_next_wake();

  // SOP runs.

  /// Every SOP run, oldest first (`live_only`: the ones not terminal).
  result<std::vector<sop_run_row>> sop_runs(bool live_only = false);
  result<std::optional<sop_run_row>> sop_run(const job_id& id);
  /// A task's events, oldest first.
  result<std::vector<task_event>> task_events(const job_id& id);
  /// The audit log's entries about `subject` ("" = every entry), oldest first.
  result<std::vector<audit_entry>> audit_log(const std::string& subject = "");
  /// The earliest time an SOP engine claiming as `owner` has something to do
  /// that no change announces: an approval wait's deadline, or the lease
  /// expiry of another claimant's run. nullopt: nothing.
  result<std::optional<std::int64_t>> sop_next_wake(const std::string& owner);
  /// The live runs waiting for an approval whose timeout passed at `now` and
  /// has not fired yet, oldest deadline first (an index range: the other
  /// runs are not read).
  result<std::vector<sop_run_row>> sop_due_waits(std::int64_t now);

  /// Runs `fn` (which calls the reads above) on the read threads and resumes
  /// the caller on its executor: how an actor reads (reader_pool::offload).
  template <class F>
  auto offload(F fn) {
    return readers_.offload(std::move(fn));
  }
  /// Queues `fn` on the read threads now; its result is awaited later
  /// (reader_pool::start): reads side by side with other work.
  template <class F>
  auto start(F fn) {
    return readers_.start(std::move(fn));
  }
  /// Waits for the offloaded reads in flight and ends their threads (reader_pool::join).
  void join_reads() { readers_.join(); }

 protected:
  reader_pool readers_;
};

class task_store : public task_reader {
 public:
  task_store(writer& w, std::string path) : task_reader(std::move(path)), w_(w) {}

  writer& db_writer() { return w_; }

  /// Boot's validation, every row checked (table_has_bad_row, then
  /// refuse_first_bad_row) on the read threads, in two halves so that other
  /// reads run beside its scans: start_validation() queues one scan per
  /// table (the biggest tables first) and returns at once;
  /// finish_validation() waits for them and names the first bad row if a
  /// scan found one. Boot refuses to start on a row that does not validate.
  struct validation {
    std::vector<std::shared_ptr<runtime::one_shot<result<bool>>>>
        scans;  // validated_tables()' order
  };
  validation start_validation();
  awaitable<result<void>> finish_validation(validation v);
  /// Children that hold a claim and owe no running job row, whose claimed
  /// busy period took only inbox items (reports, shell or job notices) past
  /// its input cursor: a period woken by its inbox, whose settle would have
  /// minted the child's report. Boot resumes them instead of releasing the
  /// claim. Read on the writer's connection (off the caller's executor).
  awaitable<result<std::vector<session_id>>> claims_woken_by_inbox();

  // --- writes (each one request; answered after COMMIT) ---
  awaitable<result<void>> create_session(session_row row);
  /// Appends a transcript message; returns its seq.
  awaitable<result<std::int64_t>> append(session_id s, std::string role, std::string kind,
                                         std::string status, std::string text);
  /// Opens a busy period on disk: status busy and the claim set. Returns the
  /// session's durable seq then (startedSeq) and its input cursor.
  struct busy_start {
    std::int64_t seq = 0;
    std::int64_t input_cursor = 0;
    protocol::turn_id turn;  // a new turn, or the one a crashed period held
    /// The period resumes one a crashed host began: its transcript may hold
    /// messages of that period written before this process started.
    bool resumed = false;
    /// append_and_begin_busy: the input it appended, when no other user
    /// message lies after the input cursor (and the period is not resumed):
    /// then it is the only input of the period's first drain unless the drain
    /// takes reports from the inbox, and the drain need not read it back.
    std::optional<message_row> input;
  };
  awaitable<result<busy_start>> begin_busy(session_id s);
  /// A user input (kind "prompt" or "steer") to an idle session: appends it
  /// and opens the busy period it starts, in one transaction (append, then
  /// begin_busy, as one write). The start's seq is the input's.
  awaitable<result<busy_start>> append_and_begin_busy(session_id s, std::string kind,
                                                      std::string text);
  /// What spawn() wrote: the prompt's seq and, when it created the child,
  /// the child's row as its transaction left it (as a read after the commit
  /// finds it, until the child's actor writes again), so that the spawner
  /// makes the child's actor without reading the row back.
  struct spawned {
    std::int64_t seq = 0;
    std::optional<session_row> created;
  };
  /// Creates a child (unless it exists), appends its prompt and, for a
  /// background job, writes the running row: all in one transaction, before
  /// the child's busy period can start. A job for a child that owes no other
  /// running row starts a fresh resume budget.
  awaitable<result<spawned>> spawn(std::optional<session_row> create, session_id child,
                                   std::string prompt, std::optional<job_row> job,
                                   std::optional<bool> notify_update = {});
  /// The settle transaction: child idle (claim released, resume attempts
  /// reset, input cursor advanced) and the job row terminal with the body.
  awaitable<result<settle_result>> settle(settle_request req);
  /// settle() and the admit of the report it writes into `parent`'s inbox,
  /// in one transaction: the report's terminal receipt is written
  /// acknowledged (never pending, never updated), or dropped if the parent
  /// is gone. The parent's inbox admits the report under `nid`, from
  /// `req.child`, with `req.body`. Queued now, resolved after its COMMIT.
  std::shared_ptr<runtime::one_shot<result<settle_admit_result>>> settle_admit_submit(
      session_id parent, settle_request req, notification_id nid);
  /// Admits reports or notices into a session's inbox, in order, settling
  /// their receipts as `how` says; per item, what it did (a repeat of an id
  /// already there is dropped). errc::not_found if the session is gone
  /// (nothing admitted).
  awaitable<result<std::vector<admit_outcome>>> admit(session_id to, std::vector<report_item> items,
                                                      admit_receipts how = admit_receipts::reports);
  /// admit() without waiting: queued now (so the writer keeps the order of
  /// calls), resolved after its COMMIT.
  std::shared_ptr<runtime::one_shot<result<std::vector<admit_outcome>>>> admit_submit(
      session_id to, std::vector<report_item> items, admit_receipts how = admit_receipts::reports);
  /// The reports are in the inbox: their tasks' terminal receipts (the
  /// outbox) are acknowledged; the terminal rows stay. `delivered` false:
  /// nobody is owed them any more (their receipts are dropped).
  awaitable<result<void>> complete(std::vector<notification_id> nids, bool delivered = true);
  /// What one take_inbox moved: the appended messages, and whether pending
  /// rows were left for the next take.
  struct inbox_take {
    std::vector<message_row> messages;
    bool more = false;
  };
  /// The most inbox rows one take_inbox moves: a transaction stays bounded
  /// however many reports wait (a parent owed 100,000 takes them in turns).
  static constexpr std::size_t k_take_limit = 1024;
  /// Moves the oldest pending inbox rows, at most `limit`, into the
  /// transcript and acknowledges them, in one transaction.
  awaitable<result<inbox_take>> take_inbox(session_id s, std::size_t limit = k_take_limit);
  awaitable<result<void>> set_revert(session_id s, bool staged);
  /// Whether the session's turns may launch background jobs, and what a turn
  /// does while its jobs run ("withhold" or "report_now").
  awaitable<result<void>> set_job_policy(session_id s, bool notify, std::string policy);
  awaitable<result<int>> bump_resume(session_id s);
  /// Deletes a session with its transcript and inbox, in one transaction;
  /// every receipt still pending for it (its children's reports, the notices
  /// of tasks launched under its scope) is dropped: nobody is owed it any
  /// more. Its tasks stay (terminal history); its children stay sessions,
  /// without a parent to report to. Returns how many receipts were dropped;
  /// errc::not_found (nothing written) if it does not exist.
  awaitable<result<int>> delete_session(session_id s);
  /// Retention: deletes up to `limit` terminal tasks last changed before
  /// `before_ms` that owe nothing (no receipt of theirs pending), with their
  /// receipts, in one transaction. Returns how many tasks went. Running
  /// tasks and owed reports or notices are never touched.
  awaitable<result<int>> expire_tasks(std::int64_t before_ms, int limit = 1000);
  awaitable<result<void>> write_job(job_row row);

  // --- owned jobs and their receipts ---
  /// Writes the owner before anything is dispatched; an existing id is refused.
  awaitable<result<void>> admit_job(owned_job j);
  /// admitted → running, with the `started` receipt (recorded, not delivered:
  /// the launch already answered with the job id). False if not admitted.
  awaitable<result<bool>> mark_running(job_id id);
  /// The compare-and-set: admitted|running → `terminal`, with its pending
  /// receipt, in one transaction; returns that receipt. nullopt (nothing
  /// written) if the job was already terminal: the later transition is dropped.
  awaitable<result<std::optional<receipt>>> finish(
      job_id id, owned_state terminal, std::optional<protocol::shell_completion> completion,
      std::string body);
  /// pending → acked. False if it was not pending (acknowledging twice does nothing).
  awaitable<result<bool>> ack(event_id id);
  /// pending|acked → read: the owner read the result through a status call,
  /// so a session drain that has not shown it yet never will.
  awaitable<result<bool>> mark_read(event_id id);
  /// pending → dropped, for receipts refused on reload.
  awaitable<result<int>> drop(std::vector<event_id> ids);

  // --- delegated tasks (docs/delegation.md) ---
  /// Registers a running delegate (its owner and first lease); an existing
  /// id is refused (errc::conflict) and nothing is written.
  awaitable<result<void>> admit_delegate(delegate_task t);
  /// Moves a running task's lease on, if `owner` still owns it.
  awaitable<result<bool>> heartbeat_delegate(job_id id, std::string owner,
                                             std::int64_t lease_until);
  /// Persists the intent, if the task is running and owned by the intent's
  /// owner; false (nothing written) otherwise.
  awaitable<result<bool>> write_intent(settlement_intent i);
  /// One transaction: the intent's task, still running and still owned by
  /// the intent's owner, takes the intent's state, artifact and digest,
  /// with its terminal receipt (`receipt_body`); the intent is deleted. A
  /// task that reached another terminal state first keeps it, and the stale
  /// intent is deleted. errc::not_found if there is no intent.
  awaitable<result<promotion>> promote_intent(job_id id, std::string receipt_body);
  /// The terminal compare-and-set without an artifact (failed, cancelled,
  /// lost, timed_out), owner-matched when `owner` is set; any intent of the
  /// task goes with it. nullopt (nothing written) if it was not running.
  awaitable<result<std::optional<receipt>>> settle_delegate(job_id id,
                                                            std::optional<std::string> owner,
                                                            delegate_state terminal,
                                                            std::string error,
                                                            std::string receipt_body);

  // --- goals (docs/policy.md) ---
  /// Registers a running goal owned by `scope`, open to the tasks of the
  /// tree rooted at `root`; an existing id is refused (errc::conflict).
  awaitable<result<void>> admit_goal(job_id id, owner_scope scope, session_id root,
                                     std::string description);
  /// The goal's terminal compare-and-set (completed, failed or cancelled)
  /// with its receipt for its owner; nullopt if it was not running.
  awaitable<result<std::optional<receipt>>> close_goal(job_id id, std::string state,
                                                       std::string receipt_body);
  /// Adds model usage to a task; false if there is no such task.
  awaitable<result<bool>> add_usage(job_id task, std::int64_t input_tokens,
                                    std::int64_t output_tokens);

  // --- scheduled work (docs/cron.md) ---
  /// Adds a job, or replaces the definition of one from the same source
  /// (its claim, fence and history kept; `next_run` set). A job of the other
  /// source with that name is refused (errc::conflict), nothing written.
  awaitable<result<void>> cron_put(cron_job_row row);
  /// Deletes a job (its runs stay as history). False if there was none.
  awaitable<result<bool>> cron_remove(std::string name);
  /// Enables (with its next run) or disables a job. False if there is none.
  awaitable<result<bool>> cron_set_enabled(std::string name, bool enabled,
                                           std::optional<std::int64_t> next_run);
  /// Reconciles the jobs of a schedule file in one transaction: `rows` are
  /// added or replaced (a row whose spec is unchanged keeps its next run),
  /// config jobs not among them are deleted; runtime jobs are untouched.
  struct reconciled {
    std::vector<std::string> added, changed, removed;
  };
  awaitable<result<reconciled>> cron_reconcile(std::vector<cron_job_row> rows);
  /// The claim compare-and-set, for up to `limit` due jobs (enabled, next run
  /// at or before `now`, unclaimed or with an expired lease), oldest due
  /// first: each claimed job records `owner`, the lease and fence + 1, and
  /// its occurrence's run task is admitted (or, when an earlier claim lapsed,
  /// taken over with the new fence). One transaction.
  awaitable<result<std::vector<cron_claim>>> cron_claim_due(std::int64_t now, std::string owner,
                                                            std::int64_t lease_until, int limit);
  /// Moves the leases of `owner`'s claims on (each only if its fence still
  /// matches); returns the jobs whose claim was lost.
  awaitable<result<std::vector<std::string>>> cron_renew(
      std::string owner, std::int64_t lease_until,
      std::vector<std::pair<std::string, std::int64_t>> claims);
  /// Records that attempt `attempt` of the claimed run is about to be
  /// dispatched (the task becomes running). False if the claim is stale.
  awaitable<result<bool>> cron_attempt(std::string job, std::int64_t fence, std::string owner,
                                       job_id task, int attempt);
  /// The completion transaction (cron_completion). False with nothing
  /// written if the run task was already terminal.
  awaitable<result<bool>> cron_complete(cron_completion c);
  /// Moves an unclaimed job's next run from `expected` to `next_run`
  /// (disabling it if `disable`), optionally with a `skipped` run record
  /// for the occurrence `expected` (reason `why`). A compare-and-set: false
  /// if the job changed meanwhile.
  awaitable<result<bool>> cron_advance(std::string job, std::int64_t expected,
                                       std::optional<std::int64_t> next_run, bool disable,
                                       std::optional<std::string> skipped_why,
                                       std::size_t keep_runs = 50);
  /// Clears the claims of `owners` (provably gone processes); how many.
  /// Their run tasks stay, to be taken over by the next claim.
  awaitable<result<int>> cron_clear_claims(std::vector<std::string> owners);

  // --- SOP runs (docs/sop.md) ---
  /// Admits a run (phase pending, revision 1) with its `admitted` event and
  /// an audit entry; an existing id is refused (errc::conflict).
  awaitable<result<void>> sop_admit(sop_run_row run, std::string actor, std::string detail);
  /// The claim compare-and-set, oldest run first, for up to `limit` runs
  /// that may run (phase pending or running, unclaimed or with a lapsed
  /// lease), each only while fewer than its definition's max_concurrent runs
  /// of its SOP hold a live claim: the run records `owner`, the lease and
  /// revision + 1, with a `claimed` event. One transaction.
  awaitable<result<std::vector<sop_run_row>>> sop_claim(std::string owner, std::int64_t now,
                                                        std::int64_t lease_until, int limit);
  /// A save (sop_save). Returns the new revision; errc::conflict (nothing
  /// written) if the run is not at `revision`, is claimed by another owner,
  /// or is already terminal: the message says which.
  awaitable<result<std::int64_t>> sop_save_run(sop_save s);
  /// Moves the leases of `owner`'s claims on; returns the runs whose claim was lost.
  awaitable<result<std::vector<job_id>>> sop_renew(std::string owner, std::int64_t lease_until,
                                                   std::vector<job_id> runs);
  /// Clears the claims of `owners` (provably gone processes); how many.
  awaitable<result<int>> sop_clear_claims(std::vector<std::string> owners);

  /// Records the sandbox generation this host is bound to.
  awaitable<result<void>> bind_sandbox(protocol::sandbox_id sandbox, std::uint64_t generation);

 private:
  writer& w_;
};

}  // namespace tether::persistence
