#include "tether/actors/job.hpp"

#include <boost/asio/bind_executor.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/use_awaitable.hpp>

#include "tether/actors/host.hpp"
#include "tether/actors/sandbox_channel.hpp"
#include "tether/runtime/crash_point.hpp"

namespace tether::actors {

namespace asio = boost::asio;
using persistence::receipt;

owned_state terminal_of(const protocol::shell_completion& c) {
  switch (c.status.state) {
    case protocol::job_state::killed:
      return owned_state::cancelled;
    case protocol::job_state::unknown:
      return owned_state::lost;
    case protocol::job_state::exited:
      return c.status.exit_code == 0 ? owned_state::completed : owned_state::failed;
    case protocol::job_state::running:
      break;
  }
  return owned_state::lost;
}

std::string unknown_notice(const job_id& job, const std::string& preview, const std::string& why) {
  protocol::shell_completion c;
  c.job = job.str();
  c.status.state = protocol::job_state::unknown;
  c.status.reason = why;
  c.preview.text = preview;
  return protocol::render_notice(c);
}

namespace {

job_msg::finish finish_of(owned_state terminal, std::optional<protocol::shell_completion> c,
                          std::string body) {
  job_msg::finish f;
  f.terminal = terminal;
  f.completion = std::move(c);
  f.body = std::move(body);
  return f;
}

job_msg::finish finish_of(const protocol::shell_completion& c) {
  return finish_of(terminal_of(c), c, protocol::render_notice(c));
}

}  // namespace

job::job(runtime::executor ex, std::shared_ptr<const job_services> svc, persistence::owned_job row,
         bool resumed)
    : actor(ex, runtime::actor_options{"job " + row.id.str()}),
      svc_(std::move(svc)),
      id_(row.id),
      preview_(row.preview),
      row_(std::move(row)),
      resumed_(resumed) {}

error job::stopping_error(const job_id& id) {
  return error{errc::stopped, "the host is shutting down; job '" + id.str() +
                                  "' was left as it is for the next boot to recover"};
}

awaitable<void> job::stop() {
  job_msg::stopping s;
  auto told = co_await ask(std::move(s));
  (void)told;  // stopped already: the mailbox is closed
  co_await actor::stop();
}

void job::handle(job_message& m) {
  std::visit([this](auto& msg) { on(msg); }, m);
}

void job::changed() {
  job_note::changed n{row_};
  svc_->tell_queue(std::move(n));
}

void job::release_waiters() {
  auto ws = std::move(waiters_);
  waiters_.clear();
  for (auto& w : ws) w->set(0);
}

void job::spawn(runtime::gate::holder held, awaitable<void> work, std::string what) {
  // The holder leaves the gate once the completion handler ran, after the
  // coroutine's frame is gone.
  auto ends = std::make_shared<runtime::gate::holder>(std::move(held));
  auto self = shared_from_this();
  auto on_end = [self, ends, what = std::move(what)](std::exception_ptr e) {
    auto done = std::move(*ends);
    if (!e) return;
    self->svc_->h.warn("job " + self->id_.str() + ": " + what +
                       " failed: " + runtime::detail::describe(e) +
                       "; its live entry ended so no turn waits on it, and the job was left as "
                       "it is on disk for the next boot to recover");
    job_msg::end m;
    (void)self->tell(std::move(m));
  };
  auto ex = get_executor();
  asio::co_spawn(ex, std::move(work), asio::bind_executor(ex, std::move(on_end)));
}

// ---- handlers ------------------------------------------------------------------------

void job::on(job_msg::follow& m) {
  auto held = svc_->work.enter();
  if (!held || ended_) return;  // the queue stops: the next boot follows it
  auto self = shared_from_this();
  spawn(std::move(held), run_follow(self, std::move(m.started)), "following it");
}

void job::on(job_msg::followed& m) {
  auto& done = m.done;
  if (!done && !done.error().answered && done.error().code == errc::conflict) {
    // The daemon there is not the job's: its jobs are not attached to it,
    // and nothing is known about how this one ended.
    svc_->h.warn("job " + id_.str() + ": " + done.error().message +
                 ". The job was not attached to it: it stays as it is on disk, its receipts "
                 "pending, for the next boot to recover on its own sandbox generation (recovery "
                 "refuses to boot until that generation answers); no turn waits on it now");
    job_msg::end e;
    on(e);
    return;
  }
  if (stopping_ || ended_) return;  // stopping: the next boot settles it
  if (cancel_requested_) {
    // A completion during a cancel is the cancel's business: it is written
    // (as cancelled, or as this completion if the kill found the job ended).
    if (done) held_ = *done;
    return;
  }
  if (!done) {
    auto notice = unknown_notice(id_, preview_, done.error().message);
    spawn_finish(finish_of(owned_state::lost, std::nullopt, std::move(notice)));
    return;
  }
  spawn_finish(finish_of(*done));
}

void job::on(job_msg::cancel& m) {
  if (ended_) {
    // Its terminal receipt was handed over already (the caller reads it), or
    // it was left for the next boot.
    if (persistence::is_terminal(row_.state))
      m.reply.send();
    else
      m.reply.fail(error{errc::conflict, "job '" + id_.str() +
                                             "' is not followed by this host (the next boot "
                                             "recovers it); it was not cancelled"});
    return;
  }
  if (cancel_requested_) {
    m.reply.fail(error{errc::conflict, "job '" + id_.str() + "' is being cancelled already"});
    return;
  }
  auto held = svc_->work.enter();
  if (!held || stopping_) {
    m.reply.fail(stopping_error(id_));
    return;
  }
  cancel_requested_ = true;
  auto self = shared_from_this();
  spawn(std::move(held), run_kill(self, std::move(m.reply)), "cancelling it");
}

void job::on(job_msg::killed& m) {
  // The cancel is over; a completion held back meanwhile is the cancel's to write.
  cancel_requested_ = false;
  auto held = std::exchange(held_, std::nullopt);
  if (!m.opened) {
    if (held)
      spawn_finish(finish_of(*held), std::move(m.reply), m.opened.error());
    else
      m.reply.fail(m.opened.error());
    return;
  }
  auto& killed = m.kill;
  if (!killed && killed.error().answered && killed.error().code == errc::not_found && !held) {
    // The daemon does not know the job: nothing of it runs there, and how
    // (or whether) it ran is unknown.
    auto why =
        "the sandbox does not know it (" + killed.error().message + "); whether it ran is unknown";
    auto notice = unknown_notice(id_, preview_, why);
    spawn_finish(finish_of(owned_state::lost, std::nullopt, std::move(notice)), std::move(m.reply));
  } else if (!killed) {
    // Not confirmed stopped: no cancelled receipt. A completion that came
    // meanwhile is written as what it is.
    error not_stopped{killed.error().code, "job '" + id_.str() + "' was not confirmed stopped (" +
                                               killed.error().message +
                                               "); no cancelled receipt was written"};
    if (held)
      spawn_finish(finish_of(*held), std::move(m.reply), not_stopped);
    else
      m.reply.fail(not_stopped);
  } else {
    TETHER_CRASH_POINT("delivery.cancel.after_kill");
    // The daemon's answer says how it ended: stopped by us, or already done.
    spawn_finish(finish_of(*killed), std::move(m.reply));
  }
}

void job::on(job_msg::finish& m) {
  spawn_finish(std::move(m));
}

void job::on(job_msg::terminal_written& m) {
  // Terminal on disk: no report lists it as still running any more (the
  // turn its notice wakes settles before the entry ends), while the entry
  // stays live, so a withholding turn waits, until the hand-over.
  if (ended_) return;
  row_.state = m.terminal;
  changed();
}

void job::on(job_msg::await_resumed& m) {
  if (resumed_ || stopping_) {
    m.reply.send();
    return;
  }
  svc_->handover_held();
  holding_.push_back(std::move(m.reply));
}

void job::on(job_msg::sessions_resumed&) {
  resumed_ = true;
  for (auto& r : holding_) r.send();
  holding_.clear();
}

void job::on(job_msg::mark_running&) {
  if (ended_) return;
  row_.state = owned_state::running;
  changed();
}

void job::on(job_msg::add_waiter& m) {
  if (ended_ || stopping_) {
    m.waiter->set(0);
    return;
  }
  waiters_.push_back(std::move(m.waiter));
}

void job::on(job_msg::end&) {
  if (ended_) return;
  ended_ = true;
  // The queue forgets it before its waiters look again.
  job_note::ended n{id_, row_.scope.thread};
  svc_->tell_queue(std::move(n));
  release_waiters();
}

void job::on(job_msg::stopping& m) {
  stopping_ = true;
  release_waiters();
  for (auto& r : holding_) r.send();  // a held hand-over gives up waiting
  holding_.clear();
  m.reply.send();
}

// ---- the job's coroutines ------------------------------------------------------------

awaitable<void> job::run_follow(std::shared_ptr<job> self,
                                std::shared_ptr<runtime::one_shot<int>> started) {
  // A failed connection is not a failed job: the channel's follow reconnects
  // until the daemon answers; only its answer can make the job lost.
  auto done = co_await self->svc_->channel->follow(self->id_);
  if (started) co_await started->async_wait(asio::use_awaitable);
  // Here, not in the handler: a hook that throws ends this coroutine (and
  // the job's live entry, with a warning), never the job's mailbox.
  bool attached = done || done.error().answered || done.error().code != errc::conflict;
  if (attached && self->svc_->trace) self->svc_->trace(self->id_, "completion");
  job_msg::followed m{std::move(done)};
  (void)self->tell(std::move(m));  // closed: the queue stopped, the next boot settles it
}

awaitable<void> job::run_kill(std::shared_ptr<job> self, reply_to<void> reply) {
  auto& ch = *self->svc_->channel;
  job_msg::killed m;
  m.opened = co_await ch.open();
  if (m.opened) m.kill = co_await ch.kill(self->id_);
  m.reply = std::move(reply);
  (void)self->tell(std::move(m));  // closed: the reply fails as dropped
}

void job::spawn_finish(job_msg::finish f, reply_to<void> cancel, result<void> answer) {
  auto held = svc_->work.enter();
  if (!held) {
    // The queue stops: nothing is written now; the next boot settles it.
    f.reply.send(false);
    if (cancel) cancel.fail(stopping_error(id_));
    return;
  }
  auto self = shared_from_this();
  spawn(std::move(held), finish_then_answer(self, std::move(f), std::move(cancel), answer),
        "writing its end");
}

awaitable<void> job::finish_then_answer(std::shared_ptr<job> self, job_msg::finish f,
                                        reply_to<void> cancel, result<void> answer) {
  bool durable = co_await run_finish(self, f.terminal, std::move(f.completion), std::move(f.body),
                                     f.wake_after);
  f.reply.send(durable);
  cancel.send(std::move(answer));
}

awaitable<bool> job::run_finish(std::shared_ptr<job> self, owned_state terminal,
                                std::optional<protocol::shell_completion> c, std::string body,
                                bool wake_after) {
  auto& svc = *self->svc_;
  auto id = self->id_;
  // The terminal transition is retried until it commits (or the queue
  // stops): a job whose receipt was never written would stay live for ever,
  // and a turn withholding its completion would wait on it for ever.
  auto what =
      "job " + id.str() + ": its " + std::string(persistence::to_string(terminal)) + " receipt";
  result<std::optional<receipt>> won = error{errc::failed, "not attempted"};
  for (int attempt = 0;; ++attempt) {
    won = co_await svc.store.finish(id, terminal, c, body);
    if (won) break;
    if (!co_await svc.pauses.pause(attempt)) {
      svc.h.warn(what + " was not written: " + won.error().message +
                 "; the host is shutting down, so the job stays live on disk for the next "
                 "boot to recover");
      co_return false;
    }
    svc.h.warn(what + " was not written: " + won.error().message +
               "; the job stays live and the write is retried");
  }
  // The first terminal transition won already: it ends the job's live entry
  // once its own receipt was handed over, not this one.
  if (!*won) co_return true;
  job_msg::terminal_written tw{terminal};
  (void)self->tell(std::move(tw));
  if (wake_after)
    TETHER_CRASH_POINT("delivery.terminal.after_commit");
  else
    TETHER_CRASH_POINT("recover.terminal.after_commit");  // ended (or lost) while the host was down
  if (svc.trace) svc.trace(id, "terminal");
  if (wake_after) {
    // A job followed since recovery that ends during boot waits for boot's
    // phases: a wake now could start a session before its running subagent
    // row was bound, and it would report under a fresh id. The job's
    // handler answers once the queue told it they resumed (or it stops).
    job_msg::await_resumed ar;
    auto resumed = co_await self->ask(std::move(ar));
    (void)resumed;  // failed: the mailbox stopped with the queue
  }
  // The hand-over is retried while the host runs: a receipt left pending
  // would otherwise wait for the next boot, and its turn with it. During
  // recovery the receipt stays pending for boot's sweep, which resends every
  // pending receipt through the one delivery path before any session resumes.
  auto r = std::move(**won);
  for (int attempt = 0; wake_after; ++attempt) {
    auto delivered = co_await deliver(self, r, wake_after);
    if (delivered) break;
    if (!co_await svc.pauses.pause(attempt)) {
      svc.h.warn(what + " was kept pending: " + delivered.error().message +
                 "; the host is shutting down, so the next boot hands it over");
      break;
    }
    svc.h.warn(what + " was not handed over: " + delivered.error().message +
               "; it stays pending and the hand-over is retried");
  }
  co_await svc.channel->expire_record(id);
  // Handed over (or kept pending for the next boot): the turn may complete.
  job_msg::end e;
  (void)self->tell(std::move(e));
  co_return true;
}

awaitable<result<bool>> job::deliver(std::shared_ptr<job> self, receipt r, bool wake_after) {
  auto& svc = *self->svc_;
  // Counted as the queue's work in flight (wait_idle) until it returns.
  svc.delivering(+1);
  struct done_guard {
    const job_services* s;
    ~done_guard() { s->delivering(-1); }
  } guard{&svc};
  auto id = r.job;
  auto b = notice_batch(std::move(r), !wake_after);
  if (svc.trace) b.handed_over = [trace = svc.trace, id] { trace(id, "handed_over"); };
  auto handed = co_await svc.h.delivery().deliver(std::move(b));
  if (!handed) co_return handed.error();
  co_return *handed > 0;
}

}  // namespace tether::actors
