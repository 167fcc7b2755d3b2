#include "tether/actors/session.hpp"

#include <algorithm>
#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/bind_executor.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/use_awaitable.hpp>

#include "tether/actors/host.hpp"
#include "tether/protocol/report.hpp"
#include "tether/runtime/crash_point.hpp"
#include "tether/runtime/retry.hpp"

namespace tether::actors {

using protocol::report_state;

// The agent's window onto its session during one busy period. All calls run
// on the session's executor.
class session::context : public agent_context {
 public:
  explicit context(std::shared_ptr<session> s)
      : s_(std::move(s)),
        policy_(s_->row_.policy ? *s_->row_.policy : s_->host_.options().default_policy) {}

  const session_id& self() const override { return s_->id(); }

  awaitable<result<std::int64_t>> say(std::string text) override {
    auto copy = text;
    auto seq = co_await s_->host_.store().append(s_->id(), "assistant", "answer", "completed",
                                                 std::move(text));
    if (seq) s_->answered(*seq, std::move(copy));
    co_return seq;
  }

  awaitable<result<std::int64_t>> fail(std::string text) override {
    s_->failed_ = true;
    s_->error_text_ = text;
    co_return co_await s_->host_.store().append(s_->id(), "assistant", "answer", "error",
                                                std::move(text));
  }

  awaitable<result<session_id>> spawn_background(spawn_request req) override {
    auto r = co_await spawn(std::move(req), true);
    if (!r) co_return r.error();
    co_return r->first;
  }

  awaitable<result<std::string>> spawn_foreground(spawn_request req) override {
    auto req_timeout = req.timeout;
    auto r = co_await spawn(std::move(req), false);
    if (!r) co_return r.error();
    auto reply = r->second;
    auto child = r->first;
    // A limit: past it the child is interrupted; it settles "cancelled" and
    // that answers the wait below.
    auto timed_out = std::make_shared<std::atomic<bool>>(false);
    std::optional<asio::steady_timer> limit;
    if (req_timeout) {
      limit.emplace(co_await asio::this_coro::executor, *req_timeout);
      host* hp = &s_->host_;
      auto on_limit = [hp, child, timed_out](boost::system::error_code ec) {
        if (ec) return;
        timed_out->store(true);
        hp->interrupt(child);
      };
      limit->async_wait(std::move(on_limit));
    }
    auto answer = co_await reply->async_wait(asio::use_awaitable);
    if (limit) limit->cancel();
    if (timed_out->load())
      co_return error{errc::timeout, "subagent '" + child.str() + "' ran past its " +
                                         std::to_string(req_timeout->count()) +
                                         " ms limit and was interrupted" +
                                         (answer ? "; its report: " + *answer : std::string())};
    // The caller cancelled the call (its drain was interrupted): the child's
    // run is cancelled with it (seed 002). A shutdown is not a cancel: the
    // child keeps its claim for the next boot.
    if (!answer && answer.error().code == errc::cancelled && !s_->stopping_)
      s_->host_.interrupt(child);
    co_return answer;
  }

  const protocol::session_policy& policy() const override { return policy_; }
  int depth() const override { return s_->row_.depth; }

  awaitable<result<void>> act(std::string tool) override {
    if (!policy_.allows_tool(tool))
      co_return co_await refuse("the tool '" + tool +
                                "' is not allowed by the policy of session '" + s_->id().str() +
                                "' (policy field 'tools')");
    auto budget = s_->host_.budget_of(s_->row_);
    if (budget && !budget->try_charge())
      co_return co_await refuse(
          "the action budget of this session's tree is spent (" +
          std::to_string(budget->options().max_actions) + " actions in " +
          std::to_string(
              std::chrono::duration_cast<std::chrono::seconds>(budget->options().window).count()) +
          " s, shared with its parent and children); '" + tool + "' was not run");
    co_return result<void>{};
  }

  awaitable<result<void>> report_usage(std::int64_t input_tokens,
                                       std::int64_t output_tokens) override {
    std::optional<job_id> task = s_->job_ ? std::optional<job_id>(s_->job_->id) : s_->row_.task_id;
    if (!task)
      co_return error{errc::not_found, "session '" + s_->id().str() +
                                           "' works for no task, so its usage was not counted"};
    auto added = co_await s_->host_.store().add_usage(*task, input_tokens, output_tokens);
    if (!added) co_return added.error();
    if (!*added)
      co_return error{errc::not_found,
                      "task '" + task->str() + "' of session '" + s_->id().str() +
                          "' has no row (gone, or a foreground call's); its usage was not "
                          "counted"};
    co_return result<void>{};
  }

  awaitable<result<std::string>> start_shell(std::string command) override {
    // A shell is an owned job of this turn: one queue owns every background
    // command (a host with no sandbox configured runs a local daemon).
    launch_request req;
    // Idempotent across a replay: a busy period resumed after a crash runs
    // its turn again under the same turn id, and its n-th shell with the
    // same command gets the job the first run launched, never a second run.
    req.key = shell_key(++shells_, command);
    req.command = std::move(command);
    auto id = co_await launch_job(std::move(req));
    if (!id) co_return id.error();
    co_return id->str();
  }

  // "s<n>-<FNV-1a of the command, 16 hex digits>": 1-64 of [A-Za-z0-9_.-].
  static std::string shell_key(int n, const std::string& command) {
    std::uint64_t h = 1469598103934665603ULL;
    for (unsigned char c : command) {
      h ^= c;
      h *= 1099511628211ULL;
    }
    char hex[17];
    std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(h));
    return "s" + std::to_string(n) + "-" + hex;
  }

  owner_scope scope() const override {
    owner_scope o;
    o.tenant = s_->row_.tenant;
    o.thread = s_->id();
    o.turn = s_->turn_;
    return o;
  }

  awaitable<result<job_id>> launch_job(launch_request req) override {
    if (!policy_.shells)
      co_return co_await refuse("the policy of session '" + s_->id().str() +
                                "' does not allow shells (policy field 'shells'); nothing was "
                                "started");
    auto allowed = co_await act(std::string(protocol::tool_shell));
    if (!allowed) co_return allowed.error();
    // The session's policy is what the shell runs under; the agent's request
    // may tighten it, never loosen it.
    req.isolate = req.isolate || policy_.isolate_shells();
    req.allow_network = req.allow_network && policy_.network;
    if (policy_.writable) req.writable = policy_.writable;
    req.channel = "tool";
    co_return co_await s_->host_.jobs().launch_as_session(scope(), std::move(req),
                                                          s_->row_.job_notify);
  }

