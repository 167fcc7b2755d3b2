#pragma once
// Background shells as real processes, watched without blocking an executor.
//
// Each shell runs `bash -c COMMAND` under a small wrapper in its own session
// (setsid), with output in <dir>/<id>.out. The wrapper writes the exit status
// to <dir>/<id>.status (write then rename, so it is whole or absent) and its
// pid to <dir>/<id>.pid, so a restarted host can find a shell again: a status
// file means it finished; a live pid means it still runs; neither means the
// status is unknown (-1), never 0. The command runs under the same per-stage
// capture as a sandbox job (protocol::capture_script, into <dir>/<id>.capture),
// so `cargo test | tail` is judged by its failing stage.
//
// The notice is the sandbox's (protocol::render_notice): the command preview,
// the status line and the output tail are scrubbed with the rules of the host's
// environment (the shell inherits it) and bounded; output is read in chunks
// through the stream scrubber, keeping only its last bytes.
#include <sys/types.h>

#include <boost/asio/posix/stream_descriptor.hpp>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "tether/protocol/ids.hpp"
#include "tether/protocol/notice.hpp"
#include "tether/protocol/scrub.hpp"
#include "tether/runtime/actor.hpp"

namespace tether::actors {

struct shell_info {
  std::string id;  // also its notification id
  protocol::session_id owner;
  std::string command;
  pid_t pid = -1;
};

class shell_runner {
 public:
  using on_exit_fn = std::function<void(const shell_info&, const std::string& notice)>;
  shell_runner(runtime::executor ex, std::string dir, on_exit_fn on_exit);
  ~shell_runner();

  /// Spawns the shell and starts watching it.
  result<void> start(shell_info& s);
  /// After a restart: finished → on_exit at once; alive → watched; gone
  /// without a status → on_exit with status -1 (unknown).
  void reattach(shell_info s);
  /// Stops watching (processes keep running; a restart reattaches).
  void stop();
  std::size_t running() const;

  /// The notice for a shell that could not be started: `why` says what failed.
  std::string render_failed_start(const shell_info& s, const std::string& why) const;
  /// The scrubbed, bounded one-line label of a command (still-running lists).
  std::string label(const std::string& command) const;
  /// The notice for a shell with this outcome and (raw) output file.
  std::string render_finished(const shell_info& s, const protocol::launch_outcome& o,
                              const std::string& output_path) const;

 private:
  void watch(shell_info s);
  void finished(const shell_info& s);
  std::string path(const std::string& id, const char* ext) const;

  runtime::executor ex_;
  std::string dir_;
  protocol::scrubber scrub_;
  on_exit_fn on_exit_;
  mutable std::mutex m_;
  std::map<std::string, std::unique_ptr<boost::asio::posix::stream_descriptor>> watching_;
  bool stopped_ = false;
};

}  // namespace tether::actors
