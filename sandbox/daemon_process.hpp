#pragma once
// Starting and stopping tether-sandboxd: the one place a daemon is started.
// A client connecting never starts one; ensure_daemon() does, and only it.
#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <optional>
#include <string>

#include "tether/runtime/error.hpp"

namespace tether::sandbox {

struct daemon_options {
  std::string state_dir;
  std::string
      binary;  // empty: $TETHER_SANDBOXD, else tether-sandboxd next to the running executable
  std::string sandbox_id;  // empty: minted on first start
  bool replace = false;    // bump the generation (fails if a daemon is running)
  std::optional<std::chrono::milliseconds> grace, kill_wait, idle_exit;
  std::optional<std::size_t> retain_bytes;
  std::optional<std::size_t> max_connections, max_in_flight;  // --max-connections, --max-in-flight
  bool detach = true;    // setsid + double fork, so it outlives us; false: our child (tests)
  std::string log_file;  // default: <state_dir>/daemon.log
};

struct daemon_handle {
  std::string socket_path;
  pid_t pid = 0;         // the daemon's pid (0 if unknown)
  bool started = false;  // false: one was already serving the directory
  bool child = false;    // true when started with detach=false: reap it with stop_daemon()
};

/// Makes sure a daemon serves `o.state_dir`: connects if one answers, else
/// starts one and waits for its readiness line (no polling). Blocking; call
/// it before the executors run or from a helper thread.
result<daemon_handle> ensure_daemon(const daemon_options& o);

/// SIGTERM to the daemon, then waits for it to exit (waitpid or pidfd). For
/// our own child, an exit other than status 0 is an error.
result<void> stop_daemon(const daemon_handle& h);

/// Stops the daemon serving `state_dir`, whoever started it (a host's local
/// daemon is detached): SIGTERM, then waits for it to exit. False when none
/// serves it. Its running jobs are killed; the next boot finds them lost.
result<bool> stop_daemon_in(const std::string& state_dir);

/// The directory of the running executable (/proc/self/exe).
std::string self_dir();

}  // namespace tether::sandbox
