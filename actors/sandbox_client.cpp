#include "tether/actors/sandbox_client.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/experimental/channel.hpp>
#include <boost/asio/local/stream_protocol.hpp>
#include <boost/asio/read_until.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <deque>
#include <filesystem>

#include "tether/protocol/scrub.hpp"

extern char** environ;

namespace tether::actors {

namespace asio = boost::asio;
namespace fs = std::filesystem;
constexpr auto tuple_awaitable = asio::as_tuple(asio::use_awaitable);

// ---- starting a daemon ---------------------------------------------------------------

std::string socket_path_for(const std::string& state_dir) {
  return (fs::path(state_dir) / "sock").string();
}

result<std::string> default_state_dir() {
  if (const char* d = std::getenv("TETHER_SANDBOX_DIR"); d && *d) return std::string(d);
  if (const char* h = std::getenv("HOME"); h && *h)
    return (fs::path(h) / ".tether" / "sandbox").string();
  if (const char* r = std::getenv("XDG_RUNTIME_DIR"); r && *r)
    return (fs::path(r) / "tether-sandbox").string();
  // A guessable directory under /tmp could be planted by another local user.
  return error{errc::invalid,
               "no sandbox state directory: set TETHER_SANDBOX_DIR (or HOME, or "
               "XDG_RUNTIME_DIR) to a directory only you can write; nothing was started"};
}

result<void> secure_state_dir(const std::string& dir) {
  if (dir.empty()) return error{errc::invalid, "no sandbox state directory given"};
  fs::path p(dir);
  std::error_code ec;
  if (p.has_parent_path() && !fs::exists(p.parent_path(), ec))
    fs::create_directories(p.parent_path(), ec);
  if (ec) return error{errc::io, "cannot create " + p.parent_path().string() + ": " + ec.message()};
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST)
    return error{errc::io, "cannot create sandbox state directory " + dir + ": " +
                               std::strerror(errno) + "; nothing was started"};
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0)
    return error{errc::refused, "refusing sandbox state directory " + dir + ": " +
                                    (errno == ELOOP || errno == ENOTDIR
                                         ? std::string("it is a symbolic link or not a directory")
                                         : std::string(std::strerror(errno))) +
                                    "; nothing was started"};
  struct stat st {};
  int rc = ::fstat(fd, &st);
  auto done = [&](result<void> r) {
    ::close(fd);
    return r;
  };
  if (rc != 0) return done(error{errc::io, "cannot stat " + dir + ": " + std::strerror(errno)});
  if (st.st_uid != ::geteuid())
    return done(error{errc::refused,
                      "refusing sandbox state directory " + dir + ": it is owned by uid " +
                          std::to_string(st.st_uid) + ", not by uid " +
                          std::to_string(::geteuid()) +
                          " (this process); another user could serve a fake daemon or plant "
                          "links there. Remove it or set TETHER_SANDBOX_DIR to a directory you "
                          "own; nothing was started"});
  if (st.st_mode & (S_IWGRP | S_IWOTH)) {
    char mode[8];
    std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(st.st_mode & 07777));
    return done(error{errc::refused, "refusing sandbox state directory " + dir + ": its mode " +
                                         mode +
                                         " lets group or others write it; chmod 700 it or set "
                                         "TETHER_SANDBOX_DIR elsewhere; nothing was started"});
  }
  if ((st.st_mode & 077) != 0 && ::fchmod(fd, 0700) != 0)
    return done(error{errc::io, "cannot chmod 700 " + dir + ": " + std::strerror(errno)});
  return done({});
}

result<void> check_peer_uid(int fd, const std::string& who) {
  ucred cred{};
  socklen_t len = sizeof cred;
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0)
    return error{errc::io, "cannot read the credentials of " + who + ": " + std::strerror(errno)};
  if (cred.uid != ::geteuid())
    return error{errc::refused, who + " runs as uid " + std::to_string(cred.uid) + " (pid " +
                                    std::to_string(cred.pid) + "), not as uid " +
                                    std::to_string(::geteuid()) +
                                    "; refusing it, nothing was sent"};
  return {};
}

std::string self_dir() {
  std::error_code ec;
  auto p = fs::read_symlink("/proc/self/exe", ec);
  return ec ? std::string(".") : p.parent_path().string();
}

