// tether-sandboxd with real processes: pipeline stage capture, signals, kill
// with confirmation, the grace period and the -1 path, scrubbing through the
// daemon, isolation, idempotent exec, and bad input.
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <csignal>
#include <fstream>

#include "sandbox_support.hpp"
#include "tether/protocol/json.hpp"

using namespace tether;
using namespace tether::test;
using protocol::job_state;

TEST_CASE(
    "a daemon says its sandbox id, generation and protocol version, --replace bumps the generation",
    "[sandbox]") {
  sandbox::daemon_options o;
  o.sandbox_id = "sbx-hello";
  sandbox_daemon d("sbx-hello", o);
  auto hello = [&]() -> awaitable<wire::hello_rep> {
    auto c = co_await connect(d.socket());
    co_return c->hello();
  };
  auto h1 = run(hello());
  CHECK(h1.sandbox == protocol::sandbox_id("sbx-hello"));
  CHECK(h1.generation == 1);
  CHECK(h1.version == wire::k_version);
  CHECK(h1.pid == d.handle().pid);

  d.stop();
  d.start();  // the same sandbox again: same generation
  CHECK(run(hello()).generation == 1);

  d.stop();
  d.options().replace = true;
  d.start();
  auto h3 = run(hello());
  CHECK(h3.generation == 2);
  CHECK(h3.sandbox == protocol::sandbox_id("sbx-hello"));

  d.stop();
  d.options().replace = false;
  d.options().sandbox_id = "sbx-other";
  auto refused = sandbox::ensure_daemon(d.options());
  REQUIRE_FALSE(refused.has_value());
  CHECK_THAT(refused.error().message, Catch::Contains("belongs to sandbox 'sbx-hello'"));
}

TEST_CASE("the failing stage of the last pipeline is reported: first, middle or last",
          "[sandbox]") {
  sandbox_daemon d("sbx-stages");
  auto cwd = d.dir().path().string();
  auto body = [&]() -> awaitable<void> {
    auto c = co_await connect(d.socket());

    auto first =
        co_await run_to_end(*c, command("sh -c 'echo compiling; exit 101' | tail -n 20", cwd));
    CHECK(first.status.state == job_state::exited);
    CHECK(first.status.exit_code == 101);
    CHECK(first.status.shell_code == 0);
    CHECK(first.status.failing_stage == 0);
    REQUIRE(first.status.stages.size() == 2);
    CHECK(first.status.stages[0].command == "sh -c 'echo compiling; exit 101'");
    CHECK(first.status.stages[1].code == 0);
    CHECK(first.tail == "compiling\n");
    CHECK_THAT(protocol::render_notice(first),
               Catch::Contains("stage 1 of 2 (sh -c 'echo compiling; exit 101') failed: exit 101"));

    auto middle = co_await run_to_end(*c, command("printf 'a\\nb\\n' | grep zzz | cat", cwd));
    CHECK(middle.status.failing_stage == 1);
    CHECK(middle.status.exit_code == 1);
    CHECK(middle.status.shell_code == 0);
    CHECK(middle.status.stages[1].command == "grep zzz");

    auto last =
        co_await run_to_end(*c, command("cd /tmp && printf 'a\\n' | cat | grep -q zzz", cwd));
    CHECK(last.status.failing_stage == 2);
    CHECK(last.status.exit_code == 1);
    CHECK(last.status.shell_code == 1);
    CHECK(last.status.stages.size() == 3);

    auto ok = co_await run_to_end(*c, command("echo fine | cat", cwd));
    CHECK(ok.status.state == job_state::exited);
    CHECK(ok.status.exit_code == 0);
    CHECK(ok.status.failing_stage == -1);
    CHECK(ok.status.capture == protocol::capture_kind::per_stage);
  };
  run(body());
}

