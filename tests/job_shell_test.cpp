// Local background shells (actors/shell.hpp) found again after a restart.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <boost/asio/io_context.hpp>
#include <catch2/catch.hpp>
#include <fstream>
#include <sstream>

#include "sandbox_support.hpp"
#include "support.hpp"
#include "tether/actors/shell.hpp"

using namespace tether;

namespace {

std::string own_start_time() {
  std::ifstream f("/proc/self/stat");
  std::string line;
  std::getline(f, line);
  std::istringstream in(line.substr(line.rfind(')') + 1));
  std::string field;
  for (int i = 3; i <= 22; ++i) in >> field;
  return field;
}

void write(const std::string& path, const std::string& text) {
  std::ofstream(path) << text;
}

}  // namespace

TEST_CASE("a shell reattached after a restart is watched only if its pid has the same start time",
          "[shell]") {
  test::scratch_dir dir("shell_reattach");
  boost::asio::io_context io;
  std::vector<std::string> notices;
  actors::shell_runner runner(
      io.get_executor(), dir.path().string(),
      [&](const actors::shell_info&, const std::string& n) { notices.push_back(n); });
  // A living process (this test) under the recorded pid, but started at
  // another time: the pid was reused, so the shell is gone and its status unknown.
  write(dir.file("sh_reused.pid"), std::to_string(::getpid()) + " 1\n");
  // A pid file of the old form, without a start time, proves nothing either.
  write(dir.file("sh_bare.pid"), std::to_string(::getpid()) + "\n");
  runner.reattach({"sh_reused", protocol::session_id("s1"), "sleep 1000", -1});
  runner.reattach({"sh_bare", protocol::session_id("s1"), "sleep 1000", -1});
  REQUIRE(runner.running() == 0);  // watching this test's own pid would never end
  io.run();
  REQUIRE(notices.size() == 2);
  for (auto& n : notices) {
    CHECK_THAT(n, Catch::Contains("ended with unknown status"));
    CHECK_THAT(n, Catch::Contains("status: exit -1"));
  }

  // The same pid with its true start time is still the shell: it is watched.
  write(dir.file("sh_live.pid"), std::to_string(::getpid()) + " " + own_start_time() + "\n");
  runner.reattach({"sh_live", protocol::session_id("s1"), "sleep 1000", -1});
  CHECK(runner.running() == 1);
  runner.stop();
}

TEST_CASE("a shell still running when the host restarted is watched again and reports its exit",
          "[shell]") {
  test::scratch_dir dir("shell_live");
  auto started = dir.file("started"), go = dir.file("go");
  REQUIRE(::mkfifo(started.c_str(), 0600) == 0);
  REQUIRE(::mkfifo(go.c_str(), 0600) == 0);
  boost::asio::io_context io;
  std::vector<std::string> notices;
  auto on_exit = [&](const actors::shell_info&, const std::string& n) { notices.push_back(n); };
  actors::shell_info s{"sh_1", protocol::session_id("s1"),
                       "echo up > " + started + "; cat " + go + "; exit 7", -1};
  {
    actors::shell_runner first(io.get_executor(), dir.path().string(), on_exit);
    REQUIRE(first.start(s).has_value());
    first.stop();  // the host stops; the shell runs on
  }
  // The FIFO yields "up" once the command runs, after the wrapper wrote its pid file.
  // It is read to its end: closing it before the shell's echo has written would
  // kill the shell with SIGPIPE, and then nobody would ever open `go`.
  CHECK(test::read_fifo(started) == "up\n");
  actors::shell_runner second(io.get_executor(), dir.path().string(), on_exit);
  second.reattach({"sh_1", protocol::session_id("s1"), s.command, -1});
  CHECK(second.running() == 1);
  test::release_fifo(go);
  io.run();
  REQUIRE(notices.size() == 1);
  CHECK_THAT(notices[0], Catch::StartsWith("[tether] background job sh_1 failed"));
  CHECK_THAT(notices[0], Catch::Contains("status: exit 7"));
}

namespace {
// Sets a variable for one test case and removes it after.
struct scoped_env {
  std::string name;
  scoped_env(std::string n, const std::string& value) : name(std::move(n)) {
    ::setenv(name.c_str(), value.c_str(), 1);
  }
  ~scoped_env() { ::unsetenv(name.c_str()); }
};
}  // namespace

TEST_CASE(
    "a local shell's notice is scrubbed, bounded, and judged by the failing stage of its last "
    "pipeline",
    "[shell][scrub]") {
  const std::string secret = "tok-4f9a1c7e2b8d";
  scoped_env env("DEPLOY_API_TOKEN", secret);
  const std::string ghp = "ghp_aBcDeFgHiJkLmNoPqRsTuVwXyZ0123456789";
  test::scratch_dir dir("shell_scrub");
  boost::asio::io_context io;
  std::vector<std::string> notices;
  actors::shell_runner runner(
      io.get_executor(), dir.path().string(),
      [&](const actors::shell_info&, const std::string& n) { notices.push_back(n); });
  // A megabyte of output before the secrets; the command itself names a
  // known-format token; the last pipeline's first stage fails and `cat` hides it.
  actors::shell_info s{"sh_scrub", protocol::session_id("s1"),
                       "head -c 1000000 /dev/zero | tr '\\0' x; echo; "
                       "echo \"using $DEPLOY_API_TOKEN\"; echo push " +
                           ghp + "; printf '\\033[2Aforged\\n'; (echo tests; exit 3) | cat",
                       -1};
  REQUIRE(runner.start(s).has_value());
  io.run();
  REQUIRE(notices.size() == 1);
  const auto& n = notices[0];
  CHECK(n.find(secret) == std::string::npos);
  CHECK(n.find(ghp) == std::string::npos);
  CHECK(n.find(ghp.substr(0, 12)) == std::string::npos);
  CHECK_THAT(n, Catch::Contains("| using [REDACTED]"));
  CHECK_THAT(n, Catch::Contains("command: head -c 1000000"));
  CHECK_THAT(n, Catch::Contains("[tether] background job sh_scrub failed"));
  CHECK_THAT(n, Catch::Contains("status: stage 1 of 2 ((echo tests; exit 3)) failed: exit 3"));
  CHECK_THAT(n, Catch::Contains("earlier bytes left out"));
  CHECK(n.find('\x1b') == std::string::npos);  // no raw escape reaches the model
  CHECK(n.size() < 6000);
}

TEST_CASE("a local shell's still-running label is scrubbed and bounded", "[shell][scrub]") {
  const std::string secret = "pw-93be0d1c55aa";
  scoped_env env("DB_PASSWORD", secret);
  test::scratch_dir dir("shell_label");
  boost::asio::io_context io;
  actors::shell_runner runner(io.get_executor(), dir.path().string(),
                              [](const actors::shell_info&, const std::string&) {});
  auto label = runner.label("psql \"postgres://app:" + secret + "@db/prod\" -c 'select 1' " +
                            std::string(1000, 'y'));
  CHECK(label.find(secret) == std::string::npos);
  CHECK_THAT(label, Catch::StartsWith("psql"));
  CHECK(label.size() <= 200);
}
