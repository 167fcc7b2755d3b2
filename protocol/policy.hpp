#pragma once
// A session's effective policy (docs/policy.md): what its turns may do. A
// top-level session gets the host's default (or the one it was created
// with); a child inherits its parent's, and an override may narrow it, never
// widen it. Checked where a call is made (spawn, delegate) and enforced where
// the action runs (the job queue, the sandbox daemon, the context's calls).
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "tether/protocol/json.hpp"

namespace tether::protocol {

/// The tool names the runtime itself checks; a host checks its own names
/// through agent_context::act().
inline constexpr std::string_view tool_shell = "shell";        // start_shell, launch_job
inline constexpr std::string_view tool_spawn = "spawn";        // subagents and forks
inline constexpr std::string_view tool_delegate = "delegate";  // delegated tasks
inline constexpr std::string_view tool_cron = "cron";          // scheduling cron jobs

struct session_policy {
  /// The tools its turns may use; nullopt: every tool.
  std::optional<std::set<std::string>> tools;
  /// Whether its turns may run shells at all.
  bool shells = true;
  /// Shells run inside bubblewrap (read-only root, only the work directory
  /// writable, no network unless `network`).
  bool isolated = false;
  /// Shells may reach the network. false needs isolation to be enforced, so
  /// a policy without network runs its shells isolated.
  bool network = true;
  /// The directories its shells may work in (and, isolated, the only ones
  /// they may write) and its delegates may write artifacts under; nullopt:
  /// anywhere. Absolute, lexically normal paths.
  std::optional<std::vector<std::string>> writable;
  /// The deepest level of subagents and delegates below the top-level
  /// session (depth 0) that its turns may start.
  int max_depth = 3;
  /// The memory scopes a host's memory tools may use; nullopt: every scope.
  std::optional<std::set<std::string>> memory_scopes;

  bool allows_tool(std::string_view name) const;
  bool allows_memory(std::string_view scope) const;
  /// `path` (absolute; normalised lexically) is inside one of `writable`
  /// (or writable is nullopt). A relative path is never inside.
  bool allows_path(std::string_view path) const;
  /// Whether its shells must run isolated: asked for, or needed to enforce
  /// no network or writable paths.
  bool isolate_shells() const { return isolated || !network || writable.has_value(); }

  friend bool operator==(const session_policy&, const session_policy&) = default;
};

/// `path` (absolute; normalised lexically) is one of `dirs` or inside one. A
/// relative path never is.
bool path_within(std::string_view path, const std::vector<std::string>& dirs);

/// A narrowing asked for at a spawn or a delegate: each field set replaces
/// the parent's, and must not widen it.
struct policy_override {
  std::optional<std::set<std::string>> tools;
  std::optional<bool> shells;
  std::optional<bool> isolated;
  std::optional<bool> network;
  std::optional<std::vector<std::string>> writable;
  std::optional<int> max_depth;
  std::optional<std::set<std::string>> memory_scopes;
};

/// The child's policy: `parent` with `o` applied. A field that would widen
/// the parent's is an error naming the field and why; nothing is applied.
decoded<session_policy> narrow(const session_policy& parent, const policy_override& o);

/// The checks a policy itself must pass (absolute, normal writable paths,
/// max_depth in 0..64): an error names the field.
std::optional<decode_error> check(const session_policy& p);

json::value to_json(const session_policy& p);
decoded<session_policy> policy_from_json(const json::value& v, std::string prefix = "policy");
decoded<policy_override> override_from_json(const json::value& v, std::string prefix = "policy");

}  // namespace tether::protocol
