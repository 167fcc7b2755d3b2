// A delegate's owner identity, and whether its owner is provably gone: only
// `gone` lets recovery reclaim, so every doubt must read `uncertain` or
// `alive`. The probes run against real processes started here, and every
// event a test waits for (a child's exit) is observed, never slept for.
#include "tether/runtime/owner_identity.hpp"

#include <fcntl.h>
#include <poll.h>
#include <spawn.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "catch_result.hpp"
#include "support.hpp"

using namespace tether;
using runtime::owner_liveness;
using runtime::process_identity;

extern char** environ;

namespace {

constexpr auto k_exit_limit = std::chrono::seconds(60);  // a bound on a hang, not a sync margin

bool is_nonce(const std::string& s) {
  if (s.size() != 32) return false;
  for (char c : s)
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  return true;
}

// Waits until `pid` (our child) has exited, without reaping it; false if it
// is still running at `limit`.
bool wait_exited(pid_t pid, std::chrono::milliseconds limit) {
  int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
  if (pidfd < 0) return false;
  pollfd p{pidfd, POLLIN, 0};
  int ready;
  do ready = ::poll(&p, 1, static_cast<int>(limit.count()));
  while (ready < 0 && errno == EINTR);
  ::close(pidfd);
  return ready == 1;
}

// A real child process (`program -c '...'`, i.e. a shell) that runs until
// its stdin closes: finish() closes it, so the child exits when we say. The
// constructor returns once the child has written a line, so its exec is
// complete (posix_spawn may return before the kernel has set the new name).
class blocked_child {
 public:
  explicit blocked_child(const std::string& program = "/bin/sh") {
    int in[2], out[2];
    REQUIRE(::pipe2(in, O_CLOEXEC) == 0);
    REQUIRE(::pipe2(out, O_CLOEXEC) == 0);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, in[0], 0);  // dup2 clears CLOEXEC on the copies
    posix_spawn_file_actions_adddup2(&fa, out[1], 1);
    std::vector<std::string> args = {program, "-c", "echo started && read x"};
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    int rc = ::posix_spawn(&pid_, program.c_str(), &fa, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&fa);
    ::close(in[0]);
    ::close(out[1]);
    write_fd_ = in[1];
    REQUIRE(rc == 0);
    pollfd p{out[0], POLLIN, 0};
    int ready;
    do ready = ::poll(&p, 1, static_cast<int>(std::chrono::milliseconds(k_exit_limit).count()));
    while (ready < 0 && errno == EINTR);
    char line[16] = {};
    ssize_t n = ready == 1 ? ::read(out[0], line, sizeof line - 1) : -1;
    ::close(out[0]);
    const std::string said(line, n > 0 ? static_cast<std::size_t>(n) : 0);
    if (said != "started\n") {  // never leave a child behind
      finish();
      ::kill(pid_, SIGKILL);  // our own child, by its id
      reap();
    }
    REQUIRE(said == "started\n");
  }
  ~blocked_child() {
    finish();
    if (!reaped_) {
      if (!wait_exited(pid_, k_exit_limit)) ::kill(pid_, SIGKILL);  // our own child, by its id
      reap();
    }
  }
  pid_t pid() const { return pid_; }
  /// Closes the child's stdin: it reads EOF and exits.
  void finish() {
    if (write_fd_ >= 0) ::close(write_fd_);
    write_fd_ = -1;
  }
  void reap() {
    int status = 0;
    ::waitpid(pid_, &status, 0);
    reaped_ = true;
  }

 private:
  pid_t pid_ = -1;
  int write_fd_ = -1;
  bool reaped_ = false;
};

process_identity identity_of_child(const blocked_child& c) {
  auto id = runtime::identity_of(c.pid());
  REQUIRE(id);
  CHECK(id->pid == c.pid());
  CHECK(id->nonce.empty());
  return *id;
}

std::string other_boot_id(const std::string& boot) {
  std::string other = "00000000-1111-2222-3333-444444444444";
  return other == boot ? "55555555-1111-2222-3333-444444444444" : other;
}

std::string stat_line(const std::string& comm, std::uint64_t start_ticks) {
  // Fields 3..21, then 22 (starttime), then a few more, as the kernel writes them.
  return "4242 (" + comm + ") S 1 4242 4242 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 " +
         std::to_string(start_ticks) + " 2306048 200 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0" +
         " 17 1 0 0 0 0 0\n";
}

std::uint64_t uptime_s() {
  std::ifstream in("/proc/uptime");
  double up = 0;
  in >> up;
  REQUIRE(in);
  return static_cast<std::uint64_t>(up);
}

}  // namespace