  awaitable<result<job_view>> job_status(job_id job) override {
    co_return co_await s_->host_.jobs().status(scope(), std::move(job));
  }

  awaitable<result<job_view>> wait_job(job_id job) override {
    co_return co_await s_->host_.jobs().wait(scope(), std::move(job));
  }

  awaitable<result<job_view>> cancel_job(job_id job) override {
    co_return co_await s_->host_.jobs().cancel(scope(), std::move(job));
  }

  void wake_self() override { s_->ring(wake_scope::input); }

  awaitable<result<void>> cancel_child(session_id child) override {
    auto row = co_await s_->host_.store().load_session(child);
    if (!row) co_return row.error();
    if (!*row || (*row)->parent != s_->id())
      co_return error{errc::not_found, "session '" + child.str() + "' not found"};
    s_->host_.interrupt(child);
    co_return result<void>{};
  }

  awaitable<result<std::vector<message_row>>> transcript() override {
    auto& store = s_->host_.store();
    auto read = [&store, me = s_->id()] { return store.messages(me); };
    co_return co_await store.offload(std::move(read));
  }

  awaitable<result<std::int64_t>> input_ordinal(std::int64_t seq) override {
    // A transcript is append-only: the count up to an earlier seq stays
    // true, so only the messages after it are counted.
    auto known = s_->inputs_counted_;
    if (seq < known.seq) known = {};
    auto& store = s_->host_.store();
    auto read = [&store, me = s_->id(), after = known.seq, seq] {
      return store.user_inputs(me, after, seq);
    };
    auto counted = co_await store.offload(std::move(read));
    if (!counted) co_return counted.error();
    auto ordinal = known.count + counted->count;
    // Remembered up to the last message the read saw, not up to seq: a seq
    // past the end of the transcript must not hide the inputs still to come.
    if (counted->last > s_->inputs_counted_.seq) s_->inputs_counted_ = {counted->last, ordinal};
    co_return ordinal;
  }

  awaitable<result<job_id>> delegate_background(delegate_request req) override {
    auto call = co_await delegate_call_for(std::move(req));
    if (!call) co_return call.error();
    co_return co_await s_->host_.delegation().start_task(std::move(*call));
  }

  awaitable<result<delegate_view>> delegate_run(
      delegate_request req, std::optional<std::chrono::milliseconds> timeout) override {
    auto call = co_await delegate_call_for(std::move(req));
    if (!call) co_return call.error();
    co_return co_await s_->host_.delegation().run(std::move(*call), timeout);
  }

  awaitable<result<delegate_view>> delegate_result(job_id id) override {
    co_return co_await s_->host_.delegation().result_of(scope(), std::move(id));
  }

  awaitable<result<delegate_view>> delegate_wait(
      job_id id, std::optional<std::chrono::milliseconds> timeout) override {
    co_return co_await s_->host_.delegation().wait(scope(), std::move(id), timeout);
  }

  awaitable<result<std::vector<delegate_view>>> delegate_list() override {
    co_return co_await s_->host_.delegation().list(scope());
  }

  awaitable<result<delegate_view>> delegate_cancel(job_id id) override {
    co_return co_await s_->host_.delegation().cancel(scope(), std::move(id));
  }

  awaitable<result<persistence::cron_job_row>> cron_add(protocol::cron_job_spec spec) override {
    auto* cron = s_->host_.cron();
    if (!cron)
      co_return error{errc::refused, "this host runs no cron scheduler; nothing was scheduled"};
    auto allowed = co_await act(std::string(protocol::tool_cron));
    if (!allowed) co_return allowed.error();
    spec.agent = s_->row_.agent;  // the owner comes from the runtime, never the model
    auto added = co_await cron->add(std::move(spec));
    if (!added) co_return scrubbed(added.error());
    co_return added;
  }

  awaitable<result<std::vector<persistence::cron_job_row>>> cron_jobs() override {
    auto* cron = s_->host_.cron();
    if (!cron) co_return std::vector<persistence::cron_job_row>{};
    auto all = co_await cron->jobs();
    if (!all) co_return scrubbed(all.error());
    std::vector<persistence::cron_job_row> mine;
    for (auto& j : *all)
      if (j.spec.agent == s_->row_.agent) mine.push_back(std::move(j));
    co_return mine;
  }

  awaitable<result<bool>> cron_remove(std::string name) override {
    auto* cron = s_->host_.cron();
    if (!cron) co_return false;
    auto allowed = co_await act(std::string(protocol::tool_cron));
    if (!allowed) co_return allowed.error();
    auto mine = co_await cron_jobs();
    if (!mine) co_return mine.error();
    bool owned = false;
    for (auto& j : *mine) owned = owned || j.spec.name == name;
    if (!owned) co_return false;  // another agent's job reads as a missing one
    co_return co_await cron->remove(std::move(name));
  }

 private:
  using inline_reply = std::shared_ptr<runtime::one_shot<result<std::string>>>;

  // An error a model reads: scrubbed and bounded, its code kept.
  error scrubbed(const error& e) {
    return error{e.code, protocol::make_preview(s_->host_.scrubber().scrub(e.message), 2000).text};
  }

  // A refusal by policy or budget: written to the transcript (as a control
  // line the agent's reports never quote), then returned.
  awaitable<error> refuse(std::string why) {
    why = protocol::make_preview(s_->host_.scrubber().scrub(why), 1000).text;
    auto line = "refused: " + why;
    auto written =
        co_await s_->host_.store().append(s_->id(), "assistant", "control", "error", line);
    if (!written)
      s_->host_.warn("session " + s_->id().str() +
                     ": a refusal was not written to its "
                     "transcript: " +
                     written.error().message);
    co_return error{errc::refused, std::move(why)};
  }

