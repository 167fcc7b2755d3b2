#include "sandbox_support.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/inotify.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <condition_variable>
#include <csignal>
#include <fstream>
#include <mutex>
#include <sstream>
#include <thread>

#include "tether/protocol/json.hpp"

namespace tether::test {

void sandbox_daemon::crash() {
  REQUIRE(h_.child);
  ::kill(h_.pid, SIGKILL);
  int st = 0;
  REQUIRE(::waitpid(h_.pid, &st, 0) == h_.pid);
  REQUIRE(WIFSIGNALED(st));
  h_.pid = 0;
}

// Resumes a paused daemon after a long while unless the test resumed it:
// a client that would wait for ever on it then fails instead of hanging.
struct pause_guard {
  std::mutex m;
  std::condition_variable cv;
  bool done = false;
  std::thread t;
  explicit pause_guard(pid_t pid) {
    t = std::thread([this, pid] {
      std::unique_lock lk(m);
      if (!cv.wait_for(lk, std::chrono::minutes(2), [this] { return done; })) ::kill(pid, SIGCONT);
    });
  }
  ~pause_guard() {
    {
      std::lock_guard lk(m);
      done = true;
    }
    cv.notify_all();
    t.join();
  }
};

void sandbox_daemon::pause() {
  REQUIRE(h_.child);
  REQUIRE(::kill(h_.pid, SIGSTOP) == 0);
  int st = 0;
  REQUIRE(::waitpid(h_.pid, &st, WUNTRACED) == h_.pid);
  REQUIRE(WIFSTOPPED(st));
  paused_ = true;
  guard_ = std::make_shared<pause_guard>(h_.pid);
}

void sandbox_daemon::resume() {
  guard_.reset();
  REQUIRE(::kill(h_.pid, SIGCONT) == 0);
  int st = 0;
  REQUIRE(::waitpid(h_.pid, &st, WCONTINUED) == h_.pid);
  REQUIRE(WIFCONTINUED(st));
  paused_ = false;
}

int sandbox_daemon::wait_exit(std::chrono::seconds limit) {
  REQUIRE(h_.child);
  int pfd = static_cast<int>(::syscall(SYS_pidfd_open, h_.pid, 0));
  REQUIRE(pfd >= 0);
  pollfd p{pfd, POLLIN, 0};
  int n;
  while ((n = ::poll(&p, 1, static_cast<int>(limit.count() * 1000))) < 0 && errno == EINTR) {
  }
  ::close(pfd);
  INFO("the daemon did not exit within " << limit.count() << " s; daemon.log:\n" << log());
  REQUIRE(n == 1);
  int st = 0;
  REQUIRE(::waitpid(h_.pid, &st, 0) == h_.pid);
  h_.pid = 0;
  return st;
}

std::string sandbox_daemon::full_log() const {
  std::ifstream f(opts_.state_dir + "/daemon.log");
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

bool sandbox_daemon::wait_for_log(const std::string& needle, std::chrono::seconds limit) const {
  auto deadline = std::chrono::steady_clock::now() + limit;
  int in = ::inotify_init1(IN_CLOEXEC | IN_NONBLOCK);
  REQUIRE(in >= 0);
  std::string file = opts_.state_dir + "/daemon.log";
  REQUIRE(::inotify_add_watch(in, file.c_str(), IN_MODIFY) >= 0);
  bool found = false;
  for (;;) {
    // Checked after the watch is in place: a write in between is not missed.
    if (full_log().find(needle) != std::string::npos) {
      found = true;
      break;
    }
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) break;
    pollfd p{in, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left.count())) < 0 && errno != EINTR) break;
    char drain[4096];
    while (::read(in, drain, sizeof drain) > 0) {
    }
  }
  ::close(in);
  return found;
}

std::string sandbox_daemon::log() const {
  std::ifstream f(opts_.state_dir + "/daemon.log");
  std::string all((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  return all.size() > 4000 ? all.substr(all.size() - 4000) : all;
}

awaitable<client_ptr> connect(std::string socket, wire::conn_mode mode) {
  auto c = co_await sandbox::client::connect(socket, mode, "tether_tests");
  INFO("connect: " << (c ? std::string("ok") : c.error().message));
  REQUIRE(c.has_value());
  co_return std::move(*c);
}

wire::exec_req command(std::string cmd, std::string cwd,
                       std::vector<std::pair<std::string, std::string>> extra_env) {
  wire::exec_req r;
  r.command = std::move(cmd);
  r.cwd = std::move(cwd);
  r.env = {{"PATH", "/usr/local/bin:/usr/bin:/bin"}, {"LANG", "C.UTF-8"}};
  for (auto& kv : extra_env) r.env.push_back(std::move(kv));
  return r;
}

awaitable<protocol::shell_completion> run_to_end(sandbox::client& c, wire::exec_req r) {
  std::string what = r.command;
  auto s = co_await c.exec(std::move(r));
  INFO("exec '" << what << "': " << (s ? std::string("ok") : s.error().message));
  REQUIRE(s.has_value());
  auto done = co_await c.wait(s->job);
  INFO("wait '" << what << "': " << (done ? std::string("ok") : done.error().message));
  REQUIRE(done.has_value());
  co_return std::move(*done);
}

void age_completed_record(const std::string& state_dir, const protocol::job_id& job,
                          std::int64_t ms) {
  auto file = state_dir + "/jobs/" + job.str() + "/job.json";
  std::ifstream in(file);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto v = protocol::parse_json(text);
  INFO(file << ": " << text);
  REQUIRE(v.has_value());
  auto* done = v->as_object().if_contains("done");
  REQUIRE(done != nullptr);
  auto& ended = done->as_object()["ended_at_ms"];
  ended = ended.to_number<std::int64_t>() - ms;
  std::ofstream(file, std::ios::trunc) << protocol::to_text(*v);
}

std::vector<int> live_group_members(int pgid) {
  std::vector<int> out;
  DIR* d = ::opendir("/proc");
  if (!d) return out;
  while (auto* e = ::readdir(d)) {
    char* end;
    long pid = std::strtol(e->d_name, &end, 10);
    if (*end != '\0' || pid <= 0) continue;
    std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
    std::string line;
    if (!std::getline(f, line)) continue;
    auto close = line.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream in(line.substr(close + 2));
    std::string state, ppid, pgrp;
    in >> state >> ppid >> pgrp;
    if (std::atoi(pgrp.c_str()) == pgid && state != "Z" && state != "X")
      out.push_back(static_cast<int>(pid));
  }
  ::closedir(d);
  return out;
}

void release_fifo(const std::string& path) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
  REQUIRE(fd >= 0);
  ::close(fd);
}

std::string read_fifo(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  REQUIRE(fd >= 0);
  std::string text;
  char buf[256];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    REQUIRE(n >= 0);
    if (n == 0) break;
    text.append(buf, static_cast<std::size_t>(n));
  }
  ::close(fd);
  return text;
}

}  // namespace tether::test
