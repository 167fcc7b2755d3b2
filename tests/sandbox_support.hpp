#pragma once
// A real tether-sandboxd per test, started as our child in a scratch state
// directory, and helpers to drive it from coroutines.
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "support.hpp"
#include "tether/sandbox/client.hpp"
#include "tether/sandbox/daemon_process.hpp"
#include "tether/sandbox/state_dir.hpp"

namespace tether::test {

namespace wire = protocol::sandbox;
using boost::asio::awaitable;
using client_ptr = std::unique_ptr<sandbox::client>;

inline std::string sandboxd_binary() {
  return std::string(TETHER_BIN_DIR) + "/tether-sandboxd";
}

class sandbox_daemon {
 public:
  explicit sandbox_daemon(const std::string& tag, sandbox::daemon_options o = {}) : dir_(tag) {
    opts_ = std::move(o);
    opts_.state_dir = dir_.file("state");
    opts_.binary = sandboxd_binary();
    opts_.detach = false;
    start();
  }
  ~sandbox_daemon() {
    if (h_.pid <= 0) return;
    if (paused_) resume();
    auto r = sandbox::stop_daemon(h_);
    if (std::uncaught_exceptions() == 0) {
      INFO((r ? std::string() : r.error().message) << "; daemon.log:\n" << log());
      CHECK(r.has_value());  // a clean exit: no sanitizer report, no crash
    }
  }

  void start() {
    auto r = sandbox::ensure_daemon(opts_);
    INFO("ensure_daemon: " << (r ? std::string("ok") : r.error().message));
    REQUIRE(r.has_value());
    REQUIRE(r->started);
    h_ = *r;
  }
  void stop() {
    auto r = sandbox::stop_daemon(h_);
    INFO((r ? std::string() : r.error().message));
    REQUIRE(r.has_value());
    h_.pid = 0;
  }
  /// Kills the daemon outright (no cleanup at all) and reaps it.
  void crash();
  /// SIGSTOP, confirmed stopped (waitpid WUNTRACED): it reads nothing until
  /// resume(). A guard thread resumes it after two minutes if the test never
  /// does (a client that would hang for ever then fails instead).
  void pause();
  /// SIGCONT, confirmed (waitpid WCONTINUED).
  void resume();
  /// Waits for the daemon to exit by itself (at most `limit`, then fails) and
  /// reaps it; returns its wait status.
  int wait_exit(std::chrono::seconds limit);
  /// Waits (inotify, at most `limit`) until daemon.log holds `needle`; false
  /// when the limit passed first.
  bool wait_for_log(const std::string& needle, std::chrono::seconds limit) const;
  /// The whole daemon.log.
  std::string full_log() const;

  /// The daemon's log (its stderr), for failure messages.
  std::string log() const;

  sandbox::daemon_options& options() { return opts_; }
  const sandbox::daemon_handle& handle() const { return h_; }
  const std::string& socket() const { return h_.socket_path; }
  const scratch_dir& dir() const { return dir_; }

 private:
  scratch_dir dir_;
  sandbox::daemon_options opts_;
  sandbox::daemon_handle h_;
  bool paused_ = false;
  std::shared_ptr<struct pause_guard> guard_;
};

awaitable<client_ptr> connect(std::string socket,
                              wire::conn_mode mode = wire::conn_mode::read_write);

/// A request to run `command` in `cwd` with a small environment.
wire::exec_req command(std::string command, std::string cwd,
                       std::vector<std::pair<std::string, std::string>> extra_env = {});

/// exec, then wait for the completion; REQUIREs both succeed.
awaitable<protocol::shell_completion> run_to_end(sandbox::client& c, wire::exec_req r);

/// Moves a completed job's end `ms` further into the past in its record, as
/// if it had ended that long ago (stop the daemon first; a start reads it).
void age_completed_record(const std::string& state_dir, const protocol::job_id& job,
                          std::int64_t ms);

/// Non-zombie processes in process group `pgid`.
std::vector<int> live_group_members(int pgid);

/// Opens the FIFO for writing and closes it: a `cat FIFO` in a job returns.
void release_fifo(const std::string& path);
// Opens a FIFO for reading (waiting for its writer) and reads until every
// writer has closed it; returns what was written.
std::string read_fifo(const std::string& path);

}  // namespace tether::test
