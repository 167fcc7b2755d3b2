#pragma once
// Scheduled work (docs/cron.md): the scheduler, an actor that finds due jobs
// in the task store, claims them, runs each due occurrence as a task of kind
// `cron_run`, and records the run and the job's next step in one transaction.
//
// The life of one occurrence, each step durable before the next:
//   1. the claim compare-and-set: the job's claimant, lease and fencing
//      token (fence + 1), and the occurrence's run task admitted
//                                                [cron.claim.after_commit];
//   2. per attempt: the attempt recorded on the run task (running)
//                                                [cron.attempt.after_commit];
//   3. the command sent to the sandbox daemon under the attempt's id
//      (`<task>-a<attempt>`: the daemon's exec is idempotent by id, so a
//      claimant that takes over a lapsed claim follows the same process
//      instead of starting another)             [cron.dispatch.after_exec];
//   4. its completion followed (with the job's timeout; a kill is confirmed);
//      a failure is retried after an exponential backoff with jitter;
//   5. one transaction, only with the claim's fencing token: the run's
//      terminal state and record (status, duration, bounded scrubbed
//      output), the history pruned, and the job rescheduled from its
//      schedule (never from the completion time), deleted or disabled
//                                                [cron.complete.after_commit].
//
// Due detection does not poll: the loop sleeps on the wall clock until the
// earliest next run or lease expiry (runtime/wall_clock.hpp), and is woken by
// every change (a job added, removed, enabled; a run ended) and by a step of
// the wall clock, after which overdue jobs get the catch-up policy.
//
// Mailbox: the live runs (job → fence, attempt id) are touched only on the
// actor's executor: by its handlers and by the coroutines it spawns there.
#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <variant>
#include <vector>

#include "tether/actors/sandbox_channel.hpp"
#include "tether/persistence/task_store.hpp"
#include "tether/protocol/cron.hpp"
#include "tether/protocol/policy.hpp"
#include "tether/runtime/actor.hpp"
#include "tether/runtime/gate.hpp"
#include "tether/runtime/one_shot.hpp"
#include "tether/runtime/wall_clock.hpp"

namespace tether::actors {

using boost::asio::awaitable;

struct cron_options {
  /// A schedule file (JSON, docs/cron.md) reconciled at start; "" none.
  std::string file;
  /// Overdue occurrences at start (or after the wall clock stepped forward):
  /// run them (coalesced: one run per job, of its newest missed occurrence)
  /// or skip them. A job's own `catch_up` overrides it.
  bool catch_up = true;
  /// At most this many overdue jobs are caught up at once; the rest are
  /// skipped as if catch-up were off, with a warning naming them.
  int catch_up_cap = 32;
  /// A next run less than this late is due, not overdue (a timer's latency,
  /// a small clock correction).
  std::chrono::milliseconds overdue_grace{60000};
  /// A claim's lease, renewed every `renew_every` while its run goes on.
  std::chrono::milliseconds lease{60000};
  std::chrono::milliseconds renew_every{20000};
  /// Runs at once (claims are taken only for free slots).
  int max_runs = 8;
  std::size_t keep_runs = 50;  // history per job
  /// How often the completion transaction is tried before giving up (the
  /// claim then lapses and the occurrence is taken over); a delete that
  /// fails `delete_attempts` times becomes a disable.
  int complete_attempts = 8;
  int delete_attempts = 3;
  /// The work directory of a shell run whose job names none ("" = the
  /// process's current directory).
  std::string cwd;
  /// The clock (default: the system's, through a timerfd).
  std::shared_ptr<runtime::wall_clock> clock;
  /// Who claims (default: this process's identity, runtime/owner_identity.hpp).
  std::string claimant;
  /// Each owning agent's policy; an agent not named takes the host's default.
  std::map<std::string, protocol::session_policy> agent_policies;
  /// The loop ends instead of sleeping past this wall time (a bounded run:
  /// the CLI's virtual clock); nullopt: it runs until shutdown.
  std::optional<std::int64_t> stop_at;
  /// Instrumentation (tests): called on the scheduler's executor before each
  /// write of a run ("attempt", "complete"), so a test can inject a fault
  /// into exactly that transaction.
  std::function<void(std::string_view step)> on_step;
  /// Seeds the backoff's jitter (0: random).
  std::uint64_t jitter_seed = 0;
};

/// Runs a prompt job's occurrence: the agent's answer, or an error.
/// `run_id` is the attempt's id (a fresh session is named after it, so a
/// taken-over run finds the session instead of prompting again).
using cron_prompt_runner = std::function<awaitable<result<std::string>>(
    protocol::cron_job_spec, protocol::job_id run_id, protocol::session_policy)>;

/// What start() did.
struct cron_startup {
  persistence::task_store::reconciled file;  // the schedule file's jobs
  int claims_cleared = 0;                    // claims of provably gone claimants
  int caught_up = 0;                         // overdue jobs run (coalesced)
  int skipped = 0;                           // overdue jobs skipped (one-shots disabled)
  std::vector<std::string> warnings;
};

namespace cron_msg {
/// Something changed (a job, a run ended): the loop looks again now.
struct poke {};
/// The number of runs in flight here.
struct live_count {
  runtime::reply_to<int> reply;
};
/// Resolves once no run is in flight here.
struct await_idle {
  runtime::reply_to<void> reply;
};
/// Resolves once the loop, with no run in flight, went to sleep after a
/// pass that looked at the clock at or after `at` (tests drive a manual
/// clock with it: nothing is left to do at that time).
struct await_quiet {
  std::int64_t at = 0;
  runtime::reply_to<void> reply;
};
}  // namespace cron_msg

using cron_message =
    std::variant<cron_msg::poke, cron_msg::live_count, cron_msg::await_idle, cron_msg::await_quiet>;

class cron_scheduler : public runtime::actor<cron_scheduler, cron_message> {
 public:
  /// `channel`: the sandbox route shell runs go through; `prompts`: what
  /// runs a prompt job (may be empty: such jobs fail with a clear error).
  cron_scheduler(runtime::executor ex, persistence::task_store& store, cron_options opts,
                 std::shared_ptr<sandbox_channel> channel, cron_prompt_runner prompts,
                 protocol::session_policy default_policy,
                 std::function<void(const std::string&)> warn);

