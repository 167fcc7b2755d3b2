// The daemon's connections under load and misbehaviour (docs/sandbox.md,
// "Security"): a failing request handler, a cap on connections and on
// requests in flight, and running out of file descriptors.
#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <optional>
#include <string>

#include "sandbox_support.hpp"

using namespace tether;
using namespace tether::test;
using namespace std::chrono_literals;

namespace {

// A raw client: writes request lines, reads reply lines; every read has a
// deadline, so a daemon that never answers fails the test instead of hanging it.
class line_conn {
 public:
  explicit line_conn(const std::string& path, bool must_connect = true) {
    fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    REQUIRE(fd_ >= 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::snprintf(a.sun_path, sizeof a.sun_path, "%s", path.c_str());
    connected_ = ::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
    if (must_connect) REQUIRE(connected_);
  }
  bool connected() const { return connected_; }
  ~line_conn() {
    if (fd_ >= 0) ::close(fd_);
  }
  line_conn(const line_conn&) = delete;

  void send(const std::string& s) {
    std::size_t off = 0;
    while (off < s.size()) {
      auto n = ::send(fd_, s.data() + off, s.size() - off, MSG_NOSIGNAL);
      REQUIRE(n > 0);
      off += static_cast<std::size_t>(n);
    }
  }
  /// The next line, or nullopt at end of stream; fails after `limit`.
  std::optional<std::string> line(std::chrono::seconds limit = 60s) {
    for (;;) {
      auto nl = buf_.find('\n');
      if (nl != std::string::npos) {
        auto l = buf_.substr(0, nl);
        buf_.erase(0, nl + 1);
        return l;
      }
      if (eof_) return std::nullopt;
      pollfd p{fd_, POLLIN, 0};
      int r = ::poll(&p, 1, static_cast<int>(limit.count() * 1000));
      INFO("no reply from the daemon within " << limit.count() << " s");
      REQUIRE(r == 1);
      char tmp[65536];
      auto n = ::read(fd_, tmp, sizeof tmp);
      if (n <= 0) {
        eof_ = true;
        continue;
      }
      buf_.append(tmp, static_cast<std::size_t>(n));
    }
  }
  std::string ask(const std::string& request) {
    send(request + "\n");
    auto l = line();
    REQUIRE(l.has_value());
    return *l;
  }
  /// True when the daemon closed the connection (after any lines still unread).
  bool closed_by_daemon(std::chrono::seconds limit = 60s) {
    while (line(limit)) {
    }
    return eof_;
  }
  /// Half-closes: the daemon reads end of stream, closes its side, and only
  /// then does closed_by_daemon() return.
  void shutdown_write() { ::shutdown(fd_, SHUT_WR); }
  int fd() const { return fd_; }

 private:
  int fd_ = -1;
  bool connected_ = false;
  std::string buf_;
  bool eof_ = false;
};

const std::string k_hello = R"({"type":"hello","v":1,"id":1})";

// Sets an environment variable for one test (the daemon inherits it).
struct env_var {
  env_var(const char* name, const char* value) : name_(name) { ::setenv(name, value, 1); }
  ~env_var() { ::unsetenv(name_); }
  const char* name_;
};

actors::daemon_options idle_exit(std::chrono::milliseconds ms) {
  actors::daemon_options o;
  o.idle_exit = ms;
  return o;
}

// A connection to a daemon started with a short --idle-exit-ms: if it went
// idle before we connected (a slow machine), it is started again.
std::unique_ptr<line_conn> connect_before_idle_exit(sandbox_daemon& d) {
  for (int attempt = 0; attempt < 5; ++attempt) {
    auto c = std::make_unique<line_conn>(d.socket(), false);
    if (c->connected()) return c;
    d.wait_exit(60s);
    d.start();
  }
  FAIL("the daemon went idle before every one of 5 connection attempts");
  return nullptr;
}

}  // namespace

TEST_CASE("a connection whose request handler throws is closed, and the idle daemon then exits",
          "[sandbox][connection]") {
  // expire is answered on the connection's read loop, list by a coroutine of its own.
  auto type = GENERATE(std::string("expire"), std::string("list"));
  env_var hook("TETHER_SANDBOXD_THROW_ON", type.c_str());
  sandbox_daemon d("sbx-conn-throws-" + type, idle_exit(100ms));
  auto c = connect_before_idle_exit(d);
  CHECK_THAT(c->ask(k_hello), Catch::Contains(R"("type":"hello")"));
  c->send(R"({"type":")" + type + R"(","id":2})" + "\n");
  INFO("daemon.log:\n" << d.log());
  CHECK(c->closed_by_daemon());
  int st = d.wait_exit(60s);
  CHECK(WIFEXITED(st));
  CHECK(WEXITSTATUS(st) == 0);
  auto log = d.full_log();
  CHECK_THAT(log, Catch::Contains("a connection failed") &&
                      Catch::Contains("TETHER_SANDBOXD_THROW_ON=" + type) &&
                      Catch::Contains("it was closed"));
  CHECK_THAT(log, Catch::Contains("idle for 100 ms"));
}
