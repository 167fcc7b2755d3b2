#include "launcher.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <spawn.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "tether/protocol/notice.hpp"

namespace tether::sandboxd {

namespace {

constexpr int k_status_fd = 63;
constexpr int k_go_fd = 62;

std::string find_on_path(const std::string& name) {
  const char* path = std::getenv("PATH");
  std::string p = path ? path : "/usr/local/bin:/usr/bin:/bin";
  std::stringstream ss(p);
  std::string dir;
  while (std::getline(ss, dir, ':')) {
    if (dir.empty()) continue;
    std::string cand = dir + "/" + name;
    if (::access(cand.c_str(), X_OK) == 0) return cand;
  }
  return {};
}

struct file_actions {
  posix_spawn_file_actions_t fa;
  file_actions() { posix_spawn_file_actions_init(&fa); }
  ~file_actions() { posix_spawn_file_actions_destroy(&fa); }
};
struct spawn_attr {
  posix_spawnattr_t a;
  spawn_attr() { posix_spawnattr_init(&a); }
  ~spawn_attr() { posix_spawnattr_destroy(&a); }
};

}  // namespace

launcher_config find_tools() {
  launcher_config c;
  auto bash = find_on_path("bash");
  if (!bash.empty()) c.bash = bash;
  c.bwrap = find_on_path("bwrap");
  if (const char* b = std::getenv("TETHER_SANDBOXD_BWRAP"); b && *b) c.bwrap = b;
  return c;
}

namespace {
// bwrap's arguments for a job in `cwd` (empty: none bound), up to the `--`.
std::vector<std::string> bwrap_args(const launcher_config& cfg, const std::string& cwd,
                                    bool allow_network) {
  std::vector<std::string> a = {cfg.bwrap, "--ro-bind", "/",     "/",       "--dev",
                                "/dev",    "--proc",    "/proc", "--tmpfs", "/tmp"};
  if (!cwd.empty()) a.insert(a.end(), {"--bind", cwd, cwd});
  a.push_back("--unshare-all");
  if (allow_network) a.push_back("--share-net");
  if (!cwd.empty()) a.insert(a.end(), {"--chdir", cwd});
  a.push_back("--");
  return a;
}

std::vector<char*> c_argv(std::vector<std::string>& v) {
  std::vector<char*> out;
  for (auto& s : v) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}
}  // namespace

std::string probe_isolation(const launcher_config& cfg, int timeout_ms) {
  if (cfg.bwrap.empty()) return "bwrap is not installed (Debian package bubblewrap)";
  auto argv = bwrap_args(cfg, "", false);
  argv.insert(argv.end(), {cfg.bash, "-c", ":"});
  auto av = c_argv(argv);
  int err[2];
  if (::pipe2(err, O_CLOEXEC) != 0)
    return std::string("could not run bwrap to check it: pipe: ") + std::strerror(errno);
  file_actions fa;
  posix_spawn_file_actions_adddup2(&fa.fa, err[1], 2);
  posix_spawn_file_actions_addclosefrom_np(&fa.fa, 3);
  posix_spawn_file_actions_addopen(&fa.fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&fa.fa, 1, "/dev/null", O_WRONLY, 0);
  char* no_env[] = {nullptr};
  pid_t pid;
  int rc = ::posix_spawn(&pid, av[0], &fa.fa, nullptr, av.data(), no_env);
  ::close(err[1]);
  if (rc != 0) {
    ::close(err[0]);
    return "could not run " + cfg.bwrap + ": " + std::strerror(rc);
  }
  // What bwrap says, until it exits and closes its end (bounded in time and size).
  std::string said;
  pollfd p{err[0], POLLIN, 0};
  bool timed_out = false;
  for (;;) {
    int n = ::poll(&p, 1, timeout_ms);
    if (n < 0 && errno == EINTR) continue;
    if (n == 0) {
      timed_out = true;
      ::kill(pid, SIGKILL);
      break;
    }
    char buf[1024];
    ssize_t got = ::read(err[0], buf, sizeof buf);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) break;
    if (said.size() < 4096) said.append(buf, static_cast<std::size_t>(got));
  }
  ::close(err[0]);
  int st = 0;
  while (::waitpid(pid, &st, 0) < 0 && errno == EINTR) {
  }
  while (!said.empty() && (said.back() == '\n' || said.back() == ' ')) said.pop_back();
  if (timed_out)
    return cfg.bwrap + " did not finish setting up an isolated shell within " +
           std::to_string(timeout_ms) + " ms";
  if (WIFEXITED(st) && WEXITSTATUS(st) == 0) return {};
  std::string how = WIFEXITED(st) ? "exit " + std::to_string(WEXITSTATUS(st))
                                  : "signal " + std::to_string(WTERMSIG(st));
  return cfg.bwrap + " cannot set up an isolated shell here (" + how + ")" +
         (said.empty() ? std::string() : ": " + said);
}

std::string launcher_script(const std::string& command) {
  return "read -r -n 1 -u 62 __tether_go; exec 62<&-; [ \"$__tether_go\" = g ] || exit 125; "
         "unset __tether_go\n" +
         protocol::capture_script(command);
}

bool release(int& go_fd) {
  if (go_fd < 0) return false;
  char g = 'g';
  ssize_t n;
  do {
    n = ::write(go_fd, &g, 1);
  } while (n < 0 && errno == EINTR);
  int e = errno;
  ::close(go_fd);
  go_fd = -1;
  errno = e;
  return n == 1;
}