  // The call the delegates' registry gets: the runtime's scope, depth,
  // policy (narrowed by the request) and budget, never the model's.
  awaitable<result<delegate_call>> delegate_call_for(delegate_request req) {
    auto narrowed = narrowed_policy(req.policy);
    if (!narrowed) co_return co_await refuse(narrowed.error().message);
    if (!policy_.allows_path(req.workspace.string()))
      co_return co_await refuse("the workspace '" + req.workspace.string() +
                                "' is outside the writable paths of session '" + s_->id().str() +
                                "' (policy field 'writable'); nothing was started");
    if (depth() + 1 > policy_.max_depth) co_return co_await refuse(depth_refusal("delegate"));
    if (req.goal) {
      auto ok = co_await check_goal(*req.goal);
      if (!ok) co_return ok.error();
    }
    auto allowed = co_await act(std::string(protocol::tool_delegate));
    if (!allowed) co_return allowed.error();
    delegate_call c;
    c.goal = req.goal;
    c.caller = scope();
    c.agent = std::move(req.agent);
    c.prompt = std::move(req.prompt);
    c.workspace = std::move(req.workspace);
    c.depth = depth() + 1;
    c.policy = std::move(*narrowed);
    c.budget_root = s_->row_.tree_root();
    co_return c;
  }

  result<protocol::session_policy> narrowed_policy(
      const std::optional<protocol::policy_override>& o) const {
    if (!o) return policy_;
    auto p = protocol::narrow(policy_, *o);
    if (!p)
      return error{errc::refused, "the policy field '" + p.error().field + "' " +
                                      p.error().problem + "; nothing was started"};
    return *p;
  }

  // A goal a task of this session may join: a goal of its tree (anyone
  // else's reads as missing). Whether it is still running is checked again
  // by the transaction that admits the task.
  awaitable<result<void>> check_goal(const job_id& goal) {
    auto g = co_await s_->host_.goal(s_->id(), goal);
    if (!g) co_return error{g.error().code, g.error().message + "; nothing was started"};
    if (g->state != "running")
      co_return error{errc::conflict, "goal '" + goal.str() + "' is " + g->state +
                                          ", so no task can join it; nothing was started"};
    co_return result<void>{};
  }

  std::string depth_refusal(const char* what) const {
    return "a " + std::string(what) + " from session '" + s_->id().str() + "' (depth " +
           std::to_string(depth()) + ") would be at depth " + std::to_string(depth() + 1) +
           ", past its policy's max_depth " + std::to_string(policy_.max_depth) +
           "; nothing was started";
  }

  // Registers the job before the child's busy period can start: the child
  // row, its prompt and (background) the running job row in one transaction,
  // then the binding, then the wake.
  awaitable<result<std::pair<session_id, inline_reply>>> spawn(spawn_request req, bool background) {
    host& h = s_->host_;
    if (req.job_policy && !is_job_policy(*req.job_policy))
      co_return error{errc::invalid, "job policy '" + *req.job_policy +
                                         "' is not one of withhold, report_now; nothing was sent"};
    auto narrowed = narrowed_policy(req.policy);
    if (!narrowed) co_return co_await refuse(narrowed.error().message);
    session_id child = req.child ? *req.child : session_id(protocol::mint("ses"));
    auto existing = co_await h.store().load_session(child);
    if (!existing) co_return existing.error();
    if (*existing && req.policy)
      co_return co_await refuse("a follow-up keeps the policy of session '" + child.str() +
                                "'; no follow-up was sent");
    if (!*existing && depth() + 1 > policy_.max_depth)
      co_return co_await refuse(depth_refusal(req.fork ? "fork" : "subagent"));
    if (req.goal && !background)
      co_return error{errc::invalid, "a foreground spawn has no task row to join goal '" +
                                         req.goal->str() +
                                         "'; spawn it in the background; nothing was started"};
    if (req.goal) {
      auto ok = co_await check_goal(*req.goal);
      if (!ok) co_return ok.error();
    }
    // Counted against the tree's budget like every action (a follow-up too).
    auto allowed = co_await act(std::string(protocol::tool_spawn));
    if (!allowed) co_return allowed.error();
    std::optional<session_row> create;
    std::optional<session_id> parent;
    std::optional<bool> notify;
    if (*existing) {
      // A fork creates a new session; only a follow-up reaches an existing
      // one, and only one's own child of one's own tenant.
      if (req.fork)
        co_return error{errc::refused, "a fork creates a new session, but session '" + child.str() +
                                           "' exists already; nothing was sent"};
      if ((*existing)->parent != s_->id() || (*existing)->tenant != s_->row_.tenant)
        co_return error{errc::refused, "session '" + child.str() + "' is not a child of '" +
                                           s_->id().str() + "'; no follow-up was sent"};
      if (req.job_policy && *req.job_policy != (*existing)->job_policy)
        co_return error{errc::refused, "a follow-up keeps the job policy of session '" +
                                           child.str() + "' (" + (*existing)->job_policy +
                                           "), not '" + *req.job_policy +
                                           "'; host::set_job_policy changes it; no follow-up "
                                           "was sent"};
      parent = (*existing)->parent;
      notify = req.notify ? req.notify : (*existing)->notify;  // a follow-up keeps it
      auto joined = co_await join_live(child, req, background, notify);
      if (!joined) co_return joined.error();
      if (*joined) co_return std::make_pair(child, **joined);
    } else {
      session_row row;
      row.id = child;
      if (!req.fork) {
        row.parent = s_->id();
        row.notify = req.notify;  // nullopt = on; never inherited from us
        parent = row.parent;
        notify = req.notify;
      }
      row.description = req.description;
      row.agent = req.agent;
      row.tenant = s_->row_.tenant;  // a child or a fork works for the same tenant
      // A child or a fork works under this session's policy (narrowed, never
      // widened), one level deeper, and spends this tree's action budget.
      row.policy = std::move(*narrowed);
      row.depth = depth() + 1;
      row.budget_root = s_->row_.tree_root();
      // A subagent reports now by default (its parent gets report 1 with the
      // still-running list, report 2 when its jobs end); a fork, which has no
      // parent to report to, starts like a top-level session.
      const auto& defaults = h.options().job_policies;
      row.job_policy = req.job_policy ? *req.job_policy
                       : req.fork     ? defaults.top_level
                                      : defaults.subagent;
      create = std::move(row);
    }
    job_binding job;
    job.id = job_id(protocol::mint("job"));
    job.nid = notification_id(protocol::mint("msg"));
    job.generation = h.next_generation();
    job.background = background;
    job.parent = parent;
    job.description = req.description;
    std::optional<persistence::job_row> row;
    if (background) {
      persistence::job_row jr;
      jr.id = job.id;
      jr.nid = job.nid;
      jr.parent = parent;
      jr.child = child;
      jr.generation = job.generation;
      jr.description = req.description;
      jr.goal = req.goal;
      row = std::move(jr);
    } else {
      job.inline_reply = make_inline_reply();
    }
    std::optional<bool> notify_update;
    if (*existing && req.notify) notify_update = req.notify;
    auto written = co_await h.store().spawn(std::move(create), child, std::move(req.prompt),
                                            std::move(row), notify_update);
    if (!written) co_return written.error();
    // A child this transaction created: its actor is made from the row the
    // transaction returned, with no read back.
    auto c = co_await h.load(child, std::move(written->created));
    if (!c) co_return c.error();
    if (parent) h.note_child(*parent, child);
    // A background job is outstanding from the moment its running row is
    // written (seed §4), not from when the child's busy period starts: an
    // ancestor that settles in between lists it as still running.
    if (background) h.note_phase(child, true, false, false);
    auto reply = job.inline_reply;
    session_msg::bind_job bind{std::move(job), notify};
    (*c)->tell(std::move(bind));
    h.wake(**c, wake_scope::input, false);
    co_return std::make_pair(child, reply);
  }

