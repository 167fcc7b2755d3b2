#pragma once
// SOP runs (docs/sop.md): the engine, an actor that owns run progression on
// the one task store. A run is a task of kind `sop_run`; each step that does
// work is a child task of kind `sop_step`; every save is a compare-and-set on
// the run's revision through the single writer.
//
// The life of a run, each step durable before the next:
//   1. admitted (phase pending), with its definition snapshotted, an
//      `admitted` event and an audit entry        [sop.admit.after_commit];
//   2. claimed: the execution claim (owner, lease), only while fewer than
//      the SOP's max_concurrent runs hold one        [sop.claim.after_commit];
//   3. per working step (shell, prompt): the step's task admitted with the
//      visit counted and the attempt recorded       [sop.step.after_admit];
//      each later attempt recorded before it is sent [sop.attempt.after_commit];
//      a shell's command sent to the sandbox daemon under the attempt's id
//                                                  [sop.dispatch.after_exec];
//      its outcome, the step task's terminal transition and the next step (or
//      the run's terminal transition) in one save   [sop.step.after_end];
//   4. an approval or a checkpoint parks the run: phase waiting_approval or
//      paused_checkpoint, the claim released in the same save
//                                                   [sop.park.after_commit];
//      an approval, a rejection or a resume (through the API) makes it
//      pending at its next step; the next claim takes it on.
//
// A process that dies mid-step leaves the step's task running and the run's
// claim to lapse (or to be cleared at the next start, its owner provably
// gone). The next claimant resolves the step through its task: an
// idempotent step is attempted again under the same id; another is followed
// if the daemon still has its command, else it is `lost` and the step's
// failure transition is taken. Nothing is silently run twice.
//
// Mailbox: the runs driven here (run → cancel flag, the attempt in flight)
// are touched only on the actor's executor.
#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "tether/actors/sandbox_channel.hpp"
#include "tether/persistence/task_store.hpp"
#include "tether/protocol/policy.hpp"
#include "tether/protocol/sop.hpp"
#include "tether/runtime/actor.hpp"
#include "tether/runtime/gate.hpp"
#include "tether/runtime/one_shot.hpp"
#include "tether/runtime/wall_clock.hpp"

namespace tether::actors {

using boost::asio::awaitable;

/// Where runs are kept.
enum class sop_persistence {
  /// The durable run store (the host's database, or `sop_options::db`); the
  /// engine refuses to start when it cannot be opened.
  durable,
  /// A private database in memory-backed temporary storage, deleted at
  /// shutdown: runs do not survive a restart, and every status says so.
  memory,
  /// Durable; if the store cannot be opened, a warning and then memory.
  durable_or_memory,
};

/// An approval wait whose timeout passed with `escalate`: who should know.
struct sop_escalation {
  protocol::job_id run;
  std::string sop, step;
  std::vector<std::string> approvers;
  std::int64_t waiting_since = 0;
};

struct sop_options {
  /// The directory of SOP files (protocol/sop.hpp); "" none (no SOP can start).
  std::string dir;
  sop_persistence persistence = sop_persistence::durable;
  /// The durable store's file: "" = the host's database.
  std::string db;
  /// An execution claim's lease, renewed every `renew_every` while its run goes on.
  std::chrono::milliseconds lease{3600 * 1000};
  std::chrono::milliseconds renew_every{60 * 1000};
  int max_runs = 16;                       // driven here at once
  std::chrono::milliseconds backoff{500};  // a step's first retry's pause, doubling
  std::chrono::milliseconds backoff_max{30000};
  /// The work directory of a shell step that names none ("" = the process's).
  std::string cwd;
  std::shared_ptr<runtime::wall_clock> clock;  // default: the system's
  std::string claimant;                        // default: this process's identity
  /// Each owning agent's policy; an agent not named takes the host's default.
  std::map<std::string, protocol::session_policy> agent_policies;
  /// Called (on the engine's executor) when an approval wait escalates.
  std::function<void(const sop_escalation&)> on_escalate;
};

/// Runs a prompt step: the agent's answer, or an error. `attempt` names the
/// attempt (a fresh session is named after it).
using sop_prompt_runner = std::function<awaitable<result<std::string>>(
    std::string agent, std::string prompt, protocol::job_id attempt, protocol::session_policy)>;

/// What start() did.
struct sop_startup {
  std::vector<std::string> sops;  // the definitions loaded, by name
  bool durable = true;            // false: runs are kept in memory only
  int claims_cleared = 0;         // claims of provably gone claimants (and this claimant's own)
  std::vector<std::string> warnings;
};

/// A run as the API shows it.
struct sop_run_view {
  protocol::job_id id;
  std::string sop;
  std::string state;  // pending | running | waiting_approval | paused_checkpoint | completed |
                      // failed | cancelled
  std::string step;   // the current (or last) step's name
  std::int64_t revision = 0;
  std::string claim;  // the execution claim's holder; "" none
  std::string error;  // a failed run's reason
  bool durable = true;
};

namespace sop_msg {
struct poke {};
/// Resolves once no run is driven here and the loop sleeps after a pass that
/// began after the last change and looked at the clock at or after `at`.
struct await_quiet {
  std::int64_t at = 0;
  runtime::reply_to<void> reply;
};
/// Cancels a run driven here: its step is stopped (confirmed), then the
/// terminal compare-and-set. False: not driven here.
struct cancel_live {
  protocol::job_id run;
  std::string who, reason;
  runtime::reply_to<bool> reply;
};
/// Resolves once the drive of `run` here ended (at once if none).
struct await_run {
  protocol::job_id run;
  runtime::reply_to<void> reply;
};
}  // namespace sop_msg

using sop_message =
    std::variant<sop_msg::poke, sop_msg::await_quiet, sop_msg::cancel_live, sop_msg::await_run>;

class sop_engine : public runtime::actor<sop_engine, sop_message> {
 public:
  /// `store`: the host's task store (the durable store unless opts.db names
  /// another file); `channel`: the sandbox route shell steps go through.
  sop_engine(runtime::executor ex, persistence::task_store& store, sop_options opts,
             std::shared_ptr<sandbox_channel> channel, sop_prompt_runner prompts,
             protocol::session_policy default_policy, std::function<void(const std::string&)> warn);
  ~sop_engine();

