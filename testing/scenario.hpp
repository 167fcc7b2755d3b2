#pragma once
// Scenario files: a line-based script that drives a real host with scripted
// agents, fifo-gated real shells, crash points and restarts, and checks what
// ended up on disk. The format is documented in docs/scenarios.md.
//
// parse() turns a file into a script, refusing a malformed one with an error
// naming the line and the word that was wrong. run() executes it against a
// fresh database in a scratch directory and prints each expectation with
// ok/FAIL. A `crash at` step hands the host to another process (through
// run_options::crash_segment) that runs until the crash point kills it.
#include <chrono>
#include <cstddef>
#include <functional>
#include <optional>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "tether/runtime/error.hpp"

namespace tether::testing::scenario {

/// One scripted action inside an `on NAME N:` turn (see script_action).
struct action {
  enum class kind {
    say,
    fail,
    raise,
    shell,
    spawn,
    wake_self,
    wait_cancel,
    interrupt,
    job,         // job "COMMAND" [as NAME]
    job_status,  // job-status NAME
    job_wait,    // job-wait NAME
    job_cancel,  // job-cancel NAME
    fork,        // fork NEW "DESCRIPTION" "PROMPT"
    delegate,    // delegate AGENT "PROMPT" as NAME
  };
  kind what = kind::say;
  std::string text;         // say/fail/raise text, shell gate, spawn/fork prompt, job command
  std::string target;       // spawn/fork child, interrupt target, job name
  std::string description;  // spawn
  std::string agent = "general";
  std::optional<bool> notify;  // spawn: nullopt = default
  bool background = true;      // spawn
  int count = 1;               // wake-self
};

struct turn {
  int line = 0;
  std::string session;
  int ordinal = 0;
  std::vector<action> actions;
};

/// A check of what is on disk (or in the scripted agents' memory).
struct expectation {
  enum class kind {
    inbox_count,         // expect inbox S count N
    inbox_text,          // expect inbox S POS contains|lacks|equals "T"
    inbox_state,         // expect inbox S POS acked|pending
    inbox_from,          // expect inbox S POS from C
    transcript_reports,  // expect transcript S reports N
    transcript_answers,  // expect transcript S answers N
    transcript_answer,   // expect transcript S answer contains|lacks|equals "T"
    jobs_count,          // expect jobs [filters] count N
    inline_count,        // expect inline count N
    inline_text,         // expect inline POS contains|lacks|equals "T"
    session_word,        // expect session S idle|busy|claimed|unclaimed|gone
    session_notify,      // expect session S notify on|off|default
    session_outcome,     // expect session S outcome completed|error|cancelled
    session_policy,      // expect session S policy withhold|report_now
    session_resumes,     // expect session S resumes N
    boot_field,          // expect boot FIELD N
    inbox_any,           // expect inbox S any contains|equals "T"
    inbox_none,          // expect inbox S none contains|equals "T"
    inbox_unordered,     // expect inbox S unordered contains "T" ["T"]...
    inbox_id,            // expect inbox S POS id prefix|equals "T" / id job NAME
    transcript_notices,  // expect transcript S notices N
    session_parent,      // expect session S parent P|none
    job_state,           // expect job NAME state admitted|running|completed|failed|...
    job_exit,            // expect job NAME exit N
    job_failing_stage,   // expect job NAME failing-stage K|none (number 0 = none)
    job_stage_exit,      // expect job NAME stage K exit N
    job_stage_signal,    // expect job NAME stage K signal SIG
    job_receipts,        // expect job NAME receipts N
    job_receipt,         // expect job NAME receipt pending|acked|read|dropped|none
    job_notice,          // expect job NAME notice contains|lacks|equals "T"
    delegate_state,      // expect delegate NAME state running|completed|failed|...
  };
  enum class text_op { contains, lacks, equals };
  kind what = kind::inbox_count;
  std::string session;
  int position = 0;  // 1-based; -1 = last
  text_op op = text_op::contains;
  std::string text;  // text to compare, or a keyword (acked, idle, on, a boot field...)
  long number = 0;
  // jobs filters (empty = any)
  std::string status, job_kind, mode, parent, child;
  std::string job;                 // expect job NAME, inbox S POS id job NAME
  int stage = 0;                   // expect job NAME stage K (1-based)
  std::vector<std::string> texts;  // inbox unordered
};

struct step {
  enum class kind {
    session,         // session NAME ["DESCRIPTION"]
    prompt,          // prompt NAME "TEXT"
    steer,           // steer NAME "TEXT"
    wake,            // wake NAME
    interrupt,       // interrupt NAME
    delete_session,  // delete NAME
    revert,          // revert NAME stage|clear
    background,      // background NAME
    shell_exit,      // shell GATE exits [CODE] ["OUTPUT"]
    wait_quiescent,  // wait quiescent
    wait_shells,     // wait shells
    wait_idle,       // wait idle NAME
    wait_parked,     // wait parked NAME
    wait_turn,       // wait turn NAME N
    job_read,        // job NAME status|wait|cancel
    wait_jobs,       // wait jobs
    wait_delegate,   // wait delegate NAME (its terminal state)
    crash,           // crash at POINT[:N]
    restart,         // restart
    expect,          // expect ...
  };
  kind what = kind::session;
  int line = 0;
  std::string source;  // the line as written, for output
  std::string name;    // session, gate or job
  std::string text;    // prompt text, description, shell output, crash point, job verb
  int code = 0;        // shell exit code; wait turn: the input ordinal
  bool flag = false;   // revert: staged
  expectation expect;
};

struct script {
  std::string file;
  std::vector<turn> turns;
  std::vector<step> steps;
  std::vector<std::string> gates;  // every gate a `shell` action (or a job command) uses
  /// `sandbox`: accepted for files written before every scenario got one;
  /// every scenario's host runs its shells and jobs in a real local
  /// tether-sandboxd, with or without the line.
  bool sandbox = false;
  /// `env NAME "VALUE"`: set in the host's (so every command's) environment
  /// before the sandbox and the host start.
  std::vector<std::pair<std::string, std::string>> env;
};

/// Parses scenario text. A malformed file is an errc::invalid error whose
/// message starts "FILE:LINE: " and quotes the word that was wrong.
result<script> parse(const std::string& text, const std::string& file);
result<script> parse_file(const std::string& path);

struct run_options {
  /// Scratch directory: the database, shell files, gates and the gate script.
  /// Created if missing. The caller removes it.
  std::string dir;
  std::ostream* out = nullptr;  // default std::cout
  bool verbose = false;         // also print every step as it runs
  /// How long any wait step may take before the scenario fails.
  std::chrono::milliseconds wait_timeout{std::chrono::seconds(20)};
  /// Runs the steps after the `crash at` step `crash_step` (an index into
  /// script::steps) in another process whose environment has
  /// TETHER_CRASH_AT=`point`; returns its raw wait status. That process calls
  /// run_crash_segment(). Unset: crash steps fail.
  std::function<int(std::size_t crash_step, const std::string& point)> crash_segment;
};

struct run_result {
  int passed = 0;
  int failed = 0;
  /// A wait timed out: the host may be wedged, so it was not shut down. The
  /// caller should exit the process without running destructors.
  bool stuck = false;
};

/// Runs the script from a fresh database in opts.dir. Note: prepends
/// <dir>/bin to this process's PATH, so shells find the `gate` script.
run_result run(const script& s, run_options opts);

/// In the process a crash step started: opens the host on opts.dir, boots,
/// and runs the steps after `crash_step` up to the next `restart`. Returns 0
/// if they all ran (the crash point was never reached), 1 if a step failed.
int run_crash_segment(const script& s, run_options opts, std::size_t crash_step);

}  // namespace tether::testing::scenario
