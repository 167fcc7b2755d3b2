#pragma once
// One command of scheduled or procedural work (a cron run's attempt, an SOP
// step's attempt) through the sandbox daemon, followed to its end: the
// policy's refusals checked first, the exec sent under the attempt's id
// (idempotent: a process that takes the work over follows the same command
// instead of starting another), a timeout that kills it (confirmed by the
// daemon), and the daemon's scrubbed tail bounded to the caller's limit.
#include <boost/asio/cancellation_signal.hpp>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "tether/actors/sandbox_channel.hpp"
#include "tether/protocol/policy.hpp"

namespace tether::actors {

struct command_spec {
  protocol::job_id id;  // the daemon's id for this attempt
  std::string command;  // run by `bash -c`
  std::string cwd;      // absolute
  /// Added to the current environment (what the command may want to know).
  std::vector<std::pair<std::string, std::string>> env;
  std::int64_t timeout_ms = 0;  // 0: none
  std::size_t max_output_bytes = 16384;
  /// Follow a command that may have been dispatched before; never start it.
  /// One the daemon has no record of ends `lost`.
  bool attach_only = false;
};

struct command_outcome {
  /// ok | degraded (exit 0 with no per-stage status) | error | timed_out |
  /// refused (the policy: nothing ran) | lost (attach_only: unknown to the daemon)
  std::string status;
  std::optional<int> exit;
  std::string output;  // scrubbed, bounded, ending "...[truncated]" when cut
  std::string error;
};

/// Why `policy` (of `agent`) refuses a shell in `cwd`, if it does.
std::optional<std::string> shell_refusal(const protocol::session_policy& policy,
                                         const std::string& agent, const std::string& cwd);

/// Runs `spec` under `policy` through `channel` on `ex`; `after_exec` is
/// called once the daemon accepted the exec (a crash point's place).
boost::asio::awaitable<command_outcome> run_command(
    runtime::executor ex, std::shared_ptr<sandbox_channel> channel, command_spec spec,
    const protocol::session_policy& policy, std::string agent, std::function<void()> after_exec);

/// Runs a prompt's answer (`running`) on `ex` with a timeout that cancels
/// it (through `sig`, which a caller may also emit on `ex` to cancel it);
/// the answer or the error scrubbed and bounded. ok | error | timed_out.
boost::asio::awaitable<command_outcome> run_prompt(
    runtime::executor ex, boost::asio::awaitable<result<std::string>> running,
    std::int64_t timeout_ms, std::size_t max_output_bytes,
    std::shared_ptr<boost::asio::cancellation_signal> sig);

}  // namespace tether::actors
