#include "tether/actors/job.hpp"

#include <boost/asio/use_awaitable.hpp>

#include "tether/actors/host.hpp"
#include "tether/actors/job_queue.hpp"
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

job::job(job_queue& q, persistence::owned_job row) : q_(q), row_(std::move(row)) {}

void job::changed() {
  q_.job_changed(row_);
}

void job::mark_running() {
  if (ended_) return;
  row_.state = owned_state::running;
  changed();
}

void job::add_waiter(std::shared_ptr<runtime::one_shot<int>> w) {
  if (ended_) {
    w->set(0);
    return;
  }
  waiters_.push_back(std::move(w));
}

void job::release_waiters() {
  auto ws = std::move(waiters_);
  waiters_.clear();
  for (auto& w : ws) w->set(0);
}

void job::end() {
  if (ended_) return;
  ended_ = true;
  auto self = shared_from_this();  // the queue's registry held the last reference
  release_waiters();
  q_.job_ended(row_.id);
}

awaitable<void> job::follow(std::shared_ptr<runtime::one_shot<int>> started,
                            [[maybe_unused]] runtime::gate::holder held) {
  auto self = shared_from_this();
  auto id = row_.id;
  // A failed connection is not a failed job: the channel's follow reconnects
  // until the daemon answers; only its answer can make the job lost.
  auto done = co_await q_.channel_->follow(id);
  if (started) co_await started->async_wait(asio::use_awaitable);
  if (!done && !done.error().answered && done.error().code == errc::conflict) {
    // The daemon there is not the job's: its jobs are not attached to it,
    // and nothing is known about how this one ended.
    q_.host_.warn("job " + id.str() + ": " + done.error().message +
                  ". The job was not attached to it: it stays as it is on disk, its receipts "
                  "pending, for the next boot to recover on its own sandbox generation (recovery "
                  "refuses to boot until that generation answers); no turn waits on it now");
    end();
    co_return;
  }
  if (q_.opts_.trace) q_.opts_.trace(id, "completion");
  if (q_.closing()) co_return;  // the next boot settles it
  if (ended_) co_return;
  if (cancel_requested_) {
    // A completion during a cancel is the cancel's business: it is written
    // (as cancelled, or as this completion if the kill found the job ended).
    if (done) held_ = *done;
    co_return;
  }
  if (!done) {
    auto notice = unknown_notice(id, row_.preview, done.error().message);
    co_await finish(owned_state::lost, std::nullopt, std::move(notice));
    co_return;
  }
  auto body = protocol::render_notice(*done);
  auto terminal = terminal_of(*done);
  co_await finish(terminal, std::move(*done), std::move(body));
}

awaitable<result<void>> job::cancel() {
  auto self = shared_from_this();
  auto id = row_.id;
  if (cancel_requested_)
    co_return error{errc::conflict, "job '" + id.str() + "' is being cancelled already"};
  cancel_requested_ = true;
  // On every way out: the cancel is over, and a completion held back
  // meanwhile is handed back.
  std::optional<protocol::shell_completion> held;
  auto release = [this, &held] {
    cancel_requested_ = false;
    held = std::exchange(held_, std::nullopt);
  };
  auto opened = co_await q_.channel_->open();
  if (!opened) {
    release();
    if (held) co_await finish(terminal_of(*held), *held, protocol::render_notice(*held));
    co_return opened.error();
  }
  auto killed = co_await q_.channel_->kill(id);
  release();
  if (!killed && killed.error().answered && killed.error().code == errc::not_found && !held) {
    // The daemon does not know the job: nothing of it runs there, and how
    // (or whether) it ran is unknown.
    auto why =
        "the sandbox does not know it (" + killed.error().message + "); whether it ran is unknown";
    auto notice = unknown_notice(id, row_.preview, why);
    co_await finish(owned_state::lost, std::nullopt, std::move(notice));
  } else if (!killed) {
    // Not confirmed stopped: no cancelled receipt. A completion that came
    // meanwhile is written as what it is.
    if (held) co_await finish(terminal_of(*held), *held, protocol::render_notice(*held));
    co_return error{killed.error().code, "job '" + id.str() + "' was not confirmed stopped (" +
                                             killed.error().message +
                                             "); no cancelled receipt was written"};
  } else {
    TETHER_CRASH_POINT("delivery.cancel.after_kill");
    // The daemon's answer says how it ended: stopped by us, or already done.
    auto terminal = terminal_of(*killed);
    auto body = protocol::render_notice(*killed);
    co_await finish(terminal, std::move(*killed), std::move(body));
  }
  co_return result<void>{};
}