TEST_CASE("signals: a stage killed by a signal, and a shell killed outright", "[sandbox]") {
  sandbox_daemon d("sbx-signals");
  auto cwd = d.dir().path().string();
  auto body = [&]() -> awaitable<void> {
    auto c = co_await connect(d.socket());
    auto segv = co_await run_to_end(*c, command("sh -c 'kill -SEGV $$' | cat", cwd));
    CHECK(segv.status.failing_stage == 0);
    CHECK(segv.status.stages[0].signal == SIGSEGV);
    CHECK(segv.status.exit_code == 128 + SIGSEGV);
    CHECK_THAT(protocol::render_status_line(segv.status), Catch::Contains("killed by SIGSEGV"));

    auto self = co_await run_to_end(*c, command("echo going; kill -KILL $$", cwd));
    CHECK(self.status.capture == protocol::capture_kind::shell_only);
    CHECK(self.status.signal == SIGKILL);
    CHECK(self.status.exit_code == 128 + SIGKILL);
    CHECK(self.tail == "going\n");

    auto exits = co_await run_to_end(*c, command("echo before; exit 3", cwd));
    CHECK(exits.status.capture == protocol::capture_kind::shell_only);
    CHECK(exits.status.exit_code == 3);
    CHECK_THAT(protocol::render_notice(exits), Catch::Contains("the shell's status only"));
  };
  run(body());
}

TEST_CASE("output and preview are scrubbed on the sandbox side, and the status is unchanged",
          "[sandbox]") {
  sandbox_daemon d("sbx-scrub");
  auto cwd = d.dir().path().string();
  const std::string value = "Zq8mV2pL9xRt44";
  const std::string literal = "ghp_aBcDeFgHiJkLmNoPqRsTuVwXyZ0123456789";
  auto body = [&]() -> awaitable<void> {
    auto c = co_await connect(d.socket());
    // The secret is written in two pieces, as two writes.
    auto r = command(
        "printf 'val=%s' \"${MY_API_TOKEN:0:5}\"; printf '%s\\n' \"${MY_API_TOKEN:5}\"; "
        "echo pushing with " +
            literal + "; exit 3",
        cwd, {{"MY_API_TOKEN", value}});
    auto s = co_await c->exec(std::move(r));
    REQUIRE(s.has_value());
    auto done = co_await c->wait(s->job);
    REQUIRE(done.has_value());
    CHECK(done->status.exit_code == 3);
    auto notice = protocol::render_notice(*done);
    INFO(notice);
    CHECK(notice.find(value) == std::string::npos);
    CHECK(notice.find(value.substr(5)) == std::string::npos);
    CHECK(notice.find(literal) == std::string::npos);
    CHECK(notice.find("[REDACTED]") != std::string::npos);
    CHECK(done->preview.text.find(literal) == std::string::npos);
    // What attach returns is scrubbed too.
    auto all = co_await c->attach(s->job, 0);
    REQUIRE(all.has_value());
    CHECK(all->data.find(value.substr(5)) == std::string::npos);
    CHECK(all->data.find("val=[REDACTED]") != std::string::npos);
  };
  run(body());
}

TEST_CASE("kill confirms a process group that ignores TERM is gone, after escalating to KILL",
          "[sandbox]") {
  sandbox_daemon d("sbx-kill");
  auto cwd = d.dir().path().string();
  auto body = [&]() -> awaitable<void> {
    auto c = co_await connect(d.socket());
    auto s = co_await c->exec(command("trap '' TERM; sleep 300 & echo ready; wait", cwd));
    REQUIRE(s.has_value());
    auto seen = co_await c->wait_for_output(s->job, "ready");
    REQUIRE(seen.has_value());
    REQUIRE(*seen);
    auto still = co_await c->poll(s->job);
    REQUIRE(still.has_value());
    CHECK_FALSE(still->has_value());  // running: no completion yet
    auto pgid = static_cast<int>(s->pid);
    CHECK(live_group_members(pgid).size() >= 2);  // the shell and its sleep
    auto k = co_await c->kill(s->job, std::chrono::milliseconds(100));
    REQUIRE(k.has_value());
    CHECK(k->status.state == job_state::killed);
    CHECK(k->status.signal == SIGKILL);
    CHECK(live_group_members(pgid).empty());  // confirmed before the reply
    CHECK_THAT(protocol::render_notice(*k), Catch::Contains("was stopped"));

    auto polite = co_await c->exec(command("sleep 300", cwd));
    REQUIRE(polite.has_value());
    auto k2 = co_await c->kill(polite->job, std::chrono::milliseconds(60000));
    REQUIRE(k2.has_value());
    CHECK(k2->status.signal == SIGTERM);
    CHECK(live_group_members(static_cast<int>(polite->pid)).empty());
  };
  run(body());
}

