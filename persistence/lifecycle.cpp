// The lifecycle table (lifecycle.hpp): seed 001's change checklist per kind
// of task, and the read-only record of one task that `tether inspect --task`
// answers it with.
#include "tether/persistence/lifecycle.hpp"

#include <SQLiteCpp/Statement.h>

#include <algorithm>

#include "tether/persistence/task_store.hpp"

namespace tether::persistence {

std::string_view to_string(durability d) {
  switch (d) {
    case durability::process_local:
      return "process-local";
    case durability::durably_supervised:
      return "durably supervised";
    case durability::restart_resumable:
      return "restart-resumable";
  }
  return "unknown";
}

std::string_view to_string(field_source s) {
  switch (s) {
    case field_source::row:
      return "row";
    case field_source::elsewhere:
      return "elsewhere";
    case field_source::absent:
      return "absent";
  }
  return "unknown";
}

namespace {

// Every value of a state enum, in declaration order: its to_string() says
// "unknown" past the last one. REQUIRES: the enumerators are 0..n-1 (none
// of these enums gives a value of its own).
template <class E>
std::vector<E> every() {
  std::vector<E> out;
  for (int i = 0; i < 64; ++i) {
    auto e = static_cast<E>(i);
    if (to_string(e) == "unknown") break;
    out.push_back(e);
  }
  return out;
}

// What each state means. No default: -Wswitch names a state added to an
// enum and not described here, and an empty meaning fails the test.
std::string_view meaning(job_status s) {
  switch (s) {
    case job_status::running:
      return "the child session's busy period is open (spawned, not yet settled); boot resumes it";
    case job_status::completed:
      return "the busy period settled; its report is the body and the terminal receipt";
    case job_status::error:
      return "the busy period ended in an error (the agent failed, or the resume budget ran out "
             "after restarts)";
    case job_status::cancelled:
      return "the busy period was interrupted (cancel_child, interrupt, delete_session)";
  }
  return "";
}

std::string_view meaning(owned_state s) {
  switch (s) {
    case owned_state::admitted:
      return "the owner scope is written; the exec is not confirmed (boot asks the daemon, "
             "read-only)";
    case owned_state::running:
      return "the sandbox daemon runs it and its job actor follows it (`started` receipt written)";
    case owned_state::completed:
      return "it exited with status 0";
    case owned_state::failed:
      return "it exited with another status, or the daemon refused to start it";
    case owned_state::cancelled:
      return "the daemon confirmed its kill";
    case owned_state::lost:
      return "how it ended is unknown (the daemon does not know it): exit -1, never run again";
  }
  return "";
}

std::string_view meaning(delegate_state s) {
  switch (s) {
    case delegate_state::running:
      return "registered with its owner identity and a lease; the owner's worker runs it";
    case delegate_state::completed:
      return "its settlement intent was promoted: artifact published, its digest recorded";
    case delegate_state::failed:
      return "the runner or the publication failed, or recovery found the artifact missing or "
             "not matching its digest";
    case delegate_state::cancelled:
      return "a cancel won the compare-and-set (the worker's token is signalled only then)";
    case delegate_state::lost:
      return "recovery found its owner provably gone, with no settlement intent left";
    case delegate_state::timed_out:
      return "the run timeout won, or recovery found its lease expired while its owner lives";
  }
  return "";
}

std::string_view local_shell_meaning(job_status s) {
  switch (s) {
    case job_status::running:
      return "";  // refused by boot: schema step 6 settled every running one as lost
    case job_status::completed:
    case job_status::error:
    case job_status::cancelled:
      return "ended under a build before schema step 6, which recorded how";
  }
  return "";
}

std::string_view meaning(goal_state s) {
  switch (s) {
    case goal_state::running:
      return "open: tasks of its tree may join it (spawn_request::goal, delegate_request::goal)";
    case goal_state::completed:
      return "closed by a session of its tree as done (host::close_goal); no task joins it now";
    case goal_state::failed:
      return "closed by a session of its tree as failed; no task joins it now";
    case goal_state::cancelled:
      return "closed by a session of its tree as cancelled; its members are not cancelled with it";
  }
  return {};
}

// The kinds whose rows store the one state machine's words directly (cron
// and SOP runs, SOP steps): admitted and running, then the terminal word of
// each transition (task_transitions: transition_of_word), so a transition
// added to protocol::transition must be described for each kind here.
enum class run_kind { cron_run, sop_run, sop_step };

std::string_view live_meaning(run_kind k, bool running) {
  switch (k) {
    case run_kind::cron_run:
      return running ? "an attempt was recorded by its claimant (payload.attempt) and is in flight"
                     : "its occurrence was claimed (the claim, with a fencing token, is on the "
                       "cron_jobs row) and no attempt was recorded yet";
    case run_kind::sop_run:
      return running ? "claimed at least once: its payload.phase says pending (behind the cap or "
                       "moved on by a decision), running (claimed, driven step by step), "
                       "waiting_approval or paused_checkpoint (parked, no claim)"
                     : "admitted (payload.phase pending), never claimed yet";
    case run_kind::sop_step:
      return running ? "its command or prompt is in flight (attempt payload.inflight of its run)"
                     : "";  // admitted running: never stored
  }
  return "";
}

std::string_view meaning(run_kind k, protocol::transition t) {
  using protocol::transition;
  switch (t) {
    case transition::started:
      return "";  // not a state: the receipt a shell writes when it starts
    case transition::completed:
      switch (k) {
        case run_kind::cron_run:
          return "the attempt ended ok or degraded; the job's next run is set in the same "
                 "transaction";
        case run_kind::sop_run:
          return "a step's (or an approval's) success transition reached the end";
        case run_kind::sop_step:
          return "its command exited 0 (or its prompt answered); the run's next step was saved "
                 "in the same transaction";
      }
      return "";
    case transition::failed:
      switch (k) {
        case run_kind::cron_run:
          return "the last attempt failed (or was refused by the agent's policy)";
        case run_kind::sop_run:
          return "a failure transition reached `fail`, a rejection, max_visits, or a step that "
                 "was lost";
        case run_kind::sop_step:
          return "its last attempt failed (retries spent) or was refused by the policy";
      }
      return "";
    case transition::cancelled:
      switch (k) {
        case run_kind::cron_run:
          return "skipped: no owning agent, or overdue with catch-up off; it never ran";
        case run_kind::sop_run:
          return "sop_engine::cancel (a running step stopped first, confirmed), or an approval "
                 "timeout with on_timeout cancel";
        case run_kind::sop_step:
          return "its run was cancelled while it ran; its command was stopped first";
      }
      return "";
    case transition::lost:
      switch (k) {
        case run_kind::cron_run:
          return "";  // a lost command is recorded as a failed run
        case run_kind::sop_run:
          return "";  // a lost step takes its failure transition
        case run_kind::sop_step:
          return "in flight when its process died, not idempotent, and the daemon has no "
                 "record of it: never sent again; the run takes its failure transition";
      }
      return "";
    case transition::timed_out:
      switch (k) {
        case run_kind::cron_run:
          return "the attempt ran past the job's timeout and was killed";
        case run_kind::sop_run:
          return "";  // a step's timeout is the step's state
        case run_kind::sop_step:
          return "its last attempt ran past the step's timeout_ms and was killed";
      }
      return "";
  }
  return "";
}

std::vector<state_meaning> run_states(run_kind k) {
  std::vector<state_meaning> out;
  for (bool running : {false, true})
    if (auto m = live_meaning(k, running); !m.empty())
      out.push_back({running ? "running" : "admitted", false, m});
  for (auto t : every<protocol::transition>())
    if (auto m = meaning(k, t); !m.empty()) out.push_back({std::string(to_string(t)), true, m});
  return out;
}

std::vector<state_meaning> subagent_states() {
  std::vector<state_meaning> out;
  for (auto s : every<job_status>())
    out.push_back({task_state_word(s), s != job_status::running, meaning(s)});
  return out;
}

std::vector<state_meaning> shell_states() {
  std::vector<state_meaning> out;
  for (auto s : every<owned_state>())
    out.push_back({std::string(to_string(s)), is_terminal(s), meaning(s)});
  return out;
}

std::vector<state_meaning> delegate_states() {
  std::vector<state_meaning> out;
  for (auto s : every<delegate_state>())
    out.push_back({std::string(to_string(s)), s != delegate_state::running, meaning(s)});
  return out;
}

// History: the terminal words a v3 `jobs` row carried over (schema step 4),
// and `lost` for one still running at step 6.
std::vector<state_meaning> local_shell_states() {
  std::vector<state_meaning> out;
  for (auto s : every<job_status>())
    if (s != job_status::running) out.push_back({task_state_word(s), true, local_shell_meaning(s)});
  out.push_back({std::string(to_string(owned_state::lost)), true,
                 "still running at schema step 6 (its result was never kept): settled lost, its "
                 "owner told once; never run again"});
  return out;
}

std::vector<state_meaning> goal_states() {
  std::vector<state_meaning> out;
  for (auto s : every<goal_state>())
    out.push_back({std::string(to_string(s)), s != goal_state::running, meaning(s)});
  return out;
}

using F = field_source;

std::vector<lifecycle> build() {
  std::vector<lifecycle> out;
  {
    lifecycle l;
    l.kind = "subagent";
    l.admitted = "yes";
    l.owner =
        "the child session's run coordinator (actors/session.hpp) settles it; the parent's inbox "
        "(actors/inbox.hpp) admits its report";
    l.store =
        "tasks (its report: the terminal receipt in receipts, written in the settle "
        "transaction)";
    l.durable = durability::restart_resumable;
    l.durable_why =
        "a busy period open at a crash is resumed at boot from the durable transcript (at most "
        "host_options::resume_budget times, then settled failed)";
    l.cancel =
        "the parent's cancel_child (agent_context), host::interrupt or delete_session: the "
        "child's drain is cancelled and settles cancelled, reporting once";
    l.in_flight =
        "whatever the child's agent already started: its shells are owned jobs of their "
        "own and keep running until cancelled";
    l.states_from = "persistence::job_status, stored as task_state_word() (error is failed)";
    l.states = subagent_states();
    l.waits =
        "none: no waiting, approval or checkpoint state (a withholding turn is a session "
        "policy, not a task state)";
    l.fields = {
        {"parent", F::row, "parent_id: the parent session owed the report (a session, not a task)"},
        {"child", F::row, "child_id: the child session whose busy period it reports"},
        {"agent", F::elsewhere, "the child session's row (sessions.agent), not the task row"},
        {"originator", F::elsewhere,
         "receipts.scope: the parent's tenant, the parent as thread, its turn"},
        {"tenant", F::elsewhere, "the parent session's tenant, in receipts.scope"},
        {"depth", F::elsewhere, "sessions.depth of its child (0: a top-level session)"},
        {"usage", F::row,
         "input_tokens, output_tokens: what the child's agent reported "
         "(agent_context::report_usage) while this task ran (a background spawn's)"},
        {"owner", F::absent, "no owner process recorded: the next boot on the file resumes it"},
        {"lease", F::absent, "no heartbeat lease"},
        {"goal", F::row,
         "goal_id: spawn_request::goal (a background spawn's), checked open in "
         "the admitting transaction"},
    };
    l.recovery_can_duplicate = true;
    l.recovery =
        "a resumed busy period runs the agent again from its durable transcript, so a side effect "
        "of the crashed run that was not recorded can happen again (the report is not duplicated)";
    l.delivery_idempotent = true;
    l.delivery =
        "the terminal receipt <task>/<transition> stays pending until the parent's inbox "
        "admits it under its notification id; boot resends it and a repeat is dropped";
    out.push_back(std::move(l));
  }
  {
    lifecycle l;
    l.kind = "shell";
    l.admitted = "yes";
    l.owner =
        "the job queue (actors/job_queue.hpp) and one job actor per live job "
        "(actors/job.hpp); the command runs in the sandbox daemon";
    l.store = "tasks (receipts: its started and terminal receipts)";
    l.durable = durability::durably_supervised;
    l.durable_why =
        "the command runs in the sandbox daemon, which outlives the host; boot reattaches "
        "read-only and follows it or settles how it ended, never runs it again";
    l.cancel =
        "job_queue::cancel (the owning turn's cancel_job), stop_turn or stop_thread: the "
        "daemon's confirmed kill, then the compare-and-set to cancelled";
    l.in_flight =
        "the command until the daemon confirms its kill; a completion after a confirmed "
        "cancel is dropped";
    l.states_from = "persistence::owned_state";
    l.states = shell_states();
    l.waits = "none: no waiting, approval or checkpoint state";
    l.fields = {
        {"parent", F::absent, "no parent task or session column"},
        {"child", F::absent, "child_id is not used"},
        {"agent", F::absent, "not recorded"},
        {"originator", F::row,
         "thread, turn, scope (with sandbox and generation): the launching turn, supplied by the "
         "runtime"},
        {"tenant", F::row, "tenant, equal to scope.tenant"},
        {"depth", F::absent, "not recorded"},
        {"usage", F::absent, "no token counts recorded (a shell has no model)"},
        {"owner", F::elsewhere,
         "the sandbox daemon of scope.sandbox at scope.generation; no process identity"},
        {"lease", F::absent, "no heartbeat lease on the task"},
        {"goal", F::absent, "a shell joins no goal"},
    };
    l.recovery_can_duplicate = false;
    l.recovery =
        "recovery never dispatches: it reattaches read-only, an exec is idempotent by job "
        "id, and a job the daemon does not know ends lost, never run again";
    l.delivery_idempotent = true;
    l.delivery =
        "receipts <task>/<transition> stay pending until acknowledged; boot resends every "
        "pending one and the owner's inbox drops a repeat by the receipt id";
    out.push_back(std::move(l));
  }
  {
    lifecycle l;
    l.kind = "delegate";
    l.admitted = "yes";
    l.owner =
        "the delegates actor (actors/delegates.hpp): its live registry and the worker it "
        "spawns";
    l.store =
        "tasks (settlement_intents: an unpromoted settlement; receipts: its terminal "
        "receipt)";
    l.durable = durability::durably_supervised;
    l.durable_why =
        "the worker is a coroutine of the owning process; the row (owner identity, lease, "
        "intent) lets recovery settle it truthfully, never run it again";
    l.cancel =
        "delegates::cancel by its originator (or the run timeout): the compare-and-set to "
        "cancelled, and only if it won the worker's token is signalled";
    l.in_flight =
        "the runner until it observes its token (what it already did stays done); an "
        "artifact published before the cancel stays on disk, unpromoted";
    l.states_from = "persistence::delegate_state (a row stored 'admitted' reads as running)";
    l.states = delegate_states();
    l.waits = "none: no waiting, approval or checkpoint state";
    l.fields = {
        {"parent", F::absent, "no parent task column (the originator is a session's turn)"},
        {"child", F::absent, "child_id is not used"},
        {"agent", F::row, "payload.agent"},
        {"originator", F::row,
         "thread, turn, scope: the calling turn, supplied by the runtime; result, wait, list and "
         "cancel check it"},
        {"tenant", F::row, "tenant"},
        {"depth", F::row, "payload.depth (the caller's depth + 1)"},
        {"usage", F::row,
         "input_tokens, output_tokens: what its session's agent reported "
         "(agent_context::report_usage)"},
        {"owner", F::row, "owner: v1:<pid>:<start>:<boot id>:<nonce>"},
        {"lease", F::row, "lease_until (ms since the epoch), renewed by the owner's heartbeat"},
        {"goal", F::row,
         "goal_id: delegate_request::goal, checked open in the admitting "
         "transaction"},
    };
    l.recovery_can_duplicate = false;
    l.recovery =
        "recovery never runs the work again: it promotes an intent only for a provably gone owner "
        "and an artifact matching its digest, else fails, loses or times out; an owner alive or "
        "uncertain keeps its row, and each pass says why";
    l.delivery_idempotent = true;
    l.delivery =
        "the terminal receipt <task>/<transition> stays pending until admitted; boot "
        "resends it through the one delivery path and the inbox drops a repeat";
    out.push_back(std::move(l));
  }
  {
    lifecycle l;
    l.kind = "local_shell";
    l.admitted = "no: history; builds since schema step 6 run every shell as an owned job";
    l.owner = "none now (an earlier build's session ran it in its own process)";
    l.store = "tasks (history only)";
    l.durable = durability::process_local;
    l.durable_why =
        "it ran in the host process of a previous build, which kept no result this build can "
        "read; schema step 6 settled every running one as lost";
    l.cancel = "none: nothing of this kind runs";
    l.in_flight = "nothing this build can see";
    l.states_from = "schema steps 4 and 6 (terminal persistence::job_status words, and lost)";
    l.states = local_shell_states();
    l.waits = "none";
    l.fields = {
        {"parent", F::absent, "no parent"},
        {"child", F::row, "child_id: the session that owned it (its notice went there)"},
        {"agent", F::absent, "not recorded"},
        {"originator", F::row, "child_id (the owning session)"},
        {"tenant", F::absent, "not recorded"},
        {"depth", F::absent, "not recorded"},
        {"usage", F::absent, "not recorded"},
        {"owner", F::absent, "not recorded"},
        {"lease", F::absent, "not recorded"},
        {"goal", F::absent, "not recorded"},
    };
    l.recovery_can_duplicate = false;
    l.recovery = "this build never runs one: step 6 settled the running ones as lost";
    l.delivery_idempotent = true;
    l.delivery =
        "step 6 admitted its one notice under its notification id (a repeat is dropped "
        "by the inbox's key); nothing else is owed";
    out.push_back(std::move(l));
  }
  {
    lifecycle l;
    l.kind = "goal";
    l.admitted = "yes";
    l.owner = "the host (host::create_goal, goal, close_goal); no actor runs it";
    l.store = "tasks (its members: tasks whose goal_id names it; receipts: its closing notice)";
    l.durable = durability::restart_resumable;
    l.durable_why =
        "a goal is a record, not a process: it stays open across restarts until a session of "
        "its tree closes it";
    l.cancel = "host::close_goal(.., \"cancelled\") by a session of its tree";
    l.in_flight =
        "its members: closing a goal cancels none of them; they keep running and settle as "
        "their own kinds do";
    l.states_from = "persistence::goal_state";
    l.states = goal_states();
    l.waits = "none: open until closed; no approval or checkpoint state";
    l.fields = {
        {"parent", F::absent, "a goal has no parent task"},
        {"child", F::elsewhere, "its members: tasks with goal_id = its id"},
        {"agent", F::absent, "a goal runs no agent"},
        {"originator", F::row, "thread, turn, scope: the session that created it"},
        {"tenant", F::row, "tenant"},
        {"depth", F::absent, "not recorded"},
        {"usage", F::elsewhere, "summed over its members' input_tokens and output_tokens"},
        {"owner", F::absent, "no owning process: nothing runs"},
        {"lease", F::absent, "no lease: nothing runs"},
        {"goal", F::absent, "goals do not nest"},
    };
    l.recovery_can_duplicate = false;
    l.recovery = "recovery does nothing to a goal: it runs nothing";
    l.delivery_idempotent = true;
    l.delivery =
        "its closing receipt <goal>/<transition> stays pending until admitted into the "
        "creator's inbox; boot resends it and the inbox drops a repeat";
    out.push_back(std::move(l));
  }
  {
    lifecycle l;
    l.kind = "cron_run";
    l.admitted = "yes";
    l.owner =
        "the cron scheduler (actors/cron.hpp): its loop claims the due job and drives the "
        "occurrence's attempts";
    l.store =
        "tasks (the job's definition, next run and claim: cron_jobs; its terminal receipt is "
        "written dropped)";
    l.durable = durability::restart_resumable;
    l.durable_why =
        "the run task and the job's claim are durable: a claim whose claimant died lapses (or "
        "is cleared at start, its owner provably gone) and the next claim takes the run over at "
        "the attempt it recorded";
    l.cancel =
        "no API cancels a run in flight: its attempt ends by itself or is killed at the job's "
        "timeout; removing or disabling the job stops later occurrences";
    l.in_flight =
        "the attempt's command in the sandbox daemon (sent under <task>-a<attempt>), or a "
        "prompt's turn in its session, until it ends";
    l.states_from =
        "the one state machine's words: admitted, running, then protocol::transition's "
        "terminal words";
    l.states = run_states(run_kind::cron_run);
    l.waits = "none: no waiting, approval or checkpoint state";
    l.fields = {
        {"parent", F::absent, "no parent task: its job is payload.job (a cron_jobs row)"},
        {"child", F::absent,
         "not recorded (an isolated prompt's session is named after the attempt)"},
        {"agent", F::row, "payload.agent: the job's owning agent"},
        {"originator", F::row, "thread cron:<job>, turn the occurrence (ms), scope"},
        {"tenant", F::row, "tenant"},
        {"depth", F::absent, "not recorded: a run is not part of a tree of sessions"},
        {"usage", F::absent, "not recorded"},
        {"owner", F::elsewhere, "cron_jobs.claim_owner (the claimant), with its fencing token"},
        {"lease", F::elsewhere, "cron_jobs.claim_until, renewed while the run goes on"},
        {"goal", F::absent, "a run joins no goal"},
    };
    l.recovery_can_duplicate = true;
    l.recovery =
        "a shell attempt taken over is sent under the same id and the daemon attaches to it "
        "(once, unless the daemon itself lost it); a prompt in the agent's main session may be "
        "asked again";
    l.delivery_idempotent = true;
    l.delivery =
        "its terminal receipt is written dropped: no inbox is owed it; the record is the row "
        "and the job's last status";
    out.push_back(std::move(l));
  }
  {
    lifecycle l;
    l.kind = "sop_run";
    l.admitted = "yes";
    l.owner =
        "the SOP engine (actors/sop.hpp): its loop claims runs under each SOP's cap; a drive "
        "per claimed run saves each step";
    l.store =
        "tasks (its progression in payload; its events in task_events; who approved what in "
        "audit_log, never read to decide; its terminal receipt is written dropped)";
    l.durable = durability::restart_resumable;
    l.durable_why =
        "every save is a revision compare-and-set of its payload: a restart takes the run on "
        "at its step, a parked run comes back parked without a claim, a step in flight is "
        "resolved through its task";
    l.cancel =
        "sop_engine::cancel in any state that is not terminal: a running step's command is "
        "stopped (confirmed by the daemon) before the terminal compare-and-set";
    l.in_flight =
        "nothing of a shell step (stopped first); a prompt step's turn is cancelled through its "
        "signal, and what it already did stays done";
    l.states_from =
        "the one state machine's words: admitted, running, then protocol::transition's "
        "terminal words; the SOP state is payload.phase while it is live";
    l.states = run_states(run_kind::sop_run);
    l.waits =
        "waiting_approval and paused_checkpoint (payload.phase of a running run, holding no "
        "claim); an approval's timeout escalates, cancels or, only when the definition says so, "
        "approves";
    l.fields = {
        {"parent", F::absent, "no parent task"},
        {"child", F::elsewhere, "its steps: sop_step tasks whose parent_id is the run"},
        {"agent", F::row, "payload.definition.agent: the SOP's agent"},
        {"originator", F::row,
         "thread sop:<sop>, turn the run id, scope; who started it: the audit log (sop.start)"},
        {"tenant", F::row, "tenant"},
        {"depth", F::absent, "not recorded: a run is not part of a tree of sessions"},
        {"usage", F::absent, "not recorded"},
        {"owner", F::row, "owner: the claimant while claimed (none while parked)"},
        {"lease", F::row, "lease_until, renewed while the run is driven"},
        {"goal", F::absent, "a run joins no goal"},
    };
    l.recovery_can_duplicate = false;
    l.recovery =
        "the run itself repeats nothing: each step is its own task (see sop_step), and a "
        "decision or a save at a stale revision is refused";
    l.delivery_idempotent = true;
    l.delivery =
        "its terminal receipt is written dropped: no inbox is owed it; the record is the row and "
        "its events";
    out.push_back(std::move(l));
  }
  {
    lifecycle l;
    l.kind = "sop_step";
    l.admitted = "yes";
    l.owner = "the SOP engine's drive of its run (actors/sop.hpp)";
    l.store =
        "tasks (its terminal receipt is written dropped; its run's payload names it in flight)";
    l.durable = durability::durably_supervised;
    l.durable_why =
        "its row and its attempt's daemon id let the next claimant of its run follow it; it is "
        "run again only when the step is declared idempotent";
    l.cancel = "cancelling its run: the command is stopped through the daemon, confirmed";
    l.in_flight =
        "nothing of a shell attempt once the daemon confirmed the stop; a prompt's turn until "
        "it observes its cancellation";
    l.states_from =
        "the one state machine's words: running (admitted so), then protocol::transition's "
        "terminal words";
    l.states = run_states(run_kind::sop_step);
    l.waits = "none: an approval or a checkpoint is the run's phase, not a step task";
    l.fields = {
        {"parent", F::row, "parent_id: its run (a task)"},
        {"child", F::absent, "not used"},
        {"agent", F::elsewhere, "its run's definition (payload.definition.agent of the run)"},
        {"originator", F::row, "thread, turn, scope: its run's, copied at admission"},
        {"tenant", F::row, "tenant (its run's)"},
        {"depth", F::absent, "not recorded"},
        {"usage", F::absent, "not recorded"},
        {"owner", F::elsewhere, "its run's claim (the run's owner)"},
        {"lease", F::elsewhere, "its run's lease_until"},
        {"goal", F::absent, "a step joins no goal"},
    };
    l.recovery_can_duplicate = true;
    l.recovery =
        "only a step declared idempotent: it is sent again under the same attempt id (the "
        "daemon attaches if it still has it); any other step is followed, or lost, never sent "
        "again";
    l.delivery_idempotent = true;
    l.delivery = "its terminal receipt is written dropped: no inbox is owed it";
    out.push_back(std::move(l));
  }
  return out;
}

}  // namespace

const std::vector<std::string_view>& checklist_fields() {
  static const std::vector<std::string_view> f = {"parent", "child", "agent", "originator",
                                                  "tenant", "depth", "usage", "owner",
                                                  "lease",  "goal"};
  return f;
}

const std::vector<std::string_view>& field_keys(std::string_view field) {
  static const std::vector<std::pair<std::string_view, std::vector<std::string_view>>> keys = {
      {"parent", {"parent_id"}},
      {"child", {"child_id"}},
      {"agent", {"agent", "payload.agent"}},
      {"originator", {"thread", "turn", "scope"}},
      {"tenant", {"tenant", "principal"}},
      {"depth", {"depth", "payload.depth"}},
      {"usage", {"input_tokens", "output_tokens"}},
      {"owner", {"owner"}},
      {"lease", {"lease_until"}},
      {"goal", {"goal_id"}},
  };
  static const std::vector<std::string_view> none;
  for (auto& [f, k] : keys)
    if (f == field) return k;
  return none;
}

const std::vector<lifecycle>& lifecycles() {
  static const std::vector<lifecycle> table = build();
  return table;
}

const lifecycle* lifecycle_of(std::string_view kind) {
  for (auto& l : lifecycles())
    if (l.kind == kind) return &l;
  return nullptr;
}

std::vector<std::string> state_words(std::string_view kind) {
  std::vector<std::string> out;
  if (auto* l = lifecycle_of(kind))
    for (auto& s : l->states) out.push_back(s.word);
  return out;
}

bool raw_row::has(std::string_view column) const {
  return std::any_of(columns.begin(), columns.end(), [&](auto& c) { return c.first == column; });
}

std::optional<std::string> raw_row::get(std::string_view column) const {
  for (auto& [name, value] : columns)
    if (name == column) return value;
  return std::nullopt;
}

namespace {

std::vector<raw_row> rows_of(SQLite::Statement& q) {
  std::vector<raw_row> out;
  while (q.executeStep()) {
    raw_row r;
    for (int i = 0; i < q.getColumnCount(); ++i) {
      auto c = q.getColumn(i);
      r.columns.emplace_back(q.getColumnName(i),
                             c.isNull() ? std::nullopt : std::optional<std::string>(c.getString()));
    }
    out.push_back(std::move(r));
  }
  return out;
}

std::optional<raw_row> one_of(SQLite::Database& db, const std::string& sql,
                              const std::string& key) {
  SQLite::Statement q(db, sql);
  q.bind(1, key);
  auto rows = rows_of(q);
  if (rows.empty()) return std::nullopt;
  return std::move(rows.front());
}

}  // namespace

result<std::optional<task_record>> read_task_record(reader_pool& readers,
                                                    const protocol::job_id& id) {
  try {
    auto c = readers.acquire();
    // One read transaction: the row, its receipts and its intent are of one
    // moment even while a host writes the file.
    c->exec("BEGIN");
    struct end_read {
      SQLite::Database& db;
      ~end_read() {
        try {
          db.exec("COMMIT");
        } catch (...) {
        }
      }
    } ending{*c};
    auto task = one_of(*c, "SELECT * FROM tasks WHERE id = ?", id.str());
    if (!task) return std::optional<task_record>{};
    task_record out;
    out.task = std::move(*task);
    SQLite::Statement rq(*c, "SELECT * FROM receipts WHERE task_id = ? ORDER BY created_at, id");
    rq.bind(1, id.str());
    out.receipts = rows_of(rq);
    out.intent = one_of(*c, "SELECT * FROM settlement_intents WHERE task_id = ?", id.str());
    if (auto p = out.task.get("parent_id"))
      out.parent_session = one_of(*c, "SELECT * FROM sessions WHERE id = ?", *p);
    if (auto ch = out.task.get("child_id"))
      out.child_session = one_of(*c, "SELECT * FROM sessions WHERE id = ?", *ch);
    return std::optional<task_record>(std::move(out));
  } catch (const std::exception& e) {
    return read_error("reading task " + id.str(), e);
  }
}

}  // namespace tether::persistence
