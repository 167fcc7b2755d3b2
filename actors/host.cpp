#include "tether/actors/host.hpp"

#include <algorithm>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/experimental/awaitable_operators.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <cstdio>
#include <limits>
#include <set>

#include "tether/protocol/notice.hpp"
#include "tether/protocol/output_tail.hpp"
#include "tether/runtime/clock.hpp"
#include "tether/runtime/crash_point.hpp"
#include "tether/sandbox/client.hpp"
#include "tether/sandbox/state_dir.hpp"

namespace tether::actors {

using persistence::job_row;
using persistence::job_status;

namespace {

// The named agent in a fresh top-level session of the caller's tenant,
// prompted once; its last answer is the output. A cancel interrupts it.
delegate_runner default_delegate_runner(host& h) {
  return [&h](delegate_call c, job_id id) -> awaitable<result<std::string>> {
    persistence::session_row row;
    row.id = session_id("s_" + id.str());
    row.description = "delegated task " + id.str();
    row.agent = c.agent;
    row.tenant = c.caller.tenant;
    row.policy = c.policy;
    row.depth = c.depth;
    row.budget_root = c.budget_root;
    row.task_id = id;  // its usage counts against the task
    auto s = co_await h.create_session_row(std::move(row));
    if (!s) co_return s.error();
    auto p = co_await h.prompt(*s, c.prompt);
    if (!p) co_return p.error();
    try {
      auto idle = co_await h.wait_idle(*s);
      if (!idle) co_return idle.error();
    } catch (const boost::system::system_error&) {
      h.interrupt(*s);  // cancelled: the child is interrupted too
      throw;
    }
    auto& store = h.store();
    auto read = [&store, s = *s, after = *p] { return store.last_assistant_after(s, after); };
    auto last = co_await store.offload(std::move(read));
    if (!last) co_return last.error();
    if (!*last) co_return error{errc::failed, "agent '" + c.agent + "' gave no answer"};
    co_return (*last)->text;
  };
}

// Prompts `agent` in session `sid` and returns its last answer: a fresh
// session (created here; one that exists already is a taken-over attempt's,
// so it is waited for instead of prompted again) or, with `main`, the
// agent's main session (created if missing, prompted every time).
awaitable<result<std::string>> prompt_in_session(host& h, std::string agent, std::string prompt,
                                                 session_id sid, bool main, std::string description,
                                                 protocol::session_policy policy) {
  auto& store = h.store();
  auto read = [&store, sid] { return store.session(sid); };
  auto have = co_await store.offload(std::move(read));
  if (!have) co_return have.error();
  std::int64_t after = 0;
  if (!*have) {
    persistence::session_row row;
    row.id = sid;
    row.description = std::move(description);
    row.agent = agent;
    row.policy = policy;
    auto s = co_await h.create_session_row(std::move(row));
    if (!s) co_return s.error();
  }
  if (main || !*have) {
    auto p = co_await h.prompt(sid, prompt);
    if (!p) co_return p.error();
    after = *p;
  }
  try {
    auto idle = co_await h.wait_idle(sid);
    if (!idle) co_return idle.error();
  } catch (const boost::system::system_error&) {
    h.interrupt(sid);  // timed out: the session is interrupted too
    throw;
  }
  auto last_read = [&store, sid, after] { return store.last_assistant_after(sid, after); };
  auto last = co_await store.offload(std::move(last_read));
  if (!last) co_return last.error();
  if (!*last) co_return error{errc::failed, "agent '" + agent + "' gave no answer"};
  co_return (*last)->text;
}

// A prompt job's occurrence: its agent in a fresh session named after the
// attempt, or in the agent's main session; the last answer is the output.
cron_prompt_runner default_cron_prompt_runner(host& h) {
  return [&h](protocol::cron_job_spec spec, job_id run,
              protocol::session_policy policy) -> awaitable<result<std::string>> {
    bool main = spec.session == protocol::cron_session::main;
    session_id sid(main ? "main-" + spec.agent : "s_" + run.str());
    co_return co_await prompt_in_session(h, spec.agent, spec.prompt, sid, main,
                                         "cron job " + spec.name, std::move(policy));
  };
}

// An SOP's prompt step: its agent in a fresh session named after the attempt.
sop_prompt_runner default_sop_prompt_runner(host& h) {
  return [&h](std::string agent, std::string prompt, job_id attempt,
              protocol::session_policy policy) -> awaitable<result<std::string>> {
    session_id sid("s_" + attempt.str());
    co_return co_await prompt_in_session(h, agent, prompt, sid, false, "SOP step " + attempt.str(),
                                         std::move(policy));
  };
}

}  // namespace

result<std::unique_ptr<host>> host::open(host_options opts) {
  if (!opts.agents)
    return error{errc::invalid, "host_options.agents is empty: a host needs an agent factory"};
  for (auto& [kind, policy] : {std::pair{"top_level", &opts.job_policies.top_level},
                               std::pair{"subagent", &opts.job_policies.subagent}})
    if (!is_job_policy(*policy))
      return error{errc::invalid, std::string("host_options.job_policies.") + kind + " '" +
                                      *policy +
                                      "' is not one of withhold, report_now; no host was opened"};
  if (opts.jobs.sandbox_dir.empty()) {
    // No sandbox configured: a local, unisolated daemon beside the database
    // runs every shell as an owned job, started when the first one launches.
    opts.jobs.sandbox_dir = sandbox::local_state_dir_for(opts.db_path);
    opts.jobs.start_daemon = true;
    opts.jobs.local = true;
    if (!opts.jobs.daemon_idle_exit) opts.jobs.daemon_idle_exit = std::chrono::seconds(60);
  }
  std::unique_ptr<host> h(new host(opts));
  persistence::db_options dbo;
  dbo.path = opts.db_path;
  dbo.sync = opts.sync;
  dbo.create = opts.create_db;
  dbo.max_batch = opts.max_batch;
  auto w = persistence::writer::open(dbo);
  if (!w) return w.error();
  h->writer_ = std::move(*w);
  h->store_ = std::make_unique<persistence::task_store>(*h->writer_, opts.db_path);
  h->delivery_ = std::make_unique<actors::delivery>(*h, *h->store_);
  h->jobs_ = std::make_unique<job_queue>(h->pool_->at(0), *h, *h->store_, opts.jobs);
  auto* hp = h.get();
  auto runner = opts.run_delegate ? opts.run_delegate : default_delegate_runner(*hp);
  auto deliver = [hp](persistence::receipt r) -> awaitable<void> {
    auto id = r.id;
    auto d = co_await hp->delivery_->deliver(notice_batch(std::move(r), false));
    if (!d) hp->warn("delegate receipt " + id.str() + " was kept pending: " + d.error().message);
  };
  h->delegates_ = std::make_shared<actors::delegates>(h->pool_->at(0), *h->store_, opts.delegation,
                                                      std::move(runner), std::move(deliver),
                                                      [hp](const std::string& w) { hp->warn(w); });
  if (opts.cron)
    h->cron_ = std::make_shared<actors::cron_scheduler>(
        h->pool_->at(0), *h->store_, *opts.cron, h->jobs_->channel_ptr(),
        default_cron_prompt_runner(*hp), opts.default_policy,
        [hp](const std::string& w) { hp->warn(w); });
  if (opts.sop)
    h->sop_ = std::make_shared<actors::sop_engine>(
        h->pool_->at(0), *h->store_, *opts.sop, h->jobs_->channel_ptr(),
        default_sop_prompt_runner(*hp), opts.default_policy,
        [hp](const std::string& w) { hp->warn(w); });
  return h;
}

host::host(host_options opts)
    : opts_(std::move(opts)),
      pool_(std::make_unique<runtime::executor_pool>(opts_.threads)),
      budgets_(opts_.action_budget),
      scrub_(protocol::scrub_rules::from_env(sandbox::current_environment())),
      directory_(
          protocol::scrubber(protocol::scrub_rules::from_env(sandbox::current_environment()))) {}

host::~host() {
  shutdown();
  // Frames still queued on the executors die with them; they may touch this
  // host (activity counters), so the executors go while every member lives.
  // The queue's connections before the executors they were opened on, and
  // the delegates' timer before its executor.
  sop_.reset();
  cron_.reset();
  jobs_.reset();
  delegates_.reset();
  pool_.reset();
}

void host::warn(const std::string& w) {
  if (opts_.log)
    opts_.log(w);
  else
    std::fprintf(stderr, "tether: %s\n", w.c_str());
}

std::int64_t host::next_generation() {
  return ++generation_;
}

void host::activity(int delta, bool job) {
  quiet_.add(delta, job);
}

void host::wake(session& s, wake_scope scope, bool report, bool admitted_here) {
  activity(+1);
  if (!s.tell(session_msg::wake{scope, report, true, admitted_here})) activity(-1);
}

void host::hand_over(session& s, wake_scope scope, bool admitted_here) {
  activity(+1);
  if (!s.inbox()->tell(inbox_msg::hand_over{scope, admitted_here})) activity(-1);
}

awaitable<void> host::wait_quiescent(bool jobs) {
  co_await quiet_.wait(jobs);
}

namespace {
error deleted_error(const session_id& s) {
  return error{errc::not_found, "session '" + s.str() + "' is being deleted"};
}
}  // namespace

result<std::shared_ptr<session>> host::get(const session_id& s) {
  {
    std::lock_guard lk(m_);
    if (closed_)
      return error{errc::stopped, "host is shutting down; session '" + s.str() + "' not loaded"};
    if (deleting_.count(s)) return deleted_error(s);
    auto it = sessions_.find(s);
    if (it != sessions_.end()) return it->second;
  }
  return adopt(s, store_->session(s));
}

awaitable<result<std::shared_ptr<session>>> host::load(
    session_id s, std::optional<persistence::session_row> known) {
  {
    std::lock_guard lk(m_);
    if (closed_)
      co_return error{errc::stopped, "host is shutting down; session '" + s.str() + "' not loaded"};
    if (deleting_.count(s)) co_return deleted_error(s);
    auto it = sessions_.find(s);
    if (it != sessions_.end()) co_return it->second;
  }
  if (known) co_return adopt(s, std::move(known));
  auto row = co_await store_->load_session(s);
  co_return adopt(s, std::move(row));
}

result<std::shared_ptr<session>> host::adopt(const session_id& s,
                                             result<std::optional<persistence::session_row>> row) {
  if (!row) return row.error();
  if (!*row) return error{errc::not_found, "session '" + s.str() + "' does not exist"};
  std::lock_guard lk(m_);
  if (closed_)
    return error{errc::stopped, "host is shutting down; session '" + s.str() + "' not loaded"};
  if (deleting_.count(s)) return deleted_error(s);
  auto it = sessions_.find(s);
  if (it != sessions_.end()) return it->second;
  auto a = opts_.agents->make(**row);
  // A session and its inbox share one executor; the inbox learns its
  // session by its first message.
  auto ex = pool_->next();
  auto box = std::make_shared<inbox>(ex, *this, s);
  auto ptr = std::make_shared<session>(ex, *this, **row, std::move(a), box);
  box->tell(inbox_msg::attach{ptr});
  sessions_.emplace(s, ptr);
  directory_.add(s, (*row)->parent, (*row)->agent, (*row)->description);
  return ptr;
}

bool host::is_busy(const session_id& s) {
  return directory_.is_busy(s);
}

result<owner_scope> host::scope_of(const session_id& s) {
  auto row = store_->session(s);
  if (!row) return row.error();
  if (!*row) return error{errc::not_found, "session '" + s.str() + "' does not exist"};
  if (!(*row)->turn)
    return error{errc::refused,
                 "session '" + s.str() + "' has had no turn yet; a job needs a turn to own it"};
  owner_scope o;
  o.tenant = (*row)->tenant;
  o.thread = s;
  o.turn = *(*row)->turn;
  return o;
}

awaitable<result<void>> host::set_job_policy(session_id s, bool notify, std::string policy) {
  if (!is_job_policy(policy))
    co_return error{errc::invalid, "job policy '" + policy +
                                       "' is not one of withhold, report_now; the session's "
                                       "policy was kept"};
  // The session's actor owns its policy: it writes it and keeps it.
  auto sess = co_await load(s);
  if (!sess) co_return sess.error();
  session_msg::set_job_policy m{notify, std::move(policy), {}};
  co_return co_await (*sess)->ask(std::move(m));
}

void host::note_phase(const session_id& s, bool busy, bool settling, bool foreground) {
  directory_.phase(s, busy, settling, foreground);
}

void host::note_child(const session_id& parent, const session_id& child) {
  directory_.add_child(parent, child);
}

std::vector<protocol::running_item> host::outstanding(const session_id& s) {
  auto under = directory_.running_under(s);
  std::vector<protocol::running_item> jobs;
  for (auto& u : under.sessions)
    for (auto& j : jobs_->running(u)) jobs.push_back(std::move(j));
  jobs.insert(jobs.end(), std::make_move_iterator(under.subagents.begin()),
              std::make_move_iterator(under.subagents.end()));
  return jobs;
}

awaitable<result<session_id>> host::create_session(std::string description,
                                                   std::optional<session_id> id, std::string agent,
                                                   protocol::tenant_id tenant,
                                                   std::optional<protocol::session_policy> policy) {
  persistence::session_row row;
  row.tenant = std::move(tenant);
  row.id = id ? *id : session_id(protocol::mint("ses"));
  row.description = std::move(description);
  row.agent = std::move(agent);
  row.policy = std::move(policy);
  co_return co_await create_session_row(std::move(row));
}

awaitable<result<session_id>> host::create_session_row(persistence::session_row row) {
  if (row.tenant.empty())
    co_return error{errc::invalid,
                    "a session needs a tenant; the empty tenant was refused and "
                    "no session was created"};
  if (!row.policy) row.policy = opts_.default_policy;
  if (auto bad = protocol::check(*row.policy))
    co_return error{errc::invalid, "the session's policy field '" + bad->field + "' " +
                                       bad->problem + "; no session was created"};
  row.parent.reset();
  row.job_policy = opts_.job_policies.top_level;
  auto sid = row.id;
  auto r = co_await store_->create_session(std::move(row));
  if (!r) co_return r.error();
  co_return sid;
}

awaitable<result<std::int64_t>> host::prompt(session_id s, std::string text, bool steer) {
  auto sess = co_await load(s);
  if (!sess) co_return sess.error();
  session_msg::input in{steer ? "steer" : "prompt", std::move(text), {}};
  co_return co_await (*sess)->ask(std::move(in));
}

void host::nudge(const session_id& s, wake_scope scope) {
  if (auto sess = get(s)) wake(**sess, scope, false);
}

void host::interrupt(const session_id& s) {
  if (auto sess = get(s)) (*sess)->tell(session_msg::interrupt{});
}

awaitable<result<void>> host::stage_revert(session_id s, bool staged) {
  auto sess = co_await load(s);
  if (!sess) co_return sess.error();
  session_msg::set_revert m{staged, {}};
  co_return co_await (*sess)->ask(std::move(m));
}

awaitable<result<notification_id>> host::background(session_id child) {
  auto sess = co_await load(child);
  if (!sess) co_return sess.error();
  session_msg::to_background m;
  co_return co_await (*sess)->ask(std::move(m));
}

awaitable<result<job_id>> host::create_goal(session_id owner, std::string description) {
  auto row = co_await store_->load_session(owner);
  if (!row) co_return row.error();
  if (!*row)
    co_return error{errc::not_found, "session '" + owner.str() + "' not found; no goal was made"};
  owner_scope scope;
  scope.tenant = (*row)->tenant;
  scope.thread = owner;
  scope.turn = (*row)->turn ? *(*row)->turn : protocol::turn_id("goal");
  job_id id("goal_" + protocol::random_uuid());
  auto admitted = co_await store_->admit_goal(
      id, scope, (*row)->tree_root(), protocol::make_preview(scrub_.scrub(description), 500).text);
  if (!admitted) co_return admitted.error();
  co_return id;
}

awaitable<result<persistence::goal_record>> host::goal(session_id caller, job_id id) {
  auto row = co_await store_->load_session(caller);
  if (!row) co_return row.error();
  auto& store = *store_;
  auto read = [&store, id] { return store.goal(id); };
  auto g = co_await store.offload(std::move(read));
  if (!g) co_return g.error();
  // Another tree's (or tenant's) goal reads as a missing one.
  if (!*row || !*g || (*g)->scope.tenant != (*row)->tenant || (*g)->root != (*row)->tree_root())
    co_return error{errc::not_found, "goal '" + id.str() + "' not found"};
  co_return std::move(**g);
}

std::string host::goal_notice(const persistence::goal_record& g, const std::string& state) const {
  std::string text = "[goal " + g.id.str() + " " + state + "] " + g.description + "\n" +
                     std::to_string(g.members.size()) + " tasks; usage " +
                     std::to_string(g.input_tokens) + " input, " + std::to_string(g.output_tokens) +
                     " output tokens";
  int shown = 0;
  for (const auto& m : g.members) {
    if (++shown > 20) {
      text += "\n...[" + std::to_string(g.members.size() - 20) + " more]";
      break;
    }
    text += "\n- " + m.id.str() + " (" + m.kind + ") " + m.state;
  }
  return protocol::bounded_text(scrub_.scrub(text), 4000);
}

awaitable<result<persistence::goal_record>> host::close_goal(session_id caller, job_id id,
                                                             std::string state) {
  auto g = co_await goal(caller, id);
  if (!g) co_return g.error();
  if (g->state != "running")
    co_return error{errc::conflict,
                    "goal '" + id.str() + "' is already " + g->state + "; it was left as it was"};
  auto won = co_await store_->close_goal(id, state, goal_notice(*g, state));
  if (!won) co_return won.error();
  if (!*won) {
    auto now = co_await goal(caller, id);
    if (!now) co_return now.error();
    co_return error{errc::conflict,
                    "goal '" + id.str() + "' is already " + now->state + "; it was left as it was"};
  }
  TETHER_CRASH_POINT("goal.close.after_commit");
  auto rid = (*won)->id;
  auto d = co_await delivery_->deliver(notice_batch(std::move(**won), false));
  if (!d) warn("goal receipt " + rid.str() + " was kept pending: " + d.error().message);
  g->state = state;
  co_return std::move(*g);
}

awaitable<result<void>> host::wait_idle(session_id s) {
  auto sess = co_await load(s);
  if (!sess) co_return sess.error();
  session_msg::wait_idle m;
  co_return co_await (*sess)->ask(std::move(m));
}

awaitable<result<host::deleted>> host::delete_session(session_id s) {
  auto sess = co_await load(s);
  if (!sess) co_return sess.error();
  {
    std::lock_guard lk(m_);
    if (!deleting_.insert(s).second) co_return deleted_error(s);
  }
  // From here nothing new reaches it: load() and get() refuse it, so a
  // delivery finds its owner gone and drops the receipt.
  auto actor = *sess;
  actor->tell(session_msg::interrupt{});
  {
    session_msg::wait_idle m;
    (void)co_await actor->ask(std::move(m));  // its settle ran (or it was idle)
  }
  {
    auto st = runtime::one_shot<result<void>>::make();
    if (actor->tell(session_msg::shutdown{runtime::reply_to<void>(st)}))
      (void)co_await st->async_wait(asio::use_awaitable);
    // Its mailbox stays open until the last reference goes: a wake already
    // on its way is still handled (and its activity count released), and
    // starts nothing.
  }
  auto forget = [this, &s] {
    std::lock_guard lk(m_);
    sessions_.erase(s);
    directory_.remove(s);
    deleting_.erase(s);
  };
  deleted out;
  auto cancelled = co_await jobs_->stop_thread(actor->tenant(), s);
  if (!cancelled) {
    forget();  // the next call loads it from disk again
    co_return error{cancelled.error().code, "session '" + s.str() +
                                                "' was not deleted: cancelling its jobs failed: " +
                                                cancelled.error().message};
  }
  out.jobs_cancelled = *cancelled;
  // Its jobs are cancelled (durably) and its row is not yet deleted: a crash
  // here leaves the session on disk, its jobs cancelled; deleting it again
  // finishes the job.
  TETHER_CRASH_POINT("delete.cancel.after_jobs");
  auto dropped = co_await store_->delete_session(s);
  forget();
  if (!dropped) co_return dropped.error();
  out.receipts_dropped = *dropped;
  co_return out;
}

awaitable<void> host::deliver_owed(session_id parent, std::vector<job_row> rows,
                                   std::shared_ptr<boot_report> rep,
                                   std::shared_ptr<std::mutex> m) {
  // Chunks go out together, spawned in order on this executor: each sends its
  // admit before the next starts, and the parent's inbox mailbox and the writer's
  // queue keep that order, so the inbox order is the outbox order.
  constexpr std::size_t k_chunk = 512;
  // The parent's actor is loaded first (its row read off this executor), so
  // no chunk's deliver suspends before its admit is sent: the admits leave in
  // chunk order. A parent that is gone is handled by each deliver.
  (void)co_await load(parent);
  auto ex = co_await asio::this_coro::executor;
  std::size_t chunks = (rows.size() + k_chunk - 1) / k_chunk;
  auto left = std::make_shared<std::atomic<std::size_t>>(chunks);
  auto all_done = runtime::one_shot<int>::make();
  for (std::size_t at = 0; at < rows.size(); at += k_chunk) {
    delivery_batch b;
    b.owner = parent;
    b.recovering = true;  // phases 2 and 3 wake the parent
    std::size_t end = std::min(rows.size(), at + k_chunk);
    b.items.reserve(end - at);
    for (std::size_t i = at; i < end; ++i)
      b.items.push_back({std::move(rows[i].nid), std::nullopt, std::move(rows[i].child),
                         std::move(rows[i].body).value_or("")});
    auto n = static_cast<int>(b.items.size());
    auto task = delivery_->deliver(std::move(b));
    auto on_done = [this, parent, n, rep, m, left, all_done](std::exception_ptr e, result<int> r) {
      if (e) r = error{errc::failed, runtime::detail::describe(e)};
      {
        std::lock_guard lk(*m);
        if (r) {
          rep->delivered += n;
        } else {
          // An id conflict or any other failure: keep the rows, move on.
          std::string w = "boot: " + std::to_string(n) + " report(s) to " + parent.str() +
                          " not delivered: " + r.error().message + "; the rows were kept";
          rep->kept += n;
          rep->warnings.push_back(w);
          warn(w);
        }
      }
      if (--*left == 0) all_done->set(0);
    };
    asio::co_spawn(ex, std::move(task), std::move(on_done));
  }
  if (chunks > 0) co_await all_done->async_wait(asio::use_awaitable);
}

awaitable<bool> host::deliver_outbox(session_id owner, std::vector<outbox_entry> entries,
                                     std::shared_ptr<runtime::one_shot<int>> after,
                                     std::shared_ptr<boot_report> rep,
                                     std::shared_ptr<std::mutex> m) {
  // The owner's entries of the page before stopped short: these stay
  // pending behind them, so that the next boot still hands them over in order.
  if (after && co_await after->async_wait(asio::use_awaitable) != 0) co_return false;
  for (std::size_t at = 0; at < entries.size();) {
    if (std::holds_alternative<job_row>(entries[at])) {
      // A run of reports: in chunks, side by side, in order (deliver_owed).
      std::vector<job_row> rows;
      for (; at < entries.size() && std::holds_alternative<job_row>(entries[at]); ++at)
        rows.push_back(std::move(std::get<job_row>(entries[at])));
      co_await deliver_owed(owner, std::move(rows), rep, m);
      continue;
    }
    auto r = std::move(std::get<persistence::receipt>(entries[at++]));
    auto id = r.id;
    auto d = co_await delivery_->deliver(notice_batch(std::move(r), true));
    std::lock_guard lk(*m);
    if (d && *d > 0) ++rep->jobs.redelivered;
    if (!d) {
      auto w = "boot: receipt " + id.str() + " was kept pending: " + d.error().message;
      rep->jobs.warnings.push_back(w);
      warn(w);
    }
  }
  co_return true;
}

awaitable<bool> host::resume_inbox_period(persistence::session_row s, boot_report& rep) {
  auto attempts = co_await store_->bump_resume(s.id);
  if (!attempts) {
    // The claim stays: the next boot looks again; nothing was released.
    std::string w = "boot: resuming " + s.id.str() + ": " + attempts.error().message +
                    "; its claim was kept for the next boot";
    rep.warnings.push_back(w);
    warn(w);
    ++rep.kept;
    co_return false;
  }
  TETHER_CRASH_POINT("boot.resume_inbox.after_count");
  if (*attempts <= opts_.resume_budget) co_return true;
  // Out of resumes: the period reports an error instead of running again.
  ++rep.exhausted;
  persistence::settle_request req;
  req.child = s.id;
  req.outcome = protocol::report_state::error;
  req.input_cursor = s.input_cursor;
  req.description = s.description;
  bool deliverable = s.parent && s.notify.value_or(true);
  std::optional<notification_id> nid;
  if (deliverable) {
    nid = notification_id(protocol::mint("msg"));
    req.mint_none = nid;
    req.parent = s.parent;
    req.body = protocol::render_report(s.id, protocol::report_state::error, s.description,
                                       "Subagent failed: resume budget of " +
                                           std::to_string(opts_.resume_budget) +
                                           " exhausted after a restart");
  }
  auto body = req.body;
  auto settled = co_await store_->settle(std::move(req));
  if (!settled) {
    std::string w = "boot: settling " + s.id.str() +
                    " after its resume budget ran out: " + settled.error().message +
                    "; its claim was kept for the next boot";
    rep.warnings.push_back(w);
    warn(w);
    ++rep.kept;
    co_return false;
  }
  TETHER_CRASH_POINT("boot.exhausted.after_settle");
  if (settled->row_written && nid) {
    delivery_batch b;
    b.owner = *s.parent;
    b.items.push_back({*nid, std::nullopt, s.id, std::move(body)});
    auto d = co_await delivery_->deliver(std::move(b));
    if (d) {
      ++rep.delivered;
    } else {
      std::string w = "boot: report " + nid->str() + " to " + s.parent->str() +
                      " not delivered: " + d.error().message + "; the row was kept";
      rep.warnings.push_back(w);
      warn(w);
      ++rep.kept;
    }
  }
  co_return false;
}

// Boot's read of its outbox and the deliveries it starts, shared by boot
// and page_outbox: each owner's last delivery (the next page's entries of
// that owner wait for it), how many deliveries (and the read itself) are
// still running, and a row that did not decode.
struct host::boot_pages {
  std::shared_ptr<boot_report> rep;
  std::shared_ptr<std::mutex> rep_m;
  std::optional<persistence::outbox_key> last;  // the newest pending receipt when boot read it
  std::map<session_id, std::shared_ptr<runtime::one_shot<int>>> tails;  // by owner
  std::atomic<std::size_t> left{1};  // deliveries running, plus the read's own count
  std::shared_ptr<runtime::one_shot<int>> all_done = runtime::one_shot<int>::make();
  std::optional<error> corrupt;  // boot stops once what is in flight is done
  void finish_one() {
    if (--left == 0) all_done->set(0);
  }
};

void host::outbox_warning(boot_pages& st, const error& e) {
  auto w = "boot: pending receipts were not read: " + e.message +
           "; they stay pending for the next boot";
  std::lock_guard lk(*st.rep_m);  // earlier pages' deliveries write the report too
  st.rep->warnings.push_back(w);
  warn(w);
}

awaitable<void> host::page_outbox(std::shared_ptr<boot_pages> st) {
  if (!st->last) co_return;
  auto& store = *store_;
  // A small first page (the writer starts sooner), then larger ones (fewer
  // admits split across pages), but not so large that reading one takes
  // longer than admitting the one before: 65,536 rows did, and the writer
  // waited for the read.
  const std::size_t first_page = std::max<std::size_t>(opts_.boot_outbox_page, 1);
  std::size_t page_size = first_page;
  // Each page's read is queued as soon as the page before it came back, so
  // it runs while that page is sorted by owner and its deliveries start.
  // The read holds copies of its bounds: it may finish after this returns.
  auto start_read = [&store, last = *st->last](persistence::outbox_key after, std::size_t n) {
    auto read_page = [&store, after = std::move(after), last, n] {
      return store.outbox_page(after, last, n);
    };
    return store.start(std::move(read_page));
  };
  auto next = start_read({std::numeric_limits<std::int64_t>::min(), ""}, page_size);
  for (;;) {
    auto page = co_await next->async_take(asio::use_awaitable);
    next.reset();
    if (!page) {
      if (page.error().code == errc::corrupt)
        st->corrupt = page.error();
      else
        outbox_warning(*st, page.error());
      co_return;
    }
    if (page->empty()) co_return;
    bool more = page->size() == page_size;
    page_size = first_page * 4;  // every page after the first
    if (more) next = start_read({page->back().r.created_at, page->back().r.id.str()}, page_size);
    std::map<session_id, std::vector<outbox_entry>> outbox;
    for (auto& row : *page) {
      if (row.kind == "subagent") {
        // Its report, delivered with its row (a running child's started
        // receipt, or a receipt with no terminal row, has none here).
        if (!row.owed) continue;
        auto& job = *row.owed;
        if (!job.parent) {
          warn("job " + job.id.str() + " has no parent to report to; the row was cleared");
          {
            std::lock_guard lk(*st->rep_m);
            ++st->rep->cleared;
          }
          std::vector<notification_id> one{job.nid};
          co_await store_->complete(std::move(one), false);
          TETHER_CRASH_POINT("boot.clear.after_commit");
          continue;
        }
        auto parent = *job.parent;
        outbox[parent].emplace_back(std::move(job));
      } else if (!row.kind.empty()) {
        // Every other kind's (a shell's, a delegate's, a goal's): a notice.
        auto owner = row.r.scope.thread;
        outbox[owner].emplace_back(std::move(row.r));
      }
    }
    for (auto& [owner, entries] : outbox) {
      auto done = runtime::one_shot<int>::make();
      auto& tail = st->tails[owner];
      auto task = deliver_outbox(owner, std::move(entries), tail, st->rep, st->rep_m);
      tail = done;
      ++st->left;
      // Touches only st's count and report lock, which other threads share.
      auto on_done = [this, owner = owner, done, st](std::exception_ptr e, bool delivered) {
        if (e) {
          // Its later entries, on this page and the next, stay pending.
          auto w = "boot: delivering to " + owner.str() +
                   " stopped: " + runtime::detail::describe(e) +
                   "; its entries not yet delivered stay pending for the next boot";
          std::lock_guard lk(*st->rep_m);
          warn(w);
        }
        done->set(e || !delivered ? 1 : 0);
        st->finish_one();
      };
      asio::co_spawn(pool_->next(), std::move(task), std::move(on_done));
    }
    if (!more) co_return;
  }
}

awaitable<result<boot_report>> host::boot() {
  auto shared_rep = std::make_shared<boot_report>();
  auto rep_m = std::make_shared<std::mutex>();
  boot_report& rep = *shared_rep;
  // Every field a decision below depends on validates before anything runs,
  // is delivered or is written. Every read those decisions start from is
  // queued on the read threads behind validation's scans, before anything is
  // written, and used only once validation passed: the running subagent
  // rows, the sessions' links (whose read decodes every session's policy as
  // a loaded session would, and refuses the boot on one that does not) and
  // the job queue's recovery reads; the claims an inbox woke are read on the
  // writer's connection meanwhile. A failed read refuses the boot before a
  // resume is counted. What the recoveries below write between these reads
  // and their use changes none of them (they write other kinds' rows), and
  // phase 1 only takes children out of the woken claims (a settle ends the
  // claim), never adds one.
  auto& store = *store_;
  auto validation = store.start_validation();
  auto read_sessions = [s = &store] { return s->session_links(); };
  auto sessions_read = store.start(std::move(read_sessions));
  auto read_jobs = [s = &store] { return s->running_jobs(); };
  auto jobs_read = store.start(std::move(read_jobs));
  auto recovery_reads = job_queue::start_recovery_reads(store);
  auto validated = store.finish_validation(std::move(validation));
  auto woken_read = store.claims_woken_by_inbox();
  using namespace asio::experimental::awaitable_operators;
  auto first = co_await (std::move(validated) && std::move(woken_read));
  auto& valid = std::get<0>(first);
  if (!valid) co_return error{valid.error().code, "refusing to boot: " + valid.error().message};
  auto sessions = co_await sessions_read->async_take(asio::use_awaitable);
  auto jobs = co_await jobs_read->async_take(asio::use_awaitable);
  // Both results were moved out; their one_shots go now.
  sessions_read.reset();
  jobs_read.reset();
  auto& woken = std::get<1>(first);
  if (!sessions)
    co_return error{sessions.error().code, "refusing to boot: " + sessions.error().message};
  if (!jobs) co_return error{jobs.error().code, "refusing to boot: " + jobs.error().message};
  if (!woken) co_return error{woken.error().code, "refusing to boot: " + woken.error().message};
  // Children whose claimed period was woken by their inbox: resumed below,
  // never released (releasing would drop the report their settle owes).
  std::set<session_id> woken_by_inbox(woken->begin(), woken->end());
  // Owned jobs first: an outstanding owner that cannot be recovered stops the
  // boot before any session resumes, so no new work starts.
  auto recovered = co_await jobs_->recover(std::move(recovery_reads));
  if (!recovered) co_return recovered.error();
  rep.jobs = std::move(*recovered);
  TETHER_CRASH_POINT("boot.recover.after_jobs");
  // Delegated tasks a dead owner left: intents settled, then lost or timed
  // out rows; their receipts go out with the other notices just below.
  auto settled = co_await delegates_->recover(false);
  if (!settled)
    co_return error{settled.error().code, "refusing to boot: " + settled.error().message};
  rep.delegation = std::move(*settled);
  // Phase 1 binds the running subagent rows, then delivers every pending
  // receipt (the notices of owned jobs that ended while the host was down
  // included), each owner's in its outbox order.
  // Whether the link of each child with running rows delivers, from the
  // rows read above: boot never reads a session actor's state.
  std::map<session_id, bool> link_delivers;
  for (auto& row : *jobs)
    if (row.child) link_delivers.emplace(*row.child, false);
  if (!link_delivers.empty())
    for (auto& s : *sessions)
      if (auto it = link_delivers.find(s.id); it != link_delivers.end())
        it->second = s.parent && s.notify.value_or(true);
  // Count this boot against the resume budget of each child with running
  // rows, once per child however many rows it owes, and bind them.
  std::set<session_id> children_with_jobs;
  std::map<session_id, result<int>> resumes;  // the child's count after this boot's bump
  for (auto& row : *jobs) {
    if (!row.child) continue;
    auto counted = resumes.find(*row.child);
    if (counted == resumes.end()) {
      auto bumped = co_await store_->bump_resume(*row.child);
      if (bumped) TETHER_CRASH_POINT("boot.resume.after_count");
      counted = resumes.emplace(*row.child, std::move(bumped)).first;
    }
    const auto& attempts = counted->second;
    if (!attempts) {
      warn("boot: job " + row.id.str() + ": " + attempts.error().message + "; the row was kept");
      ++rep.kept;
      continue;
    }
    job_binding b;
    b.id = row.id;
    b.nid = row.nid;
    b.generation = row.generation;
    b.background = true;
    b.parent = row.parent;
    b.description = row.description;
    if (*attempts > opts_.resume_budget) {
      // Out of resumes: the job reports an error instead of running again.
      // Its report's receipt is written pending (or dropped, if the child's
      // link does not deliver) before the outbox is read below, so it goes
      // out with it, the newest of its parent's.
      auto loaded = co_await load(*row.child);
      if (!loaded) continue;
      persistence::settle_request req;
      req.child = *row.child;
      req.outcome = protocol::report_state::error;
      req.background_job = row.id;
      req.drop_background = !link_delivers[*row.child];
      // The count stays: a crash before the child's other rows settle must
      // not give them a fresh budget.
      req.keep_resume_attempts = true;
      req.body = protocol::render_report(*row.child, protocol::report_state::error, row.description,
                                         "Subagent failed: resume budget of " +
                                             std::to_string(opts_.resume_budget) +
                                             " exhausted after a restart");
      auto settled = co_await store_->settle(std::move(req));
      if (settled) TETHER_CRASH_POINT("boot.exhausted.after_settle");
      ++rep.exhausted;
      continue;
    }
    children_with_jobs.insert(*row.child);
    auto child = co_await load(*row.child);
    if (child) {
      session_msg::bind_job bind{std::move(b)};
      (*child)->tell(std::move(bind));
    }
  }

  // Deliver every pending receipt through the one delivery path, owners
  // side by side, each owner's in the outbox's order (each receipt's
  // creation, then id), reports and notices interleaved as they were
  // written, without a model turn: nobody is woken here; phases 2 and 3
  // below wake every session with a pending inbox, once all of it is in.
  // The outbox is read up to its newest receipt as it is now (the reports
  // settled just above included), a page at a time (page_outbox), beside
  // the reads phases 2 and 3 need: the writer admits the first reports
  // while the rest are read.
  auto pages = std::make_shared<boot_pages>();
  pages->rep = shared_rep;
  pages->rep_m = rep_m;
  auto read_end = [&store] { return store.outbox_end(); };
  auto end = co_await store.offload(std::move(read_end));
  if (!end) outbox_warning(*pages, end.error());
  if (end && *end) pages->last = **end;
  // Beside the read: the sessions into the directory. The fill yields now
  // and then, so that each page's deliveries start as soon as it is read.
  auto fill_directory = [this, &sessions]() -> awaitable<void> {
    std::size_t n = 0;
    for (auto& s : *sessions) {
      directory_.add(s.id, s.parent, std::move(s.agent), std::move(s.description));
      if (++n % 4096 == 0) co_await asio::post(asio::use_awaitable);
    }
  };
  // Whatever ends the read (an exception included), the deliveries it
  // started finish before boot goes on or returns.
  std::exception_ptr stopped;
  try {
    co_await (page_outbox(pages) && fill_directory());
  } catch (...) {
    stopped = std::current_exception();
  }
  pages->finish_one();
  co_await pages->all_done->async_wait(asio::use_awaitable);
  if (stopped) std::rethrow_exception(stopped);
  if (pages->last) TETHER_CRASH_POINT("boot.deliver.after_owed");
  // As validation refuses a row before anything runs: what was delivered
  // before it stays delivered, the rest stays pending.
  if (pages->corrupt)
    co_return error{pages->corrupt->code, "refusing to boot: " + pages->corrupt->message +
                                              "; the outbox's entries before it were delivered, "
                                              "the rest stay pending"};

  // Phases 2 and 3: resume suspended sessions, top-level first. A session
  // with reports waiting in its inbox is woken too. Read again (phase 1
  // settled some), but only the sessions these phases may wake.
  auto read_resumable = [&store] { return store.sessions_to_resume(); };
  auto refreshed = co_await store.offload(std::move(read_resumable));
  if (!refreshed)
    co_return error{refreshed.error().code, "refusing to boot: " + refreshed.error().message};
  auto read_pending = [&store] { return store.sessions_with_pending_inbox(); };
  auto pending_inbox = co_await store.offload(std::move(read_pending));
  if (!pending_inbox)
    co_return error{pending_inbox.error().code,
                    "refusing to boot: " + pending_inbox.error().message};
  std::set<session_id> with_pending(pending_inbox->begin(), pending_inbox->end());
  for (int phase = 2; phase <= 3; ++phase) {
    for (auto& s : *refreshed) {
      bool top = !s.parent.has_value();
      if ((phase == 2) != top) continue;
      bool pending = with_pending.count(s.id) > 0;
      bool suspended = s.time_suspended.has_value();
      bool owes_job = children_with_jobs.count(s.id) > 0;
      if (suspended && !top && !owes_job && woken_by_inbox.count(s.id)) {
        // A child mid-turn with no job row whose period took only its inbox
        // (a shell's notice, a report): the report its settle mints exists
        // nowhere else, so the period resumes, counted against the budget.
        auto resumed = co_await resume_inbox_period(s, rep);
        if (!resumed) continue;
      } else if (suspended && !top && !owes_job) {
        // A child mid-turn with no job row (seed §6, deferred): its claim is
        // released, as a foreground child whose parent retries.
        persistence::settle_request req;
        req.child = s.id;
        req.input_cursor = s.input_cursor;
        auto rel = co_await store_->settle(std::move(req));
        if (!rel) warn("boot: releasing the claim of " + s.id.str() + ": " + rel.error().message);
        if (rel) TETHER_CRASH_POINT("boot.release.after_commit");
        suspended = false;
      }
      // A running job row whose busy period never began (the crash came
      // between registering it and the child's start) is resumed as well.
      if (!suspended && !owes_job && !(pending && !s.revert_staged)) continue;
      auto sess = co_await load(s.id);
      if (!sess) continue;
      wake(**sess, wake_scope::input, false);
      TETHER_CRASH_POINT("boot.wake.after_tell");
      (phase == 2 ? rep.resumed_top : rep.resumed_children)++;
    }
  }
  // Only now may a job followed since recovery wake its session: a job that
  // ended while the host was down would otherwise wake its owner now, and the
  // busy period it begins would look like a crashed claim to phase 3, which
  // would release it (and a crash before its settle would lose its report).
  jobs_->sessions_resumed();
  // The delegates' heartbeat and their periodic recovery from now on.
  delegates_->start();
  // Retention last: nothing it deletes is owed, so nothing above needs it.
  auto expired = co_await expire_tasks();
  if (expired && opts_.on_retention_sweep) opts_.on_retention_sweep(*expired);
  if (opts_.task_retention && !sweep_timer_) {
    if (auto held = sweeps_.enter()) {
      auto ex = pool_->at(0);
      sweep_timer_ = std::make_shared<asio::steady_timer>(ex);
      asio::co_spawn(ex, retention_sweeps(std::move(held)), asio::detached);
    }
  }
  // Scheduled work last: its runs may prompt sessions that boot resumed.
  if (cron_) {
    auto started = co_await cron_->start();
    if (!started) co_return started.error();
    std::lock_guard lk(*rep_m);
    rep.cron = std::move(*started);
  }
  // SOP runs after it: a run's prompt steps may prompt sessions too.
  if (sop_) {
    auto started = co_await sop_->start();
    if (!started) co_return started.error();
    std::lock_guard lk(*rep_m);
    rep.sop = std::move(*started);
  }
  std::lock_guard lk(*rep_m);
  if (expired)
    rep.expired = *expired;
  else {
    auto w = "boot: expiring finished tasks: " + expired.error().message +
             "; they stay until the next try";
    rep.warnings.push_back(w);
    warn(w);
  }
  co_return rep;
}

awaitable<void> host::retention_sweeps(runtime::gate::holder held) {
  // `held` keeps shutdown's close of the gate waiting until this frame ends.
  (void)held;
  auto timer = sweep_timer_;
  for (;;) {
    timer->expires_after(opts_.retention_sweep_every);
    boost::system::error_code ec;
    co_await timer->async_wait(asio::redirect_error(asio::use_awaitable, ec));
    if (ec || shutting_down_) co_return;
    auto n = co_await expire_tasks();
    if (!n)
      warn("retention: expiring finished tasks: " + n.error().message +
           "; they stay until the next sweep");
    else if (opts_.on_retention_sweep)
      opts_.on_retention_sweep(*n);
  }
}

awaitable<result<int>> host::expire_tasks() {
  if (!opts_.task_retention) co_return 0;
  auto before = runtime::now_ms() - opts_.task_retention->count();
  constexpr int k_batch = 1000;  // one transaction each: the writer's other requests interleave
  int total = 0;
  for (;;) {
    auto n = co_await store_->expire_tasks(before, k_batch);
    if (!n) co_return n.error();
    total += *n;
    if (*n < k_batch) co_return total;
  }
}

void host::shutdown() {
  if (shutting_down_.exchange(true)) return;  // once; a second call returns at once
  // The retention sweep first: its timer is cancelled on its executor, and a
  // sweep already running finishes while the writer still answers it.
  {
    auto stop_sweeps = [this]() -> awaitable<void> {
      if (sweep_timer_) sweep_timer_->cancel();
      co_await sweeps_.close();
      // The timer goes before its executor does (~host destroys the pool).
      sweep_timer_.reset();
    };
    try {
      runtime::sync_wait(pool_->at(0), stop_sweeps());
    } catch (const std::exception& e) {
      warn(std::string("shutdown: retention sweep: ") + e.what());
    }
  }
  // The SOP engine first: no new claim, and its steps in flight end while the
  // sessions and the sandbox channel still answer them.
  if (sop_) {
    try {
      runtime::sync_wait(pool_->at(0), sop_->shutdown());
    } catch (const std::exception& e) {
      warn(std::string("shutdown: SOP engine: ") + e.what());
    }
  }
  // The scheduler next: no new claim, and its runs in flight end while the
  // sessions and the sandbox channel still answer them.
  if (cron_) {
    try {
      runtime::sync_wait(pool_->at(0), cron_->shutdown());
    } catch (const std::exception& e) {
      warn(std::string("shutdown: cron scheduler: ") + e.what());
    }
  }
  // Delegated tasks: their workers are interrupted, their rows stay running
  // for the next boot's recovery.
  if (delegates_) {
    try {
      runtime::sync_wait(pool_->at(0), delegates_->shutdown());
    } catch (const std::exception& e) {
      warn(std::string("shutdown: delegated tasks: ") + e.what());
    }
  }
  // The queue next: its coroutines finish (their connections closed) while
  // the sessions and the writer still answer them.
  if (jobs_) {
    try {
      runtime::sync_wait(pool_->at(0), jobs_->stop());
    } catch (const std::exception& e) {
      warn(std::string("shutdown: job queue: ") + e.what());
    }
  }
  std::vector<std::shared_ptr<session>> all;
  {
    std::lock_guard lk(m_);
    closed_ = true;  // no session is loaded after this snapshot
    for (auto& [id, s] : sessions_) all.push_back(s);
  }
  // Every session stops its busy period without settling (claims and
  // running rows stay for the next boot), then its mailbox.
  auto stop_all = [](std::vector<std::shared_ptr<session>> all) -> awaitable<void> {
    std::vector<std::shared_ptr<runtime::one_shot<result<void>>>> acks;
    for (auto& s : all) {
      auto st = runtime::one_shot<result<void>>::make();
      session_msg::shutdown m{runtime::reply_to<void>(st)};
      if (s->tell(std::move(m))) acks.push_back(st);
    }
    for (auto& a : acks) co_await a->async_wait(asio::use_awaitable);
    for (auto& s : all) {
      co_await s->inbox()->stop();
      co_await s->stop();
    }
  };
  if (!all.empty()) {
    try {
      runtime::sync_wait(pool_->at(0), stop_all(std::move(all)));
    } catch (const std::exception& e) {
      warn(std::string("shutdown: ") + e.what());
    }
  }
  if (writer_) writer_->stop();
  pool_->stop();
  // A read offloaded before the stop completes into a stopped executor, which
  // still exists: it must be done posting before ~host destroys the executors.
  if (store_) store_->join_reads();
  {
    std::lock_guard lk(m_);
    sessions_.clear();
  }
}

}  // namespace tether::actors
