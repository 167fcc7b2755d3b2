#pragma once
// The truth about how a shell job ended, and the completion notice the model
// reads. A pipeline is judged by every stage of its last pipeline, not only
// by the shell's status: `cargo test | tail -n 20` whose `cargo test` failed
// is a failure even though the pipeline's own status is 0. An exit status
// nobody can vouch for is -1, never 0.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace tether::protocol {

/// How one stage of the command's last pipeline ended.
struct stage_status {
  std::string command;  // the stage's text when it could be named, else ""
  int code = 0;         // as the shell reports it: exit code, or 128+signal
  int signal = 0;       // nonzero when `code` says the stage died by a signal
  friend bool operator==(const stage_status&, const stage_status&) = default;
};

enum class job_state {
  running,  // no terminal status yet
  exited,   // the shell ended on its own (successfully or not)
  killed,   // ended after a kill request
  unknown,  // how it ended is not known: exit code -1
};
std::string_view to_string(job_state s);
bool parse(std::string_view s, job_state& out);

enum class capture_kind {
  per_stage,   // every stage of the last pipeline has a status
  shell_only,  // the launcher's capture did not run; only the shell's status is known
  none,        // nothing is known (running, or status unknown)
};
std::string_view to_string(capture_kind c);
bool parse(std::string_view s, capture_kind& out);

/// A job's terminal status.
struct job_status {
  job_state state = job_state::running;
  int exit_code = -1;   // the failing stage's status, else the shell's; -1 = unknown
  int shell_code = -1;  // the shell's own status (128+signal if signalled); -1 = unknown
  int signal = 0;       // the shell was killed by this signal
  std::vector<stage_status> stages;
  int failing_stage = -1;  // index into stages, -1 = none failed
  capture_kind capture = capture_kind::none;
  std::string reason;  // for unknown / shell_only: why; otherwise a note or ""
  friend bool operator==(const job_status&, const job_status&) = default;
};

/// What the launcher observed, before judging it.
struct launch_outcome {
  // How the shell process ended, when it was reaped (our own child).
  struct shell_end {
    bool signalled = false;
    int code = 0;  // exit code, or the signal number when signalled
  };
  std::optional<shell_end> shell;
  // The launcher's capture line: "pipestatus S1 ... Sn $?" (absent when the
  // capture did not run, e.g. the command called `exit` or was killed).
  std::optional<std::string> capture_line;
  bool kill_requested = false;
  std::string unknown_reason;  // used when neither the shell end nor the capture is known
};

/// The last pipeline of a shell command list, best effort: quotes, escapes,
/// $(...), (...), {...}, compound commands, here-documents and comments are
/// respected. Parse the raw command, then scrub each stage.
struct pipeline_shape {
  std::vector<std::string> stages;
  bool negated = false;  // the pipeline starts with `!`
  friend bool operator==(const pipeline_shape&, const pipeline_shape&) = default;
};
pipeline_shape last_pipeline(std::string_view command);

/// The script `bash -c` runs for a job: the command, then on its own line the
/// capture of every stage's status of its last pipeline and the shell's `$?`
/// ("pipestatus S1 ... Sn $?") written to descriptor 63. The capture does not
/// run when the command ends the shell itself (`exit`, `exec`, a syntax error).
std::string capture_script(std::string_view command);

/// The capture line ("pipestatus ...") in what descriptor 63 received, if any.
std::optional<std::string> find_capture_line(std::string_view status_file_text);

/// Judges an outcome. `shape` names the stages when its count matches the capture.
job_status judge(const launch_outcome& o, const pipeline_shape& shape);

/// Signal name ("SIGTERM") or "signal N".
std::string signal_name(int sig);

/// A bounded, single-line view of a command (newlines shown as "⏎"), cut on a
/// UTF-8 boundary. Scrub before bounding, never after.
struct command_preview {
  std::string text;
  std::size_t truncated_bytes = 0;  // bytes of the (scrubbed) command not shown
  friend bool operator==(const command_preview&, const command_preview&) = default;
};
command_preview make_preview(std::string_view scrubbed_command, std::size_t max_bytes = 200);

/// Everything a completion notice says. Preview and tail are scrubbed on the
/// sandbox side before they are put here.
struct shell_completion {
  std::string job;
  job_status status;
  command_preview preview;
  std::string tail;  // see make_tail()
  std::uint64_t tail_omitted_bytes = 0;
  std::size_t tail_lines = 0;
  std::uint64_t output_bytes = 0;  // all output bytes, shown or not
  std::int64_t started_at_ms = 0;  // Unix ms
  std::int64_t ended_at_ms = 0;
  friend bool operator==(const shell_completion&, const shell_completion&) = default;
};

/// Prefix of every output line in a notice: output cannot pass for the
/// notice's own lines.
inline constexpr std::string_view k_tail_fence = "| ";

/// C0 controls other than newline and tab, DEL, and C1 controls (U+0080-U+009F)
/// shown as \xHH / \u00HH; CR before LF dropped. Job text is never shown raw.
std::string escape_controls(std::string_view s);

/// The notice text exactly as the model reads it (see docs/sandbox.md).
std::string render_notice(const shell_completion& c);

/// The one-line status, e.g. "exit 101 from stage 1 of 2 (cargo test); ...".
std::string render_status_line(const job_status& s);

/// Process exit code for a CLI that ran the job: the failing stage's status
/// (or 0); 128+signal when killed; 255 when unknown.
int exit_code_for(const job_status& s);

}  // namespace tether::protocol
