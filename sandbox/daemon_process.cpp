#include "tether/sandbox/daemon_process.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "tether/protocol/sandbox_wire.hpp"
#include "tether/sandbox/framing.hpp"
#include "tether/sandbox/state_dir.hpp"

namespace tether::sandbox {

namespace fs = std::filesystem;

std::string self_dir() {
  std::error_code ec;
  auto p = fs::read_symlink("/proc/self/exe", ec);
  return ec ? std::string(".") : p.parent_path().string();
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
  std::string bin = o.binary;
  if (bin.empty()) {
    const char* env = std::getenv("TETHER_SANDBOXD");
    bin = env && *env ? env : (fs::path(self_dir()) / "tether-sandboxd").string();
  }
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
  // The readiness line (tether-sandboxd's --ready-fd), framed like the wire.
  line_splitter ready(protocol::sandbox::k_max_line, "readiness line");
  std::string line;
  char buf[512];
  for (;;) {
    ssize_t n = ::read(p[0], buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    ready.feed(std::string_view(buf, static_cast<std::size_t>(n)));
    if (auto l = ready.next()) {
      if (*l) line = std::move(**l);
      break;
    }
  }
  ::close(p[0]);
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

result<bool> stop_daemon_in(const std::string& state_dir) {
  auto lock = (fs::path(state_dir) / "lock").string();
  int fd = ::open(lock.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return false;  // no daemon ever served it
  // The daemon holds an exclusive flock for its life: a shared one taken
  // here means nobody serves the directory (and a stale pid is never signalled).
  bool free = ::flock(fd, LOCK_SH | LOCK_NB) == 0;
  ::close(fd);
  if (free) return false;
  daemon_handle h;
  h.pid = lock_holder(state_dir);
  if (h.pid <= 0)
    return error{errc::corrupt, "the daemon serving " + state_dir +
                                    " holds its lock but the lock file names no pid; nothing "
                                    "was stopped"};
  auto r = stop_daemon(h);
  if (!r) return r.error();
  return true;
}

}  // namespace tether::sandbox
