#pragma once
// The job actor: one per live task of the job queue, from its admission (or
// its recovery at boot) until its terminal receipt was handed over.
//
// It owns that task's live state: its row as this host last wrote it (owner
// scope, preview, state), whether a cancel is in progress, a completion that
// arrived during one (held for the cancel to decide), the waiters of its end,
// and whether boot's phases have resumed the sessions (its hand-over waits
// until they have). It follows the daemon through the queue's sandbox
// channel, takes a cancel, runs the terminal compare-and-set through the
// receipt store (the writer; no SQL here) and hands the receipt it won to the
// one delivery path (actors/delivery.hpp).
//
// A job's path (crash points in brackets; the queue's header has the rest):
//   follow: the daemon's completion, after the `started` receipt
//   cancel: the daemon's confirmed kill, then the CAS      [delivery.cancel.after_kill]
//   terminal: compare-and-set with its pending receipt     [delivery.terminal.after_commit]
//     (during recovery)                                     [recover.terminal.after_commit]
//   hand-over to the owner's session through delivery      [delivery.ack.after_commit,
//                                                            delivery.handover.after_admit]
//   end: its waiters resume and the queue forgets it
//
// Mailbox: every request (follow, cancel, finish, a waiter, the queue's
// news) is a message, and only the handlers decide. The long work (following
// the daemon, a kill, the terminal write and its hand-over) runs as
// coroutines the handlers spawn on the job's executor, each holding the
// queue's gate; they report back by message (`followed`, `killed`,
// `terminal_written`, `end`), so a cancel is taken while the job is followed.
// The job is pinned to its queue's executor. It reads nothing of the queue:
// the queue tells it (`sessions_resumed`, `stopping`) or handed it an
// immutable value at construction; it tells the queue by posting a copy of
// its row onto the queue's executor (job_note), and the queue publishes the
// set of live jobs to other threads as an immutable snapshot.
#include <boost/asio/awaitable.hpp>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "tether/persistence/task_store.hpp"
#include "tether/runtime/actor.hpp"
#include "tether/runtime/gate.hpp"
#include "tether/runtime/one_shot.hpp"
#include "tether/runtime/retry.hpp"

namespace tether::actors {

using boost::asio::awaitable;

class host;
class sandbox_channel;
using persistence::owned_state;
using protocol::job_id;
using runtime::reply_to;

/// The terminal state a daemon's completion means (an unknown status: lost).
owned_state terminal_of(const protocol::shell_completion& c);
/// The notice of a job whose end is unknown: `why`, its preview, status -1.
std::string unknown_notice(const job_id& job, const std::string& preview, const std::string& why);

/// What a job tells its queue, each a copy posted onto the queue's executor.
namespace job_note {
/// Its row changed (running, or terminal on disk).
struct changed {
  persistence::owned_job row;
};
/// It is no longer live here (handed over, or left for the next boot).
struct ended {
  job_id id;
  protocol::session_id thread;  // its owner scope's, where the queue's live view keeps it
};
}  // namespace job_note
using job_note_t = std::variant<job_note::changed, job_note::ended>;

/// What a job is handed by its queue at construction: services it calls and
/// the queue's mailbox, nothing of the queue's state. Outlives every job.
struct job_services {
  persistence::task_store& store;
  host& h;
  std::shared_ptr<sandbox_channel> channel;
  runtime::retry_pauses& pauses;  // its retried writes and hand-overs
  runtime::gate& work;            // the queue's work in flight: every job coroutine holds it
  std::function<void(const job_id&, std::string_view)> trace;  // may be empty
  std::function<void(job_note_t)> tell_queue;                  // posts onto the queue's executor
  /// Thread-safe counters of the queue: a delivery in flight (for
  /// wait_idle), and a hand-over held for boot's phases (boot's report).
  std::function<void(int)> delivering;
  std::function<void()> handover_held;
};

namespace job_msg {
/// Follow the job on the daemon to its end; its completion is written once
/// `started` is set (null: at once), so the receipts keep their order.
struct follow {
  std::shared_ptr<runtime::one_shot<int>> started;
};
/// A confirmed kill, then the terminal CAS with what the daemon answered
/// (cancelled, or how it had ended). An error when a cancel is in progress
/// already, no route opens, or the kill was not confirmed (then no
/// cancelled receipt is written; a completion that came meanwhile is
/// written as what it is).
struct cancel {
  reply_to<void> reply;
};
/// The terminal CAS and the delivery of its receipt; true once a terminal
/// transition of the job is durable (this one or an earlier one).
/// `wake_after` false (recovery): the receipt stays pending for boot's sweep
/// and nobody is woken.
struct finish {
  owned_state terminal = owned_state::lost;
  std::optional<protocol::shell_completion> completion;
  std::string body;
  bool wake_after = true;
  reply_to<bool> reply;
};
/// Its `started` receipt was written.
struct mark_running {};
/// Resumes `waiter` (with 0) when the job ends, or when the queue stops.
struct add_waiter {
  std::shared_ptr<runtime::one_shot<int>> waiter;
};
/// The job is no longer live here: the queue forgets it, then its waiters
/// resume. Idempotent.
struct end {};
/// Boot's phases resumed the sessions: a held hand-over goes ahead.
struct sessions_resumed {};
/// The queue stops: waiters resume and find it stopping, a held hand-over
/// gives up waiting, and a later completion is left for the next boot.
struct stopping {
  reply_to<void> reply;
};
// From the job's own coroutines.
/// The daemon's answer to the follow (after the started receipt).
struct followed {
  result<protocol::shell_completion> done = error{errc::failed, "not followed"};
};
/// The cancel's kill came back; `opened` is the route's opening.
struct killed {
  result<void> opened;
  result<protocol::shell_completion> kill = error{errc::failed, "not killed"};
  reply_to<void> reply;
};
/// The terminal CAS committed with `terminal`.
struct terminal_written {
  owned_state terminal = owned_state::lost;
};
/// Answered once the hand-over may wake sessions (or the queue stops).
struct await_resumed {
  reply_to<void> reply;
};
}  // namespace job_msg

using job_message =
    std::variant<job_msg::follow, job_msg::cancel, job_msg::finish, job_msg::mark_running,
                 job_msg::add_waiter, job_msg::end, job_msg::sessions_resumed, job_msg::stopping,
                 job_msg::followed, job_msg::killed, job_msg::terminal_written,
                 job_msg::await_resumed>;

class job : public runtime::actor<job, job_message> {
 public:
  /// `resumed`: whether boot's phases had resumed the sessions when the
  /// queue made it (later, the queue tells it).
  job(runtime::executor ex, std::shared_ptr<const job_services> svc, persistence::owned_job row,
      bool resumed);