awaitable<bool> job::finish(owned_state terminal, std::optional<protocol::shell_completion> c,
                            std::string body, bool wake_after) {
  auto self = shared_from_this();
  auto id = row_.id;
  // The terminal transition is retried until it commits (or the queue
  // stops): a job whose receipt was never written would stay live for ever,
  // and a turn withholding its completion would wait on it for ever.
  auto what =
      "job " + id.str() + ": its " + std::string(persistence::to_string(terminal)) + " receipt";
  result<std::optional<receipt>> won = error{errc::failed, "not attempted"};
  for (int attempt = 0;; ++attempt) {
    won = co_await q_.store_.finish(id, terminal, c, body);
    if (won) break;
    if (!co_await q_.pauses_.pause(attempt)) {
      q_.host_.warn(what + " was not written: " + won.error().message +
                    "; the host is shutting down, so the job stays live on disk for the next "
                    "boot to recover");
      co_return false;
    }
    q_.host_.warn(what + " was not written: " + won.error().message +
                  "; the job stays live and "
                  "the write is retried");
  }
  // The first terminal transition won already: it ends the job's live entry
  // once its own receipt was handed over, not this one.
  if (!*won) co_return true;
  if (!ended_) {
    // Terminal on disk: no report lists it as still running any more (the
    // turn its notice wakes settles before the entry ends), while the entry
    // stays live, so a withholding turn waits, until the hand-over below.
    row_.state = terminal;
    changed();
  }
  if (wake_after)
    TETHER_CRASH_POINT("delivery.terminal.after_commit");
  else
    TETHER_CRASH_POINT("recover.terminal.after_commit");  // ended (or lost) while the host was down
  if (q_.opts_.trace) q_.opts_.trace(id, "terminal");
  if (wake_after) {
    // A job followed since recovery that ends during boot waits for boot's
    // phases: a wake now could start a session before its running subagent
    // row was bound, and it would report under a fresh id.
    auto resumed = q_.resumed_gate();
    if (!resumed->ready()) {
      q_.held_handover();
      co_await resumed->async_wait(asio::use_awaitable);
    }
  }
  // The hand-over is retried while the host runs: a receipt left pending
  // would otherwise wait for the next boot, and its turn with it. During
  // recovery the receipt stays pending for boot's sweep, which resends every
  // pending receipt through the one delivery path before any session resumes.
  auto r = std::move(**won);
  for (int attempt = 0; wake_after; ++attempt) {
    auto delivered = co_await deliver(r, wake_after);
    if (delivered) break;
    if (!co_await q_.pauses_.pause(attempt)) {
      q_.host_.warn(what + " was kept pending: " + delivered.error().message +
                    "; the host is shutting down, so the next boot hands it over");
      break;
    }
    q_.host_.warn(what + " was not handed over: " + delivered.error().message +
                  "; it stays pending and the hand-over is retried");
  }
  co_await q_.channel_->expire_record(id);
  // Handed over (or kept pending for the next boot): the turn may complete.
  end();
  co_return true;
}

awaitable<result<bool>> job::deliver(receipt r, bool wake_after) {
  // Counted as the queue's work in flight (wait_idle) until it returns.
  q_.busy(+1);
  struct done_guard {
    job_queue* q;
    ~done_guard() { q->busy(-1); }
  } guard{&q_};
  auto id = r.job;
  auto b = notice_batch(std::move(r), !wake_after);
  if (q_.opts_.trace) b.handed_over = [q = &q_, id] { q->opts_.trace(id, "handed_over"); };
  auto handed = co_await q_.host_.delivery().deliver(std::move(b));
  if (!handed) co_return handed.error();
  co_return *handed > 0;
}

}  // namespace tether::actors
