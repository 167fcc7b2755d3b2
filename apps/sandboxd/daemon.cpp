#include "daemon.hpp"

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/experimental/awaitable_operators.hpp>
#include <boost/asio/experimental/channel.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <functional>
#include <iostream>
#include <stdexcept>

#include "tether/protocol/ids.hpp"
#include "tether/runtime/crash_point.hpp"
#include "tether/sandbox/framing.hpp"
#include "tether/sandbox/state_dir.hpp"

namespace tether::sandboxd {

using asio::use_awaitable;
namespace json = boost::json;
constexpr auto tuple_awaitable = asio::as_tuple(asio::use_awaitable);
using wait_type = asio::posix::descriptor_base::wait_type;

std::string describe(std::exception_ptr e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& x) {
    return x.what();
  } catch (...) {
    return "an exception that is not a std::exception";
  }
}

job::~job() {
  if (out_file >= 0) ::close(out_file);
  if (output_fd >= 0) ::close(output_fd);
  if (pidfd >= 0) ::close(pidfd);
}

// ---- one client connection ----------------------------------------------------------

// What one connection may hold, whatever its peer does:
// - at most --max-in-flight requests being answered (a following attach
//   counts until its job ends); while that many are, no more is read, so the
//   peer's writes back up in its own socket;
// - replies are built only while fewer than k_max_queued_bytes wait to be
//   written, so a peer that never reads holds at most that plus one reply
//   (an attach chunk: up to 1 MiB, 1.4 MiB in base64);
// - a partial request line of at most 1 MiB (wire::k_max_line).
constexpr std::size_t k_max_queued_bytes = 1 << 20;

class connection : public std::enable_shared_from_this<connection> {
 public:
  using socket_t = asio::local::stream_protocol::socket;
  using channel_t = asio::experimental::channel<void(boost::system::error_code, std::string)>;

  connection(daemon& d, socket_t s)
      : d_(d), sock_(std::move(s)), out_(sock_.get_executor(), 64), wake_(sock_.get_executor()) {
    wake_.expires_at(asio::steady_timer::time_point::max());
  }

  // Every coroutine of a connection ends through ended(): an exception is
  // logged and the connection closed, so it is never left counted and open.
  void start() {
    auto ex = sock_.get_executor();
    asio::co_spawn(ex, read_loop(shared_from_this()), ended("reading requests"));
    asio::co_spawn(ex, write_loop(shared_from_this()), ended("writing replies"));
  }

  /// Queues a reply once there is room for it; a closed connection drops it.
  awaitable<void> send(std::uint64_t id, wire::reply_body body) {
    co_await wait_room();
    if (broken_) co_return;
    wire::reply r{id, std::move(body)};
    std::string line = sandbox::frame(wire::encode(r)).value();  // JSON holds no raw newline
    queued_bytes_ += line.size();
    boost::system::error_code ok;
    co_await out_.async_send(ok, std::move(line), tuple_awaitable);
  }

  /// Returns once fewer than k_max_queued_bytes wait to be written (or the
  /// connection broke): build a large reply only after this.
  awaitable<void> wait_room() {
    while (!broken_ && queued_bytes_ >= k_max_queued_bytes) co_await wait_wake();
  }

  bool broken() const { return broken_; }

 private:
  // Wakes every waiter of this connection; each re-checks what it waits for.
  void wake() { wake_.cancel(); }
  awaitable<void> wait_wake() {
    auto [ec] = co_await wake_.async_wait(tuple_awaitable);
    (void)ec;
  }

  awaitable<void> read_loop(std::shared_ptr<connection> /*self: keeps us alive*/) {
    // The wire's one framing (tether/sandbox/framing.hpp): a line over the
    // limit is discarded with an error and the connection goes on.
    sandbox::line_splitter lines(wire::k_max_line, "request line");
    boost::system::error_code nb;
    sock_.non_blocking(true, nb);
    for (;;) {
      // Wait for bytes, then read them into the daemon's one read buffer: an
      // idle connection holds no buffer of its own.
      auto [wec] = co_await sock_.async_wait(socket_t::wait_read, tuple_awaitable);
      if (wec) break;
      auto& chunk = d_.read_buffer();
      boost::system::error_code ec;
      std::size_t n = sock_.read_some(asio::buffer(chunk), ec);
      if (ec == asio::error::would_block || ec == asio::error::try_again) continue;
      if (ec) break;
      lines.feed(std::string_view(chunk.data(), n));
      for (;;) {
        auto line = lines.next();
        if (!line) break;  // the rest waits for the next read
        if (!*line) {
          wire::error_rep e{"invalid", line->error().message};
          co_await send(0, std::move(e));
          continue;
        }
        while (!broken_ && in_flight_ >= d_.config().max_in_flight) co_await wait_wake();
        if (broken_) co_return;
        co_await handle_line(std::move(**line));
        if (broken_) co_return;
      }
    }
    close();
  }

  awaitable<void> write_loop(std::shared_ptr<connection> /*self*/) {
    for (;;) {
      auto [ec, line] = co_await out_.async_receive(tuple_awaitable);
      if (ec) break;
      queued_bytes_ -= line.size();
      std::string batch = std::move(line);
      while (batch.size() < (256u << 10) &&
             out_.try_receive([&](boost::system::error_code e, std::string s) {
               if (e) return;
               queued_bytes_ -= s.size();
               batch += s;
             })) {
      }
      wake();
      auto [wec, n] = co_await asio::async_write(sock_, asio::buffer(batch), tuple_awaitable);
      if (wec) break;
    }
    close();
  }