  // A cancelled parent drain (interrupt, shutdown) stops waiting.
  static inline_reply make_inline_reply() {
    return runtime::one_shot<result<std::string>>::make([] {
      return result<std::string>(error{errc::cancelled, "the foreground call was cancelled"});
    });
  }

  // Seed 002: a follow-up to a child whose generation is live (busy, not
  // settling) joins that generation instead of queueing a job of its own
  // behind it: its prompt is written with no job row and is answered and
  // reported with that generation (a foreground follow-up gets the report
  // inline). nullopt: nothing to join, the follow-up gets a job of its own.
  awaitable<result<std::optional<inline_reply>>> join_live(session_id child, spawn_request& req,
                                                           bool background,
                                                           std::optional<bool> notify) {
    host& h = s_->host_;
    auto c = co_await h.load(child);
    if (!c) co_return c.error();
    auto ticket = std::make_shared<int>(0);
    session_msg::join_live ask{ticket, background ? nullptr : make_inline_reply(), {}};
    auto joined = co_await (*c)->ask(std::move(ask));
    if (!joined) {
      // Unanswered (e.g. our drain was cancelled): the child may have counted
      // us as joining; tell it we are not coming.
      session_msg::joined_input gone{ticket, false, notify};
      (*c)->tell(std::move(gone));
      co_return joined.error();
    }
    if (!*joined) co_return std::optional<inline_reply>();
    std::optional<bool> notify_update;
    if (req.notify) notify_update = req.notify;
    auto written =
        co_await h.store().spawn(std::nullopt, child, req.prompt, std::nullopt, notify_update);
    session_msg::joined_input done{ticket, written.has_value(), notify};
    (*c)->tell(std::move(done));
    if (!written) co_return written.error();
    co_return std::optional<inline_reply>(**joined);
  }

  std::shared_ptr<session> s_;
  // The session's policy never changes, and its row outlives this context.
  const protocol::session_policy& policy_;
  int shells_ = 0;  // start_shell calls in this busy period, for their keys
};

session::session(runtime::executor ex, host& h, session_row row, std::shared_ptr<agent> a,
                 std::shared_ptr<actors::inbox> box)
    : actor(ex, runtime::actor_options{"session " + row.id.str()}),
      host_(h),
      id_(row.id),
      tenant_(row.tenant),
      inbox_(std::move(box)),
      row_(std::move(row)),
      agent_(std::move(a)) {}

