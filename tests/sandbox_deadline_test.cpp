// Client-side deadlines (issue 10, item 23): a daemon that accepts connections
// but reads nothing (SIGSTOP) makes hello, exec and follows a clear
// errc::timeout after the client's deadline, never a silent hang; once it
// resumes, a retry finds the job by id. A silent follow of a live daemon is
// kept alive by the heartbeat. The daemon is really stopped, so the deadline
// must fire whatever the machine's load: no assertion depends on a margin.
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <optional>

#include "sandbox_support.hpp"
#include "tether/runtime/one_shot.hpp"

using namespace tether;
using namespace tether::test;
using Catch::Matchers::Contains;
using protocol::job_id;
using std::chrono::milliseconds;

namespace {

sandbox::client_options short_deadline() {
  sandbox::client_options o;
  o.deadline = milliseconds(300);
  o.heartbeat = milliseconds(100);
  return o;
}

awaitable<result<client_ptr>> dial(std::string socket, sandbox::client_options o) {
  co_return co_await sandbox::client::connect(socket, wire::conn_mode::read_write, "tether_tests",
                                              std::move(o));
}

// A live daemon's requests get a deadline no loaded machine reaches (a hang
// guard): only what must time out runs under short_deadline().
sandbox::client_options live_deadline() {
  sandbox::client_options o;
  o.deadline = std::chrono::seconds(60);
  return o;
}

// Dials a live daemon with short_deadline(): a hello the loaded machine did
// not answer within 300 ms is dialled again (the daemon is not stopped yet,
// so one answers), so no check depends on that margin. After 50 timeouts in
// a row the last one is returned: the daemon is not answering at all.
awaitable<result<client_ptr>> dial_short(std::string socket) {
  for (int tries = 1;; ++tries) {
    auto c = co_await dial(socket, short_deadline());
    if (c || c.error().code != errc::timeout || tries == 50) co_return c;
  }
}

std::string describe(const error& e) {
  return std::string(to_string(e.code)) + ": " + e.message;
}

}  // namespace

TEST_CASE("a stopped daemon makes hello a clear deadline error, and a retry once it resumes works",
          "[sandbox][deadline]") {
  sandbox_daemon d("dl-hello");
  auto cwd = d.dir().path().string();
  d.pause();  // connect succeeds into the listen backlog; hello waits
  // (A client that did connect is closed here, so run() returns either way.)
  auto first = run([&]() -> awaitable<result<wire::hello_rep>> {
    auto c = co_await dial(d.socket(), short_deadline());
    if (!c) co_return c.error();
    auto h = (*c)->hello();
    (*c)->close();
    co_return h;
  }());
  REQUIRE_FALSE(first.has_value());
  INFO(describe(first.error()));
  CHECK(first.error().code == errc::timeout);
  CHECK_FALSE(first.error().answered);
  CHECK_THAT(first.error().message, Contains("did not answer hello within 300 ms"));
  CHECK_THAT(first.error().message, Contains("may be stopped or wedged"));
  CHECK_THAT(first.error().message, Contains(d.socket()));

  d.resume();
  auto body = [&]() -> awaitable<void> {
    auto c = co_await dial(d.socket(), live_deadline());
    INFO((c ? std::string("ok") : describe(c.error())));
    REQUIRE(c.has_value());
    auto done = co_await run_to_end(**c, command("echo again", cwd));
    CHECK(done.status.exit_code == 0);
    CHECK_THAT(done.tail, Contains("again"));
  };
  run(body());
}