  std::function<void(std::exception_ptr)> ended(std::string what) {
    return [self = shared_from_this(), what = std::move(what)](std::exception_ptr e) {
      if (e)
        self->d_.log("a connection failed " + what + ": " + describe(e) +
                     "; it was closed (its jobs go on)");
      self->close();
    };
  }

  // A request answered by its own coroutine (it may wait for a job).
  void spawn_request(awaitable<void> answer, std::uint64_t id, std::string type) {
    auto self = shared_from_this();
    ++in_flight_;
    auto done = [self, id, type](std::exception_ptr e) {
      --self->in_flight_;
      self->wake();
      if (!e) return;
      self->d_.log("a connection failed answering " + type + " (request id " + std::to_string(id) +
                   "): " + describe(e) + "; it was closed (its jobs go on)");
      self->close();
    };
    asio::co_spawn(sock_.get_executor(), std::move(answer), std::move(done));
  }

  static awaitable<void> throw_now(std::string type) {
    throw std::runtime_error("TETHER_SANDBOXD_THROW_ON=" + type + " (test hook)");
    co_return;
  }

  static std::uint64_t peek_id(std::string_view line) {
    json::parse_options o;
    o.allow_invalid_utf8 = true;
    boost::system::error_code ec;
    auto v = json::parse(line, ec, {}, o);
    if (ec || !v.is_object()) return 0;
    auto* id = v.get_object().if_contains("id");
    if (id && id->is_uint64()) return id->get_uint64();
    if (id && id->is_int64() && id->get_int64() > 0)
      return static_cast<std::uint64_t>(id->get_int64());
    return 0;
  }

  awaitable<void> handle_line(std::string line) {
    auto req = wire::decode_request(line);
    if (!req) {
      wire::error_rep e{"invalid", "bad request: " + req.error().describe()};
      co_await send(peek_id(line), std::move(e));
      co_return;
    }
    std::uint64_t id = req->id;
    auto& body = req->body;
    static constexpr const char* names[] = {"hello", "exec", "attach", "kill", "list", "expire"};
    const std::string type = names[body.index()];
    bool answered_apart = std::holds_alternative<wire::attach_req>(body) ||
                          std::holds_alternative<wire::kill_req>(body) ||
                          std::holds_alternative<wire::list_req>(body);
    if (type == d_.config().throw_on && hello_) {
      if (!answered_apart)
        throw std::runtime_error("TETHER_SANDBOXD_THROW_ON=" + type + " (test hook)");
      spawn_request(throw_now(type), id, type);
      co_return;
    }
    if (auto* h = std::get_if<wire::hello_req>(&body)) {
      if (h->version != wire::k_version) {
        wire::error_rep e{"unsupported_version",
                          "this daemon speaks protocol version " + std::to_string(wire::k_version) +
                              "; the client asked for " + std::to_string(h->version)};
        co_await send(id, std::move(e));
        co_return;
      }
      if (hello_) {
        wire::error_rep e{"refused", "hello was already said on this connection (mode " +
                                         std::string(wire::to_string(mode_)) +
                                         "); the mode is fixed for the connection's life"};
        co_await send(id, std::move(e));
        co_return;
      }
      hello_ = true;
      mode_ = h->mode;
      co_await send(id, d_.hello(mode_));
      co_return;
    }
    if (!hello_) {
      wire::error_rep e{"refused", "send hello first: the connection has not negotiated a version"};
      co_await send(id, std::move(e));
      co_return;
    }
    bool mutates = std::holds_alternative<wire::exec_req>(body) ||
                   std::holds_alternative<wire::kill_req>(body) ||
                   std::holds_alternative<wire::expire_req>(body);
    if (mutates && mode_ == wire::conn_mode::read_only) {
      wire::error_rep e{"refused", type +
                                       " is refused: this connection is read-only (hello mode "
                                       "read_only); nothing was started or changed"};
      co_await send(id, std::move(e));
      co_return;
    }
    if (auto* x = std::get_if<wire::exec_req>(&body)) {
      auto rep = d_.exec(*x);
      co_await send(id, std::move(rep));
    } else if (auto* e = std::get_if<wire::expire_req>(&body)) {
      auto rep = d_.expire(*e);
      co_await send(id, std::move(rep));
    } else if (auto* a = std::get_if<wire::attach_req>(&body)) {
      spawn_request(d_.attach(shared_from_this(), id, std::move(*a)), id, type);
    } else if (auto* k = std::get_if<wire::kill_req>(&body)) {
      spawn_request(d_.kill(shared_from_this(), id, std::move(*k)), id, type);
    } else if (auto* l = std::get_if<wire::list_req>(&body)) {
      spawn_request(d_.list(shared_from_this(), id, std::move(*l)), id, type);
    }
  }

  void close() {
    if (broken_) return;
    broken_ = true;
    boost::system::error_code ec;
    sock_.close(ec);
    out_.cancel();
    out_.close();
    wake();
    d_.connection_closed();
  }