awaitable<void> session::handle(session_message& m) {
  using namespace session_msg;
  if (auto* w = std::get_if<wake>(&m)) {
    bool stale = w->admitted_here && !inbox_dirty_;  // a drain already took it
    if (w->report && !w->admitted_here)
      inbox_dirty_ = true;  // e.g. a job notice admitted beside the actor
    // A report admitted while a revert is staged waits for the revert.
    if (!stale && !(w->report && row_.revert_staged)) {
      this->ring(w->scope);
      if (w->report && phase_ != phase::idle) report_wake_ = true;
    }
    if (w->counted) host_.activity(-1);
  } else if (auto* in = std::get_if<input>(&m)) {
    auto scope = in->kind == "steer" ? wake_scope::steer : wake_scope::input;
    if (phase_ == phase::idle && !stopping_) {
      // The input starts a busy period: one write appends it and opens the
      // period. Nothing else starts one while this handler waits (the
      // mailbox runs one message at a time, and no period is running).
      auto begun = co_await host_.store().append_and_begin_busy(id(), in->kind, in->text);
      if (!begun) {
        in->reply.send(begun.error());
        co_return;
      }
      auto seq = begun->seq;
      pending_ = scope;
      start_busy_period(std::move(*begun));
      in->reply.send(seq);
      co_return;
    }
    auto seq = co_await host_.store().append(id(), "user", in->kind, "completed", in->text);
    if (seq) this->ring(scope);
    in->reply.send(std::move(seq));
  } else if (auto* ad = std::get_if<admitted>(&m)) {
    inbox_dirty_ = true;
    if (ad->receipts) receipt_admitted_ = true;
  } else if (std::holds_alternative<jobs_changed>(m)) {
    release_withhold();
  } else if (auto* b = std::get_if<bind_job>(&m)) {
    // A follow-up may have changed the link's notify setting.
    if (b->notify) row_.notify = *b->notify;
    // A job joins the running busy period only if that one reports no job
    // yet; a settling busy period is dying, and a second job never replaces
    // the first: both wait their turn in order.
    bool joins = (phase_ == phase::idle || phase_ == phase::busy) && (!job_ || job_->reported) &&
                 queued_jobs_.empty();
    if (joins) {
      job_ = std::move(b->job);
      // Joining a running period: drain once more so the job's own prompt is
      // answered in it, whenever the caller's wake arrives.
      if (phase_ == phase::busy) this->ring(wake_scope::input);
    } else {
      queued_jobs_.push_back(std::move(b->job));
    }
  } else if (auto* jl = std::get_if<join_live>(&m)) {
    // Only a live generation is joined: busy, its job not yet classified,
    // nothing queued behind it; never a dying (settling) one.
    // A background follow-up joins only a background generation: it is owed
    // a report in its parent's inbox; a foreground one gets the report inline.
    bool live = phase_ == phase::busy && !interrupted_ && !stopping_ && job_ && !job_->reported &&
                !job_->settling && queued_jobs_.empty() && (jl->inline_reply || job_->background);
    if (!live) {
      jl->reply.send(std::optional<std::shared_ptr<runtime::one_shot<result<std::string>>>>());
      co_return;
    }
    joiners_.push_back(jl->ticket);  // no settle before the follow-up's prompt is written
    if (jl->inline_reply) job_->joined_inline.push_back(jl->inline_reply);
    jl->reply.send(std::optional(jl->inline_reply));
  } else if (auto* ji = std::get_if<joined_input>(&m)) {
    auto it = std::find(joiners_.begin(), joiners_.end(), ji->ticket);
    if (it == joiners_.end()) co_return;  // it never joined
    joiners_.erase(it);
    if (ji->written) {
      row_.notify = ji->notify;
      this->ring(wake_scope::input);
    } else {
      release_withhold();
    }
  } else if (auto* tb = std::get_if<to_background>(&m)) {
    if (job_ && job_->settling && !job_->background) {
      tb->reply.fail(error{errc::refused, "the job of session '" + id().str() +
                                              "' is settling; its report comes inline"});
      co_return;
    }
    if (!job_ || job_->reported || job_->background) {
      tb->reply.fail(error{errc::invalid, "session '" + id().str() +
                                              "' has no foreground job to move to the background"});
      co_return;
    }
    // Mark it background before the write so a settle meanwhile waits for the row.
    job_->background = true;
    job_->row_written = runtime::one_shot<result<void>>::make();
    auto done = job_->row_written;
    auto reply = job_->inline_reply;
    persistence::job_row jr;
    jr.id = job_->id;
    jr.nid = job_->nid;
    jr.parent = job_->parent;
    jr.child = id();
    jr.generation = job_->generation;
    jr.description = job_->description;
    auto nid = job_->nid;
    auto jr_id = job_->id;
    auto w = co_await host_.store().write_job(std::move(jr));
    if (!w && job_ && job_->id == jr_id) {
      // No running row: the job stays foreground and its caller keeps waiting inline.
      job_->background = false;
      job_->row_written.reset();
    }
    done->set(w);
    if (!w) {
      tb->reply.fail(w.error());
      co_return;
    }
    if (reply)
      reply->set(std::string("Moved to the background; the report follows as " + nid.str()));
    tb->reply.send(nid);
  } else if (std::holds_alternative<interrupt>(m)) {
    // An interrupt clears a pending wake, but not a report's: the report was
    // admitted and is owed a drain, after the interrupted settle.
    pending_.reset();
    if (report_wake_) pending_ = wake_scope::steer;
    if (phase_ == phase::busy) {
      interrupted_ = true;
      drain_cancel_.emit(asio::cancellation_type::terminal);
      release_withhold();
    }
  } else if (auto* jp = std::get_if<set_job_policy>(&m)) {
    auto r = co_await host_.store().set_job_policy(id(), jp->notify, jp->policy);
    if (r) {
      row_.job_notify = jp->notify;
      row_.job_policy = jp->policy;
    }
    jp->reply.send(std::move(r));
  } else if (auto* rv = std::get_if<set_revert>(&m)) {
    auto r = co_await host_.store().set_revert(id(), rv->staged);
    if (r) {
      row_.revert_staged = rv->staged;
      // Reports admitted meanwhile are seen once the revert is resolved.
      if (!rv->staged) {
        auto& store = host_.store();
        auto read = [&store, me = id()] { return store.inbox(me); };
        auto inbox = co_await store.offload(std::move(read));
        bool pending = false;
        if (inbox)
          for (auto& i : *inbox) pending |= !i.acked;
        if (pending) {
          this->ring(wake_scope::steer);
          if (phase_ != phase::idle) report_wake_ = true;
        }
      }
    }
    rv->reply.send(std::move(r));
  } else if (auto* wi = std::get_if<wait_idle>(&m)) {
    if (phase_ == phase::idle && !pending_)
      wi->reply.send();
    else
      idle_waiters_.push_back(std::move(wi->reply));
  } else if (auto* sd = std::get_if<shutdown>(&m)) {
    stopping_ = true;
    pending_.reset();
    if (phase_ != phase::idle) drain_cancel_.emit(asio::cancellation_type::terminal);
    release_withhold();
    if (retry_timer_) retry_timer_->cancel();  // a retry waiting to run gives up now
    for (auto& w : idle_waiters_) w.fail(error{errc::stopped, "host shut down"});
    idle_waiters_.clear();
    error down{errc::stopped, "host shut down before the child settled"};
    if (job_ && job_->inline_reply) job_->inline_reply->set(down);
    if (job_)
      for (auto& r : job_->joined_inline) r->set(down);
    for (auto& q : queued_jobs_)
      if (q.inline_reply) q.inline_reply->set(down);
    if (busy_done_) {
      auto done = busy_done_;
      co_await done->async_wait(asio::use_awaitable);
    }
    sd->reply.send();
  }
}

void session::ring(wake_scope s) {
  if (stopping_) return;
  if (phase_ == phase::idle) {
    pending_ = s;
    start_busy_period();
    return;
  }
  pending_ = pending_ ? std::max(*pending_, s) : s;  // input wins over steer
  release_withhold();
}

void session::release_withhold() {
  if (withhold_) withhold_->set(0);
}

