#include "tether/actors/shell.hpp"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <boost/asio/post.hpp>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "tether/protocol/report.hpp"

extern char** environ;

namespace tether::actors {

namespace {
constexpr const char* k_wrapper =
    "__s=$(</proc/$$/stat); __s=${__s##*) }; set -- $__s; "
    "echo \"$$ ${20}\" > \"$TETHER_SHELL_BASE.pid\"; "
    "/bin/bash -c \"$TETHER_SHELL_CMD\" > \"$TETHER_SHELL_BASE.out\" 2>&1 < /dev/null; "
    "s=$?; echo $s > \"$TETHER_SHELL_BASE.status.tmp\" && "
    "mv \"$TETHER_SHELL_BASE.status.tmp\" \"$TETHER_SHELL_BASE.status\"";

int pidfd_open(pid_t pid) {
  return static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
}

// /proc/<pid>/stat starttime (field 22), or 0 if the process is gone.
unsigned long long start_time_of(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(f, line)) return 0;
  auto close = line.rfind(')');
  if (close == std::string::npos) return 0;
  std::istringstream in(line.substr(close + 1));
  std::string field;
  for (int i = 3; i <= 22 && in >> field; ++i)
    if (i == 22) return std::strtoull(field.c_str(), nullptr, 10);
  return 0;
}

std::string read_file(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// The last `lines` lines, at most `bytes` bytes, cut on a UTF-8 boundary.
std::string tail_of(const std::string& out, std::size_t lines, std::size_t bytes) {
  std::size_t start = out.size();
  std::size_t seen = 0;
  std::size_t end = out.size();
  if (end > 0 && out[end - 1] == '\n') --end;
  start = end;
  while (start > 0 && seen < lines) {
    auto nl = out.rfind('\n', start - 1);
    if (nl == std::string::npos) {
      start = 0;
      break;
    }
    start = nl;
    ++seen;
    if (seen < lines) continue;
    ++start;
  }
  if (start < out.size() && out[start] == '\n') ++start;
  if (end - start > bytes) start = end - bytes;
  while (start < end && (static_cast<unsigned char>(out[start]) & 0xC0) == 0x80) ++start;
  std::string t = out.substr(start, end - start);
  if (start > 0) t = "[" + std::to_string(start) + " earlier bytes left out]\n" + t;
  return t;
}
}  // namespace

shell_runner::shell_runner(runtime::executor ex, std::string dir, on_exit_fn on_exit)
    : ex_(ex), dir_(std::move(dir)), on_exit_(std::move(on_exit)) {
  std::filesystem::create_directories(dir_);
}

shell_runner::~shell_runner() = default;

std::string shell_runner::path(const std::string& id, const char* ext) const {
  return dir_ + "/" + id + ext;
}

std::string shell_runner::render_notice(const shell_info& s, int exit_code,
                                        const std::string& output_tail) {
  std::string out = "<shell id=\"" + protocol::escape_attribute(s.id) + "\" exit=\"" +
                    std::to_string(exit_code) + "\" command=\"" +
                    protocol::escape_attribute(s.command.substr(0, 200)) + "\">\n";
  if (exit_code == -1) out += "[exit status unknown]\n";
  out += output_tail;
  if (!output_tail.empty() && output_tail.back() != '\n') out += "\n";
  out += "</shell>";
  return out;
}

result<void> shell_runner::start(shell_info& s) {
  std::string base = dir_ + "/" + s.id;
  std::vector<std::string> env_store;
  for (char** e = environ; *e; ++e) env_store.emplace_back(*e);
  env_store.push_back("TETHER_SHELL_CMD=" + s.command);
  env_store.push_back("TETHER_SHELL_BASE=" + base);
  std::vector<char*> envp;
  for (auto& e : env_store) envp.push_back(e.data());
  envp.push_back(nullptr);
  std::string wrapper = k_wrapper;
  char* argv[] = {const_cast<char*>("/bin/bash"), const_cast<char*>("-c"), wrapper.data(), nullptr};
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSID);
  // The shell outlives the host: it must hold none of the host's descriptors
  // (a pipe kept open by an orphan blocks whoever reads the host's output).
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_addclosefrom_np(&fa, 3);
  pid_t pid = -1;
  int rc = ::posix_spawn(&pid, "/bin/bash", &fa, &attr, argv, envp.data());
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&attr);
  if (rc != 0)
    return error{errc::io, "cannot start shell '" + s.command + "': " + std::strerror(rc)};
  s.pid = pid;
  watch(s);
  return {};
}

void shell_runner::reattach(shell_info s) {
  if (std::filesystem::exists(path(s.id, ".status"))) {
    auto post_exit = [this, s] { finished(s); };
    boost::asio::post(ex_, post_exit);
    return;
  }
  // The pid file holds "PID STARTTIME": a pid alone may have been reused by
  // an unrelated process since the host stopped, so only the same start time
  // proves it is still our wrapper.
  std::istringstream pid_text(read_file(path(s.id, ".pid")));
  long pid = -1;
  unsigned long long started = 0;
  pid_text >> pid >> started;
  if (pid > 0 && started != 0 && start_time_of(static_cast<pid_t>(pid)) == started) {
    s.pid = static_cast<pid_t>(pid);
    watch(s);
    return;
  }
  s.pid = -1;
  auto post_exit = [this, s] { finished(s); };
  boost::asio::post(ex_, post_exit);
}

void shell_runner::watch(shell_info s) {
  int fd = pidfd_open(s.pid);
  if (fd < 0) {  // already gone
    auto post_exit = [this, s] { finished(s); };
    boost::asio::post(ex_, post_exit);
    return;
  }
  auto sd = std::make_unique<boost::asio::posix::stream_descriptor>(ex_, fd);
  auto* raw = sd.get();
  {
    std::lock_guard lk(m_);
    watching_[s.id] = std::move(sd);
  }
  raw->async_wait(boost::asio::posix::stream_descriptor::wait_read,
                  [this, s](boost::system::error_code ec) {
                    if (ec) return;                      // stopped
                    ::waitpid(s.pid, nullptr, WNOHANG);  // reap if it is our child
                    {
                      std::lock_guard lk(m_);
                      watching_.erase(s.id);
                    }
                    finished(s);
                  });
}

void shell_runner::finished(const shell_info& s) {
  {
    std::lock_guard lk(m_);
    if (stopped_) return;
  }
  auto status = read_file(path(s.id, ".status"));
  int code = -1;
  if (!status.empty()) code = std::atoi(status.c_str());
  auto tail = tail_of(read_file(path(s.id, ".out")), 40, 4096);
  on_exit_(s, render_notice(s, code, tail));
}

void shell_runner::stop() {
  // Only stops reporting; the descriptors close when the runner is destroyed,
  // after the executors stopped (host::shutdown orders it so).
  std::lock_guard lk(m_);
  stopped_ = true;
}

std::size_t shell_runner::running() const {
  std::lock_guard lk(m_);
  return watching_.size();
}

}  // namespace tether::actors
