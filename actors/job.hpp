#pragma once
// The job actor: one per live task of the job queue, from its admission (or
// its recovery at boot) until its terminal receipt was handed over.
//
// It owns that task's live state: its row as this host last wrote it (owner
// scope, preview, state), whether a cancel is in progress, a completion that
// arrived during one (held for the cancel to decide), and the waiters of its
// end. It follows the daemon through the queue's sandbox channel, takes a
// cancel, runs the terminal compare-and-set through the receipt store (the
// writer; no SQL here) and hands the receipt it won to the one delivery path
// (actors/delivery.hpp).
//
// A job's path (crash points in brackets; the queue's header has the rest):
//   follow: the daemon's completion, after the `started` receipt
//   cancel: the daemon's confirmed kill, then the CAS      [delivery.cancel.after_kill]
//   terminal: compare-and-set with its pending receipt     [delivery.terminal.after_commit]
//     (during recovery)                                     [recover.terminal.after_commit]
//   hand-over to the owner's session through delivery      [delivery.handover.after_admit]
//   end: its waiters resume and the queue forgets it
//
// Threads: a job is pinned to its queue's executor, which serialises its
// handlers (REQUIRES on every member: called on that executor). Nothing else
// reads its state: the queue learns of a change by the job's messages (a
// call on the shared executor carrying a copy of its row: job_changed,
// job_ended) and publishes the set of live jobs as an immutable snapshot.
#include <boost/asio/awaitable.hpp>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tether/persistence/task_store.hpp"
#include "tether/runtime/gate.hpp"
#include "tether/runtime/one_shot.hpp"

namespace tether::actors {

using boost::asio::awaitable;

class job_queue;
using persistence::owned_state;
using protocol::job_id;

/// The terminal state a daemon's completion means (an unknown status: lost).
owned_state terminal_of(const protocol::shell_completion& c);
/// The notice of a job whose end is unknown: `why`, its preview, status -1.
std::string unknown_notice(const job_id& job, const std::string& preview, const std::string& why);

class job : public std::enable_shared_from_this<job> {
 public:
  job(job_queue& q, persistence::owned_job row);
  job(const job&) = delete;
  job& operator=(const job&) = delete;

  const protocol::job_id& id() const { return row_.id; }

  /// Follows the job on the daemon to its end; its completion is written
  /// once `started` is set (so the receipts keep their order). `held` keeps
  /// the queue's gate while it runs.
  awaitable<void> follow(std::shared_ptr<runtime::one_shot<int>> started,
                         runtime::gate::holder held);
  /// A confirmed kill, then the terminal CAS with what the daemon answered
  /// (cancelled, or how it had ended). An error when a cancel is in progress
  /// already, no route opens, or the kill was not confirmed (then no
  /// cancelled receipt is written; a completion that came meanwhile is
  /// written as what it is).
  awaitable<result<void>> cancel();
  /// The terminal CAS and the delivery of its receipt. True once a terminal
  /// transition of the job is durable (this one or an earlier one).
  /// `wake_after` false (recovery): the receipt stays pending for boot's
  /// sweep and nobody is woken.
  awaitable<bool> finish(persistence::owned_state terminal,
                         std::optional<protocol::shell_completion> c, std::string body,
                         bool wake_after = true);
  /// Its `started` receipt was written.
  void mark_running();
  /// Resumes `w` (with 0) when the job ends, or when the queue stops.
  void add_waiter(std::shared_ptr<runtime::one_shot<int>> w);
  /// The job is no longer live here: its waiters resume and the queue
  /// forgets it. Idempotent.
  void end();
  /// The queue stops: waiters resume and find it stopping.
  void release_waiters();

 private:
  awaitable<result<bool>> deliver(persistence::receipt r, bool wake_after);
  void changed();

  job_queue& q_;
  persistence::owned_job row_;
  bool cancel_requested_ = false;
  std::optional<protocol::shell_completion> held_;  // a completion that arrived during a cancel
  std::vector<std::shared_ptr<runtime::one_shot<int>>> waiters_;
  bool ended_ = false;
};

}  // namespace tether::actors