std::vector<std::pair<std::string, std::string>> current_environment() {
  std::vector<std::pair<std::string, std::string>> env;
  for (char** e = environ; e && *e; ++e) {
    std::string s = *e;
    auto eq = s.find('=');
    if (eq == std::string::npos || eq == 0) continue;
    env.emplace_back(s.substr(0, eq), s.substr(eq + 1));
  }
  return env;
}

namespace {

// True when a daemon answers at `path`; an error when what answers is not ours.
result<bool> socket_answers(const std::string& path) {
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  if (path.size() >= sizeof a.sun_path) {
    ::close(fd);
    return false;
  }
  std::memcpy(a.sun_path, path.c_str(), path.size() + 1);
  bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  result<bool> r = ok;
  if (ok)
    if (auto peer = check_peer_uid(fd, "the sandbox daemon at " + path); !peer) r = peer.error();
  ::close(fd);
  return r;
}

std::string last_lines(const std::string& file, std::size_t max = 600) {
  int fd = ::open(file.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return "";
  std::string s;
  char buf[4096];
  ssize_t n;
  while ((n = ::read(fd, buf, sizeof buf)) > 0) s.append(buf, static_cast<std::size_t>(n));
  ::close(fd);
  while (!s.empty() && s.back() == '\n') s.pop_back();
  if (s.size() > max) s = s.substr(s.size() - max);
  return s;
}

pid_t lock_holder(const std::string& state_dir) {
  auto s = last_lines((fs::path(state_dir) / "lock").string(), 32);
  return static_cast<pid_t>(std::atol(s.c_str()));
}

}  // namespace

result<daemon_handle> ensure_daemon(const daemon_options& o) {
  if (o.state_dir.empty()) return error{errc::invalid, "ensure_daemon: no state dir given"};
  daemon_handle h;
  h.socket_path = socket_path_for(o.state_dir);
  if (h.socket_path.size() >= sizeof(sockaddr_un::sun_path))
    return error{errc::invalid, "socket path " + h.socket_path + " is longer than " +
                                    std::to_string(sizeof(sockaddr_un::sun_path) - 1) +
                                    " bytes; choose a shorter sandbox state dir"};
  if (auto dir = secure_state_dir(o.state_dir); !dir) return dir.error();
  if (!o.replace) {
    auto answers = socket_answers(h.socket_path);
    if (!answers) return answers.error();
    if (*answers) {
      h.pid = lock_holder(o.state_dir);
      return h;
    }
  }
  std::string bin =
      o.binary.empty() ? (fs::path(self_dir()) / "tether-sandboxd").string() : o.binary;
  if (::access(bin.c_str(), X_OK) != 0)
    return error{errc::not_found, "tether-sandboxd not found at " + bin + " (" +
                                      std::strerror(errno) + "); nothing was started"};
  std::string log =
      o.log_file.empty() ? (fs::path(o.state_dir) / "daemon.log").string() : o.log_file;

  std::vector<std::string> args = {bin, "--state-dir", o.state_dir, "--ready-fd", "3"};
  if (!o.sandbox_id.empty()) args.insert(args.end(), {"--sandbox-id", o.sandbox_id});
  if (o.replace) args.push_back("--replace");
  auto ms = [&](const char* flag, std::optional<std::chrono::milliseconds> v) {
    if (v) args.insert(args.end(), {flag, std::to_string(v->count())});
  };
  ms("--grace-ms", o.grace);
  ms("--kill-wait-ms", o.kill_wait);
  ms("--idle-exit-ms", o.idle_exit);
  if (o.retain_bytes) args.insert(args.end(), {"--retain-bytes", std::to_string(*o.retain_bytes)});
  auto count = [&](const char* flag, std::optional<std::size_t> v) {
    if (v) args.insert(args.end(), {flag, std::to_string(*v)});
  };
  count("--max-connections", o.max_connections);
  count("--max-in-flight", o.max_in_flight);
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);