TEST_CASE("completed jobs are kept for the grace period: a late poll gets the true status",
          "[sandbox]") {
  sandbox_daemon d("sbx-grace");  // default grace: 20 s
  auto cwd = d.dir().path().string();
  auto body = [&]() -> awaitable<void> {
    auto a = co_await connect(d.socket());
    auto done = co_await run_to_end(*a, command("echo built; exit 5", cwd));
    REQUIRE(done.status.exit_code == 5);
    auto late = co_await connect(d.socket());  // knows nothing of the job but its id
    auto p = co_await late->poll(protocol::job_id(done.job));
    REQUIRE(p.has_value());
    REQUIRE(p->has_value());
    CHECK((*p)->status.exit_code == 5);
    CHECK((*p)->status.state == job_state::exited);
    CHECK((*p)->tail == "built\n");
  };
  run(body());
}

TEST_CASE(
    "if cleanup won the race the retained output comes back with exit -1, no output is an error",
    "[sandbox]") {
  sandbox_daemon d("sbx-minus1");
  auto cwd = d.dir().path().string();
  auto body = [&]() -> awaitable<void> {
    auto a = co_await connect(d.socket());
    auto s = co_await a->exec(command("echo partial-output; exit 4", cwd));
    REQUIRE(s.has_value());
    auto watcher = co_await connect(d.socket());
    REQUIRE((co_await watcher->wait(s->job)).has_value());
    // `a` has read the output but not yet the status when cleanup runs.
    auto out = co_await a->attach(s->job, 0);
    REQUIRE(out.has_value());
    CHECK(out->data == "partial-output\n");
    auto gone = co_await a->expire(s->job);
    REQUIRE(gone.has_value());
    CHECK(gone->size() == 1);

    auto p = co_await a->poll(s->job);
    REQUIRE(p.has_value());
    REQUIRE(p->has_value());
    CHECK((*p)->status.state == job_state::unknown);
    CHECK((*p)->status.exit_code == -1);
    CHECK((*p)->tail == "partial-output\n");
    CHECK((*p)->preview.text == "echo partial-output; exit 4");
    CHECK_THAT(protocol::render_notice(**p), Catch::Contains("status: exit -1 (status unknown"));

    auto fresh = co_await connect(d.socket());
    auto none = co_await fresh->poll(s->job);
    REQUIRE_FALSE(none.has_value());
    CHECK(none.error().code == errc::not_found);
    CHECK_THAT(none.error().message, Catch::Contains("captured no output"));
    auto w = co_await fresh->wait(s->job);
    REQUIRE_FALSE(w.has_value());
  };
  run(body());
}

TEST_CASE("the grace timer cleans completed jobs up by itself", "[sandbox]") {
  sandbox::daemon_options o;
  o.grace = std::chrono::milliseconds(1);
  sandbox_daemon d("sbx-expiry", o);
  auto cwd = d.dir().path().string();
  protocol::job_id job;
  auto body = [&]() -> awaitable<void> {
    auto a = co_await connect(d.socket());
    // No wait(): with a 1 ms grace the record may be gone before a wait's
    // attach reaches the daemon, and that race is not what this tests.
    auto s = co_await a->exec(command("echo short-lived", cwd));
    REQUIRE(s.has_value());
    job = s->job;
    // Wait on the daemon's revision changes (events, not time) until it is gone.
    std::uint64_t rev = 0;
    for (;;) {
      auto l = co_await a->list(rev == 0 ? std::optional<std::uint64_t>{} : rev);
      REQUIRE(l.has_value());
      bool present = false;
      for (auto& j : l->jobs) {
        if (j.job != job) continue;
        present = true;
        if (j.state != protocol::job_state::running) CHECK(j.exit_code == 0);
      }
      if (!present) break;
      rev = l->revision;
    }
    auto fresh = co_await connect(d.socket());
    auto p = co_await fresh->poll(job);
    REQUIRE_FALSE(p.has_value());
    CHECK(p.error().code == errc::not_found);
  };
  run(body());
  // The grace timer removed it, after the job had ended: nothing else does.
  CHECK_THAT(d.log(), Catch::Contains("job " + job.str() +
                                      ": no host expired it within --grace-ms 1 after it "
                                      "ended; its record was removed"));
  CHECK_FALSE(std::filesystem::exists(d.dir().path() / "state" / "jobs" / job.str()));
}