  daemon& d_;
  socket_t sock_;
  channel_t out_;
  asio::steady_timer wake_;  // a condition variable: see wake()
  std::size_t queued_bytes_ = 0;
  std::size_t in_flight_ = 0;  // requests answered by their own coroutine
  bool broken_ = false;
  bool hello_ = false;
  wire::conn_mode mode_ = wire::conn_mode::read_only;
};

// ---- the daemon ------------------------------------------------------------------------

daemon::daemon(asio::io_context& io, daemon_config cfg)
    : io_(io), cfg_(std::move(cfg)), changed_(io), idle_(io) {
  changed_.expires_at(asio::steady_timer::time_point::max());
  last_activity_ = std::chrono::steady_clock::now();
}

daemon::~daemon() = default;

void daemon::log(const std::string& line) const {
  std::cerr << "tether-sandboxd[" << ::getpid() << "] " << line << std::endl;
}

void daemon::notify() {
  last_activity_ = std::chrono::steady_clock::now();
  changed_.cancel();
}

awaitable<void> daemon::wait_changed() {
  auto [ec] = co_await changed_.async_wait(tuple_awaitable);
  (void)ec;
}

void daemon::connection_opened() {
  ++connections_;
  notify();
}

void daemon::connection_closed() {
  --connections_;
  if (refused_over_cap_ > 0 && connections_ < cfg_.max_connections) {
    log("below the connection cap again (" + std::to_string(connections_) + " open); " +
        std::to_string(refused_over_cap_) + " connection(s) were refused while at it");
    refused_over_cap_ = 0;
  }
  notify();
}

// The peer gets one error line (a fresh socket's buffer takes it without
// blocking), then the hang-up. Logged once per stretch at the cap.
void daemon::refuse_over_cap(asio::local::stream_protocol::socket& s) {
  std::string why = "the daemon already serves " + std::to_string(connections_) +
                    " connections, its limit (--max-connections " +
                    std::to_string(cfg_.max_connections) + ")";
  if (refused_over_cap_++ == 0)
    log("refusing connections: " + why + "; logged once until one closes");
  wire::error_rep e{"refused", why +
                                   "; this connection is closed and nothing was done: close "
                                   "an idle connection or raise the limit"};
  std::string line = sandbox::frame(wire::encode(wire::reply{0, std::move(e)})).value();
  [[maybe_unused]] auto n =
      ::send(s.native_handle(), line.data(), line.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
  boost::system::error_code ig;
  s.close(ig);
}

std::shared_ptr<job> daemon::find(const job_id& id) const {
  auto it = jobs_.find(id.str());
  return it == jobs_.end() ? nullptr : it->second;
}

wire::error_rep daemon::not_found(const job_id& id) const {
  return {"not_found", "no job '" + id.str() + "' in sandbox '" + cfg_.id.sandbox_id +
                           "' generation " + std::to_string(cfg_.id.generation) +
                           " (unknown here, or expired: by its host once the host had written "
                           "its terminal receipt, or " +
                           std::to_string(cfg_.grace.count()) + " ms after it ended)"};
}

result<void> daemon::start() {
  if (auto r = recover(); !r) return r;
  pool_ = std::make_unique<slot_pool>(cfg_.state_dir / "spare");
  fs::path sock = cfg_.state_dir / "sock";
  if (sock.string().size() >= sizeof(sockaddr_un::sun_path))
    return error{errc::invalid, "socket path " + sock.string() + " is " +
                                    std::to_string(sock.string().size()) +
                                    " bytes; Unix sockets allow " +
                                    std::to_string(sizeof(sockaddr_un::sun_path) - 1) +
                                    "; choose a shorter --state-dir"};
  ::unlink(sock.c_str());  // we hold the lock: a socket file left here is stale
  // The socket is created 0600: no window in which another user may connect.
  mode_t old_mask = ::umask(077);
  try {
    acceptor_ = std::make_unique<asio::local::stream_protocol::acceptor>(
        io_, asio::local::stream_protocol::endpoint(sock.string()));
  } catch (const std::exception& e) {
    ::umask(old_mask);
    return error{errc::io, "cannot listen on " + sock.string() + ": " + e.what()};
  }
  ::umask(old_mask);
  ::chmod(sock.c_str(), 0600);
  spawn_accept_loop();
  if (cfg_.idle_exit.count() > 0) spawn_idle_loop();
  log("serving sandbox '" + cfg_.id.sandbox_id + "' generation " +
      std::to_string(cfg_.id.generation) + " on " + sock.string());
  return {};
}

void daemon::shutdown(const std::string& why) {
  if (stopping_) return;
  stopping_ = true;
  log("stopping (" + why + "); killing the process groups of running jobs");
  for (auto& [id, j] : jobs_)
    if (j->running() && j->rec.pid > 0) ::kill(-static_cast<pid_t>(j->rec.pid), SIGKILL);
  if (acceptor_) {
    boost::system::error_code ec;
    acceptor_->close(ec);
  }
  io_.stop();
}

// A failed accept loop would leave the daemon deaf while its jobs run: log
// what ended it and start it again.
void daemon::spawn_accept_loop() {
  asio::co_spawn(io_, accept_loop(), [this](std::exception_ptr e) {
    if (!e || stopping_) return;
    log("the accept loop failed: " + describe(e) + "; starting it again");
    asio::post(io_, [this] { spawn_accept_loop(); });
  });
}

bool daemon::hook_throws(const std::string& where) {
  return cfg_.throw_on == where && hooks_fired_.insert(where).second;
}

// A watcher that failed would leave its job running for ever in our books and
// its processes untracked: log what ended it, kill the job's process group and
// end the job with an unknown status that says why.
void daemon::spawn_watch(std::shared_ptr<job> j) {
  asio::co_spawn(io_, watch(j), [this, j](std::exception_ptr e) {
    if (!e || stopping_ || !j->running()) return;
    auto what = describe(e);
    log("job " + j->rec.job + ": watching it failed: " + what +
        "; its process group is killed and the job ends with an unknown status");
    if (j->rec.pid > 0) ::kill(-static_cast<pid_t>(j->rec.pid), SIGKILL);
    if (j->is_child && j->pidfd >= 0) {  // killed: reaped at once
      int fd = std::exchange(j->pidfd, -1);
      reap(fd);
      ::close(fd);
    }
    try {
      finalize(j, std::nullopt,
               "the daemon's watcher of this job failed (" + what + "); its processes were killed");
    } catch (const std::exception& x) {
      log("job " + j->rec.job + ": ending it failed too: " + x.what());
    }
  });
}

// A kill sequence that failed would leave its kill request waiting for a
// confirmation that never comes: log it and run it again once, escalated
// straight to SIGKILL.
void daemon::spawn_kill_sequence(std::shared_ptr<job> j, std::chrono::milliseconds wait,
                                 bool retried) {
  asio::co_spawn(io_, kill_sequence(j, wait), [this, j, retried](std::exception_ptr e) {
    if (!e || stopping_) return;
    log("job " + j->rec.job + ": its kill sequence failed: " + describe(e) +
        (retried ? "; it is not tried again" : "; trying again with SIGKILL"));
    if (!retried) spawn_kill_sequence(j, std::chrono::milliseconds(0), true);
  });
}

// A failed idle loop would keep an idle daemon up for ever: log it and start it again.
void daemon::spawn_idle_loop() {
  asio::co_spawn(io_, idle_loop(), [this](std::exception_ptr e) {
    if (!e || stopping_) return;
    log("the idle-exit loop failed: " + describe(e) + "; starting it again");
    asio::post(io_, [this] { spawn_idle_loop(); });
  });
}

awaitable<void> daemon::accept_loop() {
  for (;;) {
    auto [ec, s] = co_await acceptor_->async_accept(tuple_awaitable);
    if (ec) {
      if (stopping_ || ec == asio::error::operation_aborted) co_return;
      int e = ec.category() == boost::system::system_category() ? ec.value() : 0;
      if (e == EMFILE || e == ENFILE || e == ENOBUFS || e == ENOMEM) {
        co_await out_of_descriptors(ec);
        continue;
      }
      continue;  // that connection's own failure (e.g. ECONNABORTED)
    }
    if (fd_short_since_ && connections_ <= fd_short_connections_ / 2) {
      auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
          std::chrono::steady_clock::now() - *fd_short_since_);
      log("accepting connections again after " + std::to_string(fd_failed_accepts_) +
          " failed attempts over " + std::to_string(ms.count()) + " ms");
      fd_short_since_.reset();
      fd_failed_accepts_ = 0;
    }
    // Only our own uid may drive jobs that run with our rights.
    if (auto peer = sandbox::check_peer_uid(s.native_handle(), "a client"); !peer) {
      log("refused a connection: " + peer.error().message);
      boost::system::error_code ig;
      s.close(ig);
      continue;
    }
    if (connections_ >= cfg_.max_connections) {
      refuse_over_cap(s);
      continue;
    }
    auto c = std::make_shared<connection>(*this, std::move(s));
    connection_opened();
    c->start();
  }
}