awaitable<void> session::pause_before_retry(int attempt) {
  retry_timer_ = std::make_shared<asio::steady_timer>(get_executor());
  auto t = retry_timer_;
  co_await runtime::pause_before_retry(*t, attempt);
  retry_timer_.reset();
}

awaitable<bool> session::withholding() {
  auto& q = host_.jobs();
  if (!q.turn_has_live_jobs(id(), turn_)) co_return false;
  // The policy is this actor's own state: set when its row was loaded and by
  // host::set_job_policy's message, which writes it through the writer first.
  co_return row_.job_policy == "withhold";
}

void session::start_busy_period(std::optional<persistence::task_store::busy_start> begun) {
  phase_ = phase::busy;
  busy_done_ = runtime::one_shot<int>::make();
  host_.activity(+1);
  host_.note_phase(id(), true, false, job_ && !job_->background && !job_->reported);
  auto self = shared_from_this();
  auto ex = get_executor();
  auto on_end = [self](std::exception_ptr e) {
    if (e) self->busy_period_failed(e);
  };
  asio::co_spawn(ex, run_busy(self, std::move(begun)), asio::bind_executor(ex, std::move(on_end)));
}

void session::busy_period_failed(std::exception_ptr e) {
  auto what = runtime::detail::describe(e);
  host_.warn("session " + id().str() + ": its busy period failed: " + what +
             "; it ended in memory without a settle, so its claim and any running job row stay "
             "on disk for the next boot, and a later wake starts a new busy period");
  error failed{errc::failed, "session '" + id().str() + "': its busy period failed: " + what};
  if (job_) {
    if (job_->inline_reply && !job_->background) job_->inline_reply->set(failed);
    for (auto& r : job_->joined_inline) r->set(failed);
    job_->joined_inline.clear();
    // Not settled: a later busy period reports it under its promised id.
    job_->reported = false;
    job_->settling = false;
  }
  withhold_.reset();
  retry_timer_.reset();
  phase_ = phase::idle;
  interrupted_ = false;
  pending_.reset();
  report_wake_ = false;
  host_.note_phase(id(), false, false, false);
  auto ws = std::move(idle_waiters_);
  idle_waiters_.clear();
  for (auto& w : ws) w.fail(failed);
  busy_done_->set(0);
  host_.activity(-1);
}

awaitable<void> session::run_drain(std::shared_ptr<context> ctx, drain_input in) {
  co_await agent_->drain(*ctx, std::move(in));
}