TEST_CASE("a client that disconnects mid-stream loses nothing", "[sandbox]") {
  sandbox_daemon d("sbx-disconnect");
  auto cwd = d.dir().path().string();
  auto fifo = d.dir().file("gate");
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  auto body = [&]() -> awaitable<void> {
    protocol::job_id job;
    std::uint64_t seen = 0;
    {
      auto a = co_await connect(d.socket());
      auto s = co_await a->exec(command("echo first; cat gate; echo second", cwd));
      REQUIRE(s.has_value());
      job = s->job;
      auto first = co_await a->wait_for_output(job, "first\n");
      REQUIRE(first.has_value());
      REQUIRE(*first);
      seen = a->retained(job)->total();
    }  // `a` disconnects while the job runs and its attach is streaming
    release_fifo(fifo);
    auto b = co_await connect(d.socket());
    auto rest = co_await b->wait(job);
    REQUIRE(rest.has_value());
    CHECK(rest->status.exit_code == 0);
    auto from = co_await b->attach(job, seen);
    REQUIRE(from.has_value());
    CHECK(from->data == "second\n");
    auto all = co_await b->attach(job, 0);
    REQUIRE(all.has_value());
    CHECK(all->data == "first\nsecond\n");
  };
  run(body());
}

TEST_CASE("exec with a job id the daemon knows starts nothing new", "[sandbox]") {
  sandbox_daemon d("sbx-idem");
  auto cwd = d.dir().path().string();
  auto body = [&]() -> awaitable<void> {
    auto c = co_await connect(d.socket());
    auto r = command("echo once", cwd);
    r.job = protocol::job_id("job-fixed-1");
    auto again = r;
    auto s1 = co_await c->exec(std::move(r));
    REQUIRE(s1.has_value());
    CHECK_FALSE(s1->existing);
    REQUIRE((co_await c->wait(s1->job)).has_value());
    auto s2 = co_await c->exec(std::move(again));
    REQUIRE(s2.has_value());
    CHECK(s2->existing);
    CHECK(s2->pid == s1->pid);
    auto all = co_await c->attach(s1->job, 0);
    REQUIRE(all.has_value());
    CHECK(all->data == "once\n");
  };
  run(body());
}

TEST_CASE("connecting never starts a daemon, read-only or not, no daemon is an error",
          "[sandbox]") {
  scratch_dir dir("sbx-nodaemon");
  auto body = [&]() -> awaitable<void> {
    auto sock = sandbox::socket_path_for(dir.file("state"));
    for (auto mode : {wire::conn_mode::read_only, wire::conn_mode::read_write}) {
      auto c = co_await sandbox::client::connect(sock, mode);
      REQUIRE_FALSE(c.has_value());
      CHECK(c.error().code == errc::not_found);
      CHECK_THAT(c.error().message, Catch::Contains("never starts one"));
    }
  };
  run(body());
  CHECK_FALSE(std::filesystem::exists(dir.file("state")));
}

TEST_CASE("exec refuses a missing working directory, naming it", "[sandbox]") {
  sandbox_daemon d("sbx-cwd");
  auto body = [&]() -> awaitable<void> {
    auto c = co_await connect(d.socket());
    auto s = co_await c->exec(command("true", "/nonexistent/tether-dir"));
    REQUIRE_FALSE(s.has_value());
    CHECK(s.error().code == errc::invalid);
    CHECK_THAT(s.error().message, Catch::Contains("cwd '/nonexistent/tether-dir'"));
  };
  run(body());
}