  /// Reconciles the schedule file, clears the claims of provably gone
  /// claimants, applies the catch-up policy to overdue jobs, then starts the
  /// loop. A schedule file that does not parse is refused with its error
  /// (nothing applied, the scheduler not started).
  awaitable<result<cron_startup>> start();
  /// Stops between batches: no new claim is taken, the runs in flight end
  /// (a dispatched command is not rolled back), then the mailbox stops.
  awaitable<void> shutdown();

  /// A runtime job (checked; its first occurrence computed from now).
  awaitable<result<persistence::cron_job_row>> add(protocol::cron_job_spec spec);
  awaitable<result<bool>> remove(std::string name);
  /// Enabling computes the next occurrence from now.
  awaitable<result<bool>> set_enabled(std::string name, bool enabled);
  awaitable<result<std::vector<persistence::cron_job_row>>> jobs();
  awaitable<result<std::vector<persistence::cron_run_row>>> runs(std::string name);
  /// Resolves once no run is in flight here.
  awaitable<void> idle();
  /// Resolves once the loop ended (stop_at passed, or nothing is left to do
  /// on a virtual clock, or shutdown) and every run it started ended.
  awaitable<void> finished();
  /// The number of runs in flight here.
  awaitable<int> live();
  /// Resolves once the loop is asleep with nothing left to do at time `at`
  /// (cron_msg::await_quiet).
  awaitable<void> quiet_at(std::int64_t at);

  const std::string& claimant() const { return claimant_; }
  runtime::wall_clock& clock() { return *clock_; }

  void handle(cron_message& m);

  /// The occurrence after `occurrence` a recurring job runs next: its
  /// schedule's next one, or (when that one already passed by `now`) the
  /// catch-up policy's: the newest passed one (catch-up on), else the
  /// first after now. nullopt: none left.
  static std::optional<std::int64_t> next_run_after(const protocol::cron_job_spec& spec,
                                                    std::int64_t occurrence, std::int64_t now,
                                                    bool catch_up);

 private:
  struct live_run {
    std::int64_t fence = 0;
  };
  static awaitable<void> loop(std::shared_ptr<cron_scheduler> self, runtime::gate::holder held);
  static awaitable<void> renew_loop(std::shared_ptr<cron_scheduler> self,
                                    runtime::gate::holder held);
  static awaitable<void> run(std::shared_ptr<cron_scheduler> self, persistence::cron_claim c,
                             runtime::gate::holder held);
  struct outcome {
    std::string status;  // ok | error | degraded | timed_out
    std::optional<int> exit;
    std::string output;
    std::string error;
  };
  awaitable<outcome> attempt_shell(const persistence::cron_claim& c, const std::string& run_id,
                                   const protocol::session_policy& policy);
  awaitable<outcome> attempt_prompt(const persistence::cron_claim& c, const std::string& run_id,
                                    const protocol::session_policy& policy);
  awaitable<void> complete(const persistence::cron_claim& c, persistence::cron_completion done);
  struct overdue {
    int caught_up = 0, skipped = 0;
  };
  awaitable<result<overdue>> resolve_overdue(std::int64_t now, const char* why,
                                             std::vector<std::string>* warnings);
  bool catch_up_of(const protocol::cron_job_spec& s) const {
    return s.catch_up.value_or(opts_.catch_up);
  }
  std::chrono::milliseconds backoff(const protocol::cron_job_spec& s, int attempt);
  const protocol::session_policy& policy_of(const std::string& agent) const;
  void ended(const std::string& job);

  persistence::task_store& store_;
  const cron_options opts_;
  std::shared_ptr<sandbox_channel> channel_;
  const cron_prompt_runner prompts_;
  const protocol::session_policy default_policy_;
  const std::function<void(const std::string&)> warn_;
  std::shared_ptr<runtime::wall_clock> clock_;
  std::string claimant_;
  runtime::gate gate_;
  std::atomic<bool> stopping_{false};
  std::shared_ptr<boost::asio::steady_timer> renew_timer_;
  std::shared_ptr<runtime::one_shot<int>> loop_done_ = runtime::one_shot<int>::make();
  // On the executor only.
  std::map<std::string, live_run> live_;
  std::vector<runtime::reply_to<void>> idle_waiters_;
  std::vector<std::pair<std::int64_t, runtime::reply_to<void>>> quiet_waiters_;
  // Set while the loop sleeps: the pass's time, and the deadline it sleeps
  // to (nothing is due before it unless something changes, which resets it).
  std::optional<std::int64_t> asleep_after_;
  std::int64_t asleep_until_ = 0;
  // Counts the changes (pokes, ended runs): a pass that began before one
  // does not go to sleep as if it had seen it.
  std::uint64_t changes_ = 0;
  void notify_quiet();
  std::mt19937_64 jitter_;
};

}  // namespace tether::actors
