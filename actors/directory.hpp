#pragma once
// The session directory: the tree of sessions (who is whose parent) and what
// each one runs, as the sessions publish it, for the still-running list of a
// report and for the delivery path's steer-or-prompt choice.
//
// It holds no actor's state: each session publishes its own phase (busy,
// settling, foreground) here as it changes, the way the job queue publishes
// its live jobs, and readers take a consistent view under one lock. Labels
// (a subagent's description) are scrubbed and bounded when read out.
//
// Thread-safe: any thread.
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "tether/protocol/ids.hpp"
#include "tether/protocol/report.hpp"
#include "tether/protocol/scrub.hpp"

namespace tether::actors {

class session_directory {
 public:
  explicit session_directory(protocol::scrubber labels) : labels_(std::move(labels)) {}

  /// A session is known: its parent, agent and description.
  void add(const protocol::session_id& s, std::optional<protocol::session_id> parent,
           std::string agent, std::string description);
  void add_child(const protocol::session_id& parent, const protocol::session_id& child);
  /// The session's phase, as it publishes it.
  void phase(const protocol::session_id& s, bool busy, bool settling, bool foreground);
  bool is_busy(const protocol::session_id& s);
  /// Forgets a deleted session (and its place among its parent's children).
  void remove(const protocol::session_id& s);
  /// `s` and every descendant of it (for their jobs), and the background
  /// subagents still running under `s` (busy, not settling, not a foreground
  /// call), each labelled with its scrubbed, bounded description.
  struct under {
    std::set<protocol::session_id> sessions;
    std::vector<protocol::running_item> subagents;
  };
  under running_under(const protocol::session_id& s);

 private:
  struct entry {
    std::optional<protocol::session_id> parent;
    std::string agent;
    std::string description;
    bool busy = false;
    bool settling = false;
    bool foreground = false;
    std::set<protocol::session_id> children;
  };
  std::mutex m_;
  std::map<protocol::session_id, entry> entries_;
  protocol::scrubber labels_;
};

}  // namespace tether::actors
