#pragma once
// The sandbox channel: one per sandbox route, the only way requests reach
// that sandbox's daemon.
//
// It owns everything about the route: opening it (the platform route, the
// daemon's own socket, and an optional adapter route onto the same sandbox;
// the daemon started first when the options say so), the fallback to the
// platform route after `adapter_failures` infrastructure failures in a row,
// the extend-only sandbox lease, reconnecting with a bounded backoff when a
// connection fails, and closing.
//
// A failing route is a channel failure, not a sandbox failure: nothing here
// can retire or replace the sandbox, and a reconnect that reaches another
// sandbox or another generation is refused. Requests are safe to repeat on
// another route because exec is idempotent by job id and kill, wait and
// expire are idempotent.
//
// Mailbox: the channel is a runtime::actor pinned to one (single-threaded)
// executor. Every public request is a message (an ask); the routing state
// (which route, the failures in a row, the fallback, the lease, an opening in
// progress, the stop) is touched only by its handlers. A request's handler
// spawns the request as a coroutine of the channel (counted by its gate), so
// requests run concurrently: a long wait does not hold up an exec or a kill.
// A request asks the mailbox which route to take before each attempt and
// reports each adapter outcome back (`pick`, `outcome`), so the count towards
// the fallback and the fallback itself are decided one message at a time.
// Readable from other threads: status(), sandbox() and the lease, each an
// immutable snapshot (or an atomic) written only by the handlers.
#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <variant>
#include <vector>

#include "tether/actors/command_route.hpp"
#include "tether/runtime/actor.hpp"
#include "tether/runtime/gate.hpp"
#include "tether/runtime/one_shot.hpp"
#include "tether/runtime/retry.hpp"
#include "tether/sandbox/daemon_process.hpp"

namespace tether::actors {

using runtime::reply_to;

/// How long the platform keeps the sandbox. Only ever extended, by the
/// channel, from a route's timeout; readable from any thread.
class sandbox_lease {
 public:
  explicit sandbox_lease(std::int64_t until_ms = 0) : until_ms_(until_ms) {}
  std::int64_t until_ms() const { return until_ms_.load(); }
  /// Moves the end to `until_ms` if that is later; returns whether it moved.
  bool extend_to(std::int64_t until_ms);

