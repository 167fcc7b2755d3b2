#pragma once
// Starting a job's shell and knowing when its processes are gone.
//
// Per-stage capture: the command runs as `bash -c SCRIPT` where SCRIPT is the
// user's command followed, on its own line, by
//
//   __tether_ps=("${PIPESTATUS[@]}" "$?"); printf 'pipestatus %s\n' ... >&63; exit ...
//
// so the statuses of every stage of the command's last pipeline (and the
// shell's own $?) are written to fd 63, which is the job's `status` file.
// The capture is unavailable when the command ends the shell itself (`exit`,
// `exec`, a syntax error, an unterminated here-document, a trailing `\`) or the
// shell is killed; the notice then says the status is the shell's only.
//
// The go gate: before the command, the script reads one byte from fd 62, a
// pipe whose write end only the daemon holds (spawned::go_fd), and exits 125
// without running anything unless it reads "g". The daemon writes it once the
// job's `running` record is durable, so a daemon that dies between spawning
// and recording leaves no command running untracked: the pipe closes with it
// and the shell exits.
#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace tether::sandboxd {

struct spawn_request {
  std::string command;
  std::string cwd;
  std::vector<std::pair<std::string, std::string>> env;
  std::string status_path;  // receives the capture line (fd 63)
  bool isolate = false;
  bool allow_network = false;
};

struct spawned {
  pid_t pid = -1;                // the shell (or bwrap), leader of its own process group
  int output_fd = -1;            // read end of stdout+stderr, non-blocking, close-on-exec
  int pidfd = -1;                // readable once `pid` exits
  int go_fd = -1;                // write end of the go gate, close-on-exec (see release())
  std::uint64_t start_time = 0;  // /proc/<pid>/stat starttime, to recognise the pid later
};

struct launcher_config {
  std::string bash = "/bin/bash";
  std::string bwrap;  // empty: isolation unavailable
};

/// Finds bash and bwrap on PATH; $TETHER_SANDBOXD_BWRAP, when set, names
/// the bwrap to use instead (tests point it at one that fails).
launcher_config find_tools();

/// Whether bwrap can set up a job's isolation here: runs it once with the
/// namespaces a job gets, around `bash -c :`. Empty if it can; else why not,
/// with bwrap's own words ("bwrap: No permissions to create new namespace…"
/// where the kernel or a container forbids user namespaces). Blocks until
/// bwrap exits (at most `timeout_ms`, then it is killed).
std::string probe_isolation(const launcher_config& cfg, int timeout_ms = 10000);

/// The script `bash -c` runs: the go gate, the command, the capture line.
std::string launcher_script(const std::string& command);

/// Opens the go gate: the shell runs its command. Closes `go_fd` (sets it to
/// -1) either way; false with errno if the byte could not be written (the
/// shell is gone, or will exit without running the command).
bool release(int& go_fd);

/// Starts the job. Errors are returned as text naming what failed.
struct spawn_result {
  std::optional<spawned> ok;
  std::string error;
};
spawn_result spawn_job(const launcher_config& cfg, const spawn_request& r);

/// Non-zombie processes whose process group is `pgid`.
std::vector<pid_t> group_members(pid_t pgid);

/// /proc/<pid>/stat starttime, or 0 if the process is gone.
std::uint64_t process_start_time(pid_t pid);

/// pidfd_open(2); -1 with errno on failure.
int open_pidfd(pid_t pid);

/// How the child behind `pidfd` ended (it must have exited): {signalled, code-or-signal}.
std::optional<std::pair<bool, int>> reap(int pidfd);

}  // namespace tether::sandboxd
