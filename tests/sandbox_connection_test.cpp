// The daemon's connections under load and misbehaviour (docs/sandbox.md,
// "Security"): a failing request handler, a cap on connections and on
// requests in flight, and running out of file descriptors.
#include <fcntl.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>

#include "sandbox_support.hpp"
#include "tether/protocol/json.hpp"

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
    INFO("connect to " << path << ": " << std::strerror(errno));
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

sandbox::daemon_options idle_exit(std::chrono::milliseconds ms) {
  sandbox::daemon_options o;
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

namespace {

boost::json::object parse_line(const std::string& l) {
  auto v = protocol::parse_json(l);
  INFO("reply line: " << l);
  REQUIRE(v.has_value());
  REQUIRE(v->is_object());
  return v->get_object();
}

std::string field(const boost::json::object& o, const char* key) {
  auto* v = o.if_contains(key);
  return v && v->is_string() ? std::string(v->get_string()) : std::string();
}

// The daemon's peak resident memory in KiB (VmHWM).
long peak_kib(int pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("VmHWM:", 0) == 0) return std::atol(line.c_str() + 6);
  FAIL("no VmHWM in /proc/" << pid << "/status");
  return 0;
}

std::string exec_line(const std::string& command, const std::string& cwd) {
  boost::json::object o{{"type", "exec"},
                        {"id", 2},
                        {"command", command},
                        {"cwd", cwd},
                        {"env", boost::json::object{{"PATH", "/usr/bin:/bin"}}}};
  return boost::json::serialize(o);
}

}  // namespace

TEST_CASE(
    "connections over the daemon's cap are told so and closed, and one more is served once "
    "another closes",
    "[sandbox][connection][security]") {
  sandbox::daemon_options o;
  o.max_connections = 2;
  sandbox_daemon d("sbx-conn-cap", o);
  line_conn c1(d.socket()), c2(d.socket());
  CHECK_THAT(c1.ask(k_hello), Catch::Contains(R"("type":"hello")"));
  CHECK_THAT(c2.ask(k_hello), Catch::Contains(R"("type":"hello")"));

  line_conn c3(d.socket());
  auto refused = c3.line();
  REQUIRE(refused.has_value());
  CHECK_THAT(*refused, Catch::Contains(R"("code":"refused")") &&
                           Catch::Contains("--max-connections 2") &&
                           Catch::Contains("nothing was done"));
  CHECK(c3.closed_by_daemon());
  // The host-side client reports the daemon's reason, not just a hang-up.
  auto via_client = [&]() -> awaitable<void> {
    auto c = co_await sandbox::client::connect(d.socket(), wire::conn_mode::read_only, "t");
    REQUIRE_FALSE(c.has_value());
    CHECK_THAT(c.error().message, Catch::Contains("--max-connections 2"));
  };
  run(via_client());

  c1.shutdown_write();
  CHECK(c1.closed_by_daemon());  // the daemon closed its side: it no longer counts c1
  line_conn c4(d.socket());
  CHECK_THAT(c4.ask(k_hello), Catch::Contains(R"("type":"hello")"));
  auto log = d.full_log();
  CHECK_THAT(log, Catch::Contains("refusing connections: the daemon already serves 2"));
  INFO(log);
  CHECK(log.find("refusing connections") == log.rfind("refusing connections"));  // logged once
  CHECK_THAT(log, Catch::Contains("2 connection(s) were refused while at it"));
}

TEST_CASE("pipelined attaches whose replies are never read leave the daemon's memory bounded",
          "[sandbox][connection][security]") {
  sandbox_daemon d("sbx-conn-unread");
  auto cwd = d.dir().path().string();
  line_conn w(d.socket());
  CHECK_THAT(w.ask(k_hello), Catch::Contains(R"("type":"hello")"));
  // 1 MiB of output, all retained: every attach below answers with all of it.
  auto started = parse_line(w.ask(exec_line("head -c 786432 /dev/zero | base64 -w0", cwd)));
  REQUIRE(field(started, "type") == "started");
  auto job = field(started, "job");
  auto kill_or_done = parse_line(
      w.ask(R"({"type":"attach","id":3,"follow":true,"job":")" + job + R"(","offset":1048575})"));
  // The follow answers once the last byte is there; drain it to its status.
  while (field(kill_or_done, "type") != "status") {
    auto l = w.line();
    REQUIRE(l.has_value());
    kill_or_done = parse_line(*l);
  }
  long before = peak_kib(d.handle().pid);

  // A read-only peer pipelines 300 attaches of the whole output and never reads.
  line_conn r(d.socket());
  CHECK_THAT(r.ask(R"({"type":"hello","v":1,"mode":"read_only","id":1})"),
             Catch::Contains(R"("type":"hello")"));
  std::string batch;
  for (int i = 0; i < 300; ++i)
    batch += R"({"type":"attach","id":)" + std::to_string(10 + i) + R"(,"job":")" + job +
             R"(","max_bytes":1048576})" + "\n";
  r.send(batch);  // ~30 KB: the socket takes it whether or not the daemon reads
  // A round trip on another connection: the daemon has read what r sent.
  CHECK_THAT(w.ask(R"({"type":"list","id":4})"), Catch::Contains(R"("type":"jobs")"));
  long after = peak_kib(d.handle().pid);
  INFO("daemon peak memory before " << before << " KiB, after " << after << " KiB");
  // Unbounded, each attach would hold its 1.4 MB reply: over 400 MB.
  CHECK(after - before < 32 * 1024);
}