// Out of descriptors (or kernel memory), accept fails at once and would fail
// again at once: the pending connection stays in the backlog. Wait until something of ours was
// closed (every connection close and job change notifies), or a second has
// passed (ENFILE is freed by other processes). Logged when it starts and once
// accepting works again with half as many connections open, not per attempt.
awaitable<void> daemon::out_of_descriptors(boost::system::error_code ec) {
  using namespace asio::experimental::awaitable_operators;
  ++fd_failed_accepts_;
  if (!fd_short_since_) {
    fd_short_since_ = std::chrono::steady_clock::now();
    fd_short_connections_ = connections_;
    rlimit rl{};
    ::getrlimit(RLIMIT_NOFILE, &rl);
    log("cannot accept connections: " + ec.message() + " (descriptor limit " +
        std::to_string(rl.rlim_cur) + ", " + std::to_string(connections_) +
        " connections open); new clients wait until a descriptor is freed. Logged once "
        "until accepting works again");
  }
  asio::steady_timer retry(io_, std::chrono::seconds(1));
  auto freed = changed_.async_wait(tuple_awaitable);
  auto later = retry.async_wait(tuple_awaitable);
  co_await (std::move(freed) || std::move(later));
}

awaitable<void> daemon::idle_loop() {
  if (hook_throws("idle")) throw std::runtime_error("TETHER_SANDBOXD_THROW_ON=idle (test hook)");
  for (;;) {
    idle_.expires_after(cfg_.idle_exit);
    co_await idle_.async_wait(tuple_awaitable);
    if (stopping_) co_return;
    bool busy = connections_ > 0 || !jobs_.empty();
    if (!busy && std::chrono::steady_clock::now() - last_activity_ >= cfg_.idle_exit) {
      shutdown("idle for " + std::to_string(cfg_.idle_exit.count()) + " ms");
      co_return;
    }
  }
}

