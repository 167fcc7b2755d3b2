#pragma once
// tether-sandboxd: one per sandbox. Serves the wire protocol of
// protocol/sandbox_wire.hpp on DIR/sock, runs jobs, and keeps their records
// in DIR (see job_store.hpp) so a restarted daemon, or a host that restarted,
// finds them again by id.
//
// Single-threaded: everything runs on one io_context, except output
// scrubbing, which runs on a scrub thread while the job's watcher waits. A job's shell is watched
// through its pidfd and its output pipe; completion is the pidfd becoming
// readable, never a sleep. Waiters (attach followers, kills, list watchers)
// wait on `changed_`, a timer used as a condition variable: every state change
// cancels it and each waiter re-checks what it waits for.
#include <boost/asio/awaitable.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/local/stream_protocol.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/thread_pool.hpp>
#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <vector>

#include "job_store.hpp"
#include "launcher.hpp"
#include "slot_pool.hpp"
#include "tether/protocol/output_tail.hpp"
#include "tether/protocol/sandbox_wire.hpp"
#include "tether/protocol/scrub.hpp"

namespace tether::sandboxd {

namespace asio = boost::asio;
using asio::awaitable;
namespace wire = protocol::sandbox;
using protocol::job_id;

struct daemon_config {
  fs::path state_dir;
  identity id;
  // A completed job's record stays until a host expires it (once the host's
  // terminal receipt is durable), or at most this long after it ended: a host
  // down for hours still finds how its jobs ended.
  std::chrono::milliseconds grace{std::chrono::hours(6)};
  std::chrono::milliseconds kill_wait{5000};  // TERM → KILL escalation
  std::chrono::milliseconds idle_exit{0};     // 0: never exit when idle
  std::size_t max_connections = 256;          // more are told so and closed
  std::size_t max_in_flight = 128;            // per connection; more requests wait unread
  std::size_t retain_bytes = protocol::head_tail::k_default_limit;
  launcher_config tools;
  // Test hook ($TETHER_SANDBOXD_THROW_ON=TYPE): answering a request of this
  // type throws, as a bug would; empty in normal runs.
  std::string throw_on;
};

/// What an exception carried, for a log line.
std::string describe(std::exception_ptr e);

struct job {
  explicit job(asio::io_context& io, std::size_t retain) : out(retain / 2, retain / 2), grace(io) {}
  ~job();

  job_record rec;
  fs::path dir;
  std::unique_ptr<protocol::scrubber> scrub;
  std::unique_ptr<protocol::stream_scrubber> stream;
  protocol::head_tail out;
  int out_file = -1;  // DIR/jobs/<id>/output, appended while running
  std::uint64_t out_file_bytes = 0;
  int output_fd = -1;  // pipe from the shell; -1 for a job recovered after a restart
  int pidfd = -1;
  bool is_child = false;  // reaped by us (a recovered job is not our child)
  bool kill_started = false;
  bool stop_confirmed = false;  // after a kill: no process of the group is left
  bool expired = false;
  asio::steady_timer grace;
  bool running() const { return !rec.done.has_value(); }
};

class connection;

class daemon {
 public:
  daemon(asio::io_context& io, daemon_config cfg);
  ~daemon();

  /// Recovers the jobs on disk and starts listening on DIR/sock.
  result<void> start();
  /// Kills every running job's process group and stops the io_context.
  void shutdown(const std::string& why);

  // Used by connections.
  wire::hello_rep hello(wire::conn_mode mode) const;
  wire::reply_body exec(const wire::exec_req& r);
  wire::reply_body expire(const wire::expire_req& r);
  awaitable<void> attach(std::shared_ptr<connection> c, std::uint64_t id, wire::attach_req r);
  awaitable<void> kill(std::shared_ptr<connection> c, std::uint64_t id, wire::kill_req r);
  awaitable<void> list(std::shared_ptr<connection> c, std::uint64_t id, wire::list_req r);
  awaitable<void> wait_changed();
  void notify();
  void connection_opened();
  void connection_closed();
  asio::io_context& io() { return io_; }
  const daemon_config& config() const { return cfg_; }
  void log(const std::string& line) const;
  /// The one buffer every connection reads into (single-threaded).
  std::vector<char>& read_buffer() { return read_buffer_; }

 private:
  void spawn_accept_loop();
  // Each job coroutine runs under a completion handler: an exception is
  // logged and the normal cleanup runs (see daemon.cpp).
  void spawn_watch(std::shared_ptr<job> j);
  void spawn_kill_sequence(std::shared_ptr<job> j, std::chrono::milliseconds wait, bool retried);
  void spawn_idle_loop();
  /// The TETHER_SANDBOXD_THROW_ON test hook for `where`: true once.
  bool hook_throws(const std::string& where);
  void refuse_over_cap(asio::local::stream_protocol::socket& s);
  awaitable<void> out_of_descriptors(boost::system::error_code ec);
  awaitable<void> accept_loop();
  awaitable<void> watch(std::shared_ptr<job> j);
  awaitable<void> kill_sequence(std::shared_ptr<job> j, std::chrono::milliseconds wait);
  awaitable<void> idle_loop();
  bool drain(job& j, std::size_t budget, std::string& raw);
  awaitable<void> scrub_output(std::shared_ptr<job> j, std::string raw);
  void append_output(job& j, std::string_view scrubbed);
  void finalize(std::shared_ptr<job> j, std::optional<std::pair<bool, int>> shell,
                std::string unknown_reason);
  void arm_grace(std::shared_ptr<job> j, std::chrono::milliseconds after);
  void erase(const std::string& id);
  result<void> recover();
  wire::error_rep not_found(const job_id& id) const;
  std::shared_ptr<job> find(const job_id& id) const;

  asio::io_context& io_;
  daemon_config cfg_;
  std::set<std::string> hooks_fired_;
  std::unique_ptr<asio::local::stream_protocol::acceptor> acceptor_;
  std::unique_ptr<slot_pool> pool_;
  std::map<std::string, std::shared_ptr<job>> jobs_;
  std::uint64_t revision_ = 1;
  asio::steady_timer changed_;
  asio::steady_timer idle_;
  std::size_t connections_ = 0;
  std::size_t refused_over_cap_ = 0;  // since the cap was last reached
  // Since accept last failed for want of descriptors (EMFILE, ENFILE):
  std::optional<std::chrono::steady_clock::time_point> fd_short_since_;
  std::size_t fd_short_connections_ = 0;  // connections open when it started
  std::uint64_t fd_failed_accepts_ = 0;
  std::vector<char> read_buffer_ = std::vector<char>(1 << 16);
  std::chrono::steady_clock::time_point last_activity_;
  bool stopping_ = false;
  // Empty once bwrap proved it can isolate a job here; else why it cannot.
  // Probed at the first isolated exec.
  std::optional<std::string> isolation_problem_;
  // Output is scrubbed here, off the thread that serves connections: a job
  // printing hostile text slows its own output, not other clients.
  asio::thread_pool scrub_pool_{1};
};

/// Runs the daemon: parses argv, takes the state directory's lock, signals
/// readiness on --ready-fd. Returns the process exit code.
int daemon_main(int argc, char** argv);

}  // namespace tether::sandboxd
