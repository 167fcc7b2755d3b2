// The sandbox against hostile local users, hostile output and hostile bytes
// (docs/sandbox.md, "Security"): who may connect, which state directory is
// trusted, what job output can do to a notice, and what the decoder refuses.
#include <fcntl.h>
#include <grp.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <optional>

#include "sandbox_support.hpp"

using namespace tether;
using namespace tether::test;
namespace fs = std::filesystem;

namespace {

constexpr uid_t k_other_uid = 65534;  // nobody

// Sets or unsets environment variables for one test, restoring them after.
class env_override {
 public:
  void set(const std::string& name, const char* value) {
    if (!saved_.count(name)) {
      const char* old = std::getenv(name.c_str());
      saved_[name] = old ? std::optional<std::string>(old) : std::nullopt;
    }
    if (value)
      ::setenv(name.c_str(), value, 1);
    else
      ::unsetenv(name.c_str());
  }
  ~env_override() {
    for (auto& [k, v] : saved_) {
      if (v)
        ::setenv(k.c_str(), v->c_str(), 1);
      else
        ::unsetenv(k.c_str());
    }
  }

 private:
  std::map<std::string, std::optional<std::string>> saved_;
};

// A directory under /tmp that another uid can reach (the scratch root may not be).
struct tmp_dir {
  tmp_dir() {
    char t[] = "/tmp/tether-sec-XXXXXX";
    REQUIRE(::mkdtemp(t) != nullptr);
    path = t;
  }
  ~tmp_dir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::string path;
};

std::string slurp(const std::string& file) {
  std::ifstream f(file);
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

bool is_root() {
  if (::geteuid() == 0) return true;
  WARN("this test needs root to act as a second local user; not run");
  return false;
}

void become_other_user() {
  if (::setgroups(0, nullptr) != 0 || ::setgid(k_other_uid) != 0 || ::setuid(k_other_uid) != 0)
    ::_exit(90);
}

}  // namespace

TEST_CASE("with no TETHER_SANDBOX_DIR, HOME or XDG_RUNTIME_DIR there is no state directory",
          "[sandbox][security]") {
  env_override env;
  env.set("TETHER_SANDBOX_DIR", nullptr);
  env.set("HOME", nullptr);
  env.set("XDG_RUNTIME_DIR", nullptr);
  auto none = sandbox::default_state_dir();
  REQUIRE_FALSE(none.has_value());
  CHECK_THAT(none.error().message, Catch::Contains("set TETHER_SANDBOX_DIR"));

  env.set("XDG_RUNTIME_DIR", "/run/user/4242");
  auto xdg = sandbox::default_state_dir();
  REQUIRE(xdg.has_value());
  CHECK(*xdg == "/run/user/4242/tether-sandbox");

  // tether run says what to set and starts nothing.
  std::string out;
  int st = run_process(
      {"/usr/bin/env", "-u", "HOME", "-u", "TETHER_SANDBOX_DIR", "-u", "XDG_RUNTIME_DIR",
       std::string(TETHER_BIN_DIR) + "/tether", "run", "--", "echo hi"},
      &out);
  (void)out;
  REQUIRE(WIFEXITED(st));
  CHECK(WEXITSTATUS(st) == 125);
}

TEST_CASE("a state directory another user owns or may write is refused by client and daemon",
          "[sandbox][security]") {
  if (!is_root()) return;
  tmp_dir t;
  std::string foreign = t.path + "/foreign";
  REQUIRE(::mkdir(foreign.c_str(), 0700) == 0);
  REQUIRE(::chown(foreign.c_str(), k_other_uid, k_other_uid) == 0);
  sandbox::daemon_options o;
  o.state_dir = foreign;
  o.binary = sandboxd_binary();
  o.detach = false;
  auto r = sandbox::ensure_daemon(o);
  REQUIRE_FALSE(r.has_value());
  CHECK_THAT(r.error().message, Catch::Contains("owned by uid 65534"));
  // The daemon checks on its own too.
  std::string out;
  int st = run_process({sandboxd_binary(), "--state-dir", foreign}, &out);
  REQUIRE(WIFEXITED(st));
  CHECK(WEXITSTATUS(st) != 0);
  CHECK_FALSE(fs::exists(foreign + "/lock"));

  std::string shared = t.path + "/shared";
  REQUIRE(::mkdir(shared.c_str(), 0700) == 0);
  REQUIRE(::chmod(shared.c_str(), 0770) == 0);
  o.state_dir = shared;
  auto r2 = sandbox::ensure_daemon(o);
  REQUIRE_FALSE(r2.has_value());
  CHECK_THAT(r2.error().message, Catch::Contains("mode 0770 lets group or others write it"));
  CHECK_FALSE(fs::exists(shared + "/lock"));
}

TEST_CASE("a symbolic link planted in the state directory is never followed",
          "[sandbox][security]") {
  tmp_dir t;
  std::string victim = t.path + "/victim";
  std::ofstream(victim) << "precious\n";
  sandbox::daemon_options o;
  o.binary = sandboxd_binary();
  o.detach = false;

  // lock -> victim: the daemon refuses to open it.
  o.state_dir = t.path + "/a";
  REQUIRE(::mkdir(o.state_dir.c_str(), 0700) == 0);
  REQUIRE(::symlink(victim.c_str(), (o.state_dir + "/lock").c_str()) == 0);
  auto r = sandbox::ensure_daemon(o);
  REQUIRE_FALSE(r.has_value());
  CHECK_THAT(r.error().message, Catch::Contains("lock"));
  CHECK(slurp(victim) == "precious\n");

  // daemon.log -> victim: the client refuses to append to it.
  o.state_dir = t.path + "/b";
  REQUIRE(::mkdir(o.state_dir.c_str(), 0700) == 0);
  REQUIRE(::symlink(victim.c_str(), (o.state_dir + "/daemon.log").c_str()) == 0);
  auto r2 = sandbox::ensure_daemon(o);
  REQUIRE_FALSE(r2.has_value());
  CHECK_THAT(r2.error().message, Catch::Contains("daemon.log"));
  CHECK(slurp(victim) == "precious\n");

  // The state directory itself as a link.
  o.state_dir = t.path + "/c";
  REQUIRE(::symlink((t.path + "/a").c_str(), o.state_dir.c_str()) == 0);
  auto r3 = sandbox::ensure_daemon(o);
  REQUIRE_FALSE(r3.has_value());
  CHECK_THAT(r3.error().message, Catch::Contains("symbolic link"));
}

TEST_CASE("the state directory is created 0700 and the socket 0600", "[sandbox][security]") {
  sandbox_daemon d("sbx-modes");
  struct stat st {};
  REQUIRE(::stat(d.options().state_dir.c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0700);
  REQUIRE(::stat(d.socket().c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0600);
}

TEST_CASE("a client refuses a daemon that runs as another user and sends it nothing",
          "[sandbox][security]") {
  if (!is_root()) return;
  tmp_dir t;
  REQUIRE(::chmod(t.path.c_str(), 0777) == 0);
  std::string sock = t.path + "/sock";
  int ready[2];
  REQUIRE(::pipe(ready) == 0);
  pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    // The impostor: listens as another uid, answers hello, reports what it received.
    ::close(ready[0]);
    become_other_user();
    int l = ::socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::memcpy(a.sun_path, sock.c_str(), sock.size() + 1);
    if (::bind(l, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(l, 4) != 0)
      ::_exit(91);
    [[maybe_unused]] auto w = ::write(ready[1], "r", 1);
    int c = ::accept(l, nullptr, nullptr);
    static const char forged[] =
        "{\"type\":\"hello\",\"id\":1,\"v\":1,\"sandbox_id\":\"sbx_fake\",\"generation\":1,"
        "\"mode\":\"read_write\",\"pid\":1}\n";
    [[maybe_unused]] auto w2 = ::send(c, forged, sizeof forged - 1, MSG_NOSIGNAL);
    char buf[256];
    ssize_t got = 0, n;
    while ((n = ::read(c, buf, sizeof buf)) > 0) got += n;
    ::_exit(got == 0 ? 0 : 1);
  }
  ::close(ready[1]);
  char b;
  REQUIRE(::read(ready[0], &b, 1) == 1);
  ::close(ready[0]);
  auto c = run(sandbox::client::connect(sock, wire::conn_mode::read_write, "tether_tests"));
  REQUIRE_FALSE(c.has_value());
  CHECK_THAT(c.error().message, Catch::Contains("runs as uid 65534"));
  int st = 0;
  REQUIRE(::waitpid(pid, &st, 0) == pid);
  REQUIRE(WIFEXITED(st));
  CHECK(WEXITSTATUS(st) == 0);  // the impostor received not one byte (no hello, no env)
}

TEST_CASE("the daemon hangs up on a client that runs as another user", "[sandbox][security]") {
  if (!is_root()) return;
  tmp_dir t;
  sandbox::daemon_options o;
  o.state_dir = t.path + "/state";
  o.binary = sandboxd_binary();
  o.detach = false;
  auto h = sandbox::ensure_daemon(o);
  REQUIRE(h.has_value());
  // Open the way to the socket, as a careless chmod would.
  REQUIRE(::chmod(t.path.c_str(), 0711) == 0);
  REQUIRE(::chmod(o.state_dir.c_str(), 0711) == 0);
  REQUIRE(::chmod(h->socket_path.c_str(), 0666) == 0);
  std::string sock = h->socket_path;
  pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    become_other_user();
    int s = ::socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::memcpy(a.sun_path, sock.c_str(), sock.size() + 1);
    if (::connect(s, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) ::_exit(92);
    static const char hello[] = "{\"type\":\"hello\",\"id\":1,\"v\":1}\n";
    [[maybe_unused]] auto w = ::send(s, hello, sizeof hello - 1, MSG_NOSIGNAL);
    char buf[256];
    ssize_t got = 0, n;
    while ((n = ::read(s, buf, sizeof buf)) > 0) got += n;
    ::_exit(got == 0 ? 0 : 1);
  }
  int st = 0;
  REQUIRE(::waitpid(pid, &st, 0) == pid);
  REQUIRE(WIFEXITED(st));
  CHECK(WEXITSTATUS(st) == 0);  // connected, and got no answer at all
  REQUIRE(sandbox::stop_daemon(*h).has_value());
  CHECK_THAT(slurp(o.state_dir + "/daemon.log"), Catch::Contains("refused a connection"));
}

TEST_CASE("the daemon keeps its jobs private: jobs/ and job directories 0700, files 0600",
          "[sandbox][security]") {
  mode_t old_mask = ::umask(022);  // the usual umask, which made jobs/ 0755
  sandbox_daemon d("sbx-private");
  ::umask(old_mask);
  auto body = [&]() -> awaitable<void> {
    auto c = co_await connect(d.socket());
    co_await run_to_end(*c, command("echo private", d.dir().path().string()));
  };
  run(body());
  fs::path state = d.options().state_dir;
  auto mode = [](const fs::path& p) {
    struct stat st {};
    REQUIRE(::lstat(p.c_str(), &st) == 0);
    return st.st_mode & 0777;
  };
  CHECK(mode(state / "jobs") == 0700);
  CHECK(mode(state / "spare") == 0700);
  std::size_t jobs = 0;
  for (auto& j : fs::directory_iterator(state / "jobs")) {
    ++jobs;
    INFO(j.path());
    CHECK(mode(j.path()) == 0700);
    for (auto& f : fs::directory_iterator(j.path())) {
      INFO(f.path());
      CHECK(mode(f.path()) == 0600);
    }
  }
  CHECK(jobs == 1);
  for (const char* f : {"sandbox.json", "lock", "daemon.log"}) {
    INFO(f);
    CHECK(mode(state / f) == 0600);
  }
}
