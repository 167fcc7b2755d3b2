// `tether run`: the notice exactly as a model reads it, scrubbed, and the
// failing stage's status as the exit code.
#include <sys/stat.h>
#include <sys/wait.h>

#include <fstream>

#include "sandbox_support.hpp"
#include "tether/protocol/json.hpp"

using namespace tether;
using namespace tether::test;

namespace {

// Stops the detached daemon `tether run` started for `state_dir`.
void stop_detached(const std::string& state_dir) {
  std::ifstream f(state_dir + "/lock");
  long pid = 0;
  f >> pid;
  REQUIRE(pid > 0);
  sandbox::daemon_handle h;
  h.pid = static_cast<pid_t>(pid);
  REQUIRE(sandbox::stop_daemon(h).has_value());
}

}  // namespace

TEST_CASE("tether run prints the scrubbed notice and exits with the failing stage's status",
          "[sandbox]") {
  scratch_dir dir("sbx-cli");
  std::string state = dir.file("state");
  std::string tether = std::string(TETHER_BIN_DIR) + "/tether";
  std::vector<std::string> env = {"TETHER_SANDBOX_DIR=" + state, "MY_TOKEN=tok-5f4e3d2c1b"};
  std::string out;
  int st = run_process({tether, "run", "--tail", "3", "--",
                        "for i in 1 2 3 4 5 6; do echo line $i; done; echo \"token $MY_TOKEN\"; "
                        "sh -c 'exit 9' | cat"},
                       &out, env);
  INFO(out);
  REQUIRE(WIFEXITED(st));
  CHECK(WEXITSTATUS(st) == 9);
  CHECK(out.rfind("[tether] background job job_", 0) == 0);
  CHECK_THAT(out,
             Catch::Contains(" failed\ncommand: for i in 1 2 3 4 5 6; do echo line $i; done;"));
  CHECK_THAT(out, Catch::Contains("\nstatus: stage 1 of 2 (sh -c 'exit 9') failed: exit 9; stage "
                                  "statuses 9 0; the pipeline's own status was 0\n"));
  CHECK_THAT(out, Catch::EndsWith("last 3 lines:\n[... 28 earlier bytes left out ...]\n| line "
                                  "5\n| line 6\n| token [REDACTED]\n"));
  CHECK(out.find("tok-5f4e3d2c1b") == std::string::npos);

  // A second run finds the daemon the first one started.
  std::string out2;
  int st2 = run_process({tether, "run", "--", "echo fine"}, &out2, env);
  REQUIRE(WIFEXITED(st2));
  CHECK(WEXITSTATUS(st2) == 0);
  CHECK_THAT(out2, Catch::Contains(" succeeded\ncommand: echo fine\nstatus: exit 0\n"));
  stop_detached(state);
}

TEST_CASE("tether run without a command says what is missing", "[sandbox]") {
  scratch_dir dir("sbx-cli-usage");
  std::string out;
  int st =
      run_process({std::string(TETHER_BIN_DIR) + "/tether", "run", "--tail", "x", "--", "true"},
                  &out, {"TETHER_SANDBOX_DIR=" + dir.file("state")});
  REQUIRE(WIFEXITED(st));
  CHECK(WEXITSTATUS(st) == 2);
  CHECK_FALSE(std::filesystem::exists(dir.file("state")));  // nothing was started
}

TEST_CASE("tether run quotes each argument when given several, and runs one as a script",
          "[sandbox][security]") {
  scratch_dir dir("sbx-cli-quote");
  std::string state = dir.file("state");
  std::string tether = std::string(TETHER_BIN_DIR) + "/tether";
  std::vector<std::string> env = {"TETHER_SANDBOX_DIR=" + state};
  std::string marker = dir.file("injected");
  std::string out;
  int st =
      run_process({tether, "run", "--", "echo", "a b", "$HOME;touch " + marker, "it's"}, &out, env);
  INFO(out);
  REQUIRE(WIFEXITED(st));
  CHECK(WEXITSTATUS(st) == 0);
  CHECK_THAT(out, Catch::Contains("| a b $HOME;touch " + marker + " it's\n"));
  CHECK_FALSE(std::filesystem::exists(marker));
  // One argument is a script: the pipe is bash's.
  std::string out2;
  int st2 = run_process({tether, "run", "--", "echo one | tr o 0"}, &out2, env);
  REQUIRE(WIFEXITED(st2));
  CHECK_THAT(out2, Catch::Contains("| 0ne\n"));
  stop_detached(state);
}

TEST_CASE("tether run --isolate says isolation is unavailable and why, and runs nothing",
          "[sandbox]") {
  scratch_dir dir("sbx-cli-nouserns");
  std::string state = dir.file("state");
  std::string fake = dir.file("bwrap");  // fails as bwrap does where user namespaces are forbidden
  std::ofstream(fake) << "#!/bin/sh\n"
                         "echo 'bwrap: No permissions to create new namespace, likely because the "
                         "kernel does not allow non-privileged user namespaces.' >&2\n"
                         "exit 1\n";
  REQUIRE(::chmod(fake.c_str(), 0700) == 0);
  std::string marker = dir.file("ran-marker");
  // The error is on stderr: run through env(1) to set the environment.
  auto r = run_captured({"/usr/bin/env", "TETHER_SANDBOX_DIR=" + state,
                         "TETHER_SANDBOXD_BWRAP=" + fake, std::string(TETHER_BIN_DIR) + "/tether",
                         "run", "--isolate", "--", "touch " + marker});
  auto& out = r.output;
  INFO(out);
  CHECK(r.exit_code == 125);
  CHECK_THAT(out, Catch::Contains("tether run: "));
  CHECK_THAT(out, Catch::Contains("isolation was requested but is unavailable here"));
  CHECK_THAT(out, Catch::Contains("bwrap: No permissions to create new namespace"));
  CHECK_THAT(out, Catch::Contains("a job never runs unisolated in its place"));
  CHECK_FALSE(std::filesystem::exists(marker));
  stop_detached(state);
}