 private:
  std::atomic<std::int64_t> until_ms_;
};

struct sandbox_channel_options {
  std::string sandbox_dir;  // the daemon's state directory; empty: no sandbox
  /// Starts a daemon there if none serves it before opening the route.
  bool start_daemon = true;
  /// Empty: $TETHER_SANDBOXD if set, else tether-sandboxd next to the running executable.
  std::string daemon_binary;
  /// A daemon this channel starts exits after this long with no connection
  /// and no job (--idle-exit-ms); unset: never.
  std::optional<std::chrono::milliseconds> daemon_idle_exit;
  /// Optional adapter route onto the same sandbox, and its fallback threshold
  /// (below one it is one).
  std::function<awaitable<result<std::shared_ptr<command_route>>>(std::string socket)> adapter;
  int adapter_failures = 3;
  /// Deadline and heartbeat of the platform route's connection.
  sandbox::client_options client = sandbox::client_options::from_env();
  /// Called on the channel's executor before a route is bound to the sandbox
  /// and generation its daemon answered as: the owner checks and records it
  /// (the job queue: not older than the bound generation, then bound through
  /// the writer). An error refuses the route.
  std::function<awaitable<result<void>>(protocol::sandbox_id, std::uint64_t generation)> bind;
  /// Warnings (a fallback, an adapter that did not attach, a retried
  /// request); called on the channel's executor. Keep it short.
  std::function<void(const std::string&)> warn;
  /// Instrumentation: "dispatch_retry" and "follow_retry" as a request is
  /// sent again after a reconnect. Called on the channel's executor.
  std::function<void(const job_id&, std::string_view stage)> trace;
};

/// What the channel decided so far: an immutable snapshot.
struct route_status {
  bool open = false;
  std::string route;  // the route requests take now ("" before one is open)
  bool fell_back = false;
  int failures_in_a_row = 0;
};

/// The routes of one opening (defined in sandbox_channel.cpp): the adapter
/// while it works, the platform after it failed max_failures times in a
/// row. Replaced by a reconnect; its counters are the handlers' alone.
struct channel_routes;

/// Where a request's next attempt goes: the channel's answer to `pick` and `outcome`.
struct route_choice {
  enum class next { adapter, platform, done };
  std::shared_ptr<channel_routes> rs;
  next to = next::done;
};

namespace channel_msg {
/// Opens the route unless one is open; concurrent callers share one opening.
struct open {
  reply_to<std::shared_ptr<channel_routes>> reply;
};
struct exec {
  wire::exec_req req;
  reply_to<wire::started_rep> reply;
};
struct wait {
  job_id job;
  reply_to<protocol::shell_completion> reply;
};
struct kill {
  job_id job;
  reply_to<protocol::shell_completion> reply;
};
struct expire {
  job_id job;
  reply_to<std::vector<job_id>> reply;
};
struct dispatch {
  job_id job;
  wire::exec_req req;
  reply_to<wire::started_rep> reply;
};
struct follow {
  job_id job;
  reply_to<protocol::shell_completion> reply;
};
struct expire_record {
  job_id job;
  reply_to<void> reply;
};
struct drop_connections {
  reply_to<void> reply;
};
/// stop()'s first step: no new request, the routes' connections end, every
/// backoff ends, openers are told.
struct stopping {
  reply_to<void> reply;
};
// From the channel's own coroutines.
/// An opening ended: its routes and the sandbox they answered as, or why not.
struct opened {
  result<std::shared_ptr<channel_routes>> routes = error{errc::failed, "not opened"};
  protocol::sandbox_id sandbox;
  std::uint64_t generation = 0;
};
/// The routes open now (null: none).
struct current {
  reply_to<std::shared_ptr<channel_routes>> reply;
};
/// Which route of `rs` (null: of the open routes) the next attempt takes;
/// an adapter attempt extends the lease by the adapter's timeout.
struct pick {
  std::shared_ptr<channel_routes> rs;
  reply_to<route_choice> reply;
};
/// How an adapter attempt on `rs` ended: an infrastructure failure counts
/// towards the fallback, anything else ends the row. The answer: done, or
/// where the request goes next.
struct outcome {
  std::shared_ptr<channel_routes> rs;
  bool infrastructure_failure = false;
  std::string what;
  reply_to<route_choice> reply;
};
/// A request found `rs` failing: it is closed and forgotten if still open.
struct retire {
  std::shared_ptr<channel_routes> rs;
  reply_to<void> reply;
};
}  // namespace channel_msg

using channel_message =
    std::variant<channel_msg::open, channel_msg::exec, channel_msg::wait, channel_msg::kill,
                 channel_msg::expire, channel_msg::dispatch, channel_msg::follow,
                 channel_msg::expire_record, channel_msg::drop_connections, channel_msg::stopping,
                 channel_msg::opened, channel_msg::current, channel_msg::pick, channel_msg::outcome,
                 channel_msg::retire>;

class sandbox_channel : public runtime::actor<sandbox_channel, channel_message> {
 public:
  /// A channel that opens its routes itself, on first use.
  sandbox_channel(runtime::executor ex, sandbox_channel_options opts);
  /// A channel over routes already open (tests, embedders with their own
  /// connections): it never reconnects, and falls back from `adapter` (may
  /// be null) to `platform` after `max_failures` infrastructure failures in a
  /// row, telling `warn` (on the channel's executor) once when it does.
  sandbox_channel(runtime::executor ex, std::shared_ptr<command_route> platform,
                  std::shared_ptr<command_route> adapter, int max_failures,
                  std::shared_ptr<sandbox_lease> lease,
                  std::function<void(const std::string&)> warn = {});
  ~sandbox_channel();

  void handle(channel_message& m);

  /// Opens the route unless one is open. Concurrent callers share one opening.
  awaitable<result<void>> open();
  /// The daemon of the options' sandbox_dir, started if none answers there.
  /// Runs on a thread of its own (it blocks), never on an executor.
  awaitable<result<sandbox::daemon_handle>> ensure_daemon();

  // One attempt each on the open route (with the adapter's retries and the
  // fallback); "closed" when no route is open. They do not open one.
  awaitable<result<wire::started_rep>> exec(wire::exec_req r);
  /// Resolves with the job's completion (an unknown status is -1, never 0).
  awaitable<result<protocol::shell_completion>> wait(job_id job);
  /// Resolves once no process of the job is left (confirmed by the daemon).
  awaitable<result<protocol::shell_completion>> kill(job_id job);
  awaitable<result<std::vector<job_id>>> expire(job_id job);

  /// Sends the exec until a daemon answers it (idempotent by job id): a
  /// transport failure reconnects with a bounded backoff and sends it again,
  /// until the channel stops. Only an answer (or a stop, or a refused route) ends it.
  awaitable<result<wire::started_rep>> dispatch(job_id job, wire::exec_req er);
  /// The job's completion, or the daemon's answer that it has none: a
  /// transport failure reconnects with a bounded backoff and attaches again
  /// (never `lost`), until the channel stops or the route is refused.
  awaitable<result<protocol::shell_completion>> follow(job_id job);
  /// The job's terminal receipt is durable: the daemon may drop its record.
  /// Only through an open route (none open, or stopping: the daemon's own
  /// bound applies); a failure is a warning, never an error.
  awaitable<void> expire_record(job_id job);
  /// Ends the open route's connections: requests in flight fail as
  /// infrastructure failures, and dispatch and follow reconnect (tests cut
  /// connections with it).
  awaitable<void> drop_connections();

