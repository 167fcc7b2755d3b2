// A daemon that dies and is started again over the same state directory: the
// host reconnects read-only and finds its jobs by id, finished or still
// running, and a job whose launch the crash interrupted is reported -1.
#include <sys/stat.h>
#include <sys/wait.h>

#include <cstdlib>

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