TEST_CASE("an owner identity round-trips through its text form", "[runtime][owner]") {
  const auto& self = runtime::current_process_identity();
  CHECK(self.pid == ::getpid());
  CHECK_FALSE(self.boot_id.empty());
  CHECK(is_nonce(self.nonce));
  CHECK(&runtime::current_process_identity() == &self);
  CHECK(runtime::current_process_identity() == self);

  auto text = runtime::to_string(self);
  CHECK(text.rfind("v1:" + std::to_string(::getpid()) + ":", 0) == 0);
  auto back = runtime::parse_process_identity(text);
  REQUIRE(back);
  CHECK(*back == self);
}

TEST_CASE("threads that ask for this process's identity at once all get the same one",
          "[runtime][owner]") {
  // Run alone (as ctest runs each case), this is the identity's first use.
  std::vector<const process_identity*> seen(8, nullptr);
  {
    std::vector<std::jthread> threads;
    for (auto& s : seen) threads.emplace_back([&s] { s = &runtime::current_process_identity(); });
  }
  for (auto* s : seen) CHECK(s == &runtime::current_process_identity());
}

TEST_CASE("this process's identity agrees with what /proc says of its pid", "[runtime][owner]") {
  const auto& self = runtime::current_process_identity();
  auto read = runtime::identity_of(::getpid());
  REQUIRE(read);
  CHECK(read->start_s == self.start_s);
  CHECK(read->boot_id == self.boot_id);
  CHECK(read->nonce.empty());
  CHECK(self.start_s <= uptime_s());
}

TEST_CASE("malformed owner identities fail closed, naming the field", "[runtime][owner]") {
  const auto& self = runtime::current_process_identity();
  const std::string pid = std::to_string(self.pid), start = std::to_string(self.start_s);
  const std::string good_tail = ":" + self.boot_id + ":" + self.nonce;
  struct bad {
    std::string text;
    std::string field;
  };
  const std::vector<bad> cases = {
      {"", "version"},
      {"v2:" + pid + ":" + start + good_tail, "version"},
      {"v1:" + pid + ":" + start + ":" + self.boot_id, "nonce is missing"},
      {"v1:" + pid, "start time is missing"},
      {"v1:abc:" + start + good_tail, "pid 'abc'"},
      {"v1:0:" + start + good_tail, "pid '0'"},
      {"v1:-7:" + start + good_tail, "pid '-7'"},
      {"v1:+7:" + start + good_tail, "pid '+7'"},
      {"v1:99999999999999999999:" + start + good_tail, "pid"},
      {"v1:" + pid + ":12x" + good_tail, "start time '12x'"},
      {"v1:" + pid + "::" + self.boot_id + ":" + self.nonce, "start time ''"},
      {"v1:" + pid + ":" + start + "::" + self.nonce, "boot id is empty"},
      {"v1:" + pid + ":" + start + ":BOOT ID:" + self.nonce, "boot id 'BOOT ID'"},
      {"v1:" + pid + ":" + start + ":" + self.boot_id + ":xyz", "nonce 'xyz'"},
      {"v1:" + pid + ":" + start + ":" + self.boot_id + ":" + std::string(32, 'A'), "nonce"},
      {"v1:" + pid + ":" + start + good_tail + ":extra", "follows the nonce"},
  };
  for (const auto& c : cases) {
    INFO("text: " << c.text);
    auto parsed = runtime::parse_process_identity(c.text);
    REQUIRE_FALSE(parsed);
    CHECK(parsed.error().code == errc::invalid);
    CHECK_THAT(parsed.error().message, Catch::Contains(c.field));
    auto probe = runtime::probe_owner(c.text);
    CHECK(probe.state == owner_liveness::uncertain);
    CHECK(probe.why == parsed.error().message);
  }
}

TEST_CASE("a parse error quotes at most 120 bytes of the text, control bytes escaped",
          "[runtime][owner]") {
  std::string text = "v9:\n" + std::string(500, 'x');
  auto parsed = runtime::parse_process_identity(text);
  REQUIRE_FALSE(parsed);
  const auto& m = parsed.error().message;
  CHECK_THAT(m,
             Catch::Contains("'v9:\\x0a" + std::string(116, 'x') + "' (first 120 of 504 bytes)"));
  CHECK(m.find('\n') == std::string::npos);
  CHECK(m.size() < 400);
}

TEST_CASE("the probe says this process is alive", "[runtime][owner]") {
  auto p = runtime::probe_owner(runtime::to_string(runtime::current_process_identity()));
  CHECK(p.state == owner_liveness::alive);
  CHECK(p.why == "this very process");
}

TEST_CASE("an owner recorded under another boot is gone", "[runtime][owner]") {
  auto id = runtime::current_process_identity();
  id.boot_id = other_boot_id(id.boot_id);
  auto p = runtime::probe_owner(runtime::to_string(id));
  CHECK(p.state == owner_liveness::gone);
  CHECK_THAT(p.why, Catch::Contains("another boot"));
}