  int p[2];
  if (::pipe2(p, O_CLOEXEC) != 0)
    return error{errc::io, std::string("pipe: ") + std::strerror(errno)};
  int logfd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_NOFOLLOW | O_CLOEXEC, 0600);
  int nullfd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (logfd < 0 || nullfd < 0) {
    int e = errno;
    for (int fd : {p[0], p[1], logfd, nullfd})
      if (fd >= 0) ::close(fd);
    return error{errc::io, "cannot open " + log + ": " + std::strerror(e)};
  }
  pid_t pid = ::fork();
  if (pid < 0) {
    int e = errno;
    for (int fd : {p[0], p[1], logfd, nullfd}) ::close(fd);
    return error{errc::io, std::string("fork: ") + std::strerror(e)};
  }
  if (pid == 0) {
    // Only async-signal-safe calls from here to exec.
    if (o.detach) {
      ::setsid();
      if (::fork() != 0) ::_exit(0);
    }
    ::dup2(nullfd, 0);
    ::dup2(logfd, 1);
    ::dup2(logfd, 2);
    ::dup2(p[1], 3);           // dup2 clears close-on-exec on the copy
    ::close_range(4, ~0U, 0);  // nothing else of ours (sockets, pipes) goes along
    ::execv(argv[0], argv.data());
    static const char msg[] = "error exec of tether-sandboxd failed\n";
    [[maybe_unused]] auto n = ::write(3, msg, sizeof msg - 1);
    ::_exit(127);
  }
  ::close(p[1]);
  ::close(logfd);
  ::close(nullfd);
  if (o.detach) ::waitpid(pid, nullptr, 0);  // the intermediate child exits at once
  std::string line;
  char buf[512];
  for (;;) {
    ssize_t n = ::read(p[0], buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    line.append(buf, static_cast<std::size_t>(n));
  }
  ::close(p[0]);
  while (!line.empty() && line.back() == '\n') line.pop_back();
  if (line.rfind("ready ", 0) == 0) {
    h.started = true;
    h.child = !o.detach;
    h.pid = static_cast<pid_t>(std::atol(line.substr(line.rfind(' ') + 1).c_str()));
    return h;
  }
  if (!o.detach) ::waitpid(pid, nullptr, 0);
  if (line == "busy") {
    if (o.replace)
      return error{errc::refused,
                   "cannot replace sandbox at " + o.state_dir +
                       ": a daemon is serving it; stop it first. Nothing was changed"};
    h.pid = lock_holder(o.state_dir);
    return h;  // lost a start race: another daemon serves the directory
  }
  if (line.rfind("error ", 0) == 0)
    return error{errc::refused, "tether-sandboxd: " + line.substr(6)};
  return error{errc::io, "tether-sandboxd exited before it was ready; " + log +
                             " ends with: " + last_lines(log)};
}

result<void> stop_daemon(const daemon_handle& h) {
  if (h.pid <= 0) return error{errc::invalid, "stop_daemon: no daemon pid"};
  if (h.child) {
    ::kill(h.pid, SIGTERM);
    int st = 0;
    while (::waitpid(h.pid, &st, 0) < 0 && errno == EINTR) {
    }
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
      return error{errc::failed,
                   "tether-sandboxd (pid " + std::to_string(h.pid) + ") " +
                       (WIFEXITED(st) ? "exited with status " + std::to_string(WEXITSTATUS(st))
                                      : "was killed by signal " + std::to_string(WTERMSIG(st))) +
                       " when asked to stop"};
    return {};
  }
  int fd = static_cast<int>(::syscall(SYS_pidfd_open, h.pid, 0));
  if (fd < 0) return {};  // already gone
  ::kill(h.pid, SIGTERM);
  pollfd pfd{fd, POLLIN, 0};
  while (::poll(&pfd, 1, -1) < 0 && errno == EINTR) {
  }
  ::close(fd);
  return {};
}

// ---- the connection -----------------------------------------------------------------------

using reply_channel =
    asio::experimental::channel<void(boost::system::error_code, wire::reply_body)>;

struct sandbox_client::state {
  using clock = std::chrono::steady_clock;
  state(asio::any_io_executor ex, client_options o, std::string path)
      : sock(ex), watchdog(ex), opts(std::move(o)), socket_path(std::move(path)) {}
  asio::local::stream_protocol::socket sock;
  std::map<std::uint64_t, std::shared_ptr<reply_channel>> pending;
  std::uint64_t next_id = 1;
  std::deque<std::string> queue;
  bool writing = false;
  bool closed = false;
  std::string lost;  // why the connection ended
  // The watchdog (see client_options): silence is measured from the last line
  // read, or from the moment a request found the connection idle.
  asio::steady_timer watchdog;
  client_options opts;
  std::string socket_path;
  clock::time_point heard = clock::now();
  bool ready = false;          // hello answered: probes may be sent
  std::uint64_t probe_id = 0;  // the heartbeat probe in flight, if any
  bool timed_out = false;      // the watchdog closed the connection
};

