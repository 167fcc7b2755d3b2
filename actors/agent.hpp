#pragma once
// Where the host's agent logic plugs in: a coroutine called once per drain
// with the inputs that arrived since the last drain, and a context through
// which it answers, starts jobs and subagents, and reads state.
#include <boost/asio/awaitable.hpp>
#include <chrono>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tether/actors/delegates.hpp"
#include "tether/actors/job_queue.hpp"
#include "tether/persistence/task_store.hpp"
#include "tether/protocol/ids.hpp"
#include "tether/protocol/policy.hpp"

namespace tether::actors {

namespace asio = boost::asio;
using asio::awaitable;
using persistence::message_row;
using persistence::session_row;
using protocol::session_id;

/// Why a drain runs: new input, or only a steer into a running period. When
/// both were asked for before a drain, input wins.
enum class wake_scope { steer, input };

struct drain_input {
  std::vector<message_row> inputs;  // user messages (prompts, steers, reports, notices), by seq
  int drain_index = 0;              // 0 for the first drain of a busy period
  wake_scope scope = wake_scope::input;
};

struct spawn_request {
  std::string description;
  std::string prompt;
  std::string agent = "general";
  std::optional<bool> notify;       // nullopt: new child on, follow-up keeps its setting
  std::optional<session_id> child;  // a follow-up to this child, or the id for a new one
  bool fork = false;                // a fork has no parent: notify is irrelevant
  /// A new child's job policy ("withhold" or "report_now"); nullopt: the
  /// host's default (host_options::job_policies: subagent, or top_level for a
  /// fork). A follow-up keeps the child's policy and is refused if this names
  /// another one (host::set_job_policy changes it).
  std::optional<std::string> job_policy;
  /// A new child's policy: this session's, narrowed by the fields set here.
  /// A field that would widen it refuses the spawn and names the field. A
  /// follow-up keeps the child's policy and is refused if this is set.
  std::optional<protocol::policy_override> policy;
  /// A foreground spawn's limit: past it the child is interrupted (it
  /// settles "cancelled") and the call answers errc::timeout. nullopt: none.
  std::optional<std::chrono::milliseconds> timeout;
  /// The goal a new child's task joins (a running goal of this session's
  /// tree, host::create_goal); its state and usage roll up to it.
  std::optional<job_id> goal;
};

/// A delegate call as an agent makes it (docs/delegation.md): the runtime
/// adds the caller's scope, depth, policy and budget.
struct delegate_request {
  std::string agent = "general";
  std::string prompt;
  std::filesystem::path workspace;  // the artifact goes to <workspace>/delegates/<id>.json
  /// The delegate's policy: the caller's, narrowed by the fields set here.
  std::optional<protocol::policy_override> policy;
  /// The goal the task joins (a running goal of this session's tree).
  std::optional<job_id> goal;
};

class agent_context {
 public:
  virtual ~agent_context() = default;
  virtual const session_id& self() const = 0;
  /// Appends a completed assistant message.
  virtual awaitable<result<std::int64_t>> say(std::string text) = 0;
  /// Appends an error assistant message; the busy period ends in state "error".
  virtual awaitable<result<std::int64_t>> fail(std::string text) = 0;
  /// Starts a child in the background: its running job row is written before
  /// its busy period can start. Returns the child's id at once.
  virtual awaitable<result<session_id>> spawn_background(spawn_request req) = 0;
  /// Runs a child under a blocking tool call: returns its report inline.
  virtual awaitable<result<std::string>> spawn_foreground(spawn_request req) = 0;
  /// Starts a background shell (a real process); returns its job id. It is
  /// an owned job of this turn (launch_job), in the configured sandbox or the
  /// host's local daemon; its receipt follows the session's job policy.
  /// Idempotent across a crash: a busy period resumed by boot runs its turn
  /// again under the same turn id, and its n-th shell with the same command
  /// gets back the job the first run launched (the launch's key is the
  /// shell's position in the period and a hash of its command).
  virtual awaitable<result<std::string>> start_shell(std::string command) = 0;
  /// The scope the runtime supplies for jobs this turn launches.
  virtual owner_scope scope() const = 0;
  /// Launches a job owned by this turn through the job queue. In the
  /// background it needs the session's job notifications on.
  virtual awaitable<result<job_id>> launch_job(launch_request req) = 0;
  /// A job this turn owns (others: "not found"). Reading a terminal result
  /// here means it is not delivered again.
  virtual awaitable<result<job_view>> job_status(job_id job) = 0;
  virtual awaitable<result<job_view>> wait_job(job_id job) = 0;
  /// Confirmed kill, then the cancelled receipt.
  virtual awaitable<result<job_view>> cancel_job(job_id job) = 0;
  /// Asks for one more drain before this busy period settles.
  virtual void wake_self() = 0;
  /// Cancels a child's run (the caller cancelled its job): the child settles
  /// "cancelled" and reports that once. A session that is not this one's
  /// child is "not found", as one that does not exist.
  virtual awaitable<result<void>> cancel_child(session_id child) = 0;
  /// The durable transcript of this session (read off the actor's executor).
  virtual awaitable<result<std::vector<message_row>>> transcript() = 0;
  /// How many user messages this session had up to `seq` (1-based ordinal).
  virtual awaitable<result<std::int64_t>> input_ordinal(std::int64_t seq) = 0;

