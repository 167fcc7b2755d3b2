#pragma once
// Delegated tasks (docs/delegation.md): work an agent hands to another agent,
// synchronously or in the background, as a task of kind `delegate` on the one
// task table.
//
// The life of one background delegate, each step durable before the next:
//   1. limits (depth, capacity) checked, the originator taken from the
//      runtime's scope (never from the model);
//   2. its row registered, running, with the owning process's identity and a
//      heartbeat lease                           [delegate.admit.after_commit];
//   3. the work runs (the runner), cancellable by a token in the live registry;
//   4. its outcome serialised to exact bytes and their SHA-256 computed; a
//      settlement intent persisted               [delegate.intent.after_commit];
//   5. the bytes published as an artifact (temp file, fsync, rename, fsync of
//      the directory)                          [delegate.artifact.after_publish];
//   6. one transaction promotes the intent: the still-running, owner-matched
//      row takes the terminal state, the artifact's reference and digest (never
//      its content) and its terminal receipt; the intent goes
//                                                [delegate.promote.after_commit];
//   7. the receipt reaches the originator's inbox through the one delivery
//      path (the callback).
// Cancel, a run timeout and recovery take the same terminal compare-and-set:
// whichever wins first is kept, and a later one changes nothing. Only the
// winner of a cancel signals the worker's token.
//
// recover() (at boot and periodically) settles what a dead owner left:
// intents first (promoted only when the owner is provably gone and the
// artifact's bytes match the digest and name the task; otherwise failed,
// never completed), then running rows of provably gone owners become `lost`,
// and rows whose heartbeat lease expired become `timed_out`. An owner that is
// alive or cannot be proven gone keeps its rows, and the report says why.
//
// Mailbox: the live registry (id → originator, cancellation signal, waiters)
// is touched only by the handlers. Store reads are offloaded; writes go
// through the single writer.
#include <atomic>
#include <boost/asio/cancellation_signal.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <variant>
#include <vector>

#include "tether/persistence/task_store.hpp"
#include "tether/protocol/policy.hpp"
#include "tether/protocol/scrub.hpp"
#include "tether/runtime/actor.hpp"
#include "tether/runtime/gate.hpp"
#include "tether/runtime/retry.hpp"

namespace tether::actors {

using boost::asio::awaitable;
using persistence::delegate_state;
using protocol::job_id;
using protocol::owner_scope;

struct delegate_options {
  int max_depth = 3;         // a delegate at a deeper level is refused
  int max_background = 128;  // background delegates running at once
  std::chrono::milliseconds wait_default{30000};
  std::chrono::milliseconds wait_max{120000};
  /// A running task's lease; the owner renews it every `heartbeat`.
  std::chrono::milliseconds lease{60000};
  std::chrono::milliseconds heartbeat{20000};
  /// How often recover() runs while the registry is up (the first at start).
  std::chrono::milliseconds recovery_every{60000};
  /// A run still going after this long is timed out (zero: no limit).
  std::chrono::milliseconds run_timeout{0};
  std::size_t max_artifact_bytes = 16u << 20;
  std::size_t notice_preview_chars = 2000;  // of the output, in the originator's notice
};

/// One delegate call. `caller` and `depth` come from the runtime (the calling
/// turn's scope and its own depth + 1), never from the model.
struct delegate_call {
  owner_scope caller;
  std::string agent;
  std::string prompt;
  std::filesystem::path workspace;  // the artifact goes to <workspace>/delegates/<id>.json
  int depth = 1;
  /// The policy the task runs under (the caller's, narrowed; its workspace
  /// must be writable under it) and the root whose action budget it spends:
  /// the runner gives both to the session it runs the task in. nullopt: the
  /// host's default policy, a budget of its own.
  std::optional<protocol::session_policy> policy;
  std::optional<protocol::session_id> budget_root;
  /// The goal the task joins (checked by the caller; must be running).
  std::optional<job_id> goal;
};

/// Runs a delegated task: its output text, or an error (the task fails with
/// it). Cancellation (a won cancel, the run timeout, stop) arrives on the
/// coroutine's cancellation slot.
using delegate_runner = std::function<awaitable<result<std::string>>(delegate_call, job_id)>;

/// What the originator sees of a task.
struct delegate_view {
  job_id id;
  delegate_state state = delegate_state::running;
  std::string agent;
  std::string preview;
  std::optional<std::string> artifact, digest, error;
  std::int64_t bytes = 0;
  /// The output, read back from the artifact and checked against the digest
  /// (result() and wait() only, once completed).
  std::optional<std::string> output;
};

/// What one recovery pass did.
struct delegate_recovery {
  int promoted = 0;   // intents promoted: owner gone, artifact valid
  int failed = 0;     // intents failed: artifact missing, corrupt or another task's
  int stale = 0;      // intents whose task had already reached a terminal state
  int lost = 0;       // running rows of provably gone owners
  int timed_out = 0;  // running rows whose lease expired
  /// Rows and intents kept, each with why (owner alive, uncertain, unparsable).
  std::vector<std::string> kept;
};

/// A worker's cancellation: the signal, and whether it fired. Both the
/// handlers and the worker run on the registry's executor (one thread), so a
/// signal fired before the runner starts is seen by the worker's check.
struct cancel_token {
  boost::asio::cancellation_signal signal;
  bool fired = false;
  void fire() {
    if (fired) return;
    fired = true;
    signal.emit(boost::asio::cancellation_type::terminal);
  }
};

namespace delegate_msg {
/// Checks the limits and reserves a live slot under a fresh id.
struct reserve {
  owner_scope caller;
  int depth = 1;
  runtime::reply_to<job_id> reply;
};
/// The registration failed: the slot goes.
struct release {
  job_id id;
};
/// The row is registered: the run starts with this token.
struct started {
  job_id id;
  std::shared_ptr<cancel_token> signal;
};
/// The task reached a terminal state (or its worker ended): waiters are told.
struct finished {
  job_id id;
};
/// A cancel (or timeout) won the compare-and-set: signal the worker.
struct signal_worker {
  job_id id;
};
/// Resolves when `id` is no longer live here (at once if it is not).
struct await_end {
  job_id id;
  runtime::reply_to<void> reply;
};
/// The ids live here now (for the heartbeat).
struct live_ids {
  runtime::reply_to<std::vector<job_id>> reply;
};
/// shutdown()'s first step: nothing new starts, every worker is signalled.
struct closing {
  runtime::reply_to<void> reply;
};
}  // namespace delegate_msg

using delegate_message =
    std::variant<delegate_msg::reserve, delegate_msg::release, delegate_msg::started,
                 delegate_msg::finished, delegate_msg::signal_worker, delegate_msg::await_end,
                 delegate_msg::live_ids, delegate_msg::closing>;

class delegates : public runtime::actor<delegates, delegate_message> {
 public:
  /// `deliver` hands a terminal receipt to the originator (the host's one
  /// delivery path); `warn` reports what was kept and why.
  delegates(runtime::executor ex, persistence::task_store& store, delegate_options opts,
            delegate_runner runner, std::function<awaitable<void>(persistence::receipt)> deliver,
            std::function<void(const std::string&)> warn);

