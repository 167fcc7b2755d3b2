#pragma once
// The embedding API: what a host author needs to run agents on tether, behind
// one include (<tether/tether.hpp>). A thin facade over actors::host: open
// (which boots), sessions, prompts and steers, interrupts, typed transcripts
// and inboxes, waits, and a shutdown that is awaitable or blocking.
//
// Threads: the facade owns a small pool of executors on which the agents'
// turns run. Its awaitables may be awaited from any executor (they resume on
// the awaiter's); its blocking calls (open, close, block, the destructor) must
// not run on one of its own executor threads, that is inside an agent's turn:
// close() and block() refuse there with an error naming the misuse instead of
// deadlocking. Reads (transcript, inbox) are synchronous SQLite reads on a
// read connection: call them from the embedding application, not from a turn
// (a turn reads its own transcript through its context).
#include <boost/asio/awaitable.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "tether/actors/agent.hpp"
#include "tether/actors/host.hpp"
#include "tether/runtime/error.hpp"
#include "tether/runtime/one_shot.hpp"
#include "tether/runtime/sync_wait.hpp"

namespace tether {

using boost::asio::awaitable;
using protocol::session_id;

// ---- enums instead of strings -------------------------------------------------
// Each has to_string() giving the name stored on disk and parse() taking it
// back (false, `out` untouched, for a name it does not know).

/// Who wrote a transcript message.
enum class role { user, assistant };
/// What a transcript message is: a caller's prompt or steer, a child's report,
/// a shell's or job's notice, an agent's answer, or a control-only marker.
enum class message_kind { prompt, steer, report, notice, answer, control };
/// How a message ended: an error answer ends its busy period in "error".
enum class message_status { completed, error };
/// The kind of background work a session started.
enum class task_kind { subagent, shell };
/// Where one background task is in its life. A subagent's busy period ends
/// completed, failed (its report says "error") or cancelled; an owned shell
/// job also knows admitted and lost.
enum class task_state { admitted, running, completed, failed, cancelled, lost };
/// What a turn does while background jobs it launched still run: withhold its
/// completion until they end, or settle now and take their receipts later.
enum class job_policy { withhold, report_now };

std::string_view to_string(role v);
std::string_view to_string(message_kind v);
std::string_view to_string(message_status v);
std::string_view to_string(task_kind v);
std::string_view to_string(task_state v);
std::string_view to_string(job_policy v);
bool parse(std::string_view s, role& out);
bool parse(std::string_view s, message_kind& out);
bool parse(std::string_view s, message_status& out);
bool parse(std::string_view s, task_kind& out);
bool parse(std::string_view s, task_state& out);
bool parse(std::string_view s, job_policy& out);
/// The runtime's own state names, as task states ("error" is failed).
task_state to_task_state(persistence::job_status s);
task_state to_task_state(persistence::owned_state s);

// ---- values ---------------------------------------------------------------------

/// One transcript message, typed.
struct message {
  std::int64_t seq = 0;
  tether::role role = tether::role::user;
  message_kind kind = message_kind::prompt;
  message_status status = message_status::completed;
  std::string text;
};
/// A persisted message row as a typed message; an unknown role, kind or
/// status is an errc::corrupt error naming the seq and the field.
result<message> to_message(const persistence::message_row& row);

/// One report (or notice) admitted into a session's inbox.
struct inbox_entry {
  protocol::notification_id id;
  std::optional<session_id> from;  // the child that reported (none for a shell notice)
  std::string body;
  bool acknowledged = false;  // a drain of the session took it into the transcript
};

/// Background work still running under a session (its descendants' included).
struct running_task {
  task_kind kind = task_kind::subagent;
  std::string detail;  // "sh_1", or "explore, sessionID: ses_abc"
  std::string label;   // the command or description, scrubbed and bounded
};

// ---- agents ---------------------------------------------------------------------

/// One turn of an agent (one drain of its session): the inputs that arrived
/// since its last turn, typed, and the context through which it answers and
/// starts background work. Lives for the duration of the turn only.
class turn {
 public:
  turn(actors::agent_context& ctx, std::vector<message> inputs, int index, bool steer_only)
      : ctx_(ctx), inputs_(std::move(inputs)), index_(index), steer_only_(steer_only) {}

  const session_id& self() const { return ctx_.self(); }
  /// Prompts, steers, reports and notices, by seq.
  const std::vector<message>& inputs() const { return inputs_; }
  /// 0 for the first turn of a busy period.
  int index() const { return index_; }
  /// Woken only to take a steer into a running busy period.
  bool steer_only() const { return steer_only_; }