wire::hello_rep daemon::hello(wire::conn_mode mode) const {
  wire::hello_rep h;
  h.sandbox = protocol::sandbox_id(cfg_.id.sandbox_id);
  h.generation = cfg_.id.generation;
  h.mode = mode;
  h.pid = ::getpid();
  return h;
}

wire::reply_body daemon::exec(const wire::exec_req& r) {
  if (r.isolate && cfg_.tools.bwrap.empty())
    return wire::error_rep{"refused",
                           "isolation was requested but bwrap is not installed (Debian package "
                           "bubblewrap); nothing was started"};
  if (r.isolate && !isolation_problem_) {
    // Once per daemon: where the kernel or a container forbids user
    // namespaces, bwrap fails for every job, so a job would "fail" with
    // bwrap's words in its output. Say so up front instead.
    isolation_problem_ = probe_isolation(cfg_.tools);
    log(isolation_problem_->empty() ? "isolation with " + cfg_.tools.bwrap + " works here"
                                    : "isolation is unavailable: " + *isolation_problem_);
  }
  if (r.isolate && !isolation_problem_->empty())
    return wire::error_rep{
        "refused", "isolation was requested but is unavailable here: " + *isolation_problem_ +
                       "; nothing was started (a job never runs unisolated "
                       "in its place)"};
  struct stat st;
  if (::stat(r.cwd.c_str(), &st) != 0)
    return wire::error_rep{"invalid", "cwd '" + r.cwd + "' cannot be used (" +
                                          std::strerror(errno) + "); nothing was started"};
  if (!S_ISDIR(st.st_mode))
    return wire::error_rep{"invalid",
                           "cwd '" + r.cwd + "' is not a directory; nothing was started"};
  job_id id = r.job.empty() ? job_id(protocol::mint("job")) : r.job;
  if (auto existing = find(id)) {
    wire::started_rep s{id, existing->rec.pid, true};
    return s;
  }
  auto j = std::make_shared<job>(io_, cfg_.retain_bytes);
  j->scrub =
      std::make_unique<protocol::scrubber>(protocol::scrub_rules::from_env(r.env, r.secret_names));
  j->stream = std::make_unique<protocol::stream_scrubber>(*j->scrub);
  j->dir = cfg_.state_dir / "jobs" / id.str();
  auto& rec = j->rec;
  rec.job = id.str();
  rec.command = j->scrub->scrub(r.command);
  // Stages are split on the raw command (scrubbing can break its quoting), then scrubbed.
  rec.shape = protocol::last_pipeline(r.command);
  for (auto& st : rec.shape.stages) st = j->scrub->scrub(st);
  rec.cwd = r.cwd;
  rec.isolate = r.isolate;
  rec.state = "starting";
  rec.started_at_ms = now_ms();
  rec.tail_lines = r.tail_lines;
  rec.tail_bytes = r.tail_bytes;
  rec.preview_bytes = r.preview_bytes;
  std::error_code ec;
  auto slot = pool_ ? pool_->take() : std::nullopt;
  if (!slot || ::rename(slot->c_str(), j->dir.c_str()) != 0) ec = make_private_dir(j->dir);
  if (ec)
    return wire::error_rep{
        "io", "cannot create " + j->dir.string() + ": " + ec.message() + "; nothing was started"};
  // The record, and the job directory's entry in jobs/, are durable before
  // anything is spawned: after a power cut the job is known, never lost.
  auto recorded = write_record(j->dir, rec);
  if (recorded) recorded = sync_dir(j->dir.parent_path());
  if (!recorded) {
    fs::remove_all(j->dir, ec);
    return wire::error_rep{"io", recorded.error().message + "; nothing was started"};
  }
  TETHER_CRASH_POINT("sandboxd.job_recorded");
  j->out_file = ::open((j->dir / "output").c_str(),
                       O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_NOFOLLOW | O_CLOEXEC, 0600);
  spawn_request sr{r.command, r.cwd,          r.env, (j->dir / "status").string(),
                   r.isolate, r.allow_network};
  auto sp = spawn_job(cfg_.tools, sr);
  if (!sp.ok) {
    fs::remove_all(j->dir, ec);
    return wire::error_rep{"io", sp.error + "; nothing was started"};
  }
  j->pidfd = sp.ok->pidfd;
  j->output_fd = sp.ok->output_fd;
  j->is_child = true;
  int go_fd = sp.ok->go_fd;
  rec.pid = sp.ok->pid;
  rec.pid_start = sp.ok->start_time;
  rec.state = "running";
  // The shell waits at its go gate: until the `running` record is durable,
  // a crash here leaves a job recorded `starting` and a shell that exits
  // without running the command when the gate's pipe closes with us.
  TETHER_CRASH_POINT("sandboxd.job_spawned_unrecorded");
  if (auto w = write_record(j->dir, rec); !w) {
    ::close(go_fd);  // the shell exits at its gate
    ::kill(-static_cast<pid_t>(rec.pid), SIGKILL);
    reap(j->pidfd);
    fs::remove_all(j->dir, ec);
    return wire::error_rep{"io", w.error().message + "; the command was not run"};
  }
  if (!release(go_fd))
    log("job " + rec.job + ": cannot open its shell's go gate: " + std::strerror(errno) +
        "; the shell exits without running the command, and the job ends with its status");
  TETHER_CRASH_POINT("sandboxd.job_spawned");
  jobs_[id.str()] = j;
  ++revision_;
  notify();
  spawn_watch(j);
  wire::started_rep s{id, rec.pid, false};
  return s;
}