  /// Starts the heartbeat and the periodic recovery (the first pass after
  /// `recovery_every`: boot runs one itself).
  void start();
  /// Ends the heartbeat and recovery loops and waits for the workers (their
  /// runs are cancelled; running rows stay for the next boot's recovery),
  /// then stops the mailbox.
  awaitable<void> shutdown();

  /// A background delegate: returns its id once its row is registered.
  awaitable<result<job_id>> start_task(delegate_call c);
  /// A synchronous one: starts it and waits up to `timeout` (bounded by the
  /// options); past it the task is cancelled and the answer says so.
  awaitable<result<delegate_view>> run(delegate_call c,
                                       std::optional<std::chrono::milliseconds> timeout = {});
  /// The task as its originator sees it; anyone else gets the not-found
  /// answer a missing task gets.
  awaitable<result<delegate_view>> result_of(owner_scope caller, job_id id);
  /// Waits until the task is terminal (or the timeout), then result_of().
  awaitable<result<delegate_view>> wait(owner_scope caller, job_id id,
                                        std::optional<std::chrono::milliseconds> timeout = {});
  /// Resolves once `id`'s worker in this process has ended (at once if
  /// there is none): its outcome is written or was lost to a competing one.
  awaitable<void> worker_ended(job_id id);
  /// The originator's tasks, oldest first.
  awaitable<result<std::vector<delegate_view>>> list(owner_scope caller);
  /// Cancel: the compare-and-set to cancelled; only if it won is the worker
  /// signalled. Returns the task as it is after.
  awaitable<result<delegate_view>> cancel(owner_scope caller, job_id id);
  /// One recovery pass (see the header comment). `hand_over` false (boot):
  /// the receipts it writes stay pending for boot's resend of notices.
  awaitable<result<delegate_recovery>> recover(bool hand_over = true);

  void handle(delegate_message& m);

  /// The notice an originator reads for a terminal task: scrubbed and bounded.
  static std::string notice_text(const job_id& id, const std::string& agent, delegate_state s,
                                 const std::string& output_or_error, std::size_t bound);
  /// The exact bytes a task's artifact holds.
  static std::string envelope(const job_id& id, const std::string& agent,
                              const std::string& output);

 private:
  struct live {
    owner_scope caller;
    std::shared_ptr<cancel_token> signal;
    std::vector<runtime::reply_to<void>> waiters;
    bool cancel_requested = false;  // fired once the worker's token exists
  };

  static awaitable<void> work(std::shared_ptr<delegates> self, delegate_call c, job_id id,
                              std::shared_ptr<cancel_token> signal);
  static awaitable<void> loops(std::shared_ptr<delegates> self, runtime::gate::holder held);
  awaitable<result<std::optional<persistence::delegate_task>>> owned(const owner_scope& caller,
                                                                     const job_id& id);
  awaitable<void> hand_over(std::optional<persistence::receipt> r);
  static error not_found(const job_id& id);
  delegate_view view_of(const persistence::delegate_task& t) const;

  persistence::task_store& store_;
  const delegate_options opts_;
  const protocol::scrubber scrub_;
  const delegate_runner runner_;
  const std::function<awaitable<void>(persistence::receipt)> deliver_;
  const std::function<void(const std::string&)> warn_;
  runtime::gate gate_;
  std::atomic<bool> stopping_{false};  // set by shutdown() before the workers are signalled
  runtime::retry_pauses pauses_;       // a worker's store retries; shutdown() ends them
  std::shared_ptr<boost::asio::steady_timer> timer_;
  // Handlers only.
  std::map<job_id, live> live_;
  bool closing_ = false;
};

}  // namespace tether::actors