  /// Appends a completed assistant message.
  awaitable<result<std::int64_t>> say(std::string text) { return ctx_.say(std::move(text)); }
  /// Appends an error answer; the busy period ends in "error".
  awaitable<result<std::int64_t>> fail(std::string text) { return ctx_.fail(std::move(text)); }
  /// Starts a subagent in the background; its report arrives in this
  /// session's inbox and wakes it for another turn. Returns the child's id.
  awaitable<result<session_id>> spawn_background(std::string agent, std::string description,
                                                 std::string prompt);
  /// Runs a subagent under this turn and returns its report inline.
  awaitable<result<std::string>> spawn_foreground(std::string agent, std::string description,
                                                  std::string prompt);
  /// Delegates `prompt` to the agent named `agent` in the background
  /// (docs/delegation.md): returns the task's id once its row is registered;
  /// its output is written to <workspace>/delegates/<id>.json and a notice
  /// arrives in this session's inbox. The task runs under this session's
  /// policy, one level deeper, on its action budget.
  awaitable<result<protocol::job_id>> delegate(std::string agent, std::string prompt,
                                               std::filesystem::path workspace);
  /// One action of the host's own tool `tool`: refused (and written to the
  /// transcript) when this session's policy does not allow it or its tree's
  /// action budget is spent (docs/policy.md).
  awaitable<result<void>> act(std::string tool) { return ctx_.act(std::move(tool)); }
  /// Everything else the runtime offers a turn (shells, owned jobs,
  /// synchronous delegates, policy overrides on spawns, ...).
  actors::agent_context& context() { return ctx_; }

 private:
  actors::agent_context& ctx_;
  std::vector<message> inputs_;
  int index_ = 0;
  bool steer_only_ = false;
};

/// An agent as a small interface. One instance serves every session of its
/// name, possibly on several threads at once: keep per-session state in the
/// transcript. Throwing ends the busy period in "error" with the exception's
/// text; an interrupt cancels the turn (its busy period ends "cancelled").
class agent {
 public:
  virtual ~agent() = default;
  virtual awaitable<void> run(turn& t) = 0;
};
/// An agent as a callable: a coroutine taking the turn.
using agent_fn = std::function<awaitable<void>(turn&)>;

// ---- the host -------------------------------------------------------------------

struct options {
  std::string db_path;
  /// A missing database file is created either way; with this set, an
  /// existing empty (zero-length) file also becomes a new database (without
  /// it an empty file is refused: a truncated database is not adopted).
  bool new_database = false;
  std::size_t threads = 0;  // executors; 0 = one per core
  /// Agents by name; a session or subagent names its agent. A name that is
  /// not here fails the session's turns with an error answer that says so.
  std::map<std::string, std::shared_ptr<agent>> agents;
  /// Where warnings go. Default: stderr.
  std::function<void(const std::string&)> log;
  /// Everything else of actors::host_options (sync mode, sandbox jobs,
  /// observer, ...). Its db_path, create_db, threads, agents and log are
  /// taken from the fields above.
  actors::host_options advanced;

  /// Registers `fn` as the agent called `name` (replacing one of that name).
  options& add_agent(std::string name, agent_fn fn);
  options& add_agent(std::string name, std::shared_ptr<agent> a);
};

class embedded {
 public:
  /// Opens (or creates) the database and boots: owed reports are delivered
  /// and interrupted sessions resume. Blocks until boot is done.
  static result<std::unique_ptr<embedded>> open(options opts);
  /// close(); from one of its own executor threads (where close() is refused)
  /// it warns and leaks the runtime rather than deadlock.
  ~embedded();
  embedded(const embedded&) = delete;
  embedded& operator=(const embedded&) = delete;

  /// What boot found and repaired.
  const actors::boot_report& boot_report() const { return boot_; }

  /// Creates a top-level session run by the agent named `agent`.
  /// `policy`: what its turns (and, narrowed, its children's) may do
  /// (docs/policy.md); nullopt: options' host.default_policy.
  awaitable<result<session_id>> create_session(
      std::string description, std::string agent = "general",
      std::optional<protocol::session_policy> policy = std::nullopt);
  /// Appends a prompt durably (answered after its commit), then wakes the session.
  awaitable<result<std::int64_t>> prompt(session_id s, std::string text);
  /// Appends a steer: a running busy period takes it in its next turn.
  awaitable<result<std::int64_t>> steer(session_id s, std::string text);
  /// Cancels the session's running turn: its busy period ends "cancelled".
  result<void> interrupt(const session_id& s);
  /// Deletes the session: its running turn is interrupted (a subagent's
  /// parent gets its `cancelled` report), its background shells are killed
  /// with confirmation, then its transcript and inbox are deleted and
  /// whatever was still owed to it is dropped. Its children stay, with
  /// nobody to report to. Returns how many shells it cancelled.
  awaitable<result<int>> delete_session(session_id s);
  /// Whether the session's turns may launch background jobs, and what a turn
  /// does while they run.
  awaitable<result<void>> set_job_policy(session_id s, bool notify, job_policy policy);