  /// The sandbox and generation the route is bound to, once one was open.
  std::optional<std::pair<protocol::sandbox_id, std::uint64_t>> sandbox() const;
  route_status status() const;
  bool fell_back() const { return status().fell_back; }
  int failures_in_a_row() const { return status().failures_in_a_row; }
  /// The route requests take now.
  std::string route_name() const { return status().route; }
  sandbox_lease& lease() { return *lease_; }

  /// Refuses new requests, ends the routes' connections and every backoff,
  /// resolves once every request of the channel has finished (its gate),
  /// then stops the mailbox. Idempotent.
  awaitable<void> stop();

 private:
  using self_ptr = std::shared_ptr<sandbox_channel>;
  /// The texts of a request that is retried until the daemon answers.
  struct retry_texts {
    std::string_view stage;  // the trace's stage of a retry
    std::string_view failed;
    std::string_view after_failure;
    std::string_view retried;
  };

  void on(channel_msg::open& m);
  void on(channel_msg::exec& m);
  void on(channel_msg::wait& m);
  void on(channel_msg::kill& m);
  void on(channel_msg::expire& m);
  void on(channel_msg::dispatch& m);
  void on(channel_msg::follow& m);
  void on(channel_msg::expire_record& m);
  void on(channel_msg::drop_connections& m);
  void on(channel_msg::stopping& m);
  void on(channel_msg::opened& m);
  void on(channel_msg::current& m);
  void on(channel_msg::pick& m);
  void on(channel_msg::outcome& m);
  void on(channel_msg::retire& m);

  /// Asks the mailbox; once the channel stops, its error says so.
  template <class M>
  awaitable<result<runtime::reply_value_t<M>>> request(M m);
  /// Runs `task` as a coroutine of the channel, holding `held` (its gate),
  /// and answers `reply` with its result.
  template <class T>
  void spawn_answer(runtime::gate::holder held, reply_to<T> reply, awaitable<result<T>> task);
  template <class T>
  static awaitable<void> answer(reply_to<T> reply, awaitable<result<T>> task);
  /// A one-attempt request (exec, wait, kill, expire) on the open routes.
  template <class T, class Call>
  void one_attempt(reply_to<T>& reply, Call call);
  static awaitable<void> open_once(self_ptr self);
  /// One request on `rs` (null: the open routes): the adapter while it
  /// works, the platform after the fallback; decisions by pick and outcome.
  template <class T, class Call>
  static awaitable<result<T>> route(self_ptr self, std::shared_ptr<channel_routes> rs, Call call);
  /// A request sent until the daemon answers it, reconnecting in between.
  template <class T, class Call>
  static awaitable<result<T>> until_answered(self_ptr self, job_id job, Call call,
                                             retry_texts texts);
  /// Retires `failed` (if it is still the open route), pauses before retry
  /// `attempt` and opens a route; the stopping error once the channel stops.
  static awaitable<result<std::shared_ptr<channel_routes>>> reconnect(
      self_ptr self, std::shared_ptr<channel_routes> failed, int attempt);
  static awaitable<void> expire_on(self_ptr self, std::shared_ptr<channel_routes> rs, job_id job,
                                   reply_to<void> reply);
  route_choice choose(std::shared_ptr<channel_routes> rs);
  void publish();  // status_ from routes_
  bool stopping() const;
  void warn(const std::string& w) const;
  static error stopping_error();
  static error no_route_error();

  // Immutable after construction.
  sandbox_channel_options opts_;
  int max_failures_;
  bool opens_ = true;  // false: a channel over given routes, which never reconnects
  std::shared_ptr<sandbox_lease> lease_;
  runtime::gate gate_;            // every request and opening in flight
  runtime::retry_pauses pauses_;  // the reconnects' backoffs

  // The handlers' state.
  std::shared_ptr<channel_routes> routes_;
  bool opening_ = false;
  std::vector<reply_to<std::shared_ptr<channel_routes>>> openers_;
  bool stopping_ = false;

  // The threads ensure_daemon() started; joined by the destructor (they
  // post their answer to an executor, which must outlive the post), and
  // reaped once they answered.
  struct starter {
    std::thread thread;
    std::shared_ptr<runtime::one_shot<result<sandbox::daemon_handle>>> ready;
  };
  std::mutex starters_m_;
  std::vector<starter> starters_;

  // Snapshots for other threads, written by the handlers (stopped_: by stop()).
  mutable std::mutex m_;
  route_status status_;
  std::optional<std::pair<protocol::sandbox_id, std::uint64_t>> sandbox_;
  bool stopped_ = false;
};

}  // namespace tether::actors
