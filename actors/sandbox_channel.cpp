#include "tether/actors/sandbox_channel.hpp"

#include <boost/asio/bind_executor.hpp>
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

struct channel_routes {
  std::shared_ptr<command_route> platform;
  std::shared_ptr<command_route> adapter;
  int failures = 0;
  bool fell_back = false;
  void close() {
    if (adapter) adapter->close();
    platform->close();
  }
};

sandbox_channel::sandbox_channel(runtime::executor ex, sandbox_channel_options opts)
    : actor(ex, runtime::actor_options{"sandbox channel"}),
      opts_(std::move(opts)),
      max_failures_(opts_.adapter_failures < 1 ? 1 : opts_.adapter_failures),
      lease_(std::make_shared<sandbox_lease>()),
      pauses_(ex) {}

sandbox_channel::sandbox_channel(runtime::executor ex, std::shared_ptr<command_route> platform,
                                 std::shared_ptr<command_route> adapter, int max_failures,
                                 std::shared_ptr<sandbox_lease> lease,
                                 std::function<void(const std::string&)> warn)
    : actor(ex, runtime::actor_options{"sandbox channel"}),
      max_failures_(max_failures < 1 ? 1 : max_failures),
      opens_(false),
      lease_(lease ? std::move(lease) : std::make_shared<sandbox_lease>()),
      pauses_(ex) {
  opts_.adapter_failures = max_failures_;
  opts_.warn = std::move(warn);
  auto rs = std::make_shared<channel_routes>();
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

void sandbox_channel::warn(const std::string& w) const {
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

// ---- the public requests: asks -----------------------------------------------------

// The caller's cancellation ends only its waiting: the request runs on as a
// coroutine of the channel (an exec whose answer is lost would leave its job
// unconfirmed).
template <class M>
awaitable<result<runtime::reply_value_t<M>>> sandbox_channel::request(M m) {
  auto r = co_await ask(std::move(m));
  if (!r && (r.error().code == errc::closed || r.error().code == errc::stopped) && stopping())
    co_return stopping_error();
  co_return r;
}

awaitable<result<void>> sandbox_channel::open() {
  channel_msg::open m;
  auto r = co_await request(std::move(m));
  if (!r) co_return r.error();
  co_return result<void>{};
}

awaitable<result<wire::started_rep>> sandbox_channel::exec(wire::exec_req r) {
  channel_msg::exec m{std::move(r), {}};
  co_return co_await request(std::move(m));
}

awaitable<result<protocol::shell_completion>> sandbox_channel::wait(job_id job) {
  channel_msg::wait m{std::move(job), {}};
  co_return co_await request(std::move(m));
}

awaitable<result<protocol::shell_completion>> sandbox_channel::kill(job_id job) {
  channel_msg::kill m{std::move(job), {}};
  co_return co_await request(std::move(m));
}

awaitable<result<std::vector<job_id>>> sandbox_channel::expire(job_id job) {
  channel_msg::expire m{std::move(job), {}};
  co_return co_await request(std::move(m));
}

awaitable<result<wire::started_rep>> sandbox_channel::dispatch(job_id job, wire::exec_req er) {
  channel_msg::dispatch m{std::move(job), std::move(er), {}};
  co_return co_await request(std::move(m));
}

awaitable<result<protocol::shell_completion>> sandbox_channel::follow(job_id job) {
  channel_msg::follow m{std::move(job), {}};
  co_return co_await request(std::move(m));
}

awaitable<void> sandbox_channel::expire_record(job_id job) {
  // Stopping, or no route: the daemon's own bound applies.
  channel_msg::expire_record m{std::move(job), {}};
  auto r = co_await request(std::move(m));
  (void)r;
}

awaitable<void> sandbox_channel::drop_connections() {
  channel_msg::drop_connections m;
  auto r = co_await request(std::move(m));
  (void)r;
}

awaitable<void> sandbox_channel::stop() {
  {
    std::lock_guard lk(m_);
    stopped_ = true;  // an opening in flight gives up at its next step
  }
  channel_msg::stopping m;
  auto told = co_await ask(std::move(m));
  (void)told;  // stopped already: the mailbox is closed
  co_await gate_.close();
  co_await actor::stop();
}

// ---- handlers ------------------------------------------------------------------------

void sandbox_channel::handle(channel_message& m) {
  std::visit([this](auto& msg) { on(msg); }, m);
}

template <class T>
awaitable<void> sandbox_channel::answer(reply_to<T> reply, awaitable<result<T>> task) {
  reply.send(co_await std::move(task));
}

template <class T>
void sandbox_channel::spawn_answer(runtime::gate::holder held, reply_to<T> reply,
                                   awaitable<result<T>> task) {
  auto ends = std::make_shared<runtime::gate::holder>(std::move(held));
  auto on_end = [ends](std::exception_ptr) { auto done = std::move(*ends); };
  auto ex = get_executor();
  asio::co_spawn(ex, answer(std::move(reply), std::move(task)),
                 asio::bind_executor(ex, std::move(on_end)));
}

template <class T, class Call>
void sandbox_channel::one_attempt(reply_to<T>& reply, Call call) {
  auto held = gate_.enter();
  if (!held || stopping_) {
    reply.fail(stopping_error());
    return;
  }
  auto task = route<T>(shared_from_this(), nullptr, std::move(call));
  spawn_answer(std::move(held), std::move(reply), std::move(task));
}

void sandbox_channel::on(channel_msg::exec& m) {
  auto call = [r = std::move(m.req)](command_route& c) { return c.exec(r); };
  one_attempt(m.reply, std::move(call));
}

void sandbox_channel::on(channel_msg::wait& m) {
  auto call = [job = std::move(m.job)](command_route& c) { return c.wait(job); };
  one_attempt(m.reply, std::move(call));
}

void sandbox_channel::on(channel_msg::kill& m) {
  auto call = [job = std::move(m.job)](command_route& c) { return c.kill(job); };
  one_attempt(m.reply, std::move(call));
}

void sandbox_channel::on(channel_msg::expire& m) {
  auto call = [job = std::move(m.job)](command_route& c) { return c.expire(job); };
  one_attempt(m.reply, std::move(call));
}

void sandbox_channel::on(channel_msg::dispatch& m) {
  auto held = gate_.enter();
  if (!held || stopping_) {
    m.reply.fail(stopping_error());
    return;
  }
  auto call = [once = std::move(m.req)](command_route& c) { return c.exec(once); };
  retry_texts texts{"dispatch_retry", "no route confirmed its exec",
                    "it may have started, so it stays admitted and the exec is sent again "
                    "(idempotent by job id) once the sandbox answers",
                    "the exec is retried"};
  auto task = until_answered<wire::started_rep>(shared_from_this(), std::move(m.job),
                                                std::move(call), texts);
  spawn_answer(std::move(held), std::move(m.reply), std::move(task));
}

void sandbox_channel::on(channel_msg::follow& m) {
  auto held = gate_.enter();
  if (!held || stopping_) {
    m.reply.fail(stopping_error());
    return;
  }
  auto call = [job = m.job](command_route& c) { return c.wait(job); };
  retry_texts texts{"follow_retry", "following it failed",
                    "a failed connection is not a failed job: the queue reconnects to the "
                    "same sandbox and generation and follows it again",
                    "following it is retried"};
  auto task = until_answered<protocol::shell_completion>(shared_from_this(), std::move(m.job),
                                                         std::move(call), texts);
  spawn_answer(std::move(held), std::move(m.reply), std::move(task));
}

void sandbox_channel::on(channel_msg::expire_record& m) {
  auto rs = routes_;
  auto held = gate_.enter();
  if (!rs || !held || stopping_) {
    m.reply.send();  // shutting down, or no route: the daemon's own bound applies
    return;
  }
  auto task = expire_on(shared_from_this(), std::move(rs), std::move(m.job), std::move(m.reply));
  auto ends = std::make_shared<runtime::gate::holder>(std::move(held));
  auto on_end = [ends](std::exception_ptr) { auto done = std::move(*ends); };
  auto ex = get_executor();
  asio::co_spawn(ex, std::move(task), asio::bind_executor(ex, std::move(on_end)));
}

void sandbox_channel::on(channel_msg::drop_connections& m) {
  if (routes_) routes_->close();
  m.reply.send();
}

void sandbox_channel::on(channel_msg::stopping& m) {
  stopping_ = true;
  if (routes_) routes_->close();  // requests in flight fail at once
  pauses_.stop();                 // a reconnect waiting to run gives up now
  for (auto& o : openers_) o.fail(stopping_error());
  openers_.clear();
  m.reply.send();
}

void sandbox_channel::on(channel_msg::open& m) {
  if (stopping_) {
    m.reply.fail(stopping_error());
    return;
  }
  if (routes_) {
    m.reply.send(routes_);
    return;
  }
  if (!opens_) {
    m.reply.fail(no_route_error());
    return;
  }
  // One opening at a time: later callers share its outcome.
  openers_.push_back(std::move(m.reply));
  if (opening_) return;
  auto held = gate_.enter();
  if (!held) {
    for (auto& o : openers_) o.fail(stopping_error());
    openers_.clear();
    return;
  }
  opening_ = true;
  auto ends = std::make_shared<runtime::gate::holder>(std::move(held));
  auto self = shared_from_this();
  auto on_end = [self, ends](std::exception_ptr e) {
    auto done = std::move(*ends);
    if (!e) return;
    // Not left opening for ever: the openers are told why.
    channel_msg::opened o;
    o.routes = error{errc::failed, "opening the route failed: " + runtime::detail::describe(e)};
    (void)self->tell(std::move(o));
  };
  auto ex = get_executor();
  asio::co_spawn(ex, open_once(self), asio::bind_executor(ex, std::move(on_end)));
}

void sandbox_channel::on(channel_msg::opened& m) {
  opening_ = false;
  auto r = std::move(m.routes);
  if (r && stopping_) {
    (*r)->close();
    r = stopping_error();
  }
  if (r) {
    routes_ = *r;
    {
      std::lock_guard lk(m_);
      sandbox_ = std::make_pair(m.sandbox, m.generation);
    }
    publish();
  }
  auto openers = std::move(openers_);
  openers_.clear();
  for (auto& o : openers) {
    if (r)
      o.send(*r);
    else
      o.fail(r.error());
  }
}

void sandbox_channel::on(channel_msg::current& m) {
  m.reply.send(routes_);
}

// The adapter while it works, the platform after it failed max_failures
// times in a row; an adapter attempt extends the lease by its timeout.
route_choice sandbox_channel::choose(std::shared_ptr<channel_routes> rs) {
  if (rs->fell_back) return {std::move(rs), route_choice::next::platform};
  if (auto t = rs->adapter->timeout()) lease_->extend_to(runtime::now_ms() + t->count());
  return {std::move(rs), route_choice::next::adapter};
}

void sandbox_channel::on(channel_msg::pick& m) {
  auto rs = m.rs ? m.rs : routes_;
  if (!rs) {
    m.reply.fail(no_route_error());
    return;
  }
  m.reply.send(choose(std::move(rs)));
}

void sandbox_channel::on(channel_msg::outcome& m) {
  auto& rs = m.rs;
  if (!m.infrastructure_failure) {
    // An answer (or a success) ends the row.
    if (!rs->fell_back) {
      rs->failures = 0;
      publish();
    }
    m.reply.send(route_choice{std::move(rs), route_choice::next::done});
    return;
  }
  // Calls that were in flight when another one made the channel fall back
  // do not count again (and do not warn twice): they just move over.
  if (!rs->fell_back && ++rs->failures >= max_failures_) {
    rs->fell_back = true;
    warn("route '" + rs->adapter->name() + "' failed " + std::to_string(rs->failures) +
         " times in a row (last: " + m.what + "); falling back to '" + rs->platform->name() +
         "' on the same sandbox");
  }
  publish();
  m.reply.send(choose(std::move(rs)));
}

void sandbox_channel::on(channel_msg::retire& m) {
  if (m.rs && routes_ == m.rs) {
    routes_->close();  // its other requests fail too, and reconnect
    routes_.reset();
    publish();
  }
  m.reply.send();
}

// ---- the channel's coroutines ----------------------------------------------------------

awaitable<void> sandbox_channel::open_once(self_ptr self) {
  auto& opts = self->opts_;
  channel_msg::opened out;
  auto done = [&self, &out](result<std::shared_ptr<channel_routes>> r) {
    out.routes = std::move(r);
    (void)self->tell(std::move(out));
  };
  if (opts.sandbox_dir.empty()) {
    done(error{errc::refused, "no sandbox is configured (job_queue_options.sandbox_dir)"});
    co_return;
  }
  std::string socket = sandbox::socket_path_for(opts.sandbox_dir);
  if (opts.start_daemon) {
    auto h = co_await self->ensure_daemon();
    if (!h) {
      done(h.error());
      co_return;
    }
    socket = h->socket_path;
  }
  if (self->stopping()) {
    done(stopping_error());
    co_return;
  }
  auto c = co_await sandbox::client::connect(socket, wire::conn_mode::read_write, "tether host",
                                             opts.client);
  if (!c) {
    done(c.error());
    co_return;
  }
  if (self->stopping()) {
    done(stopping_error());  // the client closes as it goes
    co_return;
  }
  auto hello = (*c)->hello();
  // A reconnect must reach the sandbox and generation the channel's jobs run
  // on: a daemon serving another sandbox, or a replaced (newer) generation,
  // does not know them, and binding it would make their receipts stale.
  if (auto was = self->sandbox();
      was && (was->first != hello.sandbox || was->second != hello.generation)) {
    done(error{errc::conflict,
               "the sandbox daemon at " + socket + " now answers as sandbox '" +
                   hello.sandbox.str() + "' generation " + std::to_string(hello.generation) +
                   ", not sandbox '" + was->first.str() + "' generation " +
                   std::to_string(was->second) +
                   " that this host's jobs run on; the route was refused, nothing was "
                   "sent to it and the host stays bound to generation " +
                   std::to_string(was->second)});
    co_return;
  }
  if (opts.bind) {
    auto b = co_await opts.bind(hello.sandbox, hello.generation);
    if (!b) {
      done(b.error());
      co_return;
    }
  }
  if (self->stopping()) {
    done(stopping_error());
    co_return;
  }
  auto rs = std::make_shared<channel_routes>();
  rs->platform = std::make_shared<client_route>("platform", std::move(*c));
  if (opts.adapter) {
    // An adapter that cannot attach is a route failure, not a sandbox one:
    // the platform route serves alone.
    auto a = co_await opts.adapter(socket);
    if (a)
      rs->adapter = std::move(*a);
    else
      self->warn("adapter route did not attach (" + a.error().message +
                 "); commands go through the platform route on the same sandbox");
  }
  rs->fell_back = !rs->adapter;
  out.sandbox = hello.sandbox;
  out.generation = hello.generation;
  done(std::move(rs));  // a stop meanwhile closes it in the handler
}

template <class T, class Call>
awaitable<result<T>> sandbox_channel::route(self_ptr self, std::shared_ptr<channel_routes> rs,
                                            Call call) {
  channel_msg::pick p{std::move(rs), {}};
  auto next = co_await self->request(std::move(p));
  if (!next) co_return next.error();
  for (;;) {
    if (next->to == route_choice::next::platform) co_return co_await call(*next->rs->platform);
    auto r = co_await call(*next->rs->adapter);
    channel_msg::outcome o{next->rs,
                           !r && is_infrastructure_failure(r.error()),
                           r ? std::string() : r.error().message,
                           {}};
    auto after = co_await self->request(std::move(o));
    if (!after || after->to == route_choice::next::done) co_return r;
    next = std::move(after);
  }
}

template <class T, class Call>
awaitable<result<T>> sandbox_channel::until_answered(self_ptr self, job_id job, Call call,
                                                     retry_texts texts) {
  channel_msg::current cur;
  auto now = co_await self->request(std::move(cur));
  std::shared_ptr<channel_routes> rs = now ? *now : nullptr;
  for (int attempt = 0;; ++attempt) {
    if (rs) {
      auto r = co_await route<T>(self, rs, call);
      if (r || !is_infrastructure_failure(r.error()) || self->stopping()) co_return r;
      if (worth_warning(attempt))
        self->warn("job " + job.str() + ": " + std::string(texts.failed) + " (" +
                   r.error().message + "); " + std::string(texts.after_failure));
    }
    if (self->opts_.trace) self->opts_.trace(job, texts.stage);
    auto again = co_await reconnect(self, rs, attempt);
    rs.reset();
    if (again) {
      rs = std::move(*again);
      continue;
    }
    if (self->stopping() || !self->opens_ || again.error().code == errc::conflict)
      co_return again.error();
    if (worth_warning(attempt))
      self->warn("job " + job.str() + ": no route to the sandbox (" + again.error().message +
                 "); " + std::string(texts.retried));
  }
}

awaitable<result<std::shared_ptr<channel_routes>>> sandbox_channel::reconnect(
    self_ptr self, std::shared_ptr<channel_routes> failed, int attempt) {
  if (failed) {
    channel_msg::retire r{std::move(failed), {}};
    auto retired = co_await self->request(std::move(r));
    (void)retired;  // stopping: found below
  }
  if (!self->opens_) co_return no_route_error();
  if (!co_await self->pauses_.pause(attempt)) co_return stopping_error();
  channel_msg::open o;
  auto opened = co_await self->request(std::move(o));
  if (!opened) co_return opened.error();
  if (self->stopping()) co_return stopping_error();
  co_return *opened;
}

awaitable<void> sandbox_channel::expire_on(self_ptr self, std::shared_ptr<channel_routes> rs,
                                           job_id job, reply_to<void> reply) {
  auto call = [job](command_route& c) { return c.expire(job); };
  auto r = co_await route<std::vector<job_id>>(self, std::move(rs), std::move(call));
  // Expired already, or never known: nothing is kept for it.
  if (!r && !(r.error().answered && r.error().code == errc::not_found))
    self->warn("job " + job.str() + ": its terminal receipt is written, but the sandbox kept its " +
               "record (" + r.error().message + "); the daemon drops it after its own bound");
  reply.send();
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

}  // namespace tether::actors