  /// The session's durable transcript, typed.
  result<std::vector<message>> transcript(const session_id& s);
  /// The reports and notices admitted into the session's inbox, in order.
  result<std::vector<inbox_entry>> inbox(const session_id& s);
  /// Background work still running under the session.
  std::vector<running_task> running(const session_id& s);

  /// Resolves once the session is idle (after its settle). A background child
  /// may still report later and wake it again: see wait_quiescent().
  awaitable<result<void>> wait_idle(session_id s);
  /// Resolves once nothing runs: no busy period, wake or report delivery in
  /// flight, and (unless `shells` is false) no background shell. A shutdown
  /// ends the wait with errc::stopped.
  awaitable<result<void>> wait_quiescent(bool shells = true);

  /// Runs `a` on the host's executor and blocks this thread until it is done.
  /// Refused (errc::refused, `a` not run) on one of the host's own executor
  /// threads, where it would wait for itself.
  template <class T>
  result<T> block(awaitable<result<T>> a);

  /// Graceful shutdown: running busy periods stop without settling (their
  /// claims stay on disk and resume at the next open), nothing new starts.
  /// Idempotent: every call resolves once the one shutdown is done. Awaited
  /// inside an agent's turn it is refused (errc::refused): the turn would
  /// wait for the shutdown that waits for the turn.
  awaitable<result<void>> shutdown();
  /// Blocking shutdown, as shutdown(). REQUIRES: not called on one of the
  /// host's executor threads (inside an agent's turn or a continuation of
  /// one of the facade's awaitables resumed there): there it would join the
  /// thread it runs on, so it returns errc::refused naming the misuse and
  /// shuts nothing down. Idempotent.
  result<void> close();
  /// True on one of the host's executor threads.
  bool on_executor_thread() const;

  /// The executor the facade's own work runs on, for co_spawn.
  runtime::executor_pool::executor executor() { return host_->pool().at(0); }
  /// The wrapped runtime, for what the facade does not cover.
  actors::host& host() { return *host_; }

 private:
  explicit embedded(std::unique_ptr<actors::host> h);
  /// errc::stopped once a shutdown began.
  std::optional<error> stopped(std::string_view what) const;
  /// Starts the one shutdown (on a thread of its own) unless it began.
  void begin_shutdown();
  /// Runs `a` on the host's executor; its result, or errc::stopped if the
  /// host shuts down first, goes to the returned one_shot.
  template <class T>
  std::shared_ptr<runtime::one_shot<result<T>>> start_guarded(awaitable<result<T>> a,
                                                              std::string_view what);
  template <class T>
  static awaitable<void> pump(awaitable<result<T>> a,
                              std::shared_ptr<runtime::one_shot<result<T>>> w);
  /// Registers `end` to run when the shutdown begins, while `owner` lives.
  /// False (and `end` run now) once it began.
  bool on_close(std::shared_ptr<void> owner, std::function<void()> end);
  static error refused_on_executor(std::string_view call);

  std::unique_ptr<actors::host> host_;
  actors::boot_report boot_;
  std::set<std::string> agents_;  // the registered agents' names
  mutable std::mutex m_;
  bool closing_ = false;  // under m_
  std::thread closer_;    // runs host::shutdown(); joined by the destructor
  std::shared_ptr<runtime::one_shot<int>> closed_ = runtime::one_shot<int>::make();
  // Guarded waits, ended with errc::stopped when the shutdown begins.
  std::vector<std::pair<std::weak_ptr<void>, std::function<void()>>> on_close_;  // under m_
};

template <class T>
result<T> embedded::block(awaitable<result<T>> a) {
  if (on_executor_thread()) return refused_on_executor("block()");
  auto w = start_guarded(std::move(a), "block()");
  return runtime::block_on<result<T>>([&w](auto done) { w->async_wait(std::move(done)); });
}

template <class T>
std::shared_ptr<runtime::one_shot<result<T>>> embedded::start_guarded(awaitable<result<T>> a,
                                                                      std::string_view what) {
  auto w = runtime::one_shot<result<T>>::make();
  std::weak_ptr<runtime::one_shot<result<T>>> weak = w;
  auto end = [weak, msg = std::string(what)] {
    if (auto s = weak.lock())
      s->set(error{errc::stopped, "the host shut down while " + msg + " waited"});
  };
  if (!on_close(w, std::move(end))) return w;  // closing: already ended
  boost::asio::co_spawn(executor(), pump<T>(std::move(a), w), boost::asio::detached);
  return w;
}

template <class T>
awaitable<void> embedded::pump(awaitable<result<T>> a,
                               std::shared_ptr<runtime::one_shot<result<T>>> w) {
  std::optional<error> failed;
  try {
    auto r = co_await std::move(a);
    w->set(std::move(r));
  } catch (const std::exception& e) {
    failed = error{errc::failed, e.what()};
  }
  if (failed) w->set(std::move(*failed));
}

}  // namespace tether