spawn_result spawn_job(const launcher_config& cfg, const spawn_request& r) {
  spawn_result res;
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) {
    res.error = std::string("pipe: ") + std::strerror(errno);
    return res;
  }
  int go[2];
  if (::pipe2(go, O_CLOEXEC) != 0) {
    res.error = std::string("pipe: ") + std::strerror(errno);
    ::close(fds[0]);
    ::close(fds[1]);
    return res;
  }
  int status_fd =
      ::open(r.status_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (status_fd < 0) {
    res.error = "open " + r.status_path + ": " + std::strerror(errno);
    for (int fd : {fds[0], fds[1], go[0], go[1]}) ::close(fd);
    return res;
  }

  std::vector<std::string> argv;
  if (r.isolate) argv = bwrap_args(cfg, r.cwd, r.allow_network);
  argv.insert(argv.end(), {cfg.bash, "-c", launcher_script(r.command), "tether-job"});
  auto av = c_argv(argv);
  std::vector<std::string> envs;
  for (auto& [k, v] : r.env) envs.push_back(k + "=" + v);
  std::vector<char*> ev;
  for (auto& s : envs) ev.push_back(s.data());
  ev.push_back(nullptr);

  // The job gets stdin, stdout+stderr, the status fd and the go gate's read
  // end, and nothing else of ours: not the listening socket, clients' sockets
  // or other jobs' pipes (Asio does not open them close-on-exec). The status
  // fd waits at 0 and the gate at 1 while everything from 3 up is closed.
  file_actions fa;
  posix_spawn_file_actions_adddup2(&fa.fa, status_fd, 0);
  posix_spawn_file_actions_adddup2(&fa.fa, go[0], 1);
  posix_spawn_file_actions_adddup2(&fa.fa, fds[1], 2);
  posix_spawn_file_actions_addclosefrom_np(&fa.fa, 3);
  posix_spawn_file_actions_adddup2(&fa.fa, 0, k_status_fd);
  posix_spawn_file_actions_adddup2(&fa.fa, 1, k_go_fd);
  posix_spawn_file_actions_adddup2(&fa.fa, 2, 1);
  posix_spawn_file_actions_addopen(&fa.fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addchdir_np(&fa.fa, r.cwd.c_str());
  spawn_attr at;
  sigset_t none, defaults;
  sigemptyset(&none);
  sigemptyset(&defaults);
  for (int s : {SIGPIPE, SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGCHLD, SIGUSR1, SIGUSR2, SIGALRM})
    sigaddset(&defaults, s);
  posix_spawnattr_setflags(&at.a,
                           POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  posix_spawnattr_setpgroup(&at.a, 0);
  posix_spawnattr_setsigmask(&at.a, &none);
  posix_spawnattr_setsigdefault(&at.a, &defaults);

  pid_t pid;
  int rc = ::posix_spawn(&pid, av[0], &fa.fa, &at.a, av.data(), ev.data());
  ::close(fds[1]);
  ::close(go[0]);
  ::close(status_fd);
  if (rc != 0) {
    ::close(fds[0]);
    ::close(go[1]);
    res.error = "could not start " + argv[0] + " in " + r.cwd + ": " + std::strerror(rc);
    return res;
  }
  spawned s;
  s.pid = pid;
  s.output_fd = fds[0];
  s.go_fd = go[1];
  ::fcntl(s.output_fd, F_SETFL, ::fcntl(s.output_fd, F_GETFL) | O_NONBLOCK);
  s.pidfd = open_pidfd(pid);
  s.start_time = process_start_time(pid);
  if (s.pidfd < 0) {
    // Cannot watch it: do not leave it running unobserved.
    int err = errno;
    ::kill(-pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
    ::close(s.output_fd);
    ::close(s.go_fd);
    res.error = std::string("pidfd_open: ") + std::strerror(err);
    return res;
  }
  res.ok = s;
  return res;
}

namespace {
// Fields after "pid (comm) ": state, ppid, pgrp, ... starttime is field 22.
bool read_stat(pid_t pid, char& state, pid_t& pgrp, std::uint64_t& start) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(f, line)) return false;
  auto close = line.rfind(')');
  if (close == std::string::npos) return false;
  std::istringstream in(line.substr(close + 2));
  std::string field;
  std::vector<std::string> v;
  while (in >> field && v.size() < 20) v.push_back(field);
  if (v.size() < 20) return false;
  state = v[0].empty() ? '?' : v[0][0];
  pgrp = static_cast<pid_t>(std::stol(v[2]));
  start = std::stoull(v[19]);
  return true;
}
}  // namespace

std::vector<pid_t> group_members(pid_t pgid) {
  std::vector<pid_t> out;
  DIR* d = ::opendir("/proc");
  if (!d) return out;
  while (auto* e = ::readdir(d)) {
    char* end;
    long pid = std::strtol(e->d_name, &end, 10);
    if (*end != '\0' || pid <= 0) continue;
    char state;
    pid_t pgrp;
    std::uint64_t start;
    if (!read_stat(static_cast<pid_t>(pid), state, pgrp, start)) continue;
    if (pgrp == pgid && state != 'Z' && state != 'X') out.push_back(static_cast<pid_t>(pid));
  }
  ::closedir(d);
  return out;
}

std::uint64_t process_start_time(pid_t pid) {
  char state;
  pid_t pgrp;
  std::uint64_t start = 0;
  if (!read_stat(pid, state, pgrp, start)) return 0;
  return start;
}

int open_pidfd(pid_t pid) {
  return static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
}

std::optional<std::pair<bool, int>> reap(int pidfd) {
  siginfo_t si{};
  if (::waitid(static_cast<idtype_t>(3) /* P_PIDFD */, static_cast<id_t>(pidfd), &si, WEXITED) != 0)
    return std::nullopt;
  if (si.si_code == CLD_EXITED) return std::make_pair(false, si.si_status);
  return std::make_pair(true, si.si_status);
}

}  // namespace tether::sandboxd