client_options client_options::from_env() {
  client_options o;
  if (const char* v = std::getenv("TETHER_SANDBOX_DEADLINE_MS"); v && *v) {
    long long ms = std::atoll(v);
    if (ms > 0) {
      o.deadline = std::chrono::milliseconds(ms);
      o.heartbeat = std::chrono::milliseconds(std::max(1LL, ms / 4));
    }
  }
  return o;
}

namespace {

using state_ptr = std::shared_ptr<sandbox_client::state>;

error from_reply(const wire::error_rep& e) {
  errc c = errc::failed;
  if (e.code == "invalid") c = errc::invalid;
  if (e.code == "not_found") c = errc::not_found;
  if (e.code == "refused" || e.code == "unsupported_version") c = errc::refused;
  if (e.code == "io") c = errc::io;
  return error{c, "sandbox daemon: " + e.message, true};
}

error lost(const sandbox_client::state& s) {
  if (s.timed_out) return error{errc::timeout, s.lost};
  return error{errc::closed, "the connection to the sandbox daemon is closed" +
                                 (s.lost.empty() ? std::string() : " (" + s.lost + ")")};
}

awaitable<void> write_all(state_ptr s) {
  while (!s->queue.empty() && !s->closed) {
    std::string batch;
    while (!s->queue.empty() && batch.size() < (256u << 10)) {
      batch += s->queue.front();
      s->queue.pop_front();
    }
    auto [ec, n] = co_await asio::async_write(s->sock, asio::buffer(batch), tuple_awaitable);
    if (ec) {
      // Only our sending side ends: the reader still reads what the daemon
      // said before it hung up (e.g. why it refused this connection), then
      // reports the end. Closing here raced it ("Operation canceled").
      boost::system::error_code ig;
      s->sock.shutdown(asio::socket_base::shutdown_send, ig);
      break;
    }
  }
  s->writing = false;
}

void send_line(const state_ptr& s, std::string line) {
  s->queue.push_back(std::move(line));
  if (!s->writing) {
    s->writing = true;
    asio::co_spawn(s->sock.get_executor(), write_all(s), asio::detached);
  }
}

// The heartbeat probe: an attach of a job id no caller uses. Any daemon that
// reads its socket answers it at once (`not_found`, or that job's status),
// without starting or changing anything; read-only connections may send it.
void send_probe(const state_ptr& s) {
  wire::attach_req a;
  a.job = job_id("tether-heartbeat");
  a.follow = false;
  s->probe_id = s->next_id++;
  wire::request r{s->probe_id, std::move(a)};
  send_line(s, wire::encode(r) + "\n");
}

std::string millis(std::chrono::milliseconds d) {
  return std::to_string(d.count()) + " ms";
}

// While a request waits, the daemon must be heard from within the deadline;
// it is probed after a heartbeat of silence. Ends when the connection closes.
awaitable<void> watch_silence(state_ptr s) {
  using clock = sandbox_client::state::clock;
  for (;;) {
    if (s->closed) break;
    if (s->pending.empty()) {
      s->watchdog.expires_at(clock::time_point::max());
    } else {
      auto now = clock::now();
      auto silent = now - s->heard;
      if (silent >= s->opts.deadline) {
        s->timed_out = true;
        s->lost = "the sandbox daemon at " + s->socket_path + " did not answer for " +
                  millis(s->opts.deadline) + (s->ready ? " while a request waited" : " (hello)") +
                  "; it may be stopped or wedged. The connection was closed; the daemon keeps "
                  "its jobs, and a retry once it answers finds them by id";
        boost::system::error_code ig;
        s->sock.close(ig);  // the reader fails every waiting request
        break;
      }
      if (s->ready && s->probe_id == 0 && silent >= s->opts.heartbeat) send_probe(s);
      auto next = s->probe_id != 0 || s->opts.heartbeat >= s->opts.deadline
                      ? s->heard + s->opts.deadline
                      : s->heard + s->opts.heartbeat;
      s->watchdog.expires_at(next);
    }
    co_await s->watchdog.async_wait(tuple_awaitable);  // cancelled: recheck at once
  }
}

awaitable<void> read_all(state_ptr s) {
  std::string buf;
  for (;;) {
    auto [ec, n] =
        co_await asio::async_read_until(s->sock, asio::dynamic_buffer(buf), '\n', tuple_awaitable);
    if (ec) {
      // A reason the daemon gave before hanging up stays the reason.
      if (s->lost.empty()) s->lost = ec == asio::error::eof ? "the daemon closed it" : ec.message();
      break;
    }
    s->heard = sandbox_client::state::clock::now();
    std::string line = buf.substr(0, n - 1);
    buf.erase(0, n);
    auto r = wire::decode_reply(line);
    if (!r) {
      s->lost = "the daemon sent an undecodable reply: " + r.error().describe();
      break;
    }
    if (s->probe_id != 0 && r->id == s->probe_id) {
      s->probe_id = 0;  // heard: the daemon reads its socket
      if (s->opts.on_heartbeat) s->opts.on_heartbeat();
      continue;
    }
    auto it = s->pending.find(r->id);
    if (it == s->pending.end()) {
      // An error for no request (id 0) says why the daemon is about to hang up,
      // e.g. its connection cap: keep it for the error the caller sees.
      if (auto* e = std::get_if<wire::error_rep>(&r->body); e && r->id == 0 && e->code == "refused")
        s->lost = "the daemon closed it: " + e->message;
      continue;  // else an abandoned request
    }
    auto ch = it->second;
    boost::system::error_code ok;
    co_await ch->async_send(ok, std::move(r->body), tuple_awaitable);
  }
  s->closed = true;
  boost::system::error_code ig;
  s->sock.close(ig);
  s->watchdog.cancel();
  for (auto& [id, ch] : s->pending) {
    wire::error_rep e{"closed", "the connection to the sandbox daemon is closed (" + s->lost + ")"};
    if (!ch->try_send(boost::system::error_code{}, wire::reply_body(std::move(e)))) ch->close();
  }
}

// A request in flight: its replies arrive on `ch`; forgets itself when done.
class call {
 public:
  call(state_ptr s, wire::request_body body) : s_(std::move(s)) {
    if (s_->closed) return;
    id_ = s_->next_id++;
    ch_ = std::make_shared<reply_channel>(s_->sock.get_executor(), 64);
    if (s_->pending.empty()) {
      // The daemon owed nothing until now: its silence counts from here.
      s_->heard = sandbox_client::state::clock::now();
      s_->watchdog.cancel();
    }
    s_->pending[id_] = ch_;
    wire::request r{id_, std::move(body)};
    send_line(s_, wire::encode(r) + "\n");
  }
  ~call() {
    if (ch_) {
      s_->pending.erase(id_);
      ch_->cancel();  // a reader blocked sending to us must not wait forever
      ch_->close();
    }
  }
  call(const call&) = delete;

