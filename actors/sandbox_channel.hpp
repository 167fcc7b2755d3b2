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
// Serialised decisions, concurrent requests: the channel is pinned to one
// (single-threaded) executor, and every public request hops onto it before
// it touches the routing state (which route, the failures in a row, the
// fallback, the lease, an opening or a reconnect in progress). The requests
// themselves run concurrently there: a long wait does not hold up an exec or
// a kill; only the decisions between their suspensions are serialised.
// Readable from other threads: status(), sandbox() and the lease, each an
// immutable snapshot (or an atomic) written only by the channel.
#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "tether/actors/command_route.hpp"
#include "tether/runtime/actor.hpp"
#include "tether/runtime/gate.hpp"
#include "tether/runtime/one_shot.hpp"
#include "tether/runtime/retry.hpp"
#include "tether/sandbox/daemon_process.hpp"

namespace tether::actors {

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

class sandbox_channel {
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
  sandbox_channel(const sandbox_channel&) = delete;
  sandbox_channel& operator=(const sandbox_channel&) = delete;

  runtime::executor get_executor() const { return ex_; }

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
  std::string name() const { return status().route; }
  sandbox_lease& lease() { return *lease_; }

  /// Refuses new requests, ends the routes' connections and every backoff,
  /// and resolves once every request of the channel has finished (its gate).
  /// Idempotent.
  awaitable<void> stop();

 private:
  // The routes of one opening: the adapter while it works, the platform
  // after it failed max_failures times in a row. Replaced by a reconnect.
  struct routes {
    std::shared_ptr<command_route> platform;
    std::shared_ptr<command_route> adapter;
    int failures = 0;
    bool fell_back = false;
    void close() {
      if (adapter) adapter->close();
      platform->close();
    }
  };

  /// Runs `task` on the channel's executor, shielded from the caller's
  /// cancellation and counted by the gate.
  template <class T>
  awaitable<result<T>> on_channel(awaitable<result<T>> task);
  awaitable<result<void>> open_on();
  awaitable<result<void>> open_once();
  template <class T, class Call>
  awaitable<result<T>> route(std::shared_ptr<routes> rs, Call call);
  template <class T, class Call>
  awaitable<result<T>> route_current(Call call);
  /// Ends `failed` (if it is still the open route), pauses before retry
  /// `attempt` and opens a route; the stopping error once the channel stops.
  awaitable<result<std::shared_ptr<routes>>> reconnect(std::shared_ptr<routes> failed, int attempt);
  awaitable<result<wire::started_rep>> dispatch_on(job_id job, wire::exec_req er);
  awaitable<result<protocol::shell_completion>> follow_on(job_id job);
  awaitable<void> expire_record_on(job_id job);
  void publish();  // status_ from routes_
  bool stopping() const;
  void warn(const std::string& w);
  static error stopping_error();
  static error no_route_error();

  runtime::executor ex_;
  sandbox_channel_options opts_;
  int max_failures_;
  bool opens_ = true;  // false: a channel over given routes, which never reconnects
  std::shared_ptr<sandbox_lease> lease_;
  runtime::gate gate_;
  runtime::retry_pauses pauses_;

  // On the channel's executor only.
  std::shared_ptr<routes> routes_;
  std::shared_ptr<runtime::one_shot<result<void>>> opening_;

  // The threads ensure_daemon() started; joined by the destructor (they
  // post their answer to an executor, which must outlive the post), and
  // reaped once they answered.
  struct starter {
    std::thread thread;
    std::shared_ptr<runtime::one_shot<result<sandbox::daemon_handle>>> ready;
  };
  std::mutex starters_m_;
  std::vector<starter> starters_;

  // Snapshots for other threads, written on the channel's executor.
  mutable std::mutex m_;
  route_status status_;
  std::optional<std::pair<protocol::sandbox_id, std::uint64_t>> sandbox_;
  bool stopped_ = false;
};

}  // namespace tether::actors