TEST_CASE("a connection's requests beyond its in-flight cap wait unread until one is answered",
          "[sandbox][connection][security]") {
  sandbox::daemon_options o;
  o.max_in_flight = 2;
  sandbox_daemon d("sbx-conn-in-flight", o);
  auto cwd = d.dir().path().string();
  line_conn w(d.socket());
  CHECK_THAT(w.ask(k_hello), Catch::Contains(R"("type":"hello")"));
  auto started = parse_line(w.ask(exec_line("sleep 600", cwd)));
  REQUIRE(field(started, "type") == "started");
  auto job = field(started, "job");

  line_conn r(d.socket());
  CHECK_THAT(r.ask(R"({"type":"hello","v":1,"mode":"read_only","id":1})"),
             Catch::Contains(R"("type":"hello")"));
  // Two follows fill the cap until the job ends; the list behind them waits.
  auto follow = [&](int id) {
    return R"({"type":"attach","id":)" + std::to_string(id) + R"(,"follow":true,"job":")" + job +
           R"("})" + "\n";
  };
  r.send(follow(11) + follow(12) + R"({"type":"list","id":13})" + "\n");
  CHECK_THAT(w.ask(R"({"type":"list","id":3})"), Catch::Contains(R"("type":"jobs")"));
  CHECK_THAT(w.ask(R"({"type":"kill","id":4,"wait_ms":0,"job":")" + job + R"("})"),
             Catch::Contains(R"("type":"killed")"));

  int statuses_before_list = 0;
  for (;;) {
    auto l = r.line();
    REQUIRE(l.has_value());
    auto rep = parse_line(*l);
    if (field(rep, "type") == "status") ++statuses_before_list;
    if (field(rep, "type") != "jobs") continue;
    INFO("the list was answered after " << statuses_before_list << " follow(s) ended: " << *l);
    CHECK(statuses_before_list >= 1);
    CHECK_THAT(*l, Catch::Contains(R"("state":"killed")"));
    break;
  }
}

