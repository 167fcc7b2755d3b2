#pragma once
// A scripted agent for tests, the demo and scenario files. A session's script
// maps the ordinal of a user input (1 = its first prompt, report or notice)
// to the actions of the turn that reacts to it. Because the ordinal is read
// from the durable transcript, a turn replayed after a crash is the same turn.
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "tether/actors/agent.hpp"

namespace tether::testing {

// The harness drives the actors layer's own types.
using namespace tether::actors;

struct script_action {
  enum class kind {
    say,          // text: a completed answer
    fail,         // text: an error answer (busy period ends "error")
    raise,        // text: the drain throws
    shell,        // text: the command of a background shell
    spawn,        // child, description, text (prompt), notify, background
    wake_self,    // count: this many self-wakes in a row
    wait_cancel,  // blocks until the drain is cancelled (an interrupt)
    interrupt,    // child: cancels that child (agent_context::cancel_child)
    job,          // text: a command launched as a background job owned by this turn;
                  // child: the name the job is known by (empty: none)
    job_status,   // child: the name of a job this turn launched; reads its status
    job_wait,     // child: the same; waits until it is terminal (a read)
    job_cancel,   // child: the same; confirmed kill (a read)
    fork,         // child, description, text (prompt): a new session with no parent
    delegate,     // agent, text (prompt), child: the name the task is known by
  };
  kind what = kind::say;
  std::string text;
  std::string child;
  std::string description;
  std::string agent = "general";
  std::optional<bool> notify;
  bool background = true;
  int count = 1;
};

struct script_turn {
  std::vector<script_action> actions;
};

class scripted_agents : public agent_factory {
 public:
  /// The turn session `s` plays on its `ordinal`-th input.
  void on_input(const session_id& s, int ordinal, script_turn t);
  std::shared_ptr<agent> make(const session_row& session) override;

  /// What the scripted turns did, in order (for timelines and tests).
  std::vector<std::string> log() const;
  void note(std::string line);
  /// Foreground spawns return their report inline; they are kept here.
  std::vector<std::string> inline_results() const;
  void note_inline(std::string r);
  std::optional<script_turn> turn(const session_id& s, int ordinal) const;

  /// A job a turn launched under a name (`job ... as NAME`), and its owner.
  struct named_job {
    job_id id;
    session_id owner;
  };
  void note_job(const std::string& name, named_job j);
  std::optional<named_job> job(const std::string& name) const;
  /// A delegated task a turn started under a name (`delegate ... as NAME`).
  void note_delegate(const std::string& name, named_job j);
  std::optional<named_job> delegated(const std::string& name) const;
  /// Where delegated tasks write their artifacts (the scenario's directory).
  void set_workspace(std::filesystem::path p);
  std::filesystem::path workspace() const;

  /// Blocks a plain (non-executor) thread until `s` is suspended in a
  /// wait_cancel action; false if `timeout` passed first.
  bool wait_parked(const session_id& s, std::chrono::milliseconds timeout) const;
  void note_parked(const session_id& s, int delta);
  /// Blocks a plain thread until `s` has played its turn for `ordinal` to the
  /// end; false if `timeout` passed first.
  bool wait_played(const session_id& s, int ordinal, std::chrono::milliseconds timeout) const;
  void note_played(const session_id& s, int ordinal);

 private:
  mutable std::mutex m_;
  mutable std::condition_variable changed_;  // parked_ or played_ changed
  std::map<std::string, int> parked_;
  std::map<std::pair<std::string, int>, int> played_;
  std::map<std::pair<std::string, int>, script_turn> turns_;
  std::vector<std::string> log_;
  std::vector<std::string> inline_;
  std::map<std::string, named_job> jobs_;
  std::map<std::string, named_job> delegates_;
  std::filesystem::path workspace_;
};

}  // namespace tether::testing