TEST_CASE("a recorded identity without a usable pid or boot id is uncertain", "[runtime][owner]") {
  auto id = runtime::current_process_identity();
  id.boot_id.clear();
  CHECK(runtime::probe_owner(id).state == owner_liveness::uncertain);
  id = runtime::current_process_identity();
  for (int pid : {0, -1}) {  // kill(0 or -1, 0) would name a group or every process
    id.pid = pid;
    CHECK(runtime::probe_owner(id).state == owner_liveness::uncertain);
  }
  CHECK_FALSE(runtime::identity_of(0));
}

TEST_CASE("a live foreign owner is retained, a zombie too, and it is gone once reaped",
          "[runtime][owner]") {
  blocked_child child;
  auto id = identity_of_child(child);
  id.nonce = runtime::current_process_identity().nonce;  // its record carries some nonce
  const auto text = runtime::to_string(id);

  auto live = runtime::probe_owner(text);
  CHECK(live.state == owner_liveness::alive);
  CHECK_THAT(live.why, Catch::Contains("as the owner did"));

  child.finish();
  REQUIRE(wait_exited(child.pid(), k_exit_limit));  // exited, not yet reaped
  auto zombie = runtime::probe_owner(text);
  CHECK(zombie.state == owner_liveness::alive);
  CHECK_THAT(zombie.why, Catch::Contains("not yet reaped"));

  child.reap();
  auto gone = runtime::probe_owner(text);
  CHECK(gone.state == owner_liveness::gone);
  CHECK_THAT(gone.why, Catch::Contains("no such process"));
  auto after = runtime::identity_of(child.pid());
  REQUIRE_FALSE(after);
  CHECK_THAT(after.error().message, Catch::Contains("pid " + std::to_string(child.pid())));
}

TEST_CASE("a pid reused by a process that started at another second is gone", "[runtime][owner]") {
  blocked_child child;
  auto id = identity_of_child(child);
  const auto real = id.start_s;
  id.start_s = real >= 5 ? real - 5 : real + 5;
  auto p = runtime::probe_owner(id);
  CHECK(p.state == owner_liveness::gone);
  CHECK(p.why == "pid reused: pid " + std::to_string(child.pid()) + " started at " +
                     std::to_string(real) + " s, the owner at " + std::to_string(id.start_s) +
                     " s");
}

TEST_CASE("a pid reused within the owner's start second is taken for the owner",
          "[runtime][owner]") {
  blocked_child child;
  auto id = identity_of_child(child);
  id.nonce = std::string(32, 'f');  // another process's nonce: not compared
  CHECK(runtime::probe_owner(runtime::to_string(id)).state == owner_liveness::alive);
}

TEST_CASE("this process's pid with another start time is a reuse, not this process",
          "[runtime][owner]") {
  auto id = runtime::current_process_identity();
  id.start_s += 1;
  auto p = runtime::probe_owner(id);
  CHECK(p.state == owner_liveness::gone);
  CHECK_THAT(p.why, Catch::StartsWith("pid reused"));
}

TEST_CASE("a pid with no process is gone", "[runtime][owner]") {
  std::ifstream in("/proc/sys/kernel/pid_max");
  int pid_max = 0;
  in >> pid_max;
  REQUIRE(pid_max > 2);
  int pid = pid_max - 1;
  for (; pid > pid_max - 100 && ::kill(pid, 0) == 0; --pid) {
  }
  const int e = ::kill(pid, 0) == 0 ? 0 : errno;
  REQUIRE(e == ESRCH);
  auto id = runtime::current_process_identity();
  id.pid = pid;
  auto p = runtime::probe_owner(runtime::to_string(id));
  CHECK(p.state == owner_liveness::gone);
  CHECK(p.why == "no such process: pid " + std::to_string(pid));
}

// Run by the test below, as user nobody, in a process of its own; writes what
// it saw on fd 3. Hidden: it means nothing run directly.
TEST_CASE("owner probe as another user", "[.][owner-eperm-child]") {
  const char* one = std::getenv("TETHER_OWNER_PID1");
  if (!one) return;
  auto id = runtime::parse_process_identity(one);
  REQUIRE(id);
  auto same = runtime::probe_owner(*id);
  id->start_s += 5;
  auto reused = runtime::probe_owner(*id);
  std::string out = std::string(runtime::to_string(same.state)) + "\n" + same.why + "\n" +
                    std::string(runtime::to_string(reused.state)) + "\n" + reused.why + "\n";
  REQUIRE(::write(3, out.data(), out.size()) == static_cast<ssize_t>(out.size()));
}