TEST_CASE("isolated jobs run in bubblewrap: read-only root, writable work dir, no network",
          "[sandbox]") {
  if (::access("/usr/bin/bwrap", X_OK) != 0) {
    WARN("SKIPPED: bwrap is not installed; isolation not tested");
    return;
  }
  sandbox_daemon d("sbx-bwrap");
  auto cwd = d.dir().path().string();
  std::string unavailable;
  auto body = [&]() -> awaitable<void> {
    auto c = co_await connect(d.socket());
    auto r = command(
        "touch /etc/tether-probe 2>/dev/null && echo wrote-etc; echo ok > here.txt && cat "
        "here.txt; "
        "grep -c : /proc/net/dev",
        cwd);
    r.isolate = true;
    auto s = co_await c->exec(std::move(r));
    // Where the kernel or a container forbids user namespaces (a chroot, a
    // locked-down CI container) the daemon says so: the test is skipped, loudly.
    if (!s && s.error().code == errc::refused &&
        s.error().message.find("unavailable here") != std::string::npos) {
      unavailable = s.error().message;
      co_return;
    }
    INFO("exec: " << (s ? std::string("ok") : s.error().message));
    REQUIRE(s.has_value());
    auto done = co_await c->wait(s->job);
    REQUIRE(done.has_value());
    CHECK(done->status.exit_code == 0);
    CHECK(done->tail == "ok\n1\n");  // /proc/net/dev lists only lo
  };
  run(body());
  if (!unavailable.empty()) {
    WARN("SKIPPED: isolation cannot be tested on this machine: " << unavailable);
    return;
  }
  CHECK(std::filesystem::exists(d.dir().path() / "here.txt"));
  CHECK_FALSE(std::filesystem::exists("/etc/tether-probe"));
}

TEST_CASE("isolation bubblewrap cannot set up is refused with bwrap's reason and nothing runs",
          "[sandbox]") {
  // A bwrap that fails as it does where user namespaces are forbidden.
  scratch_dir tools("sbx-nouserns-tools");
  auto fake = tools.file("bwrap");
  std::ofstream(fake) << "#!/bin/sh\n"
                         "echo 'bwrap: No permissions to create new namespace, likely because the "
                         "kernel does not allow non-privileged user namespaces.' >&2\n"
                         "exit 1\n";
  REQUIRE(::chmod(fake.c_str(), 0700) == 0);
  ::setenv("TETHER_SANDBOXD_BWRAP", fake.c_str(), 1);
  sandbox_daemon d("sbx-nouserns");
  ::unsetenv("TETHER_SANDBOXD_BWRAP");
  auto cwd = d.dir().path().string();
  auto body = [&]() -> awaitable<void> {
    auto c = co_await connect(d.socket());
    for (int attempt = 0; attempt < 2; ++attempt) {  // the second answer comes from the cache
      auto r = command("touch ran-marker", cwd);
      r.isolate = true;
      auto s = co_await c->exec(std::move(r));
      REQUIRE_FALSE(s.has_value());
      CHECK(s.error().code == errc::refused);
      CHECK_THAT(s.error().message,
                 Catch::Contains("isolation was requested but is unavailable here: " + fake +
                                 " cannot set up an isolated shell here (exit 1): bwrap: No "
                                 "permissions to create new namespace"));
      CHECK_THAT(s.error().message, Catch::Contains("nothing was started (a job never runs "
                                                    "unisolated in its place)"));
    }
    // Without isolation the same daemon runs commands as before.
    auto done = co_await run_to_end(*c, command("echo plain", cwd));
    CHECK(done.status.exit_code == 0);
  };
  run(body());
  CHECK_FALSE(std::filesystem::exists(d.dir().path() / "ran-marker"));
  CHECK_THAT(d.log(), Catch::Contains("isolation is unavailable: " + fake));
}

