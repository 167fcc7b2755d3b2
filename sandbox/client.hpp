#pragma once
// The host side of a sandbox daemon (tether-sandboxd): connect, hello, exec,
// attach, wait for a completion, kill, list, expire.
//
// A client lives on one executor (single-threaded): call its coroutines from
// that executor only. Requests may overlap; replies are matched by request id.
//
// Connecting never starts a daemon. ensure_daemon() (daemon_process.hpp)
// does, and only it; a recovering host connects with conn_mode::read_only,
// which cannot start anything (the daemon refuses exec, kill and expire on
// such a connection). Replies are read with the wire's one framing
// (framing.hpp), without a line limit: an attach chunk is longer than a
// request may be.
//
// Late completions: the client keeps (bounded) the output it has received for
// each job. If the daemon cleaned a job up before its status was read, wait()
// and poll() answer with that output and exit code -1 (status unknown); with
// no output either, they answer with an error, never with a success.
#include <boost/asio/awaitable.hpp>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tether/protocol/ids.hpp"
#include "tether/protocol/notice.hpp"
#include "tether/protocol/output_tail.hpp"
#include "tether/protocol/sandbox_wire.hpp"
#include "tether/runtime/error.hpp"

namespace tether::sandbox {

namespace wire = protocol::sandbox;
using boost::asio::awaitable;
using protocol::job_id;

/// The caller's environment as exec wants it.
std::vector<std::pair<std::string, std::string>> current_environment();

/// How long a client waits on a silent daemon. While any request of a
/// connection waits (hello, exec, a follow, a kill), the daemon must be heard
/// from: after `heartbeat` of silence the client probes it (an attach the
/// daemon answers at once), and after `deadline` of silence the connection is
/// declared wedged: it is closed and every request on it fails with
/// errc::timeout, so a stopped daemon is a clear error, never a silent hang.
struct client_options {
  std::chrono::milliseconds deadline{20000};
  std::chrono::milliseconds heartbeat{5000};
  /// Instrumentation (tests): called when the daemon answered a heartbeat probe.
  std::function<void()> on_heartbeat;
  /// $TETHER_SANDBOX_DEADLINE_MS (heartbeat: a quarter of it), else the defaults.
  static client_options from_env();
};

class client {
 public:
  struct state;  // the connection, shared with its reader coroutine

  /// Connects and says hello (within `opts.deadline`). Never starts a daemon.
  static awaitable<result<std::unique_ptr<client>>> connect(std::string socket_path,
                                                            wire::conn_mode mode,
                                                            std::string client_name = "tether",
                                                            client_options opts = {});

  ~client();
  client(const client&) = delete;
  client& operator=(const client&) = delete;

  const wire::hello_rep& hello() const { return hello_; }

  awaitable<result<wire::started_rep>> exec(wire::exec_req r);

  struct attach_result {
    std::string data;
    std::uint64_t offset = 0;       // stream offset of data[0]
    std::uint64_t next_offset = 0;  // where the next attach should start
    std::uint64_t skipped = 0;      // bytes no longer retained by the daemon
    std::uint64_t output_bytes = 0;
    std::optional<protocol::shell_completion> done;
  };
  /// Output from `offset` and the status, without waiting for the job (at
  /// most what the daemon retains). With `follow` (wait()), `data` stays empty:
  /// the output is kept only in retained().
  awaitable<result<attach_result>> attach(job_id job, std::uint64_t offset);

  /// Streams the job's output (kept in retained()) until it completes.
  awaitable<result<protocol::shell_completion>> wait(job_id job);

  /// Follows the job's output until it contains `text` (true) or the job ends
  /// without it (false).
  awaitable<result<bool>> wait_for_output(job_id job, std::string text);

  /// Status now: nullopt while running. Resumes output from where this client stopped.
  awaitable<result<std::optional<protocol::shell_completion>>> poll(job_id job);

  /// Resolves once the daemon confirmed that no process of the job is left.
  awaitable<result<protocol::shell_completion>> kill(
      job_id job, std::optional<std::chrono::milliseconds> wait = {});

  awaitable<result<wire::jobs_rep>> list(std::optional<std::uint64_t> after_revision = {});
  awaitable<result<std::vector<job_id>>> expire(std::optional<job_id> job = {});

  /// Output of `job` this client has received (already scrubbed), or nullptr.
  const protocol::head_tail* retained(const job_id& job) const;
  /// Drops what this client keeps for `job` (after its notice was delivered).
  void forget(const job_id& job) { seen_.erase(job.str()); }

  void close();

  /// The most output bytes one attach of this client collected at once
  /// (beyond the bounded retained() copies): bounded however much a job prints.
  std::size_t largest_buffer() const { return largest_buffer_; }

 private:
  struct seen {
    protocol::head_tail out;
    std::uint64_t next_offset = 0;
    std::string preview;  // scrubbed, when this client launched the job
    std::int64_t tail_lines = 40, tail_bytes = 4096;
  };
  explicit client(std::shared_ptr<state> s) : s_(std::move(s)) {}
  awaitable<result<attach_result>> attach_impl(job_id job, std::uint64_t offset, bool follow);
  result<protocol::shell_completion> cleaned_up(const job_id& job, const error& e);
  void keep(const job_id& job, const wire::output_rep& o);

  std::shared_ptr<state> s_;
  wire::hello_rep hello_;
  std::map<std::string, seen> seen_;
  std::size_t largest_buffer_ = 0;
};

}  // namespace tether::sandbox