bool daemon::drain(job& j, std::size_t budget, std::string& raw) {
  char buf[65536];
  std::size_t got = 0;
  for (;;) {
    ssize_t n = ::read(j.output_fd, buf, sizeof buf);
    if (n > 0) {
      raw.append(buf, static_cast<std::size_t>(n));
      got += static_cast<std::size_t>(n);
      if (got >= budget) return true;
      continue;
    }
    if (n == 0) return false;
    if (errno == EINTR) continue;
    return errno == EAGAIN || errno == EWOULDBLOCK;
  }
}

awaitable<void> daemon::scrub_output(std::shared_ptr<job> j, std::string raw) {
  if (raw.empty()) co_return;
  // Only this job's watcher touches j->stream, and it waits here meanwhile.
  auto work = [j, raw = std::move(raw)]() -> awaitable<std::string> {
    co_return j->stream->feed(raw);
  };
  std::string scrubbed = co_await asio::co_spawn(scrub_pool_, std::move(work), use_awaitable);
  append_output(*j, scrubbed);
}

void daemon::append_output(job& j, std::string_view s) {
  if (s.empty()) return;
  j.out.append(s);
  if (j.out_file >= 0 && j.out_file_bytes < cfg_.retain_bytes) {
    std::size_t off = 0;
    while (off < s.size()) {
      ssize_t n = ::write(j.out_file, s.data() + off, s.size() - off);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        log("job " + j.rec.job + ": cannot write its output file: " + std::strerror(errno));
        ::close(j.out_file);
        j.out_file = -1;
        break;
      }
      off += static_cast<std::size_t>(n);
    }
    j.out_file_bytes += off;
  }
  notify();
}

awaitable<void> daemon::watch(std::shared_ptr<job> j) {
  using namespace asio::experimental::awaitable_operators;
  if (hook_throws("watch")) throw std::runtime_error("TETHER_SANDBOXD_THROW_ON=watch (test hook)");
  asio::posix::stream_descriptor pid_d(io_, std::exchange(j->pidfd, -1));
  std::optional<asio::posix::stream_descriptor> out_d;
  bool open = j->output_fd >= 0;
  if (open) out_d.emplace(io_, ::fcntl(j->output_fd, F_DUPFD_CLOEXEC, 0));  // j keeps its own fd
  for (;;) {
    if (open) {
      auto a = out_d->async_wait(wait_type::wait_read, use_awaitable);
      auto b = pid_d.async_wait(wait_type::wait_read, use_awaitable);
      auto which = co_await (std::move(a) || std::move(b));
      if (which.index() == 0) {
        std::string raw;
        open = drain(*j, 1 << 20, raw);
        co_await scrub_output(j, std::move(raw));
        continue;
      }
    } else {
      co_await pid_d.async_wait(wait_type::wait_read, use_awaitable);
    }
    break;
  }
  // What the shell wrote before it exited is in the pipe already. Processes it
  // left behind may keep writing; take a bounded amount.
  if (open) {
    std::string raw;
    drain(*j, 4 << 20, raw);
    co_await scrub_output(j, std::move(raw));
  }
  std::optional<std::pair<bool, int>> shell;
  if (j->is_child) shell = reap(pid_d.native_handle());
  finalize(j, shell,
           j->is_child ? "the shell's exit could not be reaped"
                       : "the daemon restarted while this job ran and its exit status was not "
                         "captured");
}

void daemon::finalize(std::shared_ptr<job> jp, std::optional<std::pair<bool, int>> shell,
                      std::string unknown_reason) {
  job& j = *jp;
  if (j.stream) append_output(j, j.stream->finish());
  if (j.output_fd >= 0) {
    ::close(j.output_fd);
    j.output_fd = -1;
  }
  protocol::launch_outcome o;
  if (shell) o.shell = protocol::launch_outcome::shell_end{shell->first, shell->second};
  if (auto st = read_file(j.dir / "status")) o.capture_line = protocol::find_capture_line(*st);
  o.kill_requested = j.rec.kill_requested;
  o.unknown_reason = std::move(unknown_reason);
  protocol::shell_completion c;
  c.job = j.rec.job;
  c.status = protocol::judge(o, j.rec.shape);
  c.preview = protocol::make_preview(j.rec.command, static_cast<std::size_t>(j.rec.preview_bytes));
  auto tail_bytes = static_cast<std::size_t>(j.rec.tail_bytes);
  auto t = protocol::make_tail(j.out.last(tail_bytes + 8), j.out.total(),
                               static_cast<std::size_t>(j.rec.tail_lines), tail_bytes);
  c.tail = std::move(t.text);
  c.tail_omitted_bytes = t.omitted_bytes;
  c.tail_lines = t.lines;
  c.output_bytes = j.out.total();
  c.started_at_ms = j.rec.started_at_ms;
  c.ended_at_ms = now_ms();

  if (j.out_file >= 0) {
    ::close(j.out_file);
    j.out_file = -1;
  }
  if (j.out_file_bytes != j.out.total()) {
    std::string snap(j.out.head());
    snap.append(j.out.tail());
    if (auto w = write_file_atomic(j.dir / "output", snap); !w) log(w.error().message);
    j.rec.head_len = j.out.head().size();
  } else {
    j.rec.head_len = j.out.total();
  }
  j.rec.output_total = j.out.total();
  j.rec.output_final = true;
  j.rec.state = std::string(protocol::to_string(c.status.state));
  j.rec.done = std::move(c);
  if (auto w = write_record(j.dir, j.rec); !w) log("job " + j.rec.job + ": " + w.error().message);
  TETHER_CRASH_POINT("sandboxd.job_finished");
  ++revision_;
  notify();
  arm_grace(jp, cfg_.grace);
}