  /// Loads the definitions (any bad file refuses the start, naming it),
  /// opens the run store the options ask for, clears the claims of provably
  /// gone claimants, then starts the loop.
  awaitable<result<sop_startup>> start();
  /// No new claim; the runs driven here stop between steps (a step in
  /// flight ends first; its claim is released for the next start).
  awaitable<void> shutdown();

  /// The definitions loaded at start.
  const std::vector<protocol::sop_definition>& definitions() const { return defs_; }
  bool durable() const { return durable_; }

  /// Admits a run of `sop` with `input` (at most its max_payload_bytes).
  awaitable<result<protocol::job_id>> start_run(std::string sop, std::string input,
                                                std::string started_by);
  /// Approves (or rejects) the approval a run waits for, as `approver`, who
  /// must be one of the step's approvers.
  awaitable<result<void>> approve(protocol::job_id run, std::string approver, std::string note);
  awaitable<result<void>> reject(protocol::job_id run, std::string approver, std::string reason);
  /// Resumes a run paused at a checkpoint.
  awaitable<result<void>> resume(protocol::job_id run, std::string who);
  /// Cancels a run in any state that is not terminal: a running step is
  /// stopped (confirmed by the daemon) before the terminal compare-and-set.
  awaitable<result<void>> cancel(protocol::job_id run, std::string who, std::string reason);

  awaitable<result<std::optional<sop_run_view>>> run(protocol::job_id id);
  awaitable<result<std::vector<sop_run_view>>> runs();
  awaitable<result<std::vector<persistence::task_event>>> events(protocol::job_id id);
  awaitable<result<std::vector<persistence::audit_entry>>> audit(std::string subject);
  /// The run store (the host's, or the engine's own).
  persistence::task_store& store() { return *store_; }

  /// Resolves once nothing is driven here and the loop sleeps with nothing
  /// to do at time `at` (sop_msg::await_quiet): how tests wait without sleeping.
  awaitable<void> quiet(std::int64_t at = 0);
  /// Resolves once the drive of `run` here ended.
  awaitable<void> run_ended(protocol::job_id run);

  const std::string& claimant() const { return claimant_; }
  runtime::wall_clock& clock() { return *clock_; }

  void handle(sop_message& m);

  /// The view of a stored run.
  static sop_run_view view_of(const persistence::sop_run_row& r, bool durable);

 private:
  struct live_run {
    bool cancel = false;
    std::string cancel_by, cancel_reason;
    std::string attempt;  // the daemon id of the shell attempt in flight, if any
    std::shared_ptr<boost::asio::cancellation_signal> prompt_signal;
    std::vector<runtime::reply_to<void>> waiters;
  };
  struct drive_ctx;
  static awaitable<void> loop(std::shared_ptr<sop_engine> self, runtime::gate::holder held);
  static awaitable<void> renew_loop(std::shared_ptr<sop_engine> self, runtime::gate::holder held);
  static awaitable<void> drive(std::shared_ptr<sop_engine> self, persistence::sop_run_row row,
                               runtime::gate::holder held);
  awaitable<bool> work_step(drive_ctx& c);
  awaitable<result<void>> save(drive_ctx& c, persistence::sop_save s);
  awaitable<void> expire_waits(std::int64_t now);
  /// An approval's or checkpoint's decision: the CAS that moves a parked
  /// run on (or ends it).
  awaitable<result<void>> decide(protocol::job_id run, std::string phase, bool success,
                                 std::string actor, std::string event, std::string audit,
                                 std::string detail);
  awaitable<result<void>> open_store(sop_startup& out);
  const protocol::session_policy& policy_of(const std::string& agent) const;
  void ended(const protocol::job_id& run);
  void notify_quiet();
  void poke();

  persistence::task_store* store_;
  const sop_options opts_;
  std::shared_ptr<sandbox_channel> channel_;
  const sop_prompt_runner prompts_;
  const protocol::session_policy default_policy_;
  const std::function<void(const std::string&)> warn_;
  std::shared_ptr<runtime::wall_clock> clock_;
  std::string claimant_;
  std::vector<protocol::sop_definition> defs_;  // set by start(), then read-only
  bool durable_ = true;                         // set by start(), then read-only
  // The engine's own store (opts.db, or memory mode).
  std::shared_ptr<persistence::writer> own_writer_;
  std::unique_ptr<persistence::task_store> own_store_;
  std::string memory_path_;
  runtime::gate gate_;
  std::atomic<bool> stopping_{false};
  std::shared_ptr<boost::asio::steady_timer> renew_timer_;
  // On the executor only.
  std::map<std::string, live_run> live_;
  std::vector<std::pair<std::int64_t, runtime::reply_to<void>>> quiet_waiters_;
  // Set while the loop sleeps: its pass's time, and the deadline it sleeps to
  // (nothing is due before it unless something changes, which resets it).
  std::optional<std::int64_t> asleep_after_;
  std::int64_t asleep_until_ = 0;
  std::uint64_t changes_ = 0;
};

}  // namespace tether::actors