awaitable<void> session::run_busy(std::shared_ptr<session> self,
                                  std::optional<persistence::task_store::busy_start> opened) {
  auto& store = host_.store();
  // started: open the busy period on disk and remember startedSeq.
  if (!queued_jobs_.empty() && (!job_ || job_->reported)) {
    job_ = std::move(queued_jobs_.front());
    queued_jobs_.erase(queued_jobs_.begin());
  }
  result<persistence::task_store::busy_start> begun = error{errc::failed, "not begun"};
  if (opened)
    begun = std::move(*opened);
  else
    begun = co_await store.begin_busy(id());
  if (!begun) {
    host_.warn("session " + id().str() + ": cannot open a busy period: " + begun.error().message);
    phase_ = phase::idle;
    pending_.reset();
    report_wake_ = false;
    host_.note_phase(id(), false, false, false);
    for (auto& w : idle_waiters_) w.fail(begun.error());
    idle_waiters_.clear();
    if (job_ && job_->inline_reply && !job_->background) job_->inline_reply->set(begun.error());
    busy_done_->set(0);
    host_.activity(-1);
    co_return;
  }
  started_seq_ = begun->seq;
  turn_ = begun->turn;
  // A period begun here sees every answer it writes (say() is the only
  // writer of this session's answers): the settle needs no read for it.
  last_answer_ = {};
  last_answer_known_ = !begun->resumed;
  if (auto* o = host_.observer()) o->started(id(), started_seq_);
  std::int64_t cursor = begun->input_cursor;
  failed_ = false;
  error_text_.clear();
  auto ctx = std::make_shared<context>(self);
  for (int drain_index = 0;; ++drain_index) {
    if (interrupted_ || stopping_) break;
    auto scope = pending_.value_or(wake_scope::input);
    pending_.reset();
    report_wake_ = false;  // this drain takes the inbox
    // Acknowledge: admitted reports move into the transcript. Skipped when
    // nothing was admitted since the last look.
    receipt_admitted_ = false;  // this drain takes what was admitted so far
    bool inbox_left = false;    // a bounded take left rows for the next drain
    bool took_reports = false;  // the take moved reports into the transcript
    if (inbox_dirty_) {
      inbox_dirty_ = false;
      TETHER_CRASH_POINT("report.drain.before_ack");
      auto taken = co_await store.take_inbox(id());
      if (!taken) {
        inbox_dirty_ = true;
        host_.warn("session " + id().str() + ": " + taken.error().message);
      }
      took_reports = taken && !taken->messages.empty();
      if (took_reports) TETHER_CRASH_POINT("report.drain.after_ack");
      if (taken && taken->more) inbox_dirty_ = inbox_left = true;
    }
    drain_input in;
    in.drain_index = drain_index;
    in.scope = scope;
    // The input that opened the period, when it is the only one after the
    // cursor and this drain took no report (a report, or an input appended
    // meanwhile, may lie between them): the drain reads nothing. Anything
    // appended after it rang a wake, so the next drain reads from it.
    // (The claim wrote it only because it is valid UTF-8, so the read would
    // return these very bytes.)
    if (drain_index == 0 && begun->input && !took_reports) {
      in.inputs.push_back(std::move(*begun->input));
    } else {
      auto read_inputs = [&store, me = id(), cursor] { return store.messages(me, cursor); };
      auto msgs = co_await store.offload(std::move(read_inputs));
      if (!msgs) {
        failed_ = true;
        error_text_ = msgs.error().message;
        break;
      }
      for (auto& mm : *msgs)
        if (mm.role == "user") in.inputs.push_back(std::move(mm));
    }
    if (!in.inputs.empty()) cursor = in.inputs.back().seq;

    // An interrupt or shutdown during the awaits above found no drain to
    // cancel: look again before starting one.
    if (interrupted_ || stopping_) break;
    // The drain runs as its own coroutine so an interrupt can cancel it
    // without cancelling the settle that follows.
    struct drain_end {
      std::exception_ptr ep;
    };
    auto done = runtime::one_shot<drain_end>::make();
    auto ex = get_executor();
    asio::co_spawn(ex, run_drain(ctx, std::move(in)),
                   asio::bind_cancellation_slot(drain_cancel_.slot(), [done](std::exception_ptr e) {
                     done->set(drain_end{e});
                   }));
    auto ended = co_await done->async_wait(asio::use_awaitable);
    auto ep = ended.ep;
    drain_cancel_.slot().clear();
    if (stopping_) break;
    if (ep && !interrupted_) {
      failed_ = true;
      try {
        std::rethrow_exception(ep);
      } catch (const std::exception& e) {
        error_text_ = e.what();
      } catch (...) {
        error_text_ = runtime::detail::describe(ep);
      }
      break;
    }
    if (interrupted_ || failed_) break;
    // Withhold the turn's completion while jobs it owns run; each change of
    // the queue's revision (or a wake) looks again.
    // A follow-up joining this generation is writing its prompt: wait for its
    // wake (or its failure) so the prompt is answered in this generation.
    for (;;) {
      if (pending_ || interrupted_ || stopping_) break;
      if (joiners_.empty()) {
        bool withhold = co_await withholding();
        if (!withhold || pending_ || interrupted_ || stopping_) break;
      }
      auto& q = host_.jobs();
      auto seen = q.revision();
      bool joining = !joiners_.empty();
      if (!joining && !q.turn_has_live_jobs(id(), turn_)) break;
      withhold_ = runtime::one_shot<int>::make();
      auto w = withhold_;
      if (!joining) {
        // Through the mailbox, behind the `admitted` of any receipt the
        // change followed (actors/inbox.hpp, Order).
        auto changed = q.revision_after(seen);
        std::weak_ptr<session> weak = shared_from_this();
        auto release = [w, weak](std::uint64_t) {
          auto s = weak.lock();
          if (!s || !s->tell(session_msg::jobs_changed{})) w->set(0);
        };
        changed->async_wait(asio::bind_executor(get_executor(), std::move(release)));
      }
      co_await w->async_wait(asio::use_awaitable);
      withhold_.reset();
    }
    // A receipt admitted since this drain began (its job has left the live
    // set by now, or soon) may have its wake still in the mailbox: it belongs
    // to this turn, so drain it now rather than in a period of its own.
    // So do the rows a bounded take left in the inbox.
    if (!pending_ && (receipt_admitted_ || inbox_left) && !row_.revert_staged)
      pending_ = wake_scope::steer;
    if (interrupted_ || stopping_ || !pending_) break;
  }
  // Stopping a turn cancels exactly the jobs it owns, confirmed stopped,
  // before the turn closes: a stop that is not confirmed is retried while the
  // turn stays open (a shutdown ends the retries and keeps the claim).
  for (int attempt = 0; interrupted_ && !stopping_ && host_.jobs().turn_has_live_jobs(id(), turn_);
       ++attempt) {
    owner_scope me;
    me.tenant = row_.tenant;
    me.thread = id();
    me.turn = turn_;
    auto stopped = co_await host_.jobs().stop_turn(std::move(me));
    if (stopping_ || !host_.jobs().turn_has_live_jobs(id(), turn_)) break;
    host_.warn("session " + id().str() + ": stopping turn " + turn_.str() + ": " +
               (stopped ? std::string("a job it owns is still live") : stopped.error().message) +
               "; the turn stays open and the stop is retried");
    co_await pause_before_retry(attempt);
  }
  if (stopping_) {  // graceful shutdown: keep the claim and the running row
    busy_done_->set(0);
    host_.activity(-1);
    co_return;
  }
  phase_ = phase::settling;
  host_.note_phase(id(), true, true, false);
  // Inputs up to `cursor` were given to a drain of this busy period.
  settle_cursor_ = cursor;
  co_await settle();
  phase_ = phase::idle;
  interrupted_ = false;
  host_.note_phase(id(), false, false, false);
  // A job bound while this busy period was already reporting another one
  // gets a busy period of its own, so its running row always settles.
  if (!queued_jobs_.empty() && !pending_) pending_ = wake_scope::input;
  release_waiters();
  busy_done_->set(0);
  if (pending_ && !stopping_) start_busy_period();
  host_.activity(-1);
}

void session::release_waiters() {
  if (pending_) return;  // a fresh busy period follows; waiters wait for it
  auto ws = std::move(idle_waiters_);
  idle_waiters_.clear();
  for (auto& w : ws) w.send();
}

