#pragma once
// A session actor and its run coordinator.
//
// Busy periods: a wake on an idle session starts one. `started` opens it on
// disk (the claim) and remembers startedSeq; the coordinator drains until no
// wake is pending (wakes during a drain coalesce into one more drain; scopes
// merge with "input" winning over "steer"); then `settled` runs exactly once,
// also after an interrupt or a failure, and only then are waiters released. A
// wake that arrives while settling starts a fresh busy period afterwards.
// An interrupt clears a pending wake and cancels the running drain.
//
// The busy period runs as its own coroutine on the actor's executor, so the
// mailbox keeps taking steers, reports and interrupts while the agent works.
#include <boost/asio/cancellation_signal.hpp>
#include <boost/asio/steady_timer.hpp>
#include <optional>
#include <variant>
#include <vector>

#include "tether/actors/agent.hpp"
#include "tether/actors/inbox.hpp"
#include "tether/persistence/task_store.hpp"
#include "tether/protocol/report.hpp"
#include "tether/runtime/actor.hpp"

namespace tether::actors {

class host;
using protocol::job_id;
using protocol::notification_id;
using runtime::reply_to;

/// The job a busy period reports under (seed §4). The flags close the windows
/// that classifying before writing opens.
struct job_binding {
  job_id id;
  notification_id nid;
  std::int64_t generation = 0;
  bool background = false;
  std::optional<session_id> parent;
  std::string description;
  // A foreground caller waiting for the report inline.
  std::shared_ptr<runtime::one_shot<result<std::string>>> inline_reply;
  // Set while a late background request is writing the running row.
  std::shared_ptr<runtime::one_shot<result<void>>> row_written;
  // Foreground follow-ups that joined this generation: its report, inline.
  std::vector<std::shared_ptr<runtime::one_shot<result<std::string>>>> joined_inline;
  bool settling = false;  // classified: a late background request is refused
  bool reported = false;  // classification happens at most once per generation
};

namespace session_msg {
struct wake {
  wake_scope scope = wake_scope::input;
  bool report = false;   // a report or notice was admitted: not woken while a revert is staged
  bool counted = false;  // host::wake counted it as activity until it is handled
  // The report was admitted through this session's inbox actor (so
  // inbox_dirty_ knows of it): if a drain already took it, the wake has nothing left to bring.
  bool admitted_here = false;
};
struct input {
  std::string kind;  // prompt | steer
  std::string text;
  reply_to<std::int64_t> reply;
};
/// Its inbox (actors/inbox.hpp) admitted something: a drain has it to take.
struct admitted {
  bool receipts = false;  // job receipts: the owning turn drains them before it settles
};
/// The job queue's set of live jobs changed: a withholding turn looks again.
/// A message, not a direct signal, so it is handled after every `admitted`
/// its jobs' receipts sent first.
struct jobs_changed {};
struct bind_job {
  job_binding job;
  // The link's notify setting after the spawn that sent this (its sender
  // read or set it); unset: unchanged. The actor never reads its row back
  // from the store for it.
  std::optional<std::optional<bool>> notify;
};
/// A follow-up asks to join the live generation (busy, not settling). The
/// answer: nullopt (not joined: it gets a job of its own), or joined, with the
/// foreground caller's inline reply (null for a background follow-up).
struct join_live {
  std::shared_ptr<int> ticket;  // names this follow-up in joined_input
  std::shared_ptr<runtime::one_shot<result<std::string>>> inline_reply;
  reply_to<std::optional<std::shared_ptr<runtime::one_shot<result<std::string>>>>> reply;
};
/// The joined follow-up's prompt was written (its wake) or was not.
struct joined_input {
  std::shared_ptr<int> ticket;
  bool written = false;
  std::optional<bool> notify;  // the link's notify setting after the follow-up
};
struct to_background {
  reply_to<notification_id> reply;
};
struct interrupt {};
struct set_revert {
  bool staged = false;
  reply_to<void> reply;
};
/// host::set_job_policy: the actor writes its row's policy through the
/// writer and keeps it, so each time a turn could settle it asks itself, not
/// the disk.
struct set_job_policy {
  bool notify = true;
  std::string policy;
  reply_to<void> reply;
};
struct wait_idle {
  reply_to<void> reply;
};
struct shutdown {
  reply_to<void> reply;
};
}  // namespace session_msg

using session_message =
    std::variant<session_msg::wake, session_msg::input, session_msg::admitted,
                 session_msg::jobs_changed, session_msg::bind_job, session_msg::join_live,
                 session_msg::joined_input, session_msg::to_background, session_msg::interrupt,
                 session_msg::set_revert, session_msg::set_job_policy, session_msg::wait_idle,
                 session_msg::shutdown>;

class session : public runtime::actor<session, session_message> {
 public:
  session(runtime::executor ex, host& h, session_row row, std::shared_ptr<agent> a,
          std::shared_ptr<actors::inbox> box);