  /// Immutable from construction: any thread.
  const job_id& id() const { return id_; }

  void handle(job_message& m);

  /// The queue stops: `stopping` (waiters resume, a held hand-over gives
  /// up), then the mailbox stops. Its coroutines end on their own once the
  /// channel stopped; the queue's gate counts them. Idempotent.
  awaitable<void> stop();

 private:
  void on(job_msg::follow& m);
  void on(job_msg::cancel& m);
  void on(job_msg::finish& m);
  void on(job_msg::mark_running& m);
  void on(job_msg::add_waiter& m);
  void on(job_msg::end& m);
  void on(job_msg::sessions_resumed& m);
  void on(job_msg::stopping& m);
  void on(job_msg::followed& m);
  void on(job_msg::killed& m);
  void on(job_msg::terminal_written& m);
  void on(job_msg::await_resumed& m);

  /// Runs `work` on the job's executor, holding `held` (the queue's gate)
  /// until its end; an exception is logged and ends the job's live entry.
  void spawn(runtime::gate::holder held, awaitable<void> work, std::string what);
  /// Spawns the terminal CAS and its hand-over (`f`), then answers f.reply
  /// with whether it is durable and `cancel` (if set) with `answer`.
  void spawn_finish(job_msg::finish f, reply_to<void> cancel = {}, result<void> answer = {});
  static awaitable<void> finish_then_answer(std::shared_ptr<job> self, job_msg::finish f,
                                            reply_to<void> cancel, result<void> answer);
  static awaitable<void> run_follow(std::shared_ptr<job> self,
                                    std::shared_ptr<runtime::one_shot<int>> started);
  static awaitable<void> run_kill(std::shared_ptr<job> self, reply_to<void> reply);
  static awaitable<bool> run_finish(std::shared_ptr<job> self, owned_state terminal,
                                    std::optional<protocol::shell_completion> c, std::string body,
                                    bool wake_after);
  static awaitable<result<bool>> deliver(std::shared_ptr<job> self, persistence::receipt r,
                                         bool wake_after);
  void release_waiters();
  void changed();
  static error stopping_error(const job_id& id);

  const std::shared_ptr<const job_services> svc_;
  const job_id id_;
  const std::string preview_;
  // The actor's state: its handlers' alone.
  persistence::owned_job row_;
  bool cancel_requested_ = false;
  std::optional<protocol::shell_completion> held_;  // a completion that arrived during a cancel
  std::vector<std::shared_ptr<runtime::one_shot<int>>> waiters_;
  bool resumed_ = true;                  // boot's phases resumed the sessions
  std::vector<reply_to<void>> holding_;  // hand-overs waiting for resumed_
  bool stopping_ = false;
  bool ended_ = false;
};

}  // namespace tether::actors
