#pragma once
// SOP definitions (docs/sop.md): a standard operating procedure is a named
// list of steps run in order, each a shell command, an agent prompt, an
// approval gate or a checkpoint, with transitions on success and on failure.
// One JSON file per SOP in the configured `sops` directory. A file that does
// not parse or check is refused whole (its path, the line of a syntax error,
// the field and the problem); a directory with one bad file loads nothing.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tether/protocol/json.hpp"

namespace tether::protocol {

enum class sop_step_kind { shell, prompt, approval, checkpoint };
std::string_view to_string(sop_step_kind k);

/// What an approval wait does when its timeout passes. `escalate` (the
/// default, fail-closed) tells the owner and keeps waiting; `cancel` ends the
/// run; `auto_approve` approves, and says so in the run's events: it is
/// honoured only where a definition names it explicitly.
enum class sop_timeout_action { escalate, cancel, auto_approve };
std::string_view to_string(sop_timeout_action a);

/// The two transition targets that are not step names.
inline constexpr std::string_view sop_end = "end";    // the run completes
inline constexpr std::string_view sop_fail = "fail";  // the run fails

struct sop_step {
  std::string name;  // unique in its SOP; [A-Za-z0-9_.-], 1..64 chars, not "end"/"fail"
  sop_step_kind kind = sop_step_kind::shell;
  std::string command;  // shell: run by `bash -c` through the sandbox daemon
  std::string cwd;      // shell: absolute; "" = the engine's default directory
  std::string prompt;   // prompt: sent to the SOP's agent in a fresh session
  /// On success (approval: on approval; checkpoint: on resume): a step name,
  /// "end" or "fail"; "" = the next step in the list ("end" after the last).
  std::string next;
  /// On failure (approval: on rejection): a step name, "end" or "fail";
  /// "" = "fail".
  std::string on_failure;
  int retries = 2;                       // shell, prompt: attempts after the first, 0..100
  int max_visits = 256;                  // how often a run may enter this step, 1..100000
  std::int64_t timeout_ms = 120000;      // shell, prompt: per attempt; 0 = none
  std::size_t max_output_bytes = 16384;  // shell, prompt: the recorded output
  /// Shell, prompt: safe to run again when the process running it died
  /// mid-step. A step that is not is resolved through its task instead (a
  /// daemon that still has the command is followed; otherwise the step is
  /// lost and its failure transition taken).
  bool idempotent = false;
  // Approval only (nullopt/empty: the SOP's).
  std::vector<std::string> approvers;
  std::optional<std::int64_t> approval_timeout_ms;  // 0 disables the timeout
  std::optional<sop_timeout_action> on_timeout;
  friend bool operator==(const sop_step&, const sop_step&) = default;
};

struct sop_definition {
  std::string name;  // unique; [A-Za-z0-9_.-], 1..64 chars
  std::string description;
  /// The owning agent: shell steps take its policy, prompt steps run as it.
  std::string agent;
  int max_concurrent = 4;                     // runs holding an execution claim at once, 1..10000
  std::size_t max_payload_bytes = 8192;       // a run's input payload, 0..1 MiB
  std::vector<std::string> approvers;         // who may approve; empty: nobody may
  std::int64_t approval_timeout_ms = 300000;  // 0 disables
  sop_timeout_action on_timeout = sop_timeout_action::escalate;
  std::vector<sop_step> steps;  // at least one

  /// The index of the step named `name`, if any.
  std::optional<std::size_t> index_of(std::string_view name) const;
  /// Where step `i` goes on success and on failure: a step name, "end" or
  /// "fail" (the defaults resolved).
  std::string success_target(std::size_t i) const;
  std::string failure_target(std::size_t i) const;
  /// An approval step's effective approvers, timeout and timeout action.
  const std::vector<std::string>& approvers_of(std::size_t i) const;
  std::int64_t approval_timeout_of(std::size_t i) const;
  sop_timeout_action on_timeout_of(std::size_t i) const;
  friend bool operator==(const sop_definition&, const sop_definition&) = default;
};

/// Every field checked (names, kinds and the fields each needs, targets that
/// name a step of this SOP, bounds); an error names the field.
std::optional<decode_error> check(const sop_definition& d);

json::value to_json(const sop_definition& d);
/// Unknown keys are refused; the result is checked.
decoded<sop_definition> sop_from_json(const json::value& v, const std::string& prefix = "");

/// One SOP file's text. A syntax error names its line and column.
decoded<sop_definition> parse_sop(std::string_view text);

/// A directory's SOPs: every `*.json` file in it, by file name. Any error
/// refuses the whole directory: the decode_error's field starts with the
/// file's path. Two files defining one name are refused. A directory that
/// does not exist is an error.
decoded<std::vector<sop_definition>> load_sop_dir(const std::string& dir);

}  // namespace tether::protocol