  /// The next reply; a daemon `error` reply becomes an error value.
  awaitable<result<wire::reply_body>> next() {
    if (!ch_) co_return lost(*s_);
    auto [ec, body] = co_await ch_->async_receive(tuple_awaitable);
    if (ec) co_return lost(*s_);
    if (auto* e = std::get_if<wire::error_rep>(&body)) {
      if (e->code == "closed") co_return lost(*s_);
      co_return from_reply(*e);
    }
    co_return body;
  }

 private:
  state_ptr s_;
  std::uint64_t id_ = 0;
  std::shared_ptr<reply_channel> ch_;
};

template <class T>
result<T> expect(result<wire::reply_body> r, const char* what) {
  if (!r) return r.error();
  if (auto* v = std::get_if<T>(&*r)) return std::move(*v);
  return error{errc::invalid,
               std::string("sandbox daemon answered ") + what + " with an unexpected reply type"};
}

}  // namespace

awaitable<result<std::unique_ptr<sandbox_client>>> sandbox_client::connect(std::string socket_path,
                                                                           wire::conn_mode mode,
                                                                           std::string client_name,
                                                                           client_options opts) {
  auto ex = co_await asio::this_coro::executor;
  auto s = std::make_shared<state>(ex, opts, socket_path);
  asio::local::stream_protocol::endpoint ep(socket_path);
  auto [ec] = co_await s->sock.async_connect(ep, tuple_awaitable);
  if (ec)
    co_return error{ec == asio::error::connection_refused || ec == asio::error::not_found ||
                            ec.value() == ENOENT
                        ? errc::not_found
                        : errc::io,
                    "no sandbox daemon answers at " + socket_path + " (" + ec.message() +
                        "); connecting never starts one"};
  // A daemon run by another user would receive our whole environment.
  if (auto peer = check_peer_uid(s->sock.native_handle(), "the sandbox daemon at " + socket_path);
      !peer)
    co_return peer.error();
  asio::co_spawn(ex, read_all(s), asio::detached);
  asio::co_spawn(ex, watch_silence(s), asio::detached);
  std::unique_ptr<sandbox_client> c(new sandbox_client(s));
  wire::hello_req h;
  h.mode = mode;
  h.client = std::move(client_name);
  call q(s, std::move(h));
  auto rep = expect<wire::hello_rep>(co_await q.next(), "hello");
  if (!rep) {
    if (rep.error().code == errc::timeout)
      co_return error{errc::timeout, "the sandbox daemon at " + socket_path +
                                         " accepted the connection but did not answer hello "
                                         "within " +
                                         millis(opts.deadline) +
                                         "; it may be stopped or wedged. Nothing was sent to "
                                         "it; retry once it answers"};
    co_return rep.error();
  }
  s->ready = true;
  if (rep->version != wire::k_version)
    co_return error{errc::refused, "the sandbox daemon speaks protocol version " +
                                       std::to_string(rep->version) + "; this client speaks " +
                                       std::to_string(wire::k_version)};
  c->hello_ = std::move(*rep);
  co_return c;
}

