#include "support.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <fstream>
#include <random>
#include <sstream>
#include <stdexcept>

#include "tether/runtime/owner_identity.hpp"
#include "tether/sandbox/daemon_process.hpp"
#include "tether/sandbox/state_dir.hpp"

namespace tether::test {

std::string file_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::string dead_owner() {
  auto id = runtime::current_process_identity();
  id.boot_id = "00000000-0000-4000-8000-000000000000";
  return runtime::to_string(id);
}

namespace {
// A host with no sandbox configured starts a local tether-sandboxd on demand;
// this test binary is not next to it, so tell ensure_daemon where it is.
[[maybe_unused]] const bool k_sandboxd_found = [] {
  ::setenv("TETHER_SANDBOXD", TETHER_BIN_DIR "/tether-sandboxd", 0);
  return true;
}();
}  // namespace

scratch_dir::scratch_dir(const std::string& tag) {
  const char* base = std::getenv("TETHER_TEST_TMP");
  std::filesystem::path root = base ? base : std::filesystem::temp_directory_path() / "tether-test";
  std::filesystem::create_directories(root);
  std::random_device rd;
  p_ = root / (tag + "-" + std::to_string(::getpid()) + "-" + std::to_string(rd()));
  std::filesystem::create_directories(p_);
}

scratch_dir::~scratch_dir() {
  std::error_code ec;
  // A host with no sandbox configured started a local daemon beside its
  // database (<db>.sandbox, detached, so it outlives the host): stop it with
  // the directory rather than leave it to its idle exit.
  // A database's local daemon lives in sandbox::local_state_dir_for(db).
  for (auto it = std::filesystem::recursive_directory_iterator(p_, ec);
       !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec)) {
    if (it->path().extension() == ".sandbox") {
      it.disable_recursion_pending();
      continue;
    }
    if (it->path().extension() != ".db") continue;
    auto dir = sandbox::local_state_dir_for(it->path().string());
    (void)sandbox::stop_daemon_in(dir);
    if (dir.rfind(p_.string(), 0) != 0) {  // the long-path fallback, outside this directory
      std::error_code gone;
      std::filesystem::remove_all(dir, gone);
    }
  }
  std::filesystem::remove_all(p_, ec);
}

namespace {

// Forks and execs `argv` with stdout (and, with `merge_stderr`, stderr) on
// `out_fd`; the child's copy of `close_fd` is closed.
pid_t spawn(const std::vector<std::string>& argv, const std::vector<std::string>& extra_env,
            int out_fd, int close_fd, bool merge_stderr) {
  pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(out_fd, 1);
    if (merge_stderr) ::dup2(out_fd, 2);
    ::close(out_fd);
    ::close(close_fd);
    for (auto& e : extra_env) ::putenv(const_cast<char*>(e.c_str()));
    std::vector<char*> a;
    for (auto& s : argv) a.push_back(const_cast<char*>(s.c_str()));
    a.push_back(nullptr);
    ::execv(a[0], a.data());
    ::_exit(127);
  }
  return pid;
}

}  // namespace

int run_process(const std::vector<std::string>& argv, std::string* out,
                const std::vector<std::string>& extra_env) {
  int fds[2];
  if (::pipe(fds) != 0) return -1;
  pid_t pid = spawn(argv, extra_env, fds[1], fds[0], !out);
  ::close(fds[1]);
  std::string buf;
  char chunk[4096];
  ssize_t n;
  while ((n = ::read(fds[0], chunk, sizeof chunk)) > 0) buf.append(chunk, n);
  ::close(fds[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  if (out) *out = std::move(buf);
  return status;
}

bounded_run run_bounded(const std::vector<std::string>& argv, std::chrono::milliseconds limit,
                        const std::vector<std::string>& extra_env) {
  bounded_run r;
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) throw std::runtime_error("run_bounded: pipe failed");
  pid_t pid = spawn(argv, extra_env, fds[1], fds[0], true);
  ::close(fds[1]);
  if (pid < 0) {
    ::close(fds[0]);
    throw std::runtime_error("run_bounded: fork failed");
  }
  // The child's exit is watched through a pidfd, so output kept open by a
  // process it started cannot keep us waiting.
  int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
  if (pidfd < 0) {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, &r.status, 0);
    ::close(fds[0]);
    throw std::runtime_error("run_bounded: pidfd_open failed; the child was killed");
  }
  auto deadline = std::chrono::steady_clock::now() + limit;
  bool pipe_open = true, exited = false;
  char chunk[4096];
  while (!exited) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      r.timed_out = true;
      ::kill(pid, SIGKILL);  // our own child, by its id
      break;
    }
    pollfd p[2] = {{pidfd, POLLIN, 0}, {fds[0], POLLIN, 0}};
    int ready = ::poll(p, pipe_open ? 2 : 1, static_cast<int>(left.count()));
    if (ready < 0 && errno != EINTR) throw std::runtime_error("run_bounded: poll failed");
    if (ready <= 0) continue;
    if (pipe_open && (p[1].revents & (POLLIN | POLLHUP))) {
      ssize_t n = ::read(fds[0], chunk, sizeof chunk);
      if (n > 0)
        r.output.append(chunk, static_cast<std::size_t>(n));
      else
        pipe_open = false;
    }
    exited = p[0].revents & POLLIN;
  }
  ::waitpid(pid, &r.status, 0);
  ::close(pidfd);
  // What the child wrote before it exited (never waiting on its descendants).
  ::fcntl(fds[0], F_SETFL, O_NONBLOCK);
  for (ssize_t n; pipe_open && (n = ::read(fds[0], chunk, sizeof chunk)) > 0;)
    r.output.append(chunk, static_cast<std::size_t>(n));
  ::close(fds[0]);
  return r;
}

captured run_captured(const std::vector<std::string>& argv) {
  std::string cmd = "exec";
  for (auto& a : argv) {
    std::string q;
    for (char c : a) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
    cmd += " '" + q + "'";
  }
  cmd += " 2>&1";
  captured r;
  int status = run_process({"/bin/sh", "-c", cmd}, &r.output);
  if (WIFEXITED(status)) r.exit_code = WEXITSTATUS(status);
  return r;
}

}  // namespace tether::test
