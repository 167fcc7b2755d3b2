#include "tether/actors/sandbox_channel.hpp"

#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <thread>

#include "tether/runtime/clock.hpp"
#include "tether/sandbox/state_dir.hpp"

namespace tether::actors {

namespace asio = boost::asio;

namespace {

// A retry's warning: the first, then every tenth (a daemon down for long
// does not flood the log).
bool worth_warning(int attempt) {
  return attempt % 10 == 0;
}

}  // namespace

bool sandbox_lease::extend_to(std::int64_t until_ms) {
  auto was = until_ms_.load();
  while (until_ms > was)
    if (until_ms_.compare_exchange_weak(was, until_ms)) return true;
  return false;
}

sandbox_channel::sandbox_channel(runtime::executor ex, sandbox_channel_options opts)
    : ex_(ex),
      opts_(std::move(opts)),
      max_failures_(opts_.adapter_failures < 1 ? 1 : opts_.adapter_failures),
      lease_(std::make_shared<sandbox_lease>()),
      pauses_(ex) {}

sandbox_channel::sandbox_channel(runtime::executor ex, std::shared_ptr<command_route> platform,
                                 std::shared_ptr<command_route> adapter, int max_failures,
                                 std::shared_ptr<sandbox_lease> lease,
                                 std::function<void(const std::string&)> warn)
    : ex_(ex),
      max_failures_(max_failures < 1 ? 1 : max_failures),
      opens_(false),
      lease_(lease ? std::move(lease) : std::make_shared<sandbox_lease>()),
      pauses_(ex) {
  opts_.adapter_failures = max_failures_;
  opts_.warn = std::move(warn);
  auto rs = std::make_shared<routes>();
  rs->platform = std::move(platform);
  rs->adapter = std::move(adapter);
  rs->fell_back = !rs->adapter;
  routes_ = std::move(rs);
  publish();
}

sandbox_channel::~sandbox_channel() {
  std::lock_guard lk(starters_m_);
  for (auto& s : starters_) s.thread.join();
}

// Runs `task` on the channel's executor to its end: the caller's
// cancellation must not cut a request in half (an exec whose answer is lost
// leaves its job unconfirmed), so the spawned work gets no cancellation slot.
template <class T>
awaitable<result<T>> sandbox_channel::on_channel(awaitable<result<T>> task) {
  auto held = gate_.enter();
  if (!held) co_return stopping_error();
  auto token = asio::bind_cancellation_slot(asio::cancellation_slot(), asio::use_awaitable);
  co_return co_await asio::co_spawn(ex_, std::move(task), std::move(token));
}

error sandbox_channel::stopping_error() {
  return error{errc::stopped,
               "the host is shutting down; no route was opened and nothing was started"};
}

error sandbox_channel::no_route_error() {
  return error{errc::closed, "no route to the sandbox is open; nothing was sent"};
}

bool sandbox_channel::stopping() const {
  std::lock_guard lk(m_);
  return stopped_;
}

void sandbox_channel::warn(const std::string& w) {
  if (opts_.warn) opts_.warn(w);
}

void sandbox_channel::publish() {
  route_status s;
  if (auto rs = routes_) {
    s.open = true;
    s.fell_back = rs->fell_back;
    s.failures_in_a_row = rs->failures;
    s.route = rs->fell_back ? rs->platform->name() : rs->adapter->name();
  }
  std::lock_guard lk(m_);
  status_ = std::move(s);
}

route_status sandbox_channel::status() const {
  std::lock_guard lk(m_);
  return status_;
}

std::optional<std::pair<protocol::sandbox_id, std::uint64_t>> sandbox_channel::sandbox() const {
  std::lock_guard lk(m_);
  return sandbox_;
}

// ---- opening --------------------------------------------------------------------------

awaitable<result<void>> sandbox_channel::open() {
  auto task = open_on();
  co_return co_await on_channel(std::move(task));
}

awaitable<result<void>> sandbox_channel::open_on() {
  if (routes_) co_return result<void>{};
  if (!opens_) co_return no_route_error();
  // One opening at a time (all on this executor): later callers share its outcome.
  if (opening_) {
    auto o = opening_;
    co_return co_await o->async_wait(asio::use_awaitable);
  }
  opening_ = runtime::one_shot<result<void>>::make();
  auto opening = opening_;
  auto r = co_await open_once();
  opening_.reset();
  opening->set(r);
  co_return r;
}

awaitable<result<void>> sandbox_channel::open_once() {
  if (opts_.sandbox_dir.empty())
    co_return error{errc::refused, "no sandbox is configured (job_queue_options.sandbox_dir)"};
  std::string socket = sandbox::socket_path_for(opts_.sandbox_dir);
  if (opts_.start_daemon) {
    auto h = co_await ensure_daemon();
    if (!h) co_return h.error();
    socket = h->socket_path;
  }
  if (stopping()) co_return stopping_error();
  auto c = co_await sandbox::client::connect(socket, wire::conn_mode::read_write, "tether host",
                                             opts_.client);
  if (!c) co_return c.error();
  if (stopping()) co_return stopping_error();  // the client closes as it goes
  auto hello = (*c)->hello();
  // A reconnect must reach the sandbox and generation the channel's jobs run
  // on: a daemon serving another sandbox, or a replaced (newer) generation,
  // does not know them, and binding it would make their receipts stale.
  if (auto was = sandbox(); was && (was->first != hello.sandbox || was->second != hello.generation))
    co_return error{errc::conflict,
                    "the sandbox daemon at " + socket + " now answers as sandbox '" +
                        hello.sandbox.str() + "' generation " + std::to_string(hello.generation) +
                        ", not sandbox '" + was->first.str() + "' generation " +
                        std::to_string(was->second) +
                        " that this host's jobs run on; the route was refused, nothing was "
                        "sent to it and the host stays bound to generation " +
                        std::to_string(was->second)};
  if (opts_.bind) {
    auto b = co_await opts_.bind(hello.sandbox, hello.generation);
    if (!b) co_return b.error();
  }
  if (stopping()) co_return stopping_error();
  auto rs = std::make_shared<routes>();
  rs->platform = std::make_shared<client_route>("platform", std::move(*c));
  if (opts_.adapter) {
    // An adapter that cannot attach is a route failure, not a sandbox one:
    // the platform route serves alone.
    auto a = co_await opts_.adapter(socket);
    if (a)
      rs->adapter = std::move(*a);
    else
      warn("adapter route did not attach (" + a.error().message +
           "); commands go through the platform route on the same sandbox");
    if (stopping()) {
      rs->close();
      co_return stopping_error();
    }
  }
  rs->fell_back = !rs->adapter;
  routes_ = std::move(rs);
  {
    std::lock_guard lk(m_);
    sandbox_ = std::make_pair(hello.sandbox, hello.generation);
  }
  publish();
  co_return result<void>{};
}

awaitable<result<sandbox::daemon_handle>> sandbox_channel::ensure_daemon() {
  // sandbox::ensure_daemon blocks (it may start one and read its readiness
  // line): it runs on a thread of its own, never on an executor.
  sandbox::daemon_options d;
  d.state_dir = opts_.sandbox_dir;
  d.binary = opts_.daemon_binary;
  d.idle_exit = opts_.daemon_idle_exit;
  auto ready = runtime::one_shot<result<sandbox::daemon_handle>>::make();
  {
    std::lock_guard lk(starters_m_);
    // Those that answered only have their post and exit left: joining them is brief.
    std::erase_if(starters_, [](starter& s) {
      if (!s.ready->ready()) return false;
      s.thread.join();
      return true;
    });
    starters_.push_back(
        {std::thread([d, ready] { ready->set(sandbox::ensure_daemon(d)); }), ready});
  }
  co_return co_await ready->async_wait(asio::use_awaitable);
}

awaitable<result<std::shared_ptr<sandbox_channel::routes>>> sandbox_channel::reconnect(
    std::shared_ptr<routes> failed, int attempt) {
  if (failed && routes_ == failed) {
    routes_->close();  // its other requests fail too, and reconnect
    routes_.reset();
    publish();
  }
  if (!opens_) co_return no_route_error();
  if (!co_await pauses_.pause(attempt)) co_return stopping_error();
  auto opened = co_await open_on();
  if (!opened) co_return opened.error();
  if (stopping()) co_return stopping_error();
  co_return routes_;
}

// ---- routing --------------------------------------------------------------------------

// The adapter while it works, the platform after it failed max_failures
// times in a row. Every decision is taken here, on the channel's executor,
// between the route's suspensions.
template <class T, class Call>
awaitable<result<T>> sandbox_channel::route(std::shared_ptr<routes> rs, Call call) {
  while (!rs->fell_back) {
    if (auto t = rs->adapter->timeout()) lease_->extend_to(runtime::now_ms() + t->count());
    auto r = co_await call(*rs->adapter);
    if (r || !is_infrastructure_failure(r.error())) {
      if (!rs->fell_back) {
        rs->failures = 0;
        publish();
      }
      co_return r;
    }
    // Calls that were in flight when another one made the channel fall back
    // do not count again (and do not warn twice): they just move over.
    if (rs->fell_back) break;
    if (++rs->failures >= max_failures_) {
      rs->fell_back = true;
      warn("route '" + rs->adapter->name() + "' failed " + std::to_string(rs->failures) +
           " times in a row (last: " + r.error().message + "); falling back to '" +
           rs->platform->name() + "' on the same sandbox");
    }
    publish();
  }
  co_return co_await call(*rs->platform);
}

template <class T, class Call>
awaitable<result<T>> sandbox_channel::route_current(Call call) {
  auto rs = routes_;
  if (!rs) co_return no_route_error();
  co_return co_await route<T>(std::move(rs), std::move(call));
}

awaitable<result<wire::started_rep>> sandbox_channel::exec(wire::exec_req r) {
  auto call = [r = std::move(r)](command_route& c) { return c.exec(r); };
  auto task = route_current<wire::started_rep>(std::move(call));
  co_return co_await on_channel(std::move(task));
}

awaitable<result<protocol::shell_completion>> sandbox_channel::wait(job_id job) {
  auto call = [job = std::move(job)](command_route& c) { return c.wait(job); };
  auto task = route_current<protocol::shell_completion>(std::move(call));
  co_return co_await on_channel(std::move(task));
}

awaitable<result<protocol::shell_completion>> sandbox_channel::kill(job_id job) {
  auto call = [job = std::move(job)](command_route& c) { return c.kill(job); };
  auto task = route_current<protocol::shell_completion>(std::move(call));
  co_return co_await on_channel(std::move(task));
}

awaitable<result<std::vector<job_id>>> sandbox_channel::expire(job_id job) {
  auto call = [job = std::move(job)](command_route& c) { return c.expire(job); };
  auto task = route_current<std::vector<job_id>>(std::move(call));
  co_return co_await on_channel(std::move(task));
}

// ---- requests that outlive a connection ----------------------------------------------

awaitable<result<wire::started_rep>> sandbox_channel::dispatch(job_id job, wire::exec_req er) {
  auto task = dispatch_on(std::move(job), std::move(er));
  co_return co_await on_channel(std::move(task));
}

awaitable<result<wire::started_rep>> sandbox_channel::dispatch_on(job_id job, wire::exec_req er) {
  auto rs = routes_;
  for (int attempt = 0;; ++attempt) {
    if (rs) {
      auto call = [once = er](command_route& c) { return c.exec(once); };
      auto started = co_await route<wire::started_rep>(rs, std::move(call));
      if (started || !is_infrastructure_failure(started.error()) || stopping()) co_return started;
      if (worth_warning(attempt))
        warn("job " + job.str() + ": no route confirmed its exec (" + started.error().message +
             "); it may have started, so it stays admitted and the exec is sent again "
             "(idempotent by job id) once the sandbox answers");
    }
    if (opts_.trace) opts_.trace(job, "dispatch_retry");
    auto again = co_await reconnect(rs, attempt);
    rs.reset();
    if (again) {
      rs = std::move(*again);
      continue;
    }
    if (stopping() || !opens_ || again.error().code == errc::conflict) co_return again.error();
    if (worth_warning(attempt))
      warn("job " + job.str() + ": no route to the sandbox (" + again.error().message +
           "); the exec is retried");
  }
}

awaitable<result<protocol::shell_completion>> sandbox_channel::follow(job_id job) {
  auto task = follow_on(std::move(job));
  co_return co_await on_channel(std::move(task));
}

awaitable<result<protocol::shell_completion>> sandbox_channel::follow_on(job_id job) {
  auto rs = routes_;
  for (int attempt = 0;; ++attempt) {
    if (rs) {
      auto call = [job](command_route& c) { return c.wait(job); };
      auto done = co_await route<protocol::shell_completion>(rs, std::move(call));
      if (done || !is_infrastructure_failure(done.error()) || stopping()) co_return done;
      if (worth_warning(attempt))
        warn("job " + job.str() + ": following it failed (" + done.error().message +
             "); a failed connection is not a failed job: the queue reconnects to the "
             "same sandbox and generation and follows it again");
    }
    if (opts_.trace) opts_.trace(job, "follow_retry");
    auto again = co_await reconnect(rs, attempt);
    rs.reset();
    if (again) {
      rs = std::move(*again);
      continue;
    }
    if (stopping() || !opens_ || again.error().code == errc::conflict) co_return again.error();
    if (worth_warning(attempt))
      warn("job " + job.str() + ": no route to the sandbox (" + again.error().message +
           "); following it is retried");
  }
}

awaitable<void> sandbox_channel::expire_record(job_id job) {
  auto held = gate_.enter();
  if (!held) co_return;  // stopping: the daemon's own bound applies
  auto token = asio::bind_cancellation_slot(asio::cancellation_slot(), asio::use_awaitable);
  co_await asio::co_spawn(ex_, expire_record_on(std::move(job)), std::move(token));
}

awaitable<void> sandbox_channel::expire_record_on(job_id job) {
  auto rs = routes_;
  if (!rs || stopping()) co_return;  // shutting down: the daemon's own bound applies
  auto call = [job](command_route& c) { return c.expire(job); };
  auto r = co_await route<std::vector<job_id>>(std::move(rs), std::move(call));
  // Expired already, or never known: nothing is kept for it.
  if (r || (r.error().answered && r.error().code == errc::not_found)) co_return;
  warn("job " + job.str() + ": its terminal receipt is written, but the sandbox kept its " +
       "record (" + r.error().message + "); the daemon drops it after its own bound");
}

awaitable<void> sandbox_channel::drop_connections() {
  auto task = [](sandbox_channel* c) -> awaitable<void> {
    if (c->routes_) c->routes_->close();
    co_return;
  };
  co_await asio::co_spawn(ex_, task(this), asio::use_awaitable);
}

// ---- stop -----------------------------------------------------------------------------

awaitable<void> sandbox_channel::stop() {
  {
    std::lock_guard lk(m_);
    stopped_ = true;
  }
  auto task = [](sandbox_channel* c) -> awaitable<void> {
    if (c->routes_) c->routes_->close();  // requests in flight fail at once
    c->pauses_.stop();                    // a reconnect waiting to run gives up now
    co_return;
  };
  auto token = asio::bind_cancellation_slot(asio::cancellation_slot(), asio::use_awaitable);
  co_await asio::co_spawn(ex_, task(this), std::move(token));
  co_await gate_.close();
}

}  // namespace tether::actors
