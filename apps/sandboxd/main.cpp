// tether-sandboxd --state-dir DIR [--sandbox-id ID] [--replace] [--grace-ms N]
//                 [--kill-wait-ms N] [--retain-bytes N] [--idle-exit-ms N]
//                 [--max-connections N] [--max-in-flight N] [--ready-fd FD]
//
// One daemon per sandbox state directory. See docs/sandbox.md.
#include <fcntl.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <boost/asio/signal_set.hpp>
#include <cerrno>
#include <charconv>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "daemon.hpp"
#include "tether/runtime/crash_point.hpp"
#include "tether/sandbox/framing.hpp"
#include "tether/sandbox/state_dir.hpp"

namespace tether::sandboxd {

namespace {

constexpr const char* k_usage =
    "usage: tether-sandboxd --state-dir DIR [--sandbox-id ID] [--replace] [--grace-ms N]\n"
    "                       [--kill-wait-ms N] [--retain-bytes N] [--idle-exit-ms N]\n"
    "                       [--max-connections N] [--max-in-flight N] [--ready-fd FD]\n"
    "       tether-sandboxd --crash-points\n";

int fail(const std::string& msg) {
  std::fprintf(stderr, "tether-sandboxd: %s\n", msg.c_str());
  return 2;
}

bool parse_num(const std::string& s, long long& out) {
  auto r = std::from_chars(s.data(), s.data() + s.size(), out);
  return r.ec == std::errc() && r.ptr == s.data() + s.size() && out >= 0;
}

// Each connection costs a descriptor and each running job about four: make
// room for the connection cap plus 1024, as far as the hard limit allows.
// (Jobs inherit the raised soft limit.)
void raise_descriptor_limit(std::size_t max_connections) {
  rlimit rl{};
  if (::getrlimit(RLIMIT_NOFILE, &rl) != 0) return;
  rlim_t want = static_cast<rlim_t>(4 * max_connections + 1024);
  if (rl.rlim_max != RLIM_INFINITY && want > rl.rlim_max) want = rl.rlim_max;
  if (want <= rl.rlim_cur) return;
  rlim_t was = rl.rlim_cur;
  rl.rlim_cur = want;
  if (::setrlimit(RLIMIT_NOFILE, &rl) != 0)
    std::fprintf(stderr,
                 "tether-sandboxd: cannot raise the descriptor limit from %llu to %llu: %s\n",
                 static_cast<unsigned long long>(was), static_cast<unsigned long long>(want),
                 std::strerror(errno));
}

// The readiness line (--ready-fd) is one line: a message that spans lines
// (an error quoting a file, say) is joined with spaces before it is framed.
void say(int fd, std::string line) {
  if (fd < 0) return;
  std::replace(line.begin(), line.end(), '\n', ' ');
  std::string l = sandbox::frame(std::move(line)).value();
  [[maybe_unused]] auto n = ::write(fd, l.data(), l.size());
  ::close(fd);
}

}  // namespace

int daemon_main(int argc, char** argv) {
  std::signal(SIGPIPE, SIG_IGN);
  // A host armed for its own crash points starts daemons with the same
  // environment; only "sandboxd." points are the daemon's to take.
  if (const char* at = std::getenv("TETHER_CRASH_AT");
      at && std::string(at).rfind("sandboxd.", 0) != 0)
    ::unsetenv("TETHER_CRASH_AT");
  if (auto r = runtime::check_crash_env(); !r) return fail(r.error().message);
  daemon_config cfg;
  if (const char* t = std::getenv("TETHER_SANDBOXD_THROW_ON")) cfg.throw_on = t;
  std::string wanted_id;
  bool replace = false;
  int ready_fd = -1;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&](std::string& out) {
      if (i + 1 >= argc) return false;
      out = argv[++i];
      return true;
    };
    auto number = [&](long long& out) {
      std::string v;
      if (!value(v)) return false;
      return parse_num(v, out);
    };
    long long n = 0;
    std::string v;
    if (a == "--state-dir" && value(v)) {
      cfg.state_dir = v;
    } else if (a == "--sandbox-id" && value(v)) {
      wanted_id = v;
    } else if (a == "--replace") {
      replace = true;
    } else if (a == "--grace-ms" && number(n)) {
      cfg.grace = std::chrono::milliseconds(n);
    } else if (a == "--kill-wait-ms" && number(n)) {
      cfg.kill_wait = std::chrono::milliseconds(n);
    } else if (a == "--retain-bytes" && number(n) && n >= 2) {
      cfg.retain_bytes = static_cast<std::size_t>(n);
    } else if (a == "--idle-exit-ms" && number(n)) {
      cfg.idle_exit = std::chrono::milliseconds(n);
    } else if (a == "--max-connections" && number(n) && n >= 1) {
      cfg.max_connections = static_cast<std::size_t>(n);
    } else if (a == "--max-in-flight" && number(n) && n >= 1) {
      cfg.max_in_flight = static_cast<std::size_t>(n);
    } else if (a == "--ready-fd" && number(n)) {
      ready_fd = static_cast<int>(n);
    } else if (a == "--crash-points") {
      for (auto& name : runtime::crash_point_names()) std::printf("%s\n", name.c_str());
      return 0;
    } else if (a == "-h" || a == "--help") {
      std::fputs(k_usage, stdout);
      return 0;
    } else {
      std::fputs(k_usage, stderr);
      return fail("bad or incomplete argument '" + a + "'");
    }
  }
  if (ready_fd >= 0) ::fcntl(ready_fd, F_SETFD, FD_CLOEXEC);
  if (cfg.state_dir.empty()) {
    std::fputs(k_usage, stderr);
    return fail("--state-dir is required");
  }
  // Only our own uid may control the directory: it holds the socket and the job records.
  if (auto r = sandbox::secure_state_dir(cfg.state_dir.string()); !r) {
    say(ready_fd, "error " + r.error().message);
    return fail(r.error().message);
  }
  cfg.state_dir = fs::absolute(cfg.state_dir);

  // One daemon per directory: the lock is held for the process's life.
  fs::path lock = cfg.state_dir / "lock";
  int lock_fd = ::open(lock.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (lock_fd < 0) return fail("cannot open " + lock.string() + ": " + std::strerror(errno));
  if (::flock(lock_fd, LOCK_EX | LOCK_NB) != 0) {
    say(ready_fd, "busy");
    std::fprintf(stderr, "tether-sandboxd: another daemon serves %s\n", cfg.state_dir.c_str());
    return replace ? 3 : 0;
  }
  std::string pid = std::to_string(::getpid()) + "\n";
  ::ftruncate(lock_fd, 0);
  [[maybe_unused]] auto w = ::pwrite(lock_fd, pid.data(), pid.size(), 0);

  auto id = load_identity(cfg.state_dir, wanted_id, replace);
  if (!id) {
    say(ready_fd, "error " + id.error().message);
    return fail(id.error().message);
  }
  cfg.id = *id;
  cfg.tools = find_tools();
  raise_descriptor_limit(cfg.max_connections);

  asio::io_context io;
  daemon d(io, cfg);
  if (auto r = d.start(); !r) {
    say(ready_fd, "error " + r.error().message);
    return fail(r.error().message);
  }
  asio::signal_set signals(io, SIGTERM, SIGINT);
  signals.async_wait([&](boost::system::error_code ec2, int sig) {
    if (!ec2) d.shutdown(std::string("signal ") + std::to_string(sig));
  });
  say(ready_fd, "ready " + cfg.id.sandbox_id + " " + std::to_string(cfg.id.generation) + " " +
                    std::to_string(::getpid()));
  io.run();
  return 0;
}

}  // namespace tether::sandboxd

int main(int argc, char** argv) {
  return tether::sandboxd::daemon_main(argc, argv);
}