sandbox_client::~sandbox_client() {
  close();
}

void sandbox_client::close() {
  if (!s_) return;
  boost::system::error_code ig;
  s_->sock.close(ig);
  s_->watchdog.cancel();  // the reader ends the watchdog with the connection
}

awaitable<result<wire::started_rep>> sandbox_client::exec(wire::exec_req r) {
  // Remember a scrubbed preview for the -1 path (the daemon scrubs the same way).
  protocol::scrubber sc(protocol::scrub_rules::from_env(r.env, r.secret_names));
  std::string preview = sc.scrub(r.command);
  auto lines = r.tail_lines, bytes = r.tail_bytes, pbytes = r.preview_bytes;
  call q(s_, std::move(r));
  auto rep = expect<wire::started_rep>(co_await q.next(), "exec");
  if (rep) {
    auto& sn = seen_[rep->job.str()];
    sn.preview = protocol::make_preview(preview, static_cast<std::size_t>(pbytes)).text;
    sn.tail_lines = lines;
    sn.tail_bytes = bytes;
  }
  co_return rep;
}

void sandbox_client::keep(const job_id& job, const wire::output_rep& o) {
  auto& sn = seen_[job.str()];
  if (o.offset + o.data.size() <= sn.next_offset) return;  // already have it
  std::string_view d(o.data);
  if (o.offset < sn.next_offset) d.remove_prefix(sn.next_offset - o.offset);
  if (o.offset > sn.next_offset)
    sn.out.append("[... " + std::to_string(o.offset - sn.next_offset) +
                  " bytes the sandbox no longer retained ...]\n");
  sn.out.append(d);
  sn.next_offset = o.offset + o.data.size();
}

const protocol::head_tail* sandbox_client::retained(const job_id& job) const {
  auto it = seen_.find(job.str());
  return it == seen_.end() ? nullptr : &it->second.out;
}

awaitable<result<sandbox_client::attach_result>> sandbox_client::attach_impl(job_id job,
                                                                             std::uint64_t offset,
                                                                             bool follow) {
  wire::attach_req a;
  a.job = job;
  a.offset = offset;
  a.follow = follow;
  call q(s_, std::move(a));
  attach_result res;
  res.offset = offset;
  res.next_offset = offset;
  bool first = true;
  for (;;) {
    auto r = co_await q.next();
    if (!r) co_return r.error();
    if (auto* o = std::get_if<wire::output_rep>(&*r)) {
      keep(job, *o);
      if (first) res.offset = o->offset, res.skipped = o->skipped;
      first = false;
      // A follow lasts the job's whole life: its output is kept only in the
      // bounded retained() head and tail, never accumulated here.
      if (!follow) {
        res.data += o->data;
        largest_buffer_ = std::max(largest_buffer_, res.data.size());
      }
      res.next_offset = o->offset + o->data.size();
      continue;
    }
    if (auto* st = std::get_if<wire::status_rep>(&*r)) {
      res.output_bytes = st->output_bytes;
      res.done = std::move(st->done);
      co_return res;
    }
    co_return error{errc::invalid, "sandbox daemon answered attach with an unexpected reply type"};
  }
}