  /// Immutable from construction, so any thread may read them (the rest of
  /// the session's row is the actor's own state).
  const session_id& id() const { return id_; }
  const protocol::tenant_id& tenant() const { return tenant_; }
  /// The session's inbox actor: reports and notices reach it only there.
  const std::shared_ptr<actors::inbox>& inbox() const { return inbox_; }

  awaitable<void> handle(session_message& m);

 private:
  class context;
  friend class context;
  enum class phase { idle, busy, settling };

  void ring(wake_scope s);  // the coordinator's wake
  /// `begun`: the period was opened on disk already (an input to an idle
  /// session, appended in the same transaction).
  void start_busy_period(std::optional<persistence::task_store::busy_start> begun = std::nullopt);
  awaitable<void> run_busy(std::shared_ptr<session> self,
                           std::optional<persistence::task_store::busy_start> begun);
  /// run_busy threw: logs it and ends the busy period in memory (waiters,
  /// activity, the binding unclassified) so nothing waits on it for ever.
  void busy_period_failed(std::exception_ptr e);
  awaitable<void> run_drain(std::shared_ptr<context> ctx, drain_input in);
  awaitable<void> settle();
  /// The settle of a report owed to a parent that is there, folded with the
  /// report's admit into one transaction through the parent's inbox actor,
  /// then the parent woken. False: the parent or its inbox is not there, and
  /// nothing was written (settle() writes the plain settle instead).
  awaitable<bool> settle_into_parent(job_binding* job, const persistence::settle_request& req,
                                     const protocol::notification_id& nid,
                                     const std::string& inline_body);
  /// The settle committed: the tool calls waiting inline get their report.
  void settle_replies(job_binding* job, const std::string& body, const std::string& inline_body);
  /// The settle did not commit and the host is shutting down.
  void settle_failed(job_binding* job, const error& e);
  void release_waiters();
  /// Ends a withholding wait (a wake, an interrupt, a shutdown).
  void release_withhold();
  /// Withhold: while jobs this turn owns run, the busy period stays open,
  /// waiting on a change of the job queue's revision (never on a timer).
  awaitable<bool> withholding();
  /// Pauses before retry `attempt` of a write that must not be given up; a
  /// shutdown ends the pause at once (the caller rechecks stopping_).
  awaitable<void> pause_before_retry(int attempt);

  host& host_;
  const session_id id_;
  const protocol::tenant_id tenant_;
  const std::shared_ptr<actors::inbox> inbox_;
  session_row row_;
  std::shared_ptr<agent> agent_;
  phase phase_ = phase::idle;
  std::optional<wake_scope> pending_;
  // Follow-ups joining the live generation whose prompts are not yet written.
  std::vector<std::shared_ptr<int>> joiners_;
  bool report_wake_ = false;  // pending_ includes a wake for an admitted report
  bool interrupted_ = false;
  bool failed_ = false;
  bool stopping_ = false;
  bool inbox_dirty_ = true;        // reports may wait in the inbox (unknown at start)
  bool receipt_admitted_ = false;  // a job receipt was admitted since the last drain began
  std::string error_text_;
  std::int64_t started_seq_ = 0;
  // The busy period's last completed answer, kept as say() writes it, when
  // the period began in this process (else the settle reads it).
  struct answer_memo {
    std::int64_t seq = 0;
    std::string text;
  };
  answer_memo last_answer_;
  bool last_answer_known_ = false;
  void answered(std::int64_t seq, std::string text) {
    if (seq > last_answer_.seq) last_answer_ = {seq, std::move(text)};
  }
  // How many user messages the transcript holds up to seq, as
  // input_ordinal last counted them (it then counts only those after).
  struct inputs_counted {
    std::int64_t seq = 0;
    std::int64_t count = 0;
  };
  inputs_counted inputs_counted_;
  std::int64_t settle_cursor_ = 0;
  asio::cancellation_signal drain_cancel_;
  std::optional<job_binding> job_;
  // Jobs waiting for a busy period of their own, oldest first. A vector, not
  // a deque: an empty std::deque allocates its map and a first node (about
  // 500 bytes for every idle session; bench_sessions), and the queue is
  // short, so taking the front is cheap.
  std::vector<job_binding> queued_jobs_;
  std::vector<reply_to<void>> idle_waiters_;
  std::shared_ptr<runtime::one_shot<int>> busy_done_;
  protocol::turn_id turn_;  // the current busy period's turn
  std::shared_ptr<runtime::one_shot<int>> withhold_;
  std::shared_ptr<asio::steady_timer> retry_timer_;  // a retry's pause, cancelled by shutdown
};

}  // namespace tether::actors