TEST_CASE(
    "an exec and a follow on a stopped daemon end with a clear deadline error, and a retry "
    "after it resumes finds the job by id",
    "[sandbox][deadline]") {
  sandbox_daemon d("dl-follow");
  auto cwd = d.dir().path().string();
  auto job = job_id("job-dl-follow");
  auto body = [&]() -> awaitable<void> {
    // The job was started; then the daemon stops, one client follows the
    // job and another sends an exec. (Without a deadline both would wait
    // until the pause guard resumes the daemon, and then fail the checks.)
    // The job is started by a client with a live deadline; the two that
    // must time out connect (hello) before the pause.
    auto starter = co_await dial(d.socket(), live_deadline());
    REQUIRE(starter.has_value());
    auto r = command("echo followed-job", cwd);
    r.job = job;
    auto s = co_await (*starter)->exec(std::move(r));
    REQUIRE(s.has_value());
    auto c = co_await dial_short(d.socket());
    REQUIRE(c.has_value());
    auto other = co_await dial_short(d.socket());
    REQUIRE(other.has_value());
    d.pause();

    auto followed = co_await (*c)->wait(job);
    REQUIRE_FALSE(followed.has_value());
    INFO(describe(followed.error()));
    CHECK(followed.error().code == errc::timeout);
    CHECK_FALSE(followed.error().answered);
    CHECK_THAT(followed.error().message,
               Contains("did not answer for 300 ms while a request waited"));
    CHECK_THAT(followed.error().message, Contains("the daemon keeps its jobs"));

    auto again = co_await (*other)->exec(command("true", cwd));
    REQUIRE_FALSE(again.has_value());
    INFO(describe(again.error()));
    CHECK(again.error().code == errc::timeout);
    CHECK_THAT(again.error().message, Contains("did not answer for 300 ms"));

    // Resumed: the retry follows the same job to its true end.
    d.resume();
    auto retry = co_await dial(d.socket(), live_deadline());
    INFO((retry ? std::string("ok") : describe(retry.error())));
    REQUIRE(retry.has_value());
    auto done = co_await (*retry)->wait(job);
    INFO((done ? std::string("ok") : describe(done.error())));
    REQUIRE(done.has_value());
    CHECK(done->status.exit_code == 0);
    CHECK_THAT(done->tail, Contains("followed-job"));
  };
  run(body());
}

TEST_CASE("a silent follow of a live daemon is kept alive by the heartbeat past the deadline",
          "[sandbox][deadline]") {
  sandbox_daemon d("dl-heartbeat");
  auto cwd = d.dir().path().string();
  auto gate = d.dir().file("gate");
  REQUIRE(::mkfifo(gate.c_str(), 0600) == 0);
  auto body = [&]() -> awaitable<void> {
    // The job stays silent until a probe was answered after the deadline
    // (1.5 s) had passed since its follow began: the follow was kept alive
    // past the deadline by probes alone, however slowly the machine runs. A
    // probe of a live daemon must be answered within the deadline; 1.5 s
    // keeps a loaded machine (a sanitizer build beside the suite) from
    // failing that, where 300 ms once did.
    const auto deadline = milliseconds(1500);
    using clock = std::chrono::steady_clock;
    auto following = std::make_shared<std::optional<clock::time_point>>();
    auto answered = std::make_shared<int>(0);
    auto past_deadline = std::make_shared<bool>(false);
    sandbox::client_options opts;
    opts.deadline = deadline;
    opts.heartbeat = milliseconds(100);
    opts.on_heartbeat = [answered, past_deadline, following, gate, deadline] {
      ++*answered;
      if (!*past_deadline && *following && clock::now() - **following > deadline) {
        *past_deadline = true;
        release_fifo(gate);
      }
    };
    auto c = co_await dial(d.socket(), std::move(opts));
    REQUIRE(c.has_value());
    auto r = command("cat " + gate + "; echo heard-through", cwd);
    auto s = co_await (*c)->exec(std::move(r));
    REQUIRE(s.has_value());
    *following = clock::now();
    auto done = co_await (*c)->wait(s->job);
    INFO((done ? std::string("ok") : describe(done.error())));
    REQUIRE(done.has_value());
    CHECK(*past_deadline);
    CHECK(*answered >= 2);
    CHECK(done->status.exit_code == 0);
    CHECK_THAT(done->tail, Contains("heard-through"));
  };
  run(body());
}