void daemon::arm_grace(std::shared_ptr<job> j, std::chrono::milliseconds after) {
  j->grace.expires_after(after);
  std::weak_ptr<job> weak = j;
  j->grace.async_wait([this, weak](boost::system::error_code ec) {
    if (ec) return;
    auto jj = weak.lock();
    if (!jj || jj->expired) return;
    log("job " + jj->rec.job + ": no host expired it within --grace-ms " +
        std::to_string(cfg_.grace.count()) + " after it ended; its record was removed");
    erase(jj->rec.job);
  });
}

void daemon::erase(const std::string& id) {
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return;
  auto j = it->second;
  j->expired = true;
  j->grace.cancel();
  std::error_code ec;
  fs::remove_all(j->dir, ec);
  if (ec) log("job " + id + ": cannot remove " + j->dir.string() + ": " + ec.message());
  jobs_.erase(it);
  ++revision_;
  notify();
}

wire::reply_body daemon::expire(const wire::expire_req& r) {
  wire::expired_rep rep;
  if (r.job) {
    auto j = find(*r.job);
    if (!j) return not_found(*r.job);
    if (j->running())
      return wire::error_rep{
          "refused", "job '" + r.job->str() + "' is still running; only completed jobs expire"};
    erase(r.job->str());
    rep.jobs.push_back(*r.job);
    return rep;
  }
  std::vector<std::string> done;
  for (auto& [id, j] : jobs_)
    if (!j->running()) done.push_back(id);
  for (auto& id : done) {
    erase(id);
    rep.jobs.emplace_back(id);
  }
  return rep;
}

awaitable<void> daemon::attach(std::shared_ptr<connection> c, std::uint64_t id,
                               wire::attach_req r) {
  auto j = find(r.job);
  if (!j) {
    co_await c->send(id, not_found(r.job));
    co_return;
  }
  std::uint64_t offset = r.offset;
  for (;;) {
    co_await c->wait_room();  // read the output only once it can be queued
    if (c->broken()) co_return;
    auto s = j->out.read(offset, static_cast<std::size_t>(r.max_bytes));
    if (!s.data.empty() || s.skipped) {
      offset = s.offset + s.data.size();
      wire::output_rep o{r.job, s.offset, std::move(s.data), s.skipped};
      co_await c->send(id, std::move(o));
      continue;
    }
    if (!j->running() || !r.follow) {
      wire::status_rep st{r.job, j->out.total(), j->rec.done};
      co_await c->send(id, std::move(st));
      co_return;
    }
    co_await wait_changed();
  }
}

awaitable<void> daemon::kill(std::shared_ptr<connection> c, std::uint64_t id, wire::kill_req r) {
  auto j = find(r.job);
  if (!j) {
    co_await c->send(id, not_found(r.job));
    co_return;
  }
  if (!j->kill_started && !j->running()) {
    wire::killed_rep k{*j->rec.done};  // it had ended on its own
    co_await c->send(id, std::move(k));
    co_return;
  }
  if (!j->kill_started) {
    j->kill_started = true;
    j->rec.kill_requested = true;
    if (auto w = write_record(j->dir, j->rec); !w)
      log("job " + j->rec.job + ": " + w.error().message);
    auto wait = r.wait_ms ? std::chrono::milliseconds(*r.wait_ms) : cfg_.kill_wait;
    spawn_kill_sequence(j, wait, false);
  }
  while (!j->stop_confirmed) {
    if (c->broken()) co_return;
    co_await wait_changed();
  }
  wire::killed_rep k{*j->rec.done};
  co_await c->send(id, std::move(k));
}

awaitable<void> daemon::kill_sequence(std::shared_ptr<job> j, std::chrono::milliseconds wait) {
  using namespace asio::experimental::awaitable_operators;
  if (hook_throws("kill_sequence"))
    throw std::runtime_error("TETHER_SANDBOXD_THROW_ON=kill_sequence (test hook)");
  auto pgid = static_cast<pid_t>(j->rec.pid);
  bool escalated = wait.count() == 0;
  ::kill(-pgid, escalated ? SIGKILL : SIGTERM);
  asio::steady_timer deadline(io_, wait);
  for (;;) {
    auto members = group_members(pgid);
    if (members.empty()) {
      if (!j->running()) break;
      co_await wait_changed();  // the shell exited; its watcher is finalizing
      continue;
    }
    int fd = open_pidfd(members.front());
    if (fd < 0) continue;  // gone between the scan and here
    asio::posix::stream_descriptor d(io_, fd);
    if (escalated) {
      co_await d.async_wait(wait_type::wait_read, use_awaitable);
      continue;
    }
    auto a = d.async_wait(wait_type::wait_read, use_awaitable);
    auto b = deadline.async_wait(use_awaitable);
    auto which = co_await (std::move(a) || std::move(b));
    if (which.index() == 1) {
      log("job " + j->rec.job + ": process group " + std::to_string(pgid) +
          " outlived SIGTERM by " + std::to_string(wait.count()) + " ms; sending SIGKILL");
      ::kill(-pgid, SIGKILL);
      escalated = true;
    }
  }
  j->stop_confirmed = true;
  notify();
}