awaitable<void> session::settle() {
  auto& store = host_.store();
  // Classify first, before anything is written (seed §4).
  job_binding* job = (job_ && !job_->reported) ? &*job_ : nullptr;
  if (job) {
    job->settling = true;
    job->reported = true;
    if (job->row_written) {
      auto w = job->row_written;
      auto written = co_await w->async_wait(asio::use_awaitable);
      if (!written) job->background = false;  // the row never existed: report inline
    }
  }
  if (auto* o = host_.observer()) co_await o->settling(id());
  report_state state = interrupted_ ? report_state::cancelled
                       : failed_    ? report_state::error
                                    : report_state::completed;
  std::optional<std::string> answer;
  if (state == report_state::cancelled) {
    answer = std::string(protocol::k_cancelled_text);
  } else if (state == report_state::error) {
    answer = error_text_;
  } else if (last_answer_known_) {
    if (last_answer_.seq > 0) answer = std::move(last_answer_.text);
  } else {
    auto read = [&store, me = id(), after = started_seq_] {
      return store.last_assistant_after(me, after);
    };
    auto last = co_await store.offload(std::move(read));
    if (!last) {
      // A message that fails to decode degrades to an error report, so the
      // release still commits.
      state = report_state::error;
      answer = last.error().message;
    } else if (*last) {
      answer = (*last)->text;
    }
  }
  auto running = host_.outstanding(id());
  bool deliverable = row_.parent.has_value() && row_.notify.value_or(true);
  auto render = [&](std::string_view text) {
    return protocol::render_report(id(), state, row_.description,
                                   protocol::render_report_body(text, running));
  };

  persistence::settle_request req;
  req.child = id();
  req.outcome = state;
  req.input_cursor = settle_cursor_;
  req.description = row_.description;
  std::optional<notification_id> nid;
  std::string inline_body;
  if (job && job->background) {
    req.background_job = job->id;
    req.drop_background = !deliverable;
    req.body = render(answer ? *answer : protocol::k_no_text_response);
    nid = job->nid;
  } else if (job) {  // foreground: the tool returns the report inline, no outbox row
    inline_body = render(answer ? *answer : protocol::k_no_text_response);
  } else if (answer && deliverable) {  // none: mint an id at commit
    nid = notification_id(protocol::mint("msg"));
    req.mint_none = nid;
    req.parent = row_.parent;
    req.body = render(*answer);
  }
  TETHER_CRASH_POINT("report.settle.before_commit");
  // A report owed to a parent that is there is settled and admitted in one
  // transaction, through the parent's inbox actor: nothing waits in the
  // outbox, and the parent is woken after that one commit.
  if (nid && row_.parent && !req.drop_background) {
    if (co_await settle_into_parent(job, req, *nid, inline_body)) co_return;
  }
  // The settle is idempotent (the same request, the same promised id): a
  // failed commit is retried before the session goes idle, so the report is
  // never lost under its promised id and the binding is never dropped.
  auto committed = co_await store.settle(req);
  for (int attempt = 0; !committed && !stopping_; ++attempt) {
    host_.warn("session " + id().str() + ": settle did not commit: " + committed.error().message +
               "; the busy period stays open and the settle is retried");
    co_await pause_before_retry(attempt);
    if (stopping_) break;
    committed = co_await store.settle(req);
  }
  if (!committed) {
    settle_failed(job, committed.error());
    co_return;
  }
  if (committed->row_written) TETHER_CRASH_POINT("report.settle.after_commit");
  if (auto* o = host_.observer()) o->settled(id(), committed->row_written ? nid : std::nullopt);
  settle_replies(job, req.body, inline_body);
  // The delivery is idempotent too (a repeated admit is dropped by its id):
  // a failed one is retried while the host runs, so the report reaches the
  // parent without waiting for a boot. A shutdown leaves the row for boot.
  for (int attempt = 0; committed->row_written && nid && row_.parent; ++attempt) {
    delivery_batch b;
    b.owner = *row_.parent;
    b.items.push_back({*nid, std::nullopt, id(), req.body});
    auto d = co_await host_.delivery().deliver(std::move(b));
    if (d) break;
    if (stopping_) {
      host_.warn("report " + nid->str() + ": " + d.error().message +
                 "; the host is shutting down, so the row stays for boot");
      break;
    }
    host_.warn("report " + nid->str() + ": " + d.error().message +
               "; the row stays in the outbox and the delivery is retried");
    co_await pause_before_retry(attempt);
  }
}

void session::settle_replies(job_binding* job, const std::string& body,
                             const std::string& inline_body) {
  if (!job) return;
  if (job->inline_reply && !job->background) job->inline_reply->set(inline_body);
  for (auto& r : job->joined_inline) r->set(job->background ? body : inline_body);
  job_.reset();
}

void session::settle_failed(job_binding* job, const error& e) {
  host_.warn("session " + id().str() + ": settle did not commit: " + e.message +
             "; the host is shutting down, so the claim stays and boot resumes it");
  if (!job) return;
  if (job->inline_reply) job->inline_reply->set(e);
  for (auto& r : job->joined_inline) r->set(e);
}

awaitable<bool> session::settle_into_parent(job_binding* job,
                                            const persistence::settle_request& req,
                                            const notification_id& nid,
                                            const std::string& inline_body) {
  auto parent = co_await host_.load(*row_.parent);
  if (!parent) co_return false;  // gone (or unreadable): the plain settle, then its delivery
  persistence::settle_admit_result done;
  for (int attempt = 0;; ++attempt) {
    inbox_msg::settle_admit ask{req, nid, {}};
    auto queued = co_await (*parent)->inbox()->ask(std::move(ask));
    error failed;
    if (queued) {
      // Waited for here, on this session's executor: the commit resumes
      // this coroutine directly.
      auto write = std::move(*queued);
      auto r = co_await write->async_wait(asio::use_awaitable);
      if (r) {
        done = std::move(*r);
        break;
      }
      failed = std::move(r.error());
    } else {
      failed = std::move(queued.error());
    }
    // The inbox stopped or was closed before it wrote anything (its host
    // shutting down, or its mailbox ended), or the writer was stopped: the
    // plain settle.
    if (failed.code == errc::stopped || failed.code == errc::closed || stopping_) co_return false;
    // Idempotent, as the plain settle is: retried while the host runs.
    host_.warn("session " + id().str() + ": settle did not commit: " + failed.message +
               "; the busy period stays open and the settle is retried");
    co_await pause_before_retry(attempt);
    if (stopping_) co_return false;
  }
  // Both points of the plain path fall after this one commit: the child is
  // idle, the report in the parent's inbox with its receipt acknowledged,
  // and the parent not yet woken.
  bool added = done.admitted == persistence::admit_outcome::added;
  // The parent's session learns of the admit first (actors/inbox.hpp, Order).
  if (added) (void)(*parent)->tell(session_msg::admitted{false});
  if (done.settled.row_written) TETHER_CRASH_POINT("report.settle.after_commit");
  if (added) TETHER_CRASH_POINT("report.admit.after_commit");
  if (auto* o = host_.observer()) {
    o->settled(id(), done.settled.row_written ? std::optional(nid) : std::nullopt);
    if (added) o->admitted(*row_.parent, nid);
  }
  settle_replies(job, req.body, inline_body);
  if (done.parent_gone)
    host_.warn("owner session '" + row_.parent->str() + "' is gone; 1 owed report(s) dropped");
  if (!done.admitted) co_return true;
  host_.hand_over(**parent, wake_scope::steer, false);
  TETHER_CRASH_POINT("report.wake.after_tell");
  co_return true;
}

}  // namespace tether::actors