namespace {

// A raw connection that writes lines and reads reply lines, blocking.
class raw_conn {
 public:
  explicit raw_conn(const std::string& path) {
    fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::snprintf(a.sun_path, sizeof a.sun_path, "%s", path.c_str());
    REQUIRE(::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  }
  ~raw_conn() { ::close(fd_); }
  void send(const std::string& s) {
    std::size_t off = 0;
    while (off < s.size()) {
      auto n = ::write(fd_, s.data() + off, s.size() - off);
      REQUIRE(n > 0);
      off += static_cast<std::size_t>(n);
    }
  }
  protocol::json::value reply() {
    for (;;) {
      auto nl = buf_.find('\n');
      if (nl != std::string::npos) {
        auto line = buf_.substr(0, nl);
        buf_.erase(0, nl + 1);
        auto v = protocol::parse_json(line);
        REQUIRE(v.has_value());
        return *v;
      }
      char tmp[4096];
      auto n = ::read(fd_, tmp, sizeof tmp);
      REQUIRE(n > 0);
      buf_.append(tmp, static_cast<std::size_t>(n));
    }
  }
  std::string ask(const std::string& line) {
    send(line + "\n");
    auto v = reply();
    return boost::json::serialize(v);
  }

 private:
  int fd_;
  std::string buf_;
};

}  // namespace

TEST_CASE("malformed or unknown input gets an error reply and never takes the daemon down",
          "[sandbox]") {
  sandbox_daemon d("sbx-malformed");
  raw_conn r(d.socket());
  CHECK_THAT(r.ask("garbage"), Catch::Contains("not valid JSON"));
  CHECK_THAT(r.ask(R"({"type":"list","id":2})"), Catch::Contains("send hello first"));
  CHECK_THAT(r.ask(R"({"type":"hello","v":99,"id":3})"),
             Catch::Contains("unsupported_version") && Catch::Contains("asked for 99"));
  CHECK_THAT(r.ask(R"({"type":"hello","v":1,"id":4})"), Catch::Contains(R"("type":"hello")"));
  CHECK_THAT(r.ask(R"({"type":"exec","id":5,"command":"ls"})"),
             Catch::Contains(R"("id":5)") && Catch::Contains("cwd: missing"));
  CHECK_THAT(r.ask(R"({"type":"reboot","id":6})"),
             Catch::Contains("unknown request type 'reboot'"));
  CHECK_THAT(r.ask(R"({"type":"attach","id":7,"job":"no-such-job"})"),
             Catch::Contains("not_found") && Catch::Contains("no-such-job"));
  CHECK_THAT(r.ask(R"({"type":"kill","id":8,"job":"x","wait_ms":-5})"), Catch::Contains("wait_ms"));
  // A line over the limit is discarded with an error; the connection goes on.
  std::string huge(wire::k_max_line + 100, 'x');
  CHECK_THAT(r.ask(huge), Catch::Contains("longer than"));
  CHECK_THAT(r.ask(R"({"type":"list","id":9})"), Catch::Contains(R"("type":"jobs")"));
  // And the daemon still serves new connections.
  raw_conn r2(d.socket());
  CHECK_THAT(r2.ask(R"({"type":"hello","v":1,"mode":"read_only","id":1})"),
             Catch::Contains(R"("mode":"read_only")"));
  CHECK_THAT(r2.ask(R"({"type":"exec","id":2,"command":"true","cwd":"/"})"),
             Catch::Contains("read-only"));
}

TEST_CASE("a second hello is refused: a read-only connection stays read-only",
          "[sandbox][security]") {
  sandbox_daemon d("sbx-hello-twice");
  raw_conn r(d.socket());
  CHECK_THAT(r.ask(R"({"type":"hello","v":1,"mode":"read_only","id":1})"),
             Catch::Contains(R"("mode":"read_only")"));
  CHECK_THAT(r.ask(R"({"type":"hello","v":1,"mode":"read_write","id":2})"),
             Catch::Contains("refused") && Catch::Contains("hello was already said"));
  auto cwd = d.dir().path().string();
  CHECK_THAT(r.ask(R"({"type":"exec","id":3,"command":"touch upgraded","cwd":")" + cwd + R"("})"),
             Catch::Contains("read-only"));
  CHECK_FALSE(std::filesystem::exists(d.dir().path() / "upgraded"));
}

TEST_CASE("following a job keeps only the bounded tail of its output, however much it prints",
          "[sandbox]") {
  sandbox_daemon d("sbx-follow-bounded");
  auto cwd = d.dir().path().string();
  auto body = [&]() -> awaitable<void> {
    auto c = co_await connect(d.socket());
    // 8 MiB of output, eight times what the client retains.
    auto done = co_await run_to_end(*c, command("head -c 8388608 /dev/zero | tr '\\0' x", cwd));
    CHECK(done.status.exit_code == 0);
    CHECK(done.output_bytes == 8388608u);
    auto* kept = c->retained(protocol::job_id(done.job));
    REQUIRE(kept != nullptr);
    CHECK(kept->head().size() + kept->tail().size() <= protocol::head_tail::k_default_limit);
    INFO("bytes the follow collected besides the retained copy");
    CHECK(c->largest_buffer() == 0);
  };
  run(body());
}