TEST_CASE("a process not ours to signal (EPERM) is alive when its start time matches",
          "[runtime][owner]") {
  auto init = runtime::identity_of(1);
  REQUIRE(init);
  init->nonce = std::string(32, '0');
  const auto text = runtime::to_string(*init);

  // Pid 1 with its real start time is alive to anyone; as root kill(1, 0)
  // succeeds, so that alone does not reach the EPERM rule.
  auto direct = runtime::probe_owner(text);
  CHECK(direct.state == owner_liveness::alive);
  if (::geteuid() != 0) {
    CHECK_THAT(direct.why, Catch::Contains("not ours to signal"));
    return;
  }

  // As root: this binary again, as user nobody, runs the hidden case above.
  auto exe = std::filesystem::read_symlink("/proc/self/exe").string();
  std::vector<std::string> args = {exe, "owner probe as another user"};
  std::vector<std::string> env = {"TETHER_OWNER_PID1=" + text};
  for (char** e = environ; *e; ++e) env.emplace_back(*e);
  std::vector<char*> argv, envp;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  for (auto& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  int fds[2];
  REQUIRE(::pipe2(fds, O_CLOEXEC) == 0);
  pid_t pid = ::fork();
  if (pid == 0) {  // only async-signal-safe calls until the exec
    if (fds[1] != 3 && ::dup2(fds[1], 3) != 3) ::_exit(124);
    if (fds[1] == 3 && ::fcntl(3, F_SETFD, 0) != 0) ::_exit(124);  // dup2 would keep CLOEXEC
    if (::setgid(65534) != 0 || ::setuid(65534) != 0) ::_exit(125);
    ::execve(argv[0], argv.data(), envp.data());
    ::_exit(126);
  }
  ::close(fds[1]);
  REQUIRE(pid > 0);
  bool exited = wait_exited(pid, k_exit_limit);
  if (!exited) ::kill(pid, SIGKILL);  // our own child, by its id
  int status = 0;
  ::waitpid(pid, &status, 0);
  std::string out;
  char buf[4096];
  for (ssize_t n; (n = ::read(fds[0], buf, sizeof buf)) > 0;) out.append(buf, n);
  ::close(fds[0]);
  REQUIRE(exited);
  REQUIRE(WIFEXITED(status));
  if (WEXITSTATUS(status) == 125) {
    WARN("cannot become user nobody here: the EPERM rule is checked only for a non-root run");
    return;
  }
  INFO("the child as nobody wrote: " << out);
  REQUIRE(WEXITSTATUS(status) == 0);
  CHECK_THAT(out, Catch::StartsWith("alive\n"));
  CHECK_THAT(out, Catch::Contains("not ours to signal"));
  // A pid held by another user's process that started at another second is a reuse.
  CHECK_THAT(out, Catch::Contains("\ngone\npid reused: pid 1 "));
}

TEST_CASE("a stat line is parsed after its last ')', whatever the command name holds",
          "[runtime][owner]") {
  using runtime::start_ticks_from_stat;
  CHECK(start_ticks_from_stat(stat_line("sh", 12345)) == 12345u);
  CHECK(start_ticks_from_stat(stat_line("a) (b", 777)) == 777u);
  CHECK(start_ticks_from_stat(
            stat_line("x) R 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20", 99)) == 99u);
  CHECK(start_ticks_from_stat(stat_line(")", 5)) == 5u);
  CHECK(start_ticks_from_stat(stat_line("", 18446744073709551615u)) == 18446744073709551615u);
  CHECK_FALSE(start_ticks_from_stat(""));
  CHECK_FALSE(start_ticks_from_stat("4242 (sh S 1 2 3"));                // no ')'
  CHECK_FALSE(start_ticks_from_stat("4242 (sh) S 1 4242 4242 0 -1 4"));  // too few fields
  CHECK_FALSE(start_ticks_from_stat(                                     // field 22 not a number
      "4242 (sh) S 1 4242 4242 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 12x 2306048 200\n"));
}

TEST_CASE("a process whose name holds ') (' has its start time read from /proc",
          "[runtime][owner]") {
  test::scratch_dir dir("owner-comm");
  auto odd = dir.file("a) (b) Z 9 9");  // the name a first-')' parser would misread
  std::filesystem::create_symlink("/bin/sh", odd);
  const auto before = runtime::current_process_identity().start_s;
  blocked_child child(odd);
  std::string comm;
  std::getline(std::ifstream("/proc/" + std::to_string(child.pid()) + "/comm"), comm);
  REQUIRE(comm == "a) (b) Z 9 9");
  auto id = identity_of_child(child);
  // It started after this process and before now (both seconds since boot).
  CHECK(id.start_s >= before);
  CHECK(id.start_s <= uptime_s());
  CHECK(runtime::probe_owner(id).state == owner_liveness::alive);
}