awaitable<void> daemon::list(std::shared_ptr<connection> c, std::uint64_t id, wire::list_req r) {
  if (r.after_revision)
    while (revision_ <= *r.after_revision) {
      if (c->broken()) co_return;
      co_await wait_changed();
    }
  wire::jobs_rep rep;
  rep.revision = revision_;
  for (auto& [jid, j] : jobs_) {
    wire::job_summary s;
    s.job = job_id(jid);
    s.state = j->rec.done ? j->rec.done->status.state : protocol::job_state::running;
    s.preview = protocol::make_preview(j->rec.command, 200).text;
    s.pid = j->rec.pid;
    s.exit_code = j->rec.done ? j->rec.done->status.exit_code : -1;
    s.output_bytes = j->out.total();
    rep.jobs.push_back(std::move(s));
  }
  co_await c->send(id, std::move(rep));
}

result<void> daemon::recover() {
  fs::path root = cfg_.state_dir / "jobs";
  std::error_code ec;
  ec = make_private_dir(root);
  if (ec) return error{errc::io, "cannot create " + root.string() + ": " + ec.message()};
  for (auto& entry : fs::directory_iterator(root, ec)) {
    if (!entry.is_directory()) continue;
    const auto name = entry.path().filename().string();
    // A temp is never a record: the rename is the commit. One holding bytes
    // is a write a crash cut short (or finished but did not rename).
    std::vector<std::string> torn;
    for (auto& t : leftover_temps(entry.path())) {
      std::error_code rec_ec;
      auto size = fs::file_size(t, rec_ec);
      fs::remove(t, rec_ec);
      torn.push_back(t.filename().string() + " (" + std::to_string(rec_ec ? 0 : size) + " bytes)");
    }
    auto rec = read_record(entry.path());
    auto said = [&](const std::string& kept) {
      if (torn.empty()) return;
      std::string list;
      for (auto& t : torn) list += (list.empty() ? "" : ", ") + t;
      log("job " + name + ": removed " + list +
          ", a record write the daemon did not finish before it stopped; " + kept);
    };
    if (!rec && rec.error().code == errc::not_found) {
      // Created, but the record never landed: nothing was started for it.
      said(
          "no record of the job had been written, so nothing was started for it and its "
          "directory was removed");
      fs::remove_all(entry.path(), ec);
      continue;
    }
    if (rec) said("the previous record (state " + rec->state + ") was kept");
    if (!rec)
      return error{rec.error().code,
                   "refusing to start: " + rec.error().message + "; nothing was changed"};
    auto j = std::make_shared<job>(io_, cfg_.retain_bytes);
    j->rec = std::move(*rec);
    j->dir = entry.path();
    if (auto out = read_file(j->dir / "output"); out) {
      if (j->rec.output_final && j->rec.head_len <= out->size()) {
        std::string_view all(*out);
        j->out = protocol::head_tail::restore(all.substr(0, j->rec.head_len),
                                              all.substr(j->rec.head_len), j->rec.output_total,
                                              cfg_.retain_bytes / 2, cfg_.retain_bytes / 2);
      } else {
        j->out.append(*out);
      }
      j->out_file_bytes = j->out.total();
    }
    const std::string id = j->rec.job;
    jobs_[id] = j;
    if (j->rec.done) {
      // Kept for its host, which expires it once its receipt is durable; a
      // record past the far bound was never expired by anyone and goes now.
      auto ago = now_ms() - j->rec.done->ended_at_ms;
      if (ago >= cfg_.grace.count()) {
        log("job " + id + " ended " + std::to_string(ago / 1000) +
            " s ago and no host expired it " + "within --grace-ms " +
            std::to_string(cfg_.grace.count()) + "; its record was removed");
        erase(id);
        continue;
      }
      arm_grace(j, std::chrono::milliseconds(cfg_.grace.count() - ago));
      continue;
    }
    if (j->rec.state == "starting") {
      finalize(j, std::nullopt, "the daemon stopped while launching this job; it may not have run");
      continue;
    }
    auto pid = static_cast<pid_t>(j->rec.pid);
    if (pid > 0 && process_start_time(pid) == j->rec.pid_start) {
      int fd = open_pidfd(pid);
      if (fd >= 0) {
        j->pidfd = fd;
        j->is_child = false;
        log("job " + id + " (pid " + std::to_string(pid) + ") is still running; watching it again");
        spawn_watch(j);
        continue;
      }
    }
    finalize(j, std::nullopt,
             "the daemon restarted after this job ended and its exit status was not captured");
  }
  if (ec) return error{errc::io, "cannot list " + root.string() + ": " + ec.message()};
  return {};
}

}  // namespace tether::sandboxd
