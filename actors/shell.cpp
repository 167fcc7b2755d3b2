#include "tether/actors/shell.hpp"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <boost/asio/post.hpp>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "tether/protocol/output_tail.hpp"
#include "tether/protocol/report.hpp"
#include "tether/sandbox/client.hpp"

extern char** environ;

namespace tether::actors {

namespace {
constexpr const char* k_wrapper =
    "__s=$(</proc/$$/stat); __s=${__s##*) }; set -- $__s; "
    "echo \"$$ ${20}\" > \"$TETHER_SHELL_BASE.pid\"; "
    "/bin/bash -c \"$TETHER_SHELL_CMD\" tether-shell > \"$TETHER_SHELL_BASE.out\" 2>&1 < /dev/null "
    "63> \"$TETHER_SHELL_BASE.capture\"; "
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

constexpr std::size_t k_tail_lines = 40;
constexpr std::size_t k_tail_bytes = 4096;
constexpr std::size_t k_preview_bytes = 200;

std::int64_t now_ms() {
  using namespace std::chrono;
  return duration_cast<milliseconds>(system_clock::now().time_since_epoch()).count();
}
}  // namespace

shell_runner::shell_runner(runtime::executor ex, std::string dir, on_exit_fn on_exit)
    : ex_(ex),
      dir_(std::move(dir)),
      scrub_(protocol::scrub_rules::from_env(sandbox::current_environment())),
      on_exit_(std::move(on_exit)) {
  std::filesystem::create_directories(dir_);
}

shell_runner::~shell_runner() = default;

std::string shell_runner::path(const std::string& id, const char* ext) const {
  return dir_ + "/" + id + ext;
}

std::string shell_runner::label(const std::string& command) const {
  return protocol::make_preview(scrub_.scrub(command), k_preview_bytes).text;
}

std::string shell_runner::render_failed_start(const shell_info& s, const std::string& why) const {
  protocol::launch_outcome o;
  o.unknown_reason = "the shell did not start: " + why;
  return render_finished(s, o, {});
}

std::string shell_runner::render_finished(const shell_info& s, const protocol::launch_outcome& o,
                                          const std::string& output_path) const {
  // Stages are split on the command as given (scrubbing can break its quoting), then scrubbed.
  auto shape = protocol::last_pipeline(s.command);
  for (auto& st : shape.stages) st = scrub_.scrub(st);
  protocol::shell_completion c;
  c.job = s.id;
  c.status = protocol::judge(o, shape);
  c.status.reason = scrub_.scrub(c.status.reason);
  c.preview = protocol::make_preview(scrub_.scrub(s.command), k_preview_bytes);
  // Scrubbed as a stream, chunk by chunk, keeping only the last bytes: memory
  // stays bounded however much the shell printed, and a secret cut by a chunk
  // boundary is still caught.
  protocol::head_tail kept(0, 4 * k_tail_bytes);
  if (!output_path.empty()) {
    int fd = ::open(output_path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd >= 0) {
      protocol::stream_scrubber stream(scrub_);
      std::string buf(64 * 1024, '\0');
      for (;;) {
        ssize_t n = ::read(fd, buf.data(), buf.size());
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        kept.append(stream.feed(std::string_view(buf.data(), static_cast<std::size_t>(n))));
      }
      kept.append(stream.finish());
      ::close(fd);
    }
  }
  auto t =
      protocol::make_tail(kept.last(k_tail_bytes + 8), kept.total(), k_tail_lines, k_tail_bytes);
  c.tail = std::move(t.text);
  c.tail_omitted_bytes = t.omitted_bytes;
  c.tail_lines = t.lines;
  c.output_bytes = kept.total();
  c.ended_at_ms = now_ms();
  return protocol::render_notice(c);
}

result<void> shell_runner::start(shell_info& s) {
  std::string base = dir_ + "/" + s.id;
  std::vector<std::string> env_store;
  for (char** e = environ; *e; ++e) env_store.emplace_back(*e);
  env_store.push_back("TETHER_SHELL_CMD=" + protocol::capture_script(s.command));
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
  if (rc != 0) return error{errc::io, std::string("cannot start /bin/bash: ") + std::strerror(rc)};
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
  protocol::launch_outcome o;
  auto status = read_file(path(s.id, ".status"));
  if (!status.empty()) {
    // The wrapper's `$?` for the command's shell: its exit code, or 128+N
    // when a signal ended it (the wrapper cannot tell the two apart).
    o.shell = protocol::launch_outcome::shell_end{false, std::atoi(status.c_str())};
    o.capture_line = protocol::find_capture_line(read_file(path(s.id, ".capture")));
  } else {
    o.unknown_reason = s.pid > 0 ? "the shell ended without writing its status"
                                 : "the shell is gone and left no status (after a restart, its "
                                   "process was not found or its pid was reused)";
  }
  on_exit_(s, render_finished(s, o, path(s.id, ".out")));
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
