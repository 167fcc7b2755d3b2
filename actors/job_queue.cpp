#include "tether/actors/job_queue.hpp"

#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/bind_executor.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <filesystem>
#include <set>

#include "tether/actors/host.hpp"
#include "tether/actors/job.hpp"
#include "tether/protocol/scrub.hpp"
#include "tether/runtime/crash_point.hpp"
#include "tether/runtime/retry.hpp"
#include "tether/sandbox/daemon_process.hpp"
#include "tether/sandbox/state_dir.hpp"

namespace tether::actors {

using persistence::receipt;
using persistence::receipt_state;
using protocol::event_id;

namespace {

error not_found(const job_id& job) {
  // The same words for a stranger's job and for no job at all.
  return error{errc::not_found, "job '" + job.str() + "' not found"};
}

}  // namespace

// Runs `task` on the queue's executor to its end: the caller's cancellation
// (an interrupted drain) must not cut a launch or a cancel in half, so the
// spawned work gets no cancellation slot; only the caller's own waiting is
// cancellable, where it is awaited (see wait()).
template <class T>
awaitable<T> job_queue::on_queue(awaitable<T> task) {
  auto token = asio::bind_cancellation_slot(asio::cancellation_slot(), asio::use_awaitable);
  co_return co_await asio::co_spawn(ex_, std::move(task), std::move(token));
}

job_queue::job_queue(runtime::executor ex, host& h, persistence::task_store& store,
                     job_queue_options opts)
    : ex_(ex), host_(h), store_(store), opts_(std::move(opts)), pauses_(ex) {
  sandbox_channel_options c;
  c.sandbox_dir = opts_.sandbox_dir;
  c.start_daemon = opts_.start_daemon;
  c.daemon_binary = opts_.daemon_binary;
  c.daemon_idle_exit = opts_.daemon_idle_exit;
  c.adapter = opts_.adapter;
  c.adapter_failures = opts_.adapter_failures;
  c.client = opts_.client;
  c.bind = [this](protocol::sandbox_id sb, std::uint64_t generation) {
    return bind_route(std::move(sb), generation);
  };
  c.warn = [this](const std::string& w) { host_.warn(w); };
  c.trace = opts_.trace;
  channel_ = std::make_shared<sandbox_channel>(ex_, std::move(c));
  auto tell_queue = [this](job_note_t n) {
    asio::post(ex_, [this, n = std::move(n)]() mutable { on_job_note(std::move(n)); });
  };
  services_ = std::make_shared<const job_services>(
      job_services{store_, host_, channel_, pauses_, gate_, opts_.trace, std::move(tell_queue),
                   [this](int delta) { busy(delta); }, [this] { held_handover(); }});
}

void job_queue::sessions_resumed() {
  asio::post(ex_, [this] {
    resumed_ = true;
    for (auto& [id, j] : jobs_) {
      job_msg::sessions_resumed m;
      (void)j->tell(std::move(m));
    }
  });
}

int job_queue::held_handovers() {
  std::lock_guard lk(m_);
  return held_handovers_;
}

void job_queue::held_handover() {
  std::lock_guard lk(m_);
  ++held_handovers_;
}

job_queue::~job_queue() = default;

awaitable<void> job_queue::stop() {
  std::vector<std::shared_ptr<runtime::one_shot<std::uint64_t>>> revs;
  std::uint64_t rev;
  {
    std::lock_guard lk(m_);
    stopped_ = true;
    for (auto& [seen, w] : revision_waiters_) revs.push_back(w);
    revision_waiters_.clear();
    rev = revision_;
  }
  auto drained = gate_.close();  // refuses new work now; awaited below
  for (auto& w : revs) w->set(rev);
  auto task = [](job_queue* q) -> awaitable<void> {
    q->resumed_ = true;  // a job made from now on holds no hand-over
    // Waiters resume and find the queue stopping, a hand-over held for boot's
    // phases gives up; the jobs stay as they are.
    std::vector<std::shared_ptr<job>> all;
    for (auto& [id, j] : q->jobs_) all.push_back(j);
    for (auto& j : all) co_await j->stop();
    q->pauses_.stop();  // a retry waiting to run gives up now
    co_await q->channel_->stop();
  };
  auto run = task(this);
  co_await on_queue(std::move(run));
  co_await std::move(drained);
}

// ---- live set and revision ---------------------------------------------------------

void job_queue::bump() {
  std::vector<std::shared_ptr<runtime::one_shot<std::uint64_t>>> ready;
  std::uint64_t rev;
  {
    std::lock_guard lk(m_);
    rev = ++revision_;
    for (auto it = revision_waiters_.begin(); it != revision_waiters_.end();) {
      if (rev > it->first) {
        ready.push_back(it->second);
        it = revision_waiters_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (auto& w : ready) w->set(rev);
}

std::uint64_t job_queue::revision() {
  std::lock_guard lk(m_);
  return revision_;
}

std::shared_ptr<runtime::one_shot<std::uint64_t>> job_queue::revision_after(std::uint64_t seen) {
  auto w = runtime::one_shot<std::uint64_t>::make();
  std::lock_guard lk(m_);
  if (revision_ > seen || stopped_)
    w->set(revision_);
  else
    revision_waiters_.emplace_back(seen, w);
  return w;
}

void job_queue::busy(int delta) {
  std::vector<std::shared_ptr<runtime::one_shot<int>>> ready;
  {
    std::lock_guard lk(m_);
    busy_ += delta;
    if (busy_ == 0) ready.swap(idle_waiters_);
  }
  for (auto& w : ready) w->set(0);
  host_.activity(delta, true);
}

awaitable<void> job_queue::wait_idle() {
  auto w = runtime::one_shot<int>::make();
  {
    std::lock_guard lk(m_);
    if (busy_ == 0) co_return;
    idle_waiters_.push_back(w);
  }
  co_await w->async_wait(asio::use_awaitable);
}

std::shared_ptr<job> job_queue::add_live(owned_job j) {
  auto id = j.id;
  auto thread = j.scope.thread;
  index_[thread][id] = j;
  auto jb = std::make_shared<job>(ex_, services_, std::move(j), resumed_);
  jobs_[id] = jb;
  publish_live(thread);
  busy(+1);
  bump();
  return jb;
}

void job_queue::on_job_note(job_note_t n) {
  if (auto* c = std::get_if<job_note::changed>(&n)) {
    if (!jobs_.count(c->row.id)) return;
    auto thread = c->row.scope.thread;  // a job's scope never changes
    index_[thread][c->row.id] = std::move(c->row);
    publish_live(thread);
  } else if (auto* e = std::get_if<job_note::ended>(&n)) {
    if (!jobs_.erase(e->id)) return;
    if (auto rows = index_.find(e->thread); rows != index_.end()) {
      rows->second.erase(e->id);
      if (rows->second.empty()) index_.erase(rows);
    }
    publish_live(e->thread);
    bump();
    busy(-1);
  }
}

void job_queue::publish_live(const protocol::session_id& thread) {
  thread_view next;
  if (auto rows = index_.find(thread); rows != index_.end()) {
    auto v = std::make_shared<std::vector<owned_job>>();
    v->reserve(rows->second.size());
    for (auto& [id, row] : rows->second) v->push_back(row);
    next = std::move(v);
  }
  std::lock_guard lk(m_);
  if (next)
    live_view_[thread] = std::move(next);
  else
    live_view_.erase(thread);
}

job_queue::thread_view job_queue::live_view(const protocol::session_id& thread) const {
  static const thread_view none = std::make_shared<const std::vector<owned_job>>();
  std::lock_guard lk(m_);
  auto it = live_view_.find(thread);
  return it == live_view_.end() ? none : it->second;
}

bool job_queue::turn_has_live_jobs(const protocol::session_id& thread,
                                   const protocol::turn_id& turn) {
  auto rows = live_view(thread);  // named: a temporary would die before the loop
  for (auto& row : *rows)
    if (row.scope.turn == turn) return true;
  return false;
}

std::vector<protocol::running_item> job_queue::running(const protocol::session_id& thread) {
  std::vector<protocol::running_item> out;
  auto rows = live_view(thread);  // named: a temporary would die before the loop
  for (auto& row : *rows)
    if (!persistence::is_terminal(row.state)) out.push_back({"shell", row.id.str(), row.preview});
  return out;
}

std::optional<std::pair<protocol::sandbox_id, std::uint64_t>> job_queue::sandbox() const {
  return channel_->sandbox();
}

// ---- routes ------------------------------------------------------------------------------

bool job_queue::closing() {
  std::lock_guard lk(m_);
  return stopped_;
}

error job_queue::stopping_error() {
  return error{errc::stopped,
               "the host is shutting down; no route was opened and nothing was started"};
}

awaitable<result<void>> job_queue::bind_route(protocol::sandbox_id sb, std::uint64_t generation) {
  // The platform route must reach the generation recovery proved, if any.
  auto read_bound = [this, sb] { return store_.bound_generation(sb); };
  auto bound = co_await store_.offload(std::move(read_bound));
  if (!bound) co_return bound.error();
  if (*bound && **bound > generation)
    co_return error{errc::refused, "sandbox '" + sb.str() + "' answers with generation " +
                                       std::to_string(generation) + ", older than the bound " +
                                       std::to_string(**bound) + "; nothing was started"};
  co_return co_await store_.bind_sandbox(sb, generation);
}

// ---- ownership ---------------------------------------------------------------------------

awaitable<result<owned_job>> job_queue::owned(owner_scope caller, job_id job) {
  auto read = [this, job] { return store_.job(job); };
  auto j = co_await store_.offload(std::move(read));
  if (!j) co_return j.error();
  if (!*j || !caller.owns((*j)->scope)) co_return not_found(job);
  co_return std::move(**j);
}

awaitable<result<job_view>> job_queue::view_of(owned_job j) {
  job_view v{j.id, j.state, j.completion, {}};
  if (persistence::is_terminal(j.state)) {
    auto rid = protocol::make_event_id(j.id, persistence::transition_of(j.state));
    auto read = [this, rid] { return store_.receipt_by_id(rid); };
    auto r = co_await store_.offload(std::move(read));
    if (!r) co_return r.error();
    if (*r) v.notice = (**r).body;
  }
  co_return v;
}

// ---- launch ------------------------------------------------------------------------------

awaitable<result<job_id>> job_queue::launch(owner_scope caller, launch_request req) {
  auto task = launch_on(std::move(caller), std::move(req), std::nullopt);
  co_return co_await on_queue(std::move(task));
}

awaitable<result<job_id>> job_queue::launch_as_session(owner_scope caller, launch_request req,
                                                       bool notify) {
  auto task = launch_on(std::move(caller), std::move(req), notify);
  co_return co_await on_queue(std::move(task));
}

awaitable<result<job_id>> job_queue::launch_on(owner_scope caller, launch_request req,
                                               std::optional<bool> notify) {
  auto held = gate_.enter();
  if (!held) co_return error{errc::stopped, "the host is shutting down; nothing was done"};
  if (caller.tenant.empty() || caller.thread.empty() || caller.turn.empty())
    co_return error{errc::invalid,
                    "launch: the caller's scope needs a tenant, a thread and a turn; "
                    "nothing was started"};
  if (!notify) {
    auto row = co_await host_.store().load_session(caller.thread);
    if (!row) co_return row.error();
    if (!*row || (*row)->tenant != caller.tenant)
      co_return error{errc::not_found,
                      "session '" + caller.thread.str() + "' not found; nothing was started"};
    notify = (*row)->job_notify;
  }
  if (req.background && !*notify)
    co_return error{errc::refused, "turn '" + caller.turn.str() + "' of session '" +
                                       caller.thread.str() +
                                       "' has notifications disabled, so a background job would "
                                       "have no way back to it; nothing was started"};
  if (req.command.empty())
    co_return error{errc::invalid, "launch: the command is empty; nothing was started"};
  auto cwd = !req.cwd.empty()     ? req.cwd
             : !opts_.cwd.empty() ? opts_.cwd
                                  : std::filesystem::current_path().string();
  if (req.writable && !protocol::path_within(cwd, *req.writable))
    co_return error{errc::refused, "launch: the work directory '" + cwd +
                                       "' is outside the session's writable paths (policy "
                                       "field 'writable'); nothing was started"};
  {
    std::lock_guard lk(m_);
    if (stopped_) co_return error{errc::stopped, "the host is shutting down; nothing was started"};
  }
  auto opened = co_await channel_->open();
  if (!opened) co_return opened.error();
  if (closing()) co_return stopping_error();
  auto sb = channel_->sandbox();

  owned_job j;
  j.id = job_id(protocol::mint("job"));
  if (req.key) {
    if (req.key->empty() || req.key->size() > 64 || !wire::valid_job_id("k" + *req.key) ||
        req.key->find('/') != std::string::npos)
      co_return error{errc::invalid, "launch: key '" + *req.key +
                                         "' must be 1-64 of [A-Za-z0-9_.-]; nothing was started"};
    j.id = job_id("job_" + caller.turn.str() + "_" + *req.key);
    // A replayed launch: the turn already owns this job.
    auto read = [this, id = j.id] { return store_.job(id); };
    auto existing = co_await store_.offload(std::move(read));
    if (!existing) co_return existing.error();
    if (*existing) {
      if (!caller.owns((*existing)->scope))
        co_return error{errc::conflict, "launch: job id '" + j.id.str() +
                                            "' belongs to another owner; nothing was started"};
      co_return j.id;
    }
  }
  j.scope = caller;
  j.scope.sandbox = sb->first;
  j.scope.generation = sb->second;
  j.channel = req.channel;
  auto env = req.env.empty() ? sandbox::current_environment() : std::move(req.env);
  protocol::scrubber scrub(protocol::scrub_rules::from_env(env));
  j.preview = protocol::make_preview(scrub.scrub(req.command)).text;
  auto id = j.id;
  // Ownership is on disk before the command exists.
  auto admitted = co_await store_.admit_job(j);
  if (!admitted) co_return admitted.error();
  TETHER_CRASH_POINT("delivery.launch.after_admit");
  auto jb = add_live(j);

  wire::exec_req er;
  er.command = std::move(req.command);
  er.cwd = std::move(cwd);
  er.env = std::move(env);
  er.job = id;
  er.isolate = req.isolate;
  er.allow_network = req.isolate && req.allow_network;
  auto started = co_await channel_->dispatch(id, std::move(er));
  if (!started) {
    bool closing;
    {
      std::lock_guard lk(m_);
      closing = stopped_;
    }
    if (closing) {
      // The connection was closed under it: whether it started is for the
      // next boot to find out (read-only); the job stays admitted.
      co_return started.error();
    }
    if (started.error().answered) {
      // The daemon refused it: nothing ran.
      auto why = "the command was not started: " + started.error().message;
      job_msg::finish f;
      f.terminal = owned_state::failed;
      f.body = unknown_notice(id, j.preview, why);
      auto written = co_await jb->ask(std::move(f));
      (void)written;  // not durable: the job stays admitted for the next boot
    } else {
      // Not a transport failure (those are retried) and no answer: a reply
      // the route could not read. Whether it started is unknown, and only
      // the daemon may say it is lost: the job stays admitted on disk for
      // the next boot's read-only recovery, and no turn waits on it.
      host_.warn("job " + id.str() + ": its exec was not confirmed (" + started.error().message +
                 "); it stays admitted for the next boot to recover");
      job_msg::end e;
      (void)jb->tell(std::move(e));
    }
    co_return started.error();
  }
  TETHER_CRASH_POINT("delivery.dispatch.after_exec");
  // Follow the job at once: the daemon answers a connection's requests in
  // order, so the follow is registered right behind the exec and a job that
  // ends quickly cannot outlive the daemon's grace unread. Its completion
  // waits for the started receipt, so the receipts keep their order.
  auto started_written = runtime::one_shot<int>::make();
  job_msg::follow follow{started_written};
  (void)jb->tell(std::move(follow));
  auto run = co_await store_.mark_running(id);
  if (!run)
    host_.warn("job " + id.str() + ": its started receipt was not written: " + run.error().message);
  if (run && *run) {
    job_msg::mark_running m;
    (void)jb->tell(std::move(m));
  }
  TETHER_CRASH_POINT("delivery.started.after_commit");
  started_written->set(0);
  co_return id;
}

// ---- status, wait, cancel ------------------------------------------------------------------

awaitable<result<job_view>> job_queue::status(owner_scope caller, job_id job) {
  auto task = status_on(std::move(caller), std::move(job));
  co_return co_await on_queue(std::move(task));
}

awaitable<result<job_view>> job_queue::wait(owner_scope caller, job_id job) {
  for (;;) {
    auto task = status_on(caller, job);
    auto v = co_await on_queue(std::move(task));
    if (!v || persistence::is_terminal(v->state)) co_return v;
    // Only this waiting is cancellable (an interrupted drain stops waiting;
    // the job runs on and its turn's stop cancels it).
    auto w = runtime::one_shot<int>::make([] { return -1; });
    auto add = add_waiter(job, w);
    auto live = co_await on_queue(std::move(add));
    if (live < 0)
      co_return error{errc::stopped, "the host is shutting down; job '" + job.str() +
                                         "' was left as it is for the next boot to recover"};
    if (live == 0) {
      // It ended between the look and now, or the next boot settles it.
      auto again = status_on(caller, job);
      co_return co_await on_queue(std::move(again));
    }
    if (co_await w->async_wait(asio::use_awaitable) < 0)
      co_return error{errc::cancelled,
                      "the wait for job '" + job.str() + "' was cancelled; the job runs on"};
  }
}

awaitable<int> job_queue::add_waiter(job_id job, std::shared_ptr<runtime::one_shot<int>> w) {
  if (closing()) co_return -1;
  auto it = jobs_.find(job);
  if (it == jobs_.end()) co_return 0;
  job_msg::add_waiter m{std::move(w)};
  if (!it->second->tell(std::move(m))) co_return -1;  // its mailbox stopped with the queue
  co_return 1;
}

awaitable<result<job_view>> job_queue::status_on(owner_scope caller, job_id job) {
  auto held = gate_.enter();
  if (!held) co_return error{errc::stopped, "the host is shutting down; nothing was read"};
  auto j = co_await owned(caller, job);
  if (!j) co_return j.error();
  if (persistence::is_terminal(j->state)) {
    // Read: it is not delivered again.
    auto rid = protocol::make_event_id(j->id, persistence::transition_of(j->state));
    auto read = co_await store_.mark_read(rid);
    if (!read) co_return read.error();
  }
  co_return co_await view_of(std::move(*j));
}

awaitable<result<job_view>> job_queue::cancel(owner_scope caller, job_id job) {
  auto task = cancel_on(std::move(caller), std::move(job), true);
  co_return co_await on_queue(std::move(task));
}

awaitable<result<job_view>> job_queue::cancel_on(owner_scope caller, job_id job, bool read) {
  auto held = gate_.enter();
  if (!held) co_return error{errc::stopped, "the host is shutting down; nothing was cancelled"};
  auto j = co_await owned(caller, job);
  if (!j) co_return j.error();
  if (!persistence::is_terminal(j->state)) {
    auto it = jobs_.find(job);
    if (it == jobs_.end())
      co_return error{errc::conflict, "job '" + job.str() +
                                          "' is not followed by this host (the next boot "
                                          "recovers it); it was not cancelled"};
    auto jb = it->second;
    job_msg::cancel m;
    auto cancelled = co_await jb->ask(std::move(m));
    if (!cancelled) co_return cancelled.error();
    auto again = co_await owned(caller, job);
    if (!again) co_return again.error();
    j = std::move(*again);
  }
  if (read && persistence::is_terminal(j->state)) {
    auto rid = protocol::make_event_id(j->id, persistence::transition_of(j->state));
    auto r = co_await store_.mark_read(rid);
    if (!r) co_return r.error();
  }
  co_return co_await view_of(std::move(*j));
}

awaitable<result<int>> job_queue::stop_turn(owner_scope turn) {
  std::vector<std::pair<job_id, owner_scope>> mine;
  auto rows = live_view(turn.thread);  // named: a temporary would die before the loop
  for (auto& row : *rows)
    if (turn.owns(row.scope)) mine.emplace_back(row.id, turn);
  co_return co_await cancel_each(std::move(mine));
}

awaitable<result<int>> job_queue::stop_thread(protocol::tenant_id tenant,
                                              protocol::session_id thread) {
  std::vector<std::pair<job_id, owner_scope>> mine;
  auto rows = live_view(thread);  // named: a temporary would die before the loop
  for (auto& row : *rows)
    if (row.scope.tenant == tenant) mine.emplace_back(row.id, row.scope);
  co_return co_await cancel_each(std::move(mine));
}

awaitable<result<int>> job_queue::cancel_each(std::vector<std::pair<job_id, owner_scope>> jobs) {
  int n = 0;
  std::optional<error> first;
  for (auto& [id, caller] : jobs) {
    auto task = cancel_on(caller, id, false);
    auto r = co_await on_queue(std::move(task));
    if (r && r->state == owned_state::cancelled) ++n;
    if (!r && !first && r.error().code != errc::not_found) first = r.error();
  }
  if (first) co_return *first;
  co_return n;
}

// ---- recovery ----------------------------------------------------------------------------

job_queue::recovery_reads job_queue::start_recovery_reads(persistence::task_store& store) {
  auto read_live = [s = &store] { return s->live_jobs(); };
  auto read_pending = [s = &store] { return s->pending_receipts_but_subagent(); };
  recovery_reads r;
  r.live = store.start(std::move(read_live));
  r.pending = store.start(std::move(read_pending));
  return r;
}

awaitable<result<recovery_report>> job_queue::recover(std::optional<recovery_reads> reads) {
  auto task = recover_on(std::move(reads));
  co_return co_await on_queue(std::move(task));
}

awaitable<result<recovery_report>> job_queue::recover_on(std::optional<recovery_reads> reads) {
  auto held = gate_.enter();
  if (!held) co_return error{errc::stopped, "the host is shutting down; nothing was done"};
  // Until boot's phases have resumed the sessions (and bound their running
  // subagent rows), no hand-over of this queue wakes anyone.
  resumed_ = false;
  recovery_report rep;
  auto refuse = [](const error& e) {
    return error{e.code, "refusing to boot: " + e.message + "; nothing was changed"};
  };
  // Past the checks, some receipts may be dropped and some jobs settled already.
  auto refuse_late = [](const std::string& what, const error& e) {
    return error{e.code, "refusing to boot: " + what + ": " + e.message +
                             "; what recovery settled before this stays settled, every other "
                             "owner was retained and no new work was started"};
  };
  if (!reads) reads = start_recovery_reads(store_);
  auto live = co_await reads->live->async_take(asio::use_awaitable);
  if (!live) co_return refuse(live.error());
  auto pending = co_await reads->pending->async_take(asio::use_awaitable);
  reads.reset();  // their one_shots, emptied by the takes
  if (!pending) co_return refuse(pending.error());

  // The host's own local daemon (no sandbox configured) is part of this
  // host: when none answers (the machine restarted, or it was killed), it is
  // started again on its state directory, whose records say how each job
  // ended (a job that was running when it died ends with status -1). It runs
  // nothing new for recovery; a configured sandbox is never started here.
  if (opts_.local && opts_.start_daemon && !live->empty()) {
    auto started = co_await channel_->ensure_daemon();
    if (!started)
      co_return refuse(error{started.error().code,
                             "the local sandbox daemon in " + opts_.sandbox_dir +
                                 " could not be started (" + started.error().message + ")"});
  }
  // Every recorded owner must be recovered on its own sandbox generation,
  // through a read-only connection that cannot start anything.
  std::unique_ptr<sandbox::client> ro;
  for (auto& j : *live) {
    auto who = "owned job '" + j.id.str() + "' (tenant " + j.scope.tenant.str() + ", thread " +
               j.scope.thread.str() + ", turn " + j.scope.turn.str() + ")";
    auto stop = [&](const std::string& why) {
      return error{errc::refused, "refusing to boot: " + who + " " + why +
                                      "; the outstanding owner was retained and no new work "
                                      "was started"};
    };
    if (j.scope.sandbox.empty() || j.scope.generation == 0)
      co_return stop(
          "has no proven sandbox generation, so it cannot tell whether its command "
          "was dispatched");
    if (opts_.sandbox_dir.empty())
      co_return stop("ran on sandbox '" + j.scope.sandbox.str() + "' generation " +
                     std::to_string(j.scope.generation) + ", but no sandbox is configured");
    if (!ro) {
      auto c = co_await sandbox::client::connect(sandbox::socket_path_for(opts_.sandbox_dir),
                                                 wire::conn_mode::read_only, "tether recovery",
                                                 opts_.client);
      if (!c)
        co_return stop("ran on sandbox '" + j.scope.sandbox.str() + "' generation " +
                       std::to_string(j.scope.generation) + ", whose daemon cannot be reached (" +
                       c.error().message + ")");
      ro = std::move(*c);
    }
    auto& h = ro->hello();
    // A local daemon's directory that answers as another sandbox lost the
    // one the job ran on (its identity and records are gone with it): the
    // daemon does not know the job, and below it ends `lost`, not run again.
    if (opts_.local) continue;
    if (h.sandbox != j.scope.sandbox || h.generation != j.scope.generation)
      co_return stop("ran on sandbox '" + j.scope.sandbox.str() + "' generation " +
                     std::to_string(j.scope.generation) + ", but the daemon there is sandbox '" +
                     h.sandbox.str() + "' generation " + std::to_string(h.generation));
  }

  // Stale receipts: another scope than their job's, an older generation than
  // the bound one, or an owner that is gone. The others are boot's to resend.
  // One read for all of them: only a shell's receipt needs its job's row
  // (store_.job reads shells only, so any other kind has none). A subagent
  // task's receipts are not read (the report path delivers them, and its
  // scope has no sandbox): 100,000 owed reports cost this check nothing.
  auto read_stale =
      [this,
       pending = std::move(*pending)]() -> result<std::vector<std::pair<event_id, std::string>>> {
    std::vector<std::pair<event_id, std::string>> out;
    std::map<std::string, std::optional<std::uint64_t>> bound_of;  // by sandbox
    for (const auto& [r, kind] : pending) {
      std::optional<owned_job> j;
      if (kind == "shell") {
        auto read = store_.job(r.job);
        if (!read) return read.error();
        j = std::move(*read);
      }
      // Another kind's receipt without a sandbox (a delegate's, a goal's):
      // nothing of this queue's to check.
      if (!j && r.scope.sandbox.empty() && r.scope.generation == 0) continue;
      std::string why;
      if (!j) {
        why = "its job does not exist";
      } else if (!(j->scope == r.scope)) {
        why = "its scope differs from its job's owner";
      } else {
        auto it = bound_of.find(r.scope.sandbox.str());
        if (it == bound_of.end()) {
          auto bound = store_.bound_generation(r.scope.sandbox);
          if (!bound) return bound.error();
          it = bound_of.emplace(r.scope.sandbox.str(), *bound).first;
        }
        if (it->second && r.scope.generation < *it->second)
          why = "it belongs to generation " + std::to_string(r.scope.generation) + " of sandbox '" +
                r.scope.sandbox.str() + "', older than the bound " + std::to_string(*it->second);
      }
      if (!why.empty()) out.emplace_back(r.id, std::move(why));
    }
    return out;
  };
  auto stale = co_await store_.offload(std::move(read_stale));
  if (!stale) co_return refuse(stale.error());
  std::vector<event_id> drop;
  for (auto& [id, why] : *stale) {
    auto w = "recovery: receipt " + id.str() + " dropped: " + why;
    rep.warnings.push_back(w);
    host_.warn(w);
    drop.push_back(id);
  }
  if (!drop.empty()) {
    rep.dropped = static_cast<int>(drop.size());
    auto d = co_await store_.drop(std::move(drop));
    if (!d) co_return refuse_late("dropping stale receipts", d.error());
    TETHER_CRASH_POINT("recover.drop.after_commit");
  }

  // Reattach: what ended while the host was down settles once; what runs is
  // followed again; what the daemon does not know is not run again. Their
  // receipts stay pending: boot's sweep resends every pending receipt.
  std::vector<std::shared_ptr<job>> follow;  // still running: followed again
  std::vector<owned_job> followed;           // their rows, as recovery read them
  std::vector<job_id> settled;               // ended while the host was down: expired below
  for (auto& j : *live) {
    auto a = co_await ro->attach(j.id, 0);
    if (!a && a.error().answered && a.error().code == errc::not_found) {
      auto jb = add_live(j);
      std::string why = j.state == owned_state::admitted
                            ? "the host stopped around its dispatch and the sandbox does not know "
                              "it; it was not run again, and whether it ran is unknown"
                            : "the sandbox no longer knows it; how it ended is unknown";
      job_msg::finish f;
      f.terminal = owned_state::lost;
      f.body = unknown_notice(j.id, j.preview, why);
      f.wake_after = false;
      auto written = co_await jb->ask(std::move(f));
      (void)written;  // not durable: the next boot recovers it again
      ++rep.lost;
      continue;
    }
    if (!a) co_return refuse_late("reattaching owned job '" + j.id.str() + "'", a.error());
    auto jb = add_live(j);
    if (a->done) {
      job_msg::finish f;
      f.terminal = terminal_of(*a->done);
      f.body = protocol::render_notice(*a->done);
      f.completion = std::move(*a->done);
      f.wake_after = false;
      auto written = co_await jb->ask(std::move(f));
      bool durable = written && *written;
      ++rep.finished_while_down;
      if (durable) settled.push_back(j.id);
      continue;
    }
    if (j.state == owned_state::admitted) {
      auto run = co_await store_.mark_running(j.id);
      if (!run)
        co_return refuse_late("marking owned job '" + j.id.str() + "' running", run.error());
      if (*run) TETHER_CRASH_POINT("recover.running.after_commit");
    }
    follow.push_back(jb);
    followed.push_back(j);
  }
  if (ro) ro->close();

  // The read-only connection cannot expire: the platform route does, once
  // the terminal receipts are durable. A failure keeps the records (the
  // daemon drops them after its own bound) and does not stop the boot.
  if (!settled.empty()) {
    auto opened = co_await channel_->open();
    if (!opened) {
      auto w = "recovery: the sandbox keeps the records of " + std::to_string(settled.size()) +
               " job(s) that ended while the host was down, until its own bound: no route to "
               "expire them (" +
               opened.error().message + ")";
      rep.warnings.push_back(w);
      host_.warn(w);
    }
    for (auto& id : settled) {
      if (!opened) break;
      co_await channel_->expire_record(id);
      TETHER_CRASH_POINT("recover.expire.after_commit");
    }
  }

  if (!follow.empty()) {
    auto opened = co_await channel_->open();
    if (!opened) co_return refuse_late("opening the platform route", opened.error());
    auto sb = channel_->sandbox();
    for (std::size_t i = 0; i < follow.size(); ++i) {
      auto& j = followed[i];
      if (sb && (sb->first != j.scope.sandbox || sb->second != j.scope.generation))
        co_return refuse_late(
            "following owned job '" + j.id.str() + "'",
            error{errc::refused, "the platform route reached sandbox '" + sb->first.str() +
                                     "' generation " + std::to_string(sb->second) +
                                     ", not the job's generation " +
                                     std::to_string(j.scope.generation)});
      job_msg::follow m;
      (void)follow[i]->tell(std::move(m));
      ++rep.reattached;
    }
  }
  co_return rep;
}

}  // namespace tether::actors
