#include "tether/actors/delegates.hpp"

#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/json.hpp>
#include <random>

#include "tether/protocol/json.hpp"
#include "tether/protocol/output_tail.hpp"
#include "tether/runtime/artifact.hpp"
#include "tether/runtime/clock.hpp"
#include "tether/runtime/crash_point.hpp"
#include "tether/runtime/owner_identity.hpp"
#include "tether/sandbox/client.hpp"

namespace tether::actors {

namespace asio = boost::asio;
namespace json = boost::json;
using persistence::delegate_task;
using persistence::receipt;

namespace {

const std::string& my_identity() {
  static const std::string id = runtime::to_string(runtime::current_process_identity());
  return id;
}

bool is_terminal(delegate_state s) {
  return s != delegate_state::running;
}

// What an artifact says, once its digest matched: its task and output.
struct envelope_fields {
  std::string task;
  std::string output;
};

result<envelope_fields> open_envelope(const std::string& bytes) {
  auto v = protocol::parse_json(bytes);
  if (!v) return error{errc::corrupt, "the artifact is not JSON: " + v.error().describe()};
  auto f = protocol::fields::of(*v, "artifact");
  if (!f) return error{errc::corrupt, f.error().describe()};
  auto task = f->str("task_id");
  auto output = f->str("output");
  if (!task) return error{errc::corrupt, task.error().describe()};
  if (!output) return error{errc::corrupt, output.error().describe()};
  return envelope_fields{std::move(*task), std::move(*output)};
}

// Reads a completed task's artifact back and checks it: the digest of its
// bytes and the task it names.
result<std::string> checked_output(const std::string& path, const std::string& digest,
                                   const job_id& id, std::size_t max_bytes) {
  auto bytes = runtime::read_artifact(path, max_bytes);
  if (!bytes) return bytes.error();
  auto got = runtime::sha256_digest(*bytes);
  if (got != digest)
    return error{errc::corrupt, "the artifact " + path + " does not match its digest (" + got +
                                    ", recorded " + digest + ")"};
  auto env = open_envelope(*bytes);
  if (!env) return env.error();
  if (env->task != id.str())
    return error{errc::corrupt, "the artifact " + path + " is the output of task '" + env->task +
                                    "', not of '" + id.str() + "'"};
  return std::move(env->output);
}

}  // namespace

delegates::delegates(runtime::executor ex, persistence::task_store& store, delegate_options opts,
                     delegate_runner runner,
                     std::function<awaitable<void>(persistence::receipt)> deliver,
                     std::function<void(const std::string&)> warn)
    : actor(ex, runtime::actor_options{"delegates"}),
      store_(store),
      opts_(std::move(opts)),
      scrub_(protocol::scrub_rules::from_env(sandbox::current_environment())),
      runner_(std::move(runner)),
      deliver_(std::move(deliver)),
      warn_(std::move(warn)),
      pauses_(ex),
      timer_(std::make_shared<asio::steady_timer>(ex)) {}

std::string delegates::envelope(const job_id& id, const std::string& agent,
                                const std::string& output) {
  json::object o{{"task_id", id.str()}, {"agent", agent}, {"output", output}};
  return json::serialize(o);
}

std::string delegates::notice_text(const job_id& id, const std::string& agent, delegate_state s,
                                   const std::string& output_or_error, std::size_t bound) {
  std::string head = "[delegated task " + id.str() + " (" + agent + ") " +
                     std::string(persistence::to_string(s)) + "]";
  if (output_or_error.empty()) return head;
  return head + "\n" + protocol::bounded_text(output_or_error, bound);
}

error delegates::not_found(const job_id& id) {
  return error{errc::not_found, "delegated task '" + id.str() + "' not found"};
}

delegate_view delegates::view_of(const delegate_task& t) const {
  delegate_view v;
  v.id = t.id;
  v.state = t.state;
  v.agent = t.agent;
  v.preview = t.preview;
  v.artifact = t.artifact;
  v.digest = t.digest;
  if (t.error) v.error = scrub_.scrub(*t.error);
  v.bytes = t.bytes;
  return v;
}

// ---- the mailbox ------------------------------------------------------------------------

void delegates::handle(delegate_message& m) {
  std::visit(
      [this](auto& msg) {
        using T = std::decay_t<decltype(msg)>;
        if constexpr (std::is_same_v<T, delegate_msg::reserve>) {
          if (closing_) {
            msg.reply.fail(error{errc::stopped, "the host is shutting down; nothing was started"});
          } else if (msg.depth > opts_.max_depth) {
            msg.reply.fail(error{errc::refused, "delegation depth " + std::to_string(msg.depth) +
                                                    " exceeds the limit of " +
                                                    std::to_string(opts_.max_depth) +
                                                    "; nothing was started"});
          } else if (static_cast<int>(live_.size()) >= opts_.max_background) {
            msg.reply.fail(error{errc::refused, std::to_string(live_.size()) +
                                                    " delegated tasks are running, the limit is " +
                                                    std::to_string(opts_.max_background) +
                                                    "; nothing was started"});
          } else {
            job_id id("dlg_" + protocol::random_uuid());
            live_[id].caller = msg.caller;
            msg.reply.send(id);
          }
        } else if constexpr (std::is_same_v<T, delegate_msg::release> ||
                             std::is_same_v<T, delegate_msg::finished>) {
          auto it = live_.find(msg.id);
          if (it == live_.end()) return;
          for (auto& w : it->second.waiters) w.send();
          live_.erase(it);
        } else if constexpr (std::is_same_v<T, delegate_msg::started>) {
          auto it = live_.find(msg.id);
          if (it == live_.end()) return;
          it->second.signal = msg.signal;
          if (it->second.cancel_requested) msg.signal->fire();
        } else if constexpr (std::is_same_v<T, delegate_msg::signal_worker>) {
          auto it = live_.find(msg.id);
          if (it == live_.end()) return;
          it->second.cancel_requested = true;
          if (it->second.signal) it->second.signal->fire();
        } else if constexpr (std::is_same_v<T, delegate_msg::await_end>) {
          auto it = live_.find(msg.id);
          if (it == live_.end())
            msg.reply.send();
          else
            it->second.waiters.push_back(std::move(msg.reply));
        } else if constexpr (std::is_same_v<T, delegate_msg::live_ids>) {
          std::vector<job_id> ids;
          for (auto& [id, l] : live_) ids.push_back(id);
          msg.reply.send(std::move(ids));
        } else if constexpr (std::is_same_v<T, delegate_msg::closing>) {
          closing_ = true;
          for (auto& [id, l] : live_) {
            l.cancel_requested = true;
            if (l.signal) l.signal->fire();
          }
          msg.reply.send();
        }
      },
      m);
}

// ---- start, run, the worker -------------------------------------------------------------

awaitable<result<job_id>> delegates::start_task(delegate_call c) {
  auto held = gate_.enter();
  if (!held) co_return error{errc::stopped, "the host is shutting down; nothing was started"};
  if (c.caller.tenant.empty() || c.caller.thread.empty())
    co_return error{errc::invalid,
                    "delegate: the caller's scope needs a tenant and a session; nothing was "
                    "started"};
  if (c.agent.empty())
    co_return error{errc::invalid, "delegate: no agent named; nothing was started"};
  if (c.workspace.empty() || !c.workspace.is_absolute())
    co_return error{errc::invalid, "delegate: the workspace '" + c.workspace.string() +
                                       "' is not an absolute path; nothing was started"};
  if (c.policy && !c.policy->allows_path(c.workspace.string()))
    co_return error{errc::refused, "delegate: the workspace '" + c.workspace.string() +
                                       "' is outside the caller's writable paths (policy field "
                                       "'writable'); nothing was started"};
  delegate_msg::reserve r{c.caller, c.depth, {}};
  auto id = co_await ask(std::move(r));
  if (!id) co_return id.error();
  delegate_task t;
  t.id = *id;
  t.scope = c.caller;
  t.agent = c.agent;
  t.preview = protocol::make_preview(scrub_.scrub(c.prompt)).text;
  t.workspace = c.workspace.string();
  t.depth = c.depth;
  t.goal = c.goal;
  t.owner = my_identity();
  t.lease_until = runtime::now_ms() + opts_.lease.count();
  // The row is the lifecycle's authority: nothing runs before it is on disk.
  auto admitted = co_await store_.admit_delegate(std::move(t));
  if (!admitted) {
    delegate_msg::release rel{*id};
    (void)tell(std::move(rel));
    co_return admitted.error();
  }
  TETHER_CRASH_POINT("delegate.admit.after_commit");
  auto signal = std::make_shared<cancel_token>();
  delegate_msg::started st{*id, signal};
  (void)tell(std::move(st));
  auto self = shared_from_this();
  auto task = work(self, std::move(c), *id, signal);
  auto ends = std::make_shared<runtime::gate::holder>(std::move(held));
  auto on_end = [ends](std::exception_ptr) { auto done = std::move(*ends); };
  asio::co_spawn(get_executor(), std::move(task), std::move(on_end));
  co_return *id;
}

awaitable<result<delegate_view>> delegates::run(delegate_call c,
                                                std::optional<std::chrono::milliseconds> timeout) {
  auto caller = c.caller;
  auto id = co_await start_task(std::move(c));
  if (!id) co_return id.error();
  auto limit = std::min(timeout.value_or(opts_.wait_default), opts_.wait_max);
  auto v = co_await wait(caller, *id, limit);
  if (!v || is_terminal(v->state)) co_return v;
  // Past its time: the caller is not kept waiting, and the child is interrupted.
  auto cancelled = co_await cancel(caller, *id);
  if (cancelled && cancelled->state == delegate_state::cancelled)
    cancelled->error = "the synchronous delegate ran past " + std::to_string(limit.count()) +
                       " ms and was cancelled";
  co_return cancelled;
}

awaitable<void> delegates::work(std::shared_ptr<delegates> self, delegate_call c, job_id id,
                                std::shared_ptr<cancel_token> signal) {
  auto ex = co_await asio::this_coro::executor;
  const auto& me = my_identity();
  // The run timeout: the same compare-and-set as a cancel, then the token.
  std::shared_ptr<asio::steady_timer> watchdog;
  if (self->opts_.run_timeout.count() > 0) {
    watchdog = std::make_shared<asio::steady_timer>(ex, self->opts_.run_timeout);
    auto watch = [](std::shared_ptr<delegates> self, std::shared_ptr<asio::steady_timer> t,
                    job_id id, std::string agent) -> awaitable<void> {
      boost::system::error_code ec;
      co_await t->async_wait(asio::redirect_error(asio::use_awaitable, ec));
      if (ec) co_return;
      auto why = "ran past its limit of " + std::to_string(self->opts_.run_timeout.count()) + " ms";
      auto body = notice_text(id, agent, delegate_state::timed_out, why, 0);
      auto won = co_await self->store_.settle_delegate(id, my_identity(), delegate_state::timed_out,
                                                       why, body);
      if (won && *won) {
        delegate_msg::signal_worker sw{id};
        (void)self->tell(std::move(sw));
        co_await self->hand_over(std::move(*won));
      }
    };
    auto w = watch(self, watchdog, id, c.agent);
    asio::co_spawn(ex, std::move(w), asio::detached);
  }
  result<std::string> out = error{errc::failed, "the runner did not answer"};
  try {
    // Fired already (a cancel won before the run began): it never starts.
    if (signal->fired) throw boost::system::system_error(asio::error::operation_aborted);
    auto running = self->runner_(c, id);
    out = co_await asio::co_spawn(
        ex, std::move(running),
        asio::bind_cancellation_slot(signal->signal.slot(), asio::use_awaitable));
  } catch (const boost::system::system_error& e) {
    out = error{errc::cancelled, std::string("the run was interrupted: ") + e.what()};
  } catch (const std::exception& e) {
    out = error{errc::failed, std::string("the runner threw: ") + e.what()};
  }
  if (watchdog) watchdog->cancel();
  auto finish = [&self, &id] {
    delegate_msg::finished f{id};
    (void)self->tell(std::move(f));
  };
  if (!out && self->stopping_) {
    // Interrupted by shutdown: the row stays running, for the next boot's
    // recovery (its owner, this process, will be gone then).
    finish();
    co_return;
  }
  if (!out) {
    // A failure without an artifact: the compare-and-set alone. A cancel or
    // timeout that won first keeps its state (nothing is written then).
    auto why = out.error().message;
    auto body = notice_text(id, c.agent, delegate_state::failed, self->scrub_.scrub(why),
                            self->opts_.notice_preview_chars);
    for (int attempt = 0;; ++attempt) {
      auto r = co_await self->store_.settle_delegate(id, me, delegate_state::failed, why, body);
      if (r) {
        if (*r) co_await self->hand_over(std::move(*r));
        break;
      }
      if (attempt >= 4 || !co_await self->pauses_.pause(attempt)) {
        self->warn_("delegate " + id.str() + ": its failure was not recorded (" +
                    r.error().message + "); the row stays running for recovery");
        break;
      }
    }
    finish();
    co_return;
  }
  // 4. The exact bytes, their digest, and the intent before anything is published.
  auto bytes = envelope(id, c.agent, *out);
  persistence::settlement_intent in;
  in.task = id;
  in.owner = me;
  in.state = delegate_state::completed;
  in.artifact = (c.workspace / "delegates" / (id.str() + ".json")).string();
  in.digest = runtime::sha256_digest(bytes);
  in.bytes = static_cast<std::int64_t>(bytes.size());
  bool recorded = false;
  for (int attempt = 0;; ++attempt) {
    auto w = co_await self->store_.write_intent(in);
    if (w) {
      recorded = *w;  // false: a cancel or timeout won first; nothing is published
      break;
    }
    // A store failure before the intent: retried, nothing published meanwhile.
    if (attempt >= 4 || !co_await self->pauses_.pause(attempt)) {
      self->warn_("delegate " + id.str() + ": its settlement intent was not recorded (" +
                  w.error().message + "); nothing was published, the row stays running");
      break;
    }
  }
  if (!recorded) {
    finish();
    co_return;
  }
  TETHER_CRASH_POINT("delegate.intent.after_commit");
  // 5. Publish, off the actor's executor (two fsyncs and a rename).
  auto publish = [dir = c.workspace / "delegates", name = id.str() + ".json",
                  bytes = std::move(bytes)] { return runtime::publish_artifact(dir, name, bytes); };
  auto published = co_await self->store_.offload(std::move(publish));
  if (!published) {
    auto why = "its artifact was not published: " + published.error().message;
    auto body = notice_text(id, c.agent, delegate_state::failed, self->scrub_.scrub(why),
                            self->opts_.notice_preview_chars);
    auto r = co_await self->store_.settle_delegate(id, me, delegate_state::failed, why, body);
    if (r && *r) co_await self->hand_over(std::move(*r));
    finish();
    co_return;
  }
  TETHER_CRASH_POINT("delegate.artifact.after_publish");
  // 6. Promote; after publication a store failure is retried here, and a stop
  // leaves it to the next recovery.
  auto body = notice_text(id, c.agent, delegate_state::completed, self->scrub_.scrub(*out),
                          self->opts_.notice_preview_chars);
  for (int attempt = 0;; ++attempt) {
    auto p = co_await self->store_.promote_intent(id, body);
    if (p) {
      TETHER_CRASH_POINT("delegate.promote.after_commit");
      if (p->promoted) co_await self->hand_over(std::move(p->terminal));
      break;
    }
    self->warn_("delegate " + id.str() + ": promoting its settlement failed (" + p.error().message +
                "); retried");
    if (!co_await self->pauses_.pause(attempt)) break;  // stopping: the next boot promotes it
  }
  finish();
}

awaitable<void> delegates::hand_over(std::optional<receipt> r) {
  if (!r || !deliver_) co_return;
  co_await deliver_(std::move(*r));
}

// ---- the originator's reads and cancel --------------------------------------------------

awaitable<result<std::optional<delegate_task>>> delegates::owned(const owner_scope& caller,
                                                                 const job_id& id) {
  auto read = [this, id] { return store_.delegate(id); };
  auto row = co_await store_.offload(std::move(read));
  if (!row) co_return row.error();
  // Another originator's task reads exactly as a missing one.
  if (!*row || (*row)->scope.tenant != caller.tenant || (*row)->scope.thread != caller.thread)
    co_return std::optional<delegate_task>{};
  co_return row;
}

awaitable<result<delegate_view>> delegates::result_of(owner_scope caller, job_id id) {
  auto row = co_await owned(caller, id);
  if (!row) co_return row.error();
  if (!*row) co_return not_found(id);
  auto v = view_of(**row);
  if (v.state == delegate_state::completed && v.artifact && v.digest) {
    auto read = [path = *v.artifact, digest = *v.digest, id, max = opts_.max_artifact_bytes] {
      return checked_output(path, digest, id, max);
    };
    auto output = co_await store_.offload(std::move(read));
    if (output)
      v.output = scrub_.scrub(*output);
    else
      v.error = scrub_.scrub(output.error().message);
  }
  co_return v;
}

awaitable<result<delegate_view>> delegates::wait(owner_scope caller, job_id id,
                                                 std::optional<std::chrono::milliseconds> timeout) {
  auto row = co_await owned(caller, id);
  if (!row) co_return row.error();
  if (!*row) co_return not_found(id);
  if (!is_terminal((*row)->state)) {
    auto limit = std::min(timeout.value_or(opts_.wait_default), opts_.wait_max);
    delegate_msg::await_end e{id, {}};
    auto ended = co_await ask(std::move(e), limit);
    (void)ended;  // a timeout answers with the task as it is
  }
  co_return co_await result_of(std::move(caller), std::move(id));
}

awaitable<void> delegates::worker_ended(job_id id) {
  delegate_msg::await_end e{std::move(id), {}};
  (void)co_await ask(std::move(e));
}

awaitable<result<std::vector<delegate_view>>> delegates::list(owner_scope caller) {
  auto read = [this] { return store_.delegates(); };
  auto rows = co_await store_.offload(std::move(read));
  if (!rows) co_return rows.error();
  std::vector<delegate_view> out;
  for (auto& t : *rows)
    if (t.scope.tenant == caller.tenant && t.scope.thread == caller.thread)
      out.push_back(view_of(t));
  co_return out;
}

awaitable<result<delegate_view>> delegates::cancel(owner_scope caller, job_id id) {
  auto row = co_await owned(caller, id);
  if (!row) co_return row.error();
  if (!*row) co_return not_found(id);
  if (!is_terminal((*row)->state)) {
    std::string why = "cancelled by its originator";
    auto body = notice_text(id, (*row)->agent, delegate_state::cancelled, why, 0);
    auto won =
        co_await store_.settle_delegate(id, std::nullopt, delegate_state::cancelled, why, body);
    if (!won) co_return won.error();
    if (*won) {
      // Only the winner signals the worker; the canceller reads the outcome
      // here, so its notice is not shown again.
      delegate_msg::signal_worker sw{id};
      (void)tell(std::move(sw));
      auto read = co_await store_.mark_read((*won)->id);
      if (!read)
        warn_("delegate " + id.str() + ": its cancel receipt was not marked read (" +
              read.error().message + ")");
    }
  }
  co_return co_await result_of(std::move(caller), std::move(id));
}

// ---- recovery, heartbeat ----------------------------------------------------------------

awaitable<result<delegate_recovery>> delegates::recover(bool deliver_now) {
  delegate_recovery rep;
  delegate_msg::live_ids q;
  auto live = co_await ask(std::move(q));
  std::set<job_id> here;
  if (live) here.insert(live->begin(), live->end());
  auto read_intents = [this] { return store_.settlement_intents(); };
  auto intents = co_await store_.offload(std::move(read_intents));
  if (!intents) co_return intents.error();
  std::set<job_id> with_intent;
  // Intents first: a settlement a dead owner began is finished or failed
  // before its row could be called lost.
  for (auto& in : *intents) {
    with_intent.insert(in.task);
    if (here.count(in.task)) continue;  // its worker is in this process, settling it
    auto probe = runtime::probe_owner(in.owner);
    if (probe.state != runtime::owner_liveness::gone) {
      rep.kept.push_back("intent of " + in.task.str() + ": owner " +
                         std::string(runtime::to_string(probe.state)) + " (" + probe.why + ")");
      continue;
    }
    auto read_row = [this, id = in.task] { return store_.delegate(id); };
    auto row = co_await store_.offload(std::move(read_row));
    std::string agent = row && *row ? (*row)->agent : std::string("?");
    result<std::string> output = error{errc::failed, "no artifact was recorded"};
    if (in.state == delegate_state::completed) {
      auto read = [path = in.artifact, digest = in.digest, id = in.task,
                   max = opts_.max_artifact_bytes] {
        return checked_output(path, digest, id, max);
      };
      output = co_await store_.offload(std::move(read));
    }
    if (output) {
      auto body = notice_text(in.task, agent, delegate_state::completed, scrub_.scrub(*output),
                              opts_.notice_preview_chars);
      auto p = co_await store_.promote_intent(in.task, body);
      if (!p) co_return p.error();
      if (p->promoted) {
        ++rep.promoted;
        if (deliver_now) co_await hand_over(std::move(p->terminal));
      } else {
        ++rep.stale;
      }
      continue;
    }
    // Never completed without its bytes: missing, corrupt or another task's.
    auto why = "recovery: " + output.error().message;
    auto body = notice_text(in.task, agent, delegate_state::failed, scrub_.scrub(why),
                            opts_.notice_preview_chars);
    auto f = co_await store_.settle_delegate(in.task, in.owner, delegate_state::failed, why, body);
    if (!f) co_return f.error();
    if (*f) {
      ++rep.failed;
      if (deliver_now) co_await hand_over(std::move(*f));
    } else {
      ++rep.stale;
    }
  }
  // Then running rows.
  auto read_rows = [this] { return store_.delegates(); };
  auto rows = co_await store_.offload(std::move(read_rows));
  if (!rows) co_return rows.error();
  auto now = runtime::now_ms();
  for (auto& t : *rows) {
    if (is_terminal(t.state) || here.count(t.id) || with_intent.count(t.id)) continue;
    auto probe = runtime::probe_owner(t.owner);
    delegate_state to;
    std::string why;
    if (probe.state == runtime::owner_liveness::gone) {
      to = delegate_state::lost;
      why = "its owner process is gone (" + probe.why + ")";
    } else if (probe.state == runtime::owner_liveness::alive && t.lease_until < now) {
      to = delegate_state::timed_out;
      why = "no heartbeat since its lease ended " + std::to_string(now - t.lease_until) +
            " ms ago (owner " + probe.why + ")";
    } else {
      rep.kept.push_back("task " + t.id.str() + ": owner " +
                         std::string(runtime::to_string(probe.state)) + " (" + probe.why + ")");
      continue;
    }
    auto body = notice_text(t.id, t.agent, to, why, 0);
    auto r = co_await store_.settle_delegate(t.id, t.owner, to, why, body);
    if (!r) co_return r.error();
    if (!*r) continue;  // settled meanwhile
    (to == delegate_state::lost ? rep.lost : rep.timed_out)++;
    if (deliver_now) co_await hand_over(std::move(*r));
  }
  for (auto& k : rep.kept) warn_("delegate recovery kept " + k);
  co_return rep;
}

void delegates::start() {
  auto held = gate_.enter();
  if (!held) return;
  asio::co_spawn(get_executor(), loops(shared_from_this(), std::move(held)), asio::detached);
}

awaitable<void> delegates::loops(std::shared_ptr<delegates> self, runtime::gate::holder held) {
  (void)held;
  auto timer = self->timer_;
  auto last_recovery = std::chrono::steady_clock::now();
  for (;;) {
    if (std::chrono::steady_clock::now() - last_recovery >= self->opts_.recovery_every) {
      last_recovery = std::chrono::steady_clock::now();
      auto r = co_await self->recover();
      if (!r) self->warn_("delegate recovery: " + r.error().message + "; retried next time");
    }
    timer->expires_after(std::min(self->opts_.heartbeat, self->opts_.recovery_every));
    boost::system::error_code ec;
    co_await timer->async_wait(asio::redirect_error(asio::use_awaitable, ec));
    if (ec || self->stopping_) co_return;
    delegate_msg::live_ids q;
    auto ids = co_await self->ask(std::move(q));
    if (!ids) co_return;
    auto until = runtime::now_ms() + self->opts_.lease.count();
    for (auto& id : *ids) {
      auto h = co_await self->store_.heartbeat_delegate(id, my_identity(), until);
      if (!h) self->warn_("delegate " + id.str() + ": heartbeat not written: " + h.error().message);
    }
  }
}

awaitable<void> delegates::shutdown() {
  // The loops' timer is cancelled on its own executor; workers are cancelled
  // through their tokens, and their rows stay running for the next boot.
  auto self = shared_from_this();
  auto stop_loops = [](std::shared_ptr<delegates> self) -> awaitable<void> {
    self->timer_->cancel();
    self->pauses_.stop();  // a worker's retry pause ends now
    co_return;
  };
  co_await asio::co_spawn(get_executor(), stop_loops(self), asio::use_awaitable);
  stopping_ = true;
  delegate_msg::closing c;
  (void)co_await ask(std::move(c));
  co_await gate_.close();
  co_await actor::stop();
}

}  // namespace tether::actors