namespace {

int open_descriptors(int pid) {
  int n = 0;
  for ([[maybe_unused]] auto& e :
       std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/fd"))
    ++n;
  return n;
}

// A number after `key` in `text` ("after 12 failed" → 12), or -1.
long number_after(const std::string& text, const std::string& key) {
  auto at = text.find(key);
  return at == std::string::npos ? -1 : std::atol(text.c_str() + at + key.size());
}

}  // namespace

TEST_CASE("the daemon raises its descriptor soft limit at start as far as the hard limit allows",
          "[sandbox][connection]") {
  // The daemon inherits our limit: a soft limit of 1024, common for login shells.
  rlimit saved{};
  REQUIRE(::getrlimit(RLIMIT_NOFILE, &saved) == 0);
  rlimit mine = saved;
  mine.rlim_cur = std::min<rlim_t>(saved.rlim_cur, 1024);
  REQUIRE(::setrlimit(RLIMIT_NOFILE, &mine) == 0);
  struct restore {
    rlimit r;
    ~restore() { ::setrlimit(RLIMIT_NOFILE, &r); }
  } restore_after{saved};
  sandbox_daemon d("sbx-conn-rlimit");
  rlimit its{};
  REQUIRE(::prlimit(d.handle().pid, RLIMIT_NOFILE, nullptr, &its) == 0);
  rlim_t want = 4 * 256 + 1024;  // the default connection cap's needs
  if (mine.rlim_max != RLIM_INFINITY) want = std::min(want, mine.rlim_max);
  CHECK(its.rlim_cur == std::max(mine.rlim_cur, want));
  CHECK(its.rlim_max == mine.rlim_max);
}

TEST_CASE(
    "out of descriptors, the daemon logs once, waits instead of spinning on accept, and "
    "serves again once descriptors are freed",
    "[sandbox][connection][security]") {
#if defined(__SANITIZE_ADDRESS__)
  // UBSan's vptr check probes memory through a pipe(): out of descriptors it
  // reports every virtual call as invalid and halts the daemon.
  WARN("not run in a sanitizer build: the sanitizer runtime itself needs descriptors");
  return;
#endif
  sandbox_daemon d("sbx-conn-emfile");
  int pid = d.handle().pid;
  line_conn first(d.socket());
  CHECK_THAT(first.ask(k_hello), Catch::Contains(R"("type":"hello")"));
  // Room for 8 more connections only.
  rlimit rl{};
  REQUIRE(::prlimit(pid, RLIMIT_NOFILE, nullptr, &rl) == 0);
  rl.rlim_cur = static_cast<rlim_t>(open_descriptors(pid) + 8);
  REQUIRE(::prlimit(pid, RLIMIT_NOFILE, &rl, nullptr) == 0);

  auto started = std::chrono::steady_clock::now();
  std::vector<std::unique_ptr<line_conn>> many;
  INFO("daemon.log:\n" << d.log());
  for (int i = 0; i < 24; ++i) many.push_back(std::make_unique<line_conn>(d.socket()));
  REQUIRE(d.wait_for_log("cannot accept connections", 60s));

  // Free them all: each accepted one is closed by the daemon on end of
  // stream, which lets it accept (and close) the ones still waiting.
  for (auto& c : many) c->shutdown_write();
  for (auto& c : many) CHECK(c->closed_by_daemon());
  first.shutdown_write();
  CHECK(first.closed_by_daemon());
  auto elapsed =
      std::chrono::duration_cast<std::chrono::seconds>(std::chrono::steady_clock::now() - started);

  line_conn again(d.socket());
  CHECK_THAT(again.ask(k_hello), Catch::Contains(R"("type":"hello")"));
  auto log = d.full_log();
  INFO(log);
  CHECK(log.find("cannot accept connections") == log.rfind("cannot accept connections"));
  CHECK_THAT(log, Catch::Contains("Too many open files"));
  long attempts = number_after(log, "accepting connections again after ");
  REQUIRE(attempts >= 1);
  // Each retry waits for a close (at most one per connection opened or closed
  // here) or a 1 s timer; a spinning loop makes thousands of attempts a second.
  CHECK(attempts <= 2 * 25 + elapsed.count() + 2);
}

TEST_CASE(
    "a job whose watcher throws ends with an unknown status that says why, its processes killed",
    "[sandbox][connection]") {
  env_var hook("TETHER_SANDBOXD_THROW_ON", "watch");
  sandbox_daemon d("sbx-watch-throws");
  auto cwd = d.dir().path().string();
  auto body = [&]() -> awaitable<void> {
    auto c = co_await connect(d.socket());
    auto s = co_await c->exec(command("sleep 300", cwd));
    REQUIRE(s.has_value());
    auto done = co_await c->wait(s->job);
    REQUIRE(done.has_value());
    CHECK(done->status.state == protocol::job_state::unknown);
    CHECK_THAT(done->status.reason, Catch::Contains("watcher of this job failed") &&
                                        Catch::Contains("TETHER_SANDBOXD_THROW_ON=watch"));
    CHECK(live_group_members(static_cast<int>(s->pid)).empty());
  };
  run(body());
  CHECK_THAT(d.full_log(), Catch::Contains("watching it failed"));
}

TEST_CASE("a kill whose kill sequence throws is still confirmed, after one escalated retry",
          "[sandbox][connection]") {
  env_var hook("TETHER_SANDBOXD_THROW_ON", "kill_sequence");
  sandbox_daemon d("sbx-kill-throws");
  auto cwd = d.dir().path().string();
  auto body = [&]() -> awaitable<void> {
    auto c = co_await connect(d.socket());
    auto s = co_await c->exec(command("sleep 300", cwd));
    REQUIRE(s.has_value());
    auto k = co_await c->kill(s->job, std::chrono::milliseconds(60000));
    REQUIRE(k.has_value());
    CHECK(k->status.state == protocol::job_state::killed);
    CHECK(k->status.signal == SIGKILL);  // the retry escalated at once
    CHECK(live_group_members(static_cast<int>(s->pid)).empty());
  };
  run(body());
  CHECK_THAT(d.full_log(), Catch::Contains("its kill sequence failed") &&
                               Catch::Contains("trying again with SIGKILL"));
}

TEST_CASE("an idle-exit loop that throws is started again, and the idle daemon still exits",
          "[sandbox][connection]") {
  env_var hook("TETHER_SANDBOXD_THROW_ON", "idle");
  sandbox_daemon d("sbx-idle-throws", idle_exit(100ms));
  int st = d.wait_exit(60s);
  CHECK(WIFEXITED(st));
  CHECK(WEXITSTATUS(st) == 0);
  CHECK_THAT(d.full_log(),
             Catch::Contains("the idle-exit loop failed") && Catch::Contains("idle for 100 ms"));
}