  // --- policy and budget (docs/policy.md) ---
  /// This session's effective policy.
  virtual const protocol::session_policy& policy() const = 0;
  /// Its depth below its top-level session (0 for one).
  virtual int depth() const = 0;
  /// One action of a host's own tool: allowed only if the policy allows
  /// `tool`, and counted against the tree's action budget. A refusal is
  /// errc::refused and is written to the transcript. The runtime's own
  /// actions (shells, spawns, delegates) are checked and counted the same way.
  virtual awaitable<result<void>> act(std::string tool) = 0;
  /// Model usage of this busy period's work, added to its task (a
  /// subagent's current task, a delegate's task) and so to the task's goal.
  /// errc::not_found when the session works for no task (a top-level one).
  virtual awaitable<result<void>> report_usage(std::int64_t input_tokens,
                                               std::int64_t output_tokens) = 0;

  // --- delegated tasks (docs/delegation.md) ---
  /// A background delegate: its id once its row is registered.
  virtual awaitable<result<job_id>> delegate_background(delegate_request req) = 0;
  /// A synchronous one: waits up to `timeout` (bounded by the host's
  /// options), then cancels it and says so.
  virtual awaitable<result<delegate_view>> delegate_run(
      delegate_request req, std::optional<std::chrono::milliseconds> timeout = {}) = 0;
  /// A task this session's turns delegated (others: "not found").
  virtual awaitable<result<delegate_view>> delegate_result(job_id id) = 0;
  virtual awaitable<result<delegate_view>> delegate_wait(
      job_id id, std::optional<std::chrono::milliseconds> timeout = {}) = 0;
  virtual awaitable<result<std::vector<delegate_view>>> delegate_list() = 0;
  virtual awaitable<result<delegate_view>> delegate_cancel(job_id id) = 0;

  // --- scheduled work (docs/cron.md) ---
  /// A runtime cron job owned by this session's agent: the runtime sets its
  /// `agent` (whatever the spec said), so a model cannot schedule work under
  /// another owner. Checked as the tool "cron" against the policy and the
  /// action budget; errc::refused when the host runs no scheduler.
  virtual awaitable<result<persistence::cron_job_row>> cron_add(protocol::cron_job_spec spec) = 0;
  /// The jobs this session's agent owns.
  virtual awaitable<result<std::vector<persistence::cron_job_row>>> cron_jobs() = 0;
  /// Removes a job this session's agent owns; another's is "not found".
  virtual awaitable<result<bool>> cron_remove(std::string name) = 0;
};

class agent {
 public:
  virtual ~agent() = default;
  /// One drain. Throwing ends the busy period in state "error" with the
  /// exception's text; cancellation (interrupt) ends it "cancelled".
  virtual awaitable<void> drain(agent_context& ctx, drain_input in) = 0;
};

/// Hooks into the run coordinator, for instrumentation and tests. Called on
/// the session's executor; keep them short.
class run_observer {
 public:
  virtual ~run_observer() = default;
  /// A busy period began; started_seq is the session's durable seq then.
  virtual void started(const session_id& /*s*/, std::int64_t /*started_seq*/) {}
  /// The busy period was classified (a late background request is now
  /// refused) and is about to commit. Awaited.
  virtual awaitable<void> settling(const session_id& /*s*/) { co_return; }
  /// The settle committed; `report` names the report it owes, if any.
  virtual void settled(const session_id& /*s*/,
                       std::optional<protocol::notification_id> /*report*/) {}
  /// A report was admitted into `parent`'s inbox (repeats excluded).
  virtual void admitted(const session_id& /*parent*/, const protocol::notification_id& /*report*/) {
  }
};

class agent_factory {
 public:
  virtual ~agent_factory() = default;
  virtual std::shared_ptr<agent> make(const session_row& session) = 0;
};

}  // namespace tether::actors
