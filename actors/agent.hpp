#pragma once
// Where the host's agent logic plugs in: a coroutine called once per drain
// with the inputs that arrived since the last drain, and a context through
// which it answers, starts jobs and subagents, and reads state.
#include <boost/asio/awaitable.hpp>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tether/actors/job_queue.hpp"
#include "tether/persistence/task_store.hpp"
#include "tether/protocol/ids.hpp"

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
