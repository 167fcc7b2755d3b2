// A daemon that dies and is started again over the same state directory: the
// host reconnects read-only and finds its jobs by id, finished or still
// running, and a job whose launch the crash interrupted is reported -1.
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "sandbox_support.hpp"
#include "tether/runtime/crash_point.hpp"

using namespace tether;
using namespace tether::test;
using protocol::job_state;

TEST_CASE("a restarted daemon finds finished and running jobs by id through a read-only connection",
          "[sandbox]") {
  sandbox_daemon d("sbx-restart");
  auto cwd = d.dir().path().string();
  auto fifo = d.dir().file("gate");
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  protocol::job_id finished, running;
  wire::hello_rep before;
  auto launch = [&]() -> awaitable<void> {
    auto c = co_await connect(d.socket());
    before = c->hello();
    auto f = co_await run_to_end(*c, command("echo done-before-restart; exit 7", cwd));
    finished = protocol::job_id(f.job);
    auto s = co_await c->exec(command("echo started; cat gate", cwd));
    REQUIRE(s.has_value());
    running = s->job;
    auto seen = co_await c->wait_for_output(running, "started\n");
    REQUIRE(seen.has_value());
    REQUIRE(*seen);
  };
  run(launch());

  d.crash();  // SIGKILL: no chance to clean up; the running job is orphaned
  d.start();

  auto reattach = [&]() -> awaitable<void> {
    auto ro = co_await connect(d.socket(), wire::conn_mode::read_only);
    CHECK(ro->hello().sandbox == before.sandbox);
    CHECK(ro->hello().generation == before.generation);
    CHECK(ro->hello().mode == wire::conn_mode::read_only);

    auto f = co_await ro->poll(finished);
    REQUIRE(f.has_value());
    REQUIRE(f->has_value());
    CHECK((*f)->status.exit_code == 7);
    CHECK((*f)->tail == "done-before-restart\n");

    // The read-only path cannot start, stop or clean up anything.
    auto x = co_await ro->exec(command("true", cwd));
    REQUIRE_FALSE(x.has_value());
    CHECK(x.error().code == errc::refused);
    auto k = co_await ro->kill(running);
    REQUIRE_FALSE(k.has_value());
    CHECK(k.error().code == errc::refused);
    auto e = co_await ro->expire();
    REQUIRE_FALSE(e.has_value());

    auto l = co_await ro->list();
    REQUIRE(l.has_value());
    bool still_running = false;
    for (auto& j : l->jobs) still_running |= j.job == running && j.state == job_state::running;
    CHECK(still_running);
  };
  run(reattach());

  release_fifo(fifo);  // the orphaned job finishes now

  auto finish = [&]() -> awaitable<void> {
    auto ro = co_await connect(d.socket(), wire::conn_mode::read_only);
    auto done = co_await ro->wait(running);
    REQUIRE(done.has_value());
    CHECK(done->status.state == job_state::exited);
    CHECK(done->status.exit_code == 0);
    CHECK(done->status.capture == protocol::capture_kind::per_stage);
    CHECK(done->tail == "started\n");
  };
  run(finish());
}

TEST_CASE("a crash between recording a job and spawning it is reported as exit -1, not run twice",
          "[sandbox]") {
  sandbox_daemon d("sbx-crashlaunch");
  auto cwd = d.dir().path().string();
  d.stop();
  // Only the daemon reaches this point; the test process never does.
  ::setenv("TETHER_CRASH_AT", "sandboxd.job_recorded", 1);
  d.start();
  ::unsetenv("TETHER_CRASH_AT");
  auto launch = [&]() -> awaitable<void> {
    auto c = co_await connect(d.socket());
    auto r = command("touch ran-marker", cwd);
    r.job = protocol::job_id("job-crash-1");
    auto s = co_await c->exec(std::move(r));
    REQUIRE_FALSE(s.has_value());  // the daemon died before answering
  };
  run(launch());
  int st = 0;
  REQUIRE(::waitpid(d.handle().pid, &st, 0) == d.handle().pid);
  CHECK(WIFSIGNALED(st));
  d.start();
  auto check = [&]() -> awaitable<void> {
    auto ro = co_await connect(d.socket(), wire::conn_mode::read_only);
    auto p = co_await ro->poll(protocol::job_id("job-crash-1"));
    REQUIRE(p.has_value());
    REQUIRE(p->has_value());
    CHECK((*p)->status.state == job_state::unknown);
    CHECK((*p)->status.exit_code == -1);
    CHECK_THAT((*p)->status.reason, Catch::Contains("may not have run"));
  };
  run(check());
  CHECK_FALSE(std::filesystem::exists(d.dir().path() / "ran-marker"));
}