awaitable<result<sandbox_client::attach_result>> sandbox_client::attach(job_id job,
                                                                        std::uint64_t offset) {
  return attach_impl(std::move(job), offset, false);
}

result<protocol::shell_completion> sandbox_client::cleaned_up(const job_id& job, const error& e) {
  auto it = seen_.find(job.str());
  if (e.code != errc::not_found) return e;
  if (it == seen_.end() || it->second.out.total() == 0)
    return error{errc::not_found,
                 "job '" + job.str() +
                     "': the sandbox has no status for it and this client "
                     "captured no output; nothing is known about how it ended (" +
                     e.message + ")",
                 e.answered};  // the daemon's own answer stays one
  auto& sn = it->second;
  protocol::shell_completion c;
  c.job = job.str();
  c.status.state = protocol::job_state::unknown;
  c.status.exit_code = -1;
  c.status.reason =
      "the sandbox cleaned this job up before its status was read; the output shown was retained "
      "by the client";
  c.preview.text = sn.preview.empty() ? "(not known to this client)" : sn.preview;
  auto bytes = static_cast<std::size_t>(sn.tail_bytes);
  auto t = protocol::make_tail(sn.out.last(bytes + 8), sn.out.total(),
                               static_cast<std::size_t>(sn.tail_lines), bytes);
  c.tail = std::move(t.text);
  c.tail_omitted_bytes = t.omitted_bytes;
  c.tail_lines = t.lines;
  c.output_bytes = sn.out.total();
  return c;
}

awaitable<result<protocol::shell_completion>> sandbox_client::wait(job_id job) {
  std::uint64_t from = seen_[job.str()].next_offset;
  auto r = co_await attach_impl(job, from, true);
  if (!r) co_return cleaned_up(job, r.error());
  if (!r->done)
    co_return error{errc::invalid, "sandbox daemon ended a followed attach of '" + job.str() +
                                       "' without a completion"};
  co_return std::move(*r->done);
}

awaitable<result<bool>> sandbox_client::wait_for_output(job_id job, std::string text) {
  auto& sn = seen_[job.str()];
  auto has = [&] {
    auto all = sn.out.read(0, static_cast<std::size_t>(sn.out.total()));
    return all.data.find(text) != std::string::npos;
  };
  if (has()) co_return true;
  wire::attach_req a;
  a.job = job;
  a.offset = sn.next_offset;
  a.follow = true;
  call q(s_, std::move(a));
  for (;;) {
    auto r = co_await q.next();
    if (!r) co_return r.error();
    if (auto* o = std::get_if<wire::output_rep>(&*r)) {
      keep(job, *o);
      if (has()) co_return true;  // the rest of the stream goes to an abandoned request
      continue;
    }
    co_return false;
  }
}

awaitable<result<std::optional<protocol::shell_completion>>> sandbox_client::poll(job_id job) {
  std::uint64_t from = seen_[job.str()].next_offset;
  auto r = co_await attach_impl(job, from, false);
  if (!r) {
    auto c = cleaned_up(job, r.error());
    if (!c) co_return c.error();
    co_return std::optional<protocol::shell_completion>(std::move(*c));
  }
  co_return std::move(r->done);
}

awaitable<result<protocol::shell_completion>> sandbox_client::kill(
    job_id job, std::optional<std::chrono::milliseconds> wait) {
  wire::kill_req k;
  k.job = std::move(job);
  if (wait) k.wait_ms = wait->count();
  call q(s_, std::move(k));
  auto rep = expect<wire::killed_rep>(co_await q.next(), "kill");
  if (!rep) co_return rep.error();
  co_return std::move(rep->done);
}

awaitable<result<wire::jobs_rep>> sandbox_client::list(
    std::optional<std::uint64_t> after_revision) {
  wire::list_req l;
  l.after_revision = after_revision;
  call q(s_, std::move(l));
  co_return expect<wire::jobs_rep>(co_await q.next(), "list");
}

awaitable<result<std::vector<job_id>>> sandbox_client::expire(std::optional<job_id> job) {
  wire::expire_req e;
  e.job = std::move(job);
  call q(s_, std::move(e));
  auto rep = expect<wire::expired_rep>(co_await q.next(), "expire");
  if (!rep) co_return rep.error();
  co_return std::move(rep->jobs);
}

}  // namespace tether::actors