TEST_CASE("a crash right after spawning still yields the job's true status", "[sandbox]") {
  sandbox_daemon d("sbx-crashspawn");
  auto cwd = d.dir().path().string();
  d.stop();
  ::setenv("TETHER_CRASH_AT", "sandboxd.job_spawned", 1);
  d.start();
  ::unsetenv("TETHER_CRASH_AT");
  auto launch = [&]() -> awaitable<void> {
    auto c = co_await connect(d.socket());
    auto r = command("echo hi | sh -c 'cat; exit 6' | cat", cwd);
    r.job = protocol::job_id("job-crash-2");
    auto s = co_await c->exec(std::move(r));
    REQUIRE_FALSE(s.has_value());
  };
  run(launch());
  int st = 0;
  REQUIRE(::waitpid(d.handle().pid, &st, 0) == d.handle().pid);
  d.start();
  auto check = [&]() -> awaitable<void> {
    auto ro = co_await connect(d.socket(), wire::conn_mode::read_only);
    auto done = co_await ro->wait(protocol::job_id("job-crash-2"));
    REQUIRE(done.has_value());
    // Its output pipe died with the daemon, but the launcher's capture did not.
    CHECK(done->status.capture == protocol::capture_kind::per_stage);
    CHECK(done->status.failing_stage == 1);
    CHECK(done->status.exit_code == 6);
  };
  run(check());
}

namespace {

// While alive, this process adopts the orphans of its descendants (the shell
// of a daemon that died), so a test can wait for them.
struct subreaper {
  subreaper() { REQUIRE(::prctl(PR_SET_CHILD_SUBREAPER, 1) == 0); }
  ~subreaper() { ::prctl(PR_SET_CHILD_SUBREAPER, 0); }
};

// Our children that lead their own process group as `comm`, zombies included.
std::vector<pid_t> adopted_group_leaders(const std::string& comm) {
  std::vector<pid_t> out;
  for (auto& e : std::filesystem::directory_iterator("/proc")) {
    auto name = e.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream f(e.path() / "stat");
    std::string line;
    if (!std::getline(f, line)) continue;
    auto open = line.find('('), close = line.rfind(')');
    if (open == std::string::npos || close == std::string::npos) continue;
    std::istringstream in(line.substr(close + 2));
    std::string state;
    long ppid = 0, pgrp = 0;
    in >> state >> ppid >> pgrp;
    auto pid = std::stol(name);
    if (ppid == ::getpid() && pgrp == pid && line.substr(open + 1, close - open - 1) == comm)
      out.push_back(static_cast<pid_t>(pid));
  }
  return out;
}

}  // namespace

TEST_CASE("a daemon killed between spawning a job and recording it running never runs its command",
          "[sandbox]") {
  sandbox_daemon d("sbx-crashgate");
  auto cwd = d.dir().path().string();
  d.stop();
  subreaper adopt;  // the daemon is our child: its orphaned shell becomes ours
  ::setenv("TETHER_CRASH_AT", "sandboxd.job_spawned_unrecorded", 1);
  d.start();
  ::unsetenv("TETHER_CRASH_AT");
  auto launch = [&]() -> awaitable<void> {
    auto c = co_await connect(d.socket());
    auto r = command("touch ran-marker", cwd);
    r.job = protocol::job_id("job-crash-3");
    auto s = co_await c->exec(std::move(r));
    REQUIRE_FALSE(s.has_value());  // the daemon died before answering
  };
  run(launch());
  int st = 0;
  REQUIRE(::waitpid(d.handle().pid, &st, 0) == d.handle().pid);
  REQUIRE(WIFSIGNALED(st));
  // The shell had been spawned; it was reparented to us when the daemon died.
  auto shells = adopted_group_leaders("bash");
  REQUIRE(shells.size() == 1);
  int shell_st = 0;
  REQUIRE(::waitpid(shells[0], &shell_st, 0) == shells[0]);
  INFO("the orphaned shell's wait status: " << shell_st);
  CHECK(WIFEXITED(shell_st));
  CHECK(WEXITSTATUS(shell_st) == 125);  // it left at its go gate
  CHECK_FALSE(std::filesystem::exists(d.dir().path() / "ran-marker"));

  d.start();
  auto check = [&]() -> awaitable<void> {
    auto ro = co_await connect(d.socket(), wire::conn_mode::read_only);
    auto p = co_await ro->poll(protocol::job_id("job-crash-3"));
    REQUIRE(p.has_value());
    REQUIRE(p->has_value());
    CHECK((*p)->status.state == job_state::unknown);
    CHECK((*p)->status.exit_code == -1);
    CHECK_THAT((*p)->status.reason, Catch::Contains("may not have run"));
  };
  run(check());
  CHECK_FALSE(std::filesystem::exists(d.dir().path() / "ran-marker"));
}

TEST_CASE(
    "a completed job's record is kept until its host expires it, and dropped past the far bound",
    "[sandbox]") {
  sandbox_daemon d("sbx-keepdone");  // default bound: hours
  auto cwd = d.dir().path().string();
  protocol::job_id recent, ancient;
  auto launch = [&]() -> awaitable<void> {
    auto c = co_await connect(d.socket());
    recent = protocol::job_id((co_await run_to_end(*c, command("echo finished; exit 0", cwd))).job);
    ancient = protocol::job_id((co_await run_to_end(*c, command("echo long-ago", cwd))).job);
  };
  run(launch());
  d.stop();
  // The host was down 23 s (longer than the old 20 s grace) while `recent`
  // ended; `ancient` ended 7 h ago and no host ever came back for it.
  age_completed_record(d.options().state_dir, recent, 23'000);
  age_completed_record(d.options().state_dir, ancient, 7 * 3600 * 1000);
  d.start();
  auto check = [&]() -> awaitable<void> {
    auto ro = co_await connect(d.socket(), wire::conn_mode::read_only);
    auto p = co_await ro->poll(recent);
    REQUIRE(p.has_value());
    REQUIRE(p->has_value());
    CHECK((*p)->status.state == job_state::exited);
    CHECK((*p)->status.exit_code == 0);
    CHECK((*p)->tail == "finished\n");
    auto gone = co_await ro->poll(ancient);
    REQUIRE_FALSE(gone.has_value());
    CHECK(gone.error().code == errc::not_found);

    // The host, its receipt written, expires it.
    auto rw = co_await connect(d.socket());
    auto e = co_await rw->expire(recent);
    REQUIRE(e.has_value());
    CHECK(*e == std::vector<protocol::job_id>{recent});
    auto l = co_await ro->list();
    REQUIRE(l.has_value());
    CHECK(l->jobs.empty());
  };
  run(check());
  CHECK_THAT(d.log(), Catch::Contains("job " + ancient.str() +
                                      " ended 25200 s ago and no host "
                                      "expired it within --grace-ms 21600000; its record was "
                                      "removed"));
  CHECK_FALSE(std::filesystem::exists(std::filesystem::path(d.options().state_dir) / "jobs" /
                                      ancient.str()));
}
