// Scenario files: every example in examples/scenarios/ holds when run through
// the real `tether` binary, and a malformed file is refused with its line
// number and the word that was wrong.
#include "tether/testing/scenario.hpp"

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "catch_result.hpp"
#include "support.hpp"

using namespace tether;
namespace fs = std::filesystem;
namespace scn = tether::testing::scenario;

namespace {

const std::string k_tether = std::string(TETHER_BIN_DIR) + "/tether";

std::vector<std::string> example_scenarios() {
  std::vector<std::string> out;
  for (auto& e : fs::directory_iterator(fs::path(TETHER_SOURCE_DIR) / "examples" / "scenarios"))
    if (e.path().extension() == ".scn") out.push_back(e.path().string());
  std::sort(out.begin(), out.end());
  return out;
}

test::captured run_tether(std::vector<std::string> args) {
  args.insert(args.begin(), k_tether);
  return test::run_captured(args);
}

std::string write_file(const test::scratch_dir& dir, const std::string& name,
                       const std::string& text) {
  auto p = dir.file(name);
  std::ofstream(p) << text;
  return p;
}

constexpr const char* k_ok_prefix =
    "session parent \"P\"\n"
    "on parent 1: spawn child \"C\" \"go\"; say \"started\"\n"
    "on child 1: say \"done\"\n";

}  // namespace

TEST_CASE("every example scenario holds through the real binary", "[scenario]") {
  auto files = example_scenarios();
  REQUIRE(files.size() >= 12);
  auto file = GENERATE_COPY(from_range(files));
  test::scratch_dir dir("scenario");
  auto r = run_tether({"scenario", file, "--dir", dir.file("run"), "--timeout", "30"});
  INFO(r.output);
  CHECK(r.output.find("FAIL") == std::string::npos);
  REQUIRE(r.exit_code == 0);
}

TEST_CASE("a scenario whose expectation fails exits 1 and prints FAIL with what it found",
          "[scenario]") {
  test::scratch_dir dir("scenario-fail");
  auto f = write_file(dir, "fail.scn",
                      std::string(k_ok_prefix) +
                          "prompt parent \"go\"\n"
                          "wait quiescent\n"
                          "expect inbox parent count 1\n"
                          "expect inbox parent 1 contains \"not in the body\"\n");
  auto r = run_tether({"scenario", f, "--dir", dir.file("run")});
  INFO(r.output);
  CHECK(r.exit_code == 1);
  CHECK(r.output.find("  ok    line 6: expect inbox parent count 1") != std::string::npos);
  CHECK(r.output.find("  FAIL  line 7: expect inbox parent 1 contains \"not in the body\"") !=
        std::string::npos);
  CHECK(r.output.find("| done") != std::string::npos);  // the body it did find
}

TEST_CASE("a wait that never ends fails the scenario after --timeout instead of hanging",
          "[scenario]") {
  test::scratch_dir dir("scenario-stuck");
  auto f = write_file(dir, "stuck.scn",
                      "session parent \"P\"\n"
                      "on parent 1: wait-until-interrupted\n"
                      "prompt parent \"go\"\n"
                      "wait quiescent\n"
                      "expect inbox parent count 0\n");
  auto r = run_tether({"scenario", f, "--dir", dir.file("run"), "--timeout", "1"});
  INFO(r.output);
  CHECK(r.exit_code == 1);
  CHECK(r.output.find("FAIL  line 4: wait quiescent — no answer within 1000 ms") !=
        std::string::npos);
}

TEST_CASE("a crash step that never reaches its crash point fails", "[scenario]") {
  test::scratch_dir dir("scenario-nocrash");
  auto f = write_file(dir, "nocrash.scn",
                      std::string(k_ok_prefix) +
                          "crash at report.settle.after_commit:5\n"
                          "prompt parent \"go\"\n"
                          "wait quiescent\n"
                          "restart\n"
                          "expect inbox parent count 1\n");
  auto r = run_tether({"scenario", f, "--dir", dir.file("run")});
  INFO(r.output);
  CHECK(r.exit_code == 1);
  CHECK(r.output.find("FAIL  line 4: crash at report.settle.after_commit:5 — it ran every step "
                      "and the crash point was never reached") != std::string::npos);
  CHECK(r.output.find("ok    line 8: expect inbox parent count 1") != std::string::npos);
}

TEST_CASE("a malformed scenario file is refused with exit 2, its line number and the word",
          "[scenario]") {
  test::scratch_dir dir("scenario-bad");
  auto f =
      write_file(dir, "bad.scn", std::string(k_ok_prefix) + "\n# a comment\npromt parent \"x\"\n");
  auto r = run_tether({"scenario", f});
  INFO(r.output);
  CHECK(r.exit_code == 2);
  CHECK(r.output.find(f + ":6: 'promt' is not a step") != std::string::npos);
}

TEST_CASE("parse errors name the line and the field or word that was wrong", "[scenario]") {
  struct bad {
    std::string text;  // appended after k_ok_prefix (3 lines)
    int line;
    std::string says;
  };
  std::vector<bad> cases = {
      {"on parent 2: sya \"x\"\n", 4, "on: 'sya' is not an action (expected say, fail"},
      {"on parent two: say \"x\"\n", 4, "on: the input ordinal 'two' is not a whole number"},
      {"on parent 2 say \"x\"\n", 4, "on: expected ':' after the input ordinal, found 'say'"},
      {"on parent 1: say \"again\"\n", 4, "session 'parent' already has a turn for input 1"},
      {"on parent 2: say \"x\" say \"y\"\n", 4, "expected ';' between actions, found 'say'"},
      {"\nprompt parent hello\n", 5,
       "prompt: expected the prompt text (a \"quoted string\"), found 'hello'"},
      {"prompt parent\n", 4, "prompt: missing the prompt text (a \"quoted string\")"},
      {"prompt parent \"unclosed\n", 4, "the quoted string \"unclosed\" is not closed"},
      {"prompt parent \"bad \\q escape\"\n", 4, "unknown escape '\\q'"},
      {"prompt ghost \"x\"\n", 4, "session 'ghost' is never created"},
      {"on ghost 1: say \"x\"\n", 4, "session 'ghost' is never created"},
      {"on parent 2: spawn kid \"K\" \"go\" notify maybe\n", 4,
       "on: 'maybe' is not a notify setting (expected on, off, default)"},
      {"on parent 2: spawn kid \"K\"\n", 4, "on: missing the child's prompt"},
      {"revert parent undo\n", 4, "revert: 'undo' is not a revert action (expected stage, clear)"},
      {"shell build exits\n", 4, "no turn starts a shell on gate 'build'"},
      {"on child 2: shell build\nshell build exits 300\n", 5,
       "shell: the exit code '300' is not a whole number from 0 to 255"},
      {"wait forever\n", 4, "wait: 'forever' is not a wait (expected quiescent, shells, idle"},
      {"wait turn child 7\n", 4, "wait turn: session 'child' has no turn for input 7"},
      {"crash at report.nowhere\nrestart\n", 4, "crash: 'report.nowhere' is not a crash point"},
      {"crash at report.settle.after_commit:0\nrestart\n", 4,
       "crash: the hit count in 'report.settle.after_commit:0' must be a positive whole number"},
      {"crash at report.settle.after_commit\n", 4,
       "'crash at report.settle.after_commit' needs a 'restart' step after it"},
      {"crash at report.settle.after_commit\nexpect inbox parent count 1\nrestart\n", 5,
       "'expect' between 'crash at' (line 4) and 'restart'"},
      {"expect inbox parent count many\n", 4,
       "expect inbox: the row count 'many' is not a whole number"},
      {"expect inbox parent 0 acked\n", 4,
       "expect inbox: the inbox row (a position from 1, or last) '0'"},
      {"expect inbox parent 1 shiny\n", 4, "expect inbox: 'shiny' is not an inbox check"},
      {"expect jobs status done count 1\n", 4, "expect jobs: 'done' is not a job status"},
      {"expect jobs count 1 extra\n", 4, "unexpected 'extra' after the end of the step"},
      {"expect session parent notify maybe\n", 4,
       "expect session: 'maybe' is not a notify setting"},
      {"expect boot rebooted 1\n", 4, "'rebooted' is not a boot field"},
      {"expect transcript parent answer is \"x\"\n", 4,
       "expect transcript: 'is' is not a text check (expected contains, lacks, equals)"},
  };
  // Sandboxes and owned jobs, fork, ids and order-free checks.
  const std::string sbx = "sandbox\non child 2: job \"gate g; echo x\" as j\n";
  std::vector<bad> more = {
      {"sandbox\nsandbox\n", 5, "sandbox: the sandbox is given already"},
      {"sandbox extra\n", 4, "sandbox: unexpected 'extra' after the end of the step"},
      {"env 9LIVES \"x\"\n", 4,
       "env: expected an environment variable name (letters, digits, _), found '9LIVES'"},
      {"env TOKEN\n", 4, "env: missing the variable's value (a \"quoted string\")"},
      {"env TOKEN secret\n", 4,
       "env: expected the variable's value (a \"quoted string\"), found 'secret'"},
      {"env PATH \"/x\"\n", 4, "env: PATH is the runner's"},
      {"env A \"1\"\nenv A \"2\"\n", 5, "env: 'A' is set already"},
      {"sandbox\non child 2: job true\n", 5,
       "on: expected the job's command (a \"quoted string\"), found 'true'"},
      {"sandbox\non child 2: job \"\"\n", 5, "on: the job's command is empty"},
      {"sandbox\non child 2: job \"true\" as\n", 5, "on: missing the job's name"},
      {"sandbox\non child 2: job \"true\" as a; job \"true\" as a\n", 5,
       "on: a job named 'a' is launched twice"},
      {"on child 2: job-wait nope\n", 4, "no turn launches a job named 'nope'"},
      {"on child 2: job-cancel \"j\"\n", 4, "on: expected the job's name"},
      {"on child 2: fork alt \"A\"\n", 4, "on: missing the fork's prompt"},
      {"on child 2: fork \"alt\" \"A\" \"go\"\n", 4, "on: expected the new session's name"},
      {sbx + "job j stop\n", 6, "job: 'stop' is not a job call (expected status, wait, cancel)"},
      {sbx + "job k status\n", 6, "no turn launches a job named 'k'"},
      {"wait job\n", 4, "wait: 'job' is not a wait"},
      {sbx + "expect job j state done\n", 6, "expect job: 'done' is not a job state"},
      {sbx + "expect job j stage 0 exit 1\n", 6,
       "expect job: the stage (from 1) '0' is not a whole number from 1"},
      {sbx + "expect job j stage 1 signal SIGNOPE\n", 6,
       "expect job: 'SIGNOPE' is not a signal name"},
      {sbx + "expect job j stage 1 status 1\n", 6, "expect job: 'status' is not a stage check"},
      {sbx + "expect job j failing-stage first\n", 6,
       "expect job: the failing stage (from 1, or none) 'first' is not a whole number"},
      {sbx + "expect job j receipt lost\n", 6, "expect job: 'lost' is not a receipt state"},
      {sbx + "expect job j notice has \"x\"\n", 6, "expect job: 'has' is not a text check"},
      {sbx + "expect job j exit 256\n", 6, "expect job: the exit code '256'"},
      {"expect job k state failed\n", 4, "no turn launches a job named 'k'"},
      {"expect inbox parent any lacks \"x\"\n", 4,
       "expect inbox: 'lacks' is not a text check (expected contains, equals)"},
      {"expect inbox parent unordered contains\n", 4,
       "expect inbox: missing a text to find (a \"quoted string\")"},
      {"expect inbox parent unordered contains \"a\" b\n", 4,
       "expect inbox: expected a text to find (a \"quoted string\"), found 'b'"},
      {"expect inbox parent 1 id like \"x\"\n", 4,
       "expect inbox: 'like' is not an id check (expected prefix, equals, job)"},
      {"expect inbox parent 1 id prefix msg_\n", 4,
       "expect inbox: expected the id's prefix (a \"quoted string\"), found 'msg_'"},
      {"expect inbox parent 1 id job k\n", 4, "no turn launches a job named 'k'"},
      {"expect transcript parent notices some\n", 4,
       "expect transcript: the notices count 'some' is not a whole number"},
      {"expect session child parent ghost\n", 4, "session 'ghost' is never created"},
  };
  cases.insert(cases.end(), more.begin(), more.end());
  for (auto& c : cases) {
    INFO(c.text);
    auto s = scn::parse(k_ok_prefix + c.text, "t.scn");
    REQUIRE_FALSE(s);
    auto msg = s.error().message;
    INFO(msg);
    CHECK(s.error().code == errc::invalid);
    CHECK(msg.rfind("t.scn:" + std::to_string(c.line) + ": ", 0) == 0);
    CHECK(msg.find(c.says) != std::string::npos);
  }
}

TEST_CASE("a job needs no sandbox line: every scenario's host runs its jobs in a local daemon",
          "[scenario]") {
  auto s =
      scn::parse(k_ok_prefix + std::string("on child 2: job \"gate g; true\" as j\n"), "t.scn");
  INFO((s ? std::string() : s.error().message));
  REQUIRE(s);
  CHECK_FALSE(s->sandbox);
  CHECK(s->gates == std::vector<std::string>{"g"});
}

TEST_CASE("a well-formed scenario parses into turns, steps and gates", "[scenario]") {
  auto s =
      scn::parse(std::string(k_ok_prefix) +
                     "on child 2: shell build; wake-self 2; interrupt parent;\n"
                     "prompt parent \"a \\\"quoted\\\" word\\nand a line\"  # trailing comment\n"
                     "shell build exits 3 \"three\"\n"
                     "expect jobs status running child child count 0\n"
                     "expect inbox parent last equals \"x\"\n",
                 "ok.scn");
  REQUIRE(s);
  REQUIRE(s->turns.size() == 3);
  CHECK(s->turns[2].actions.size() == 3);
  CHECK(s->turns[2].actions[1].count == 2);
  REQUIRE(s->gates == std::vector<std::string>{"build"});
  REQUIRE(s->steps.size() == 5);
  CHECK(s->steps[1].text == "a \"quoted\" word\nand a line");
  CHECK(s->steps[2].code == 3);
  CHECK(s->steps[2].text == "three");
  CHECK(s->steps[3].expect.status == "running");
  CHECK(s->steps[3].expect.child == "child");
  CHECK(s->steps[4].expect.position == -1);
}

TEST_CASE("a sandbox scenario parses its environment, jobs, job calls and job checks",
          "[scenario]") {
  auto s = scn::parse(std::string(k_ok_prefix) +
                          "env API_TOKEN \"abc123456\"\n"
                          "on child 2: job \"gate hold; false | cat\" as j; job-wait j; "
                          "fork alt \"Alt\" \"go\"\n"
                          "sandbox\n"
                          "job j cancel\n"
                          "wait jobs\n"
                          "shell hold exits\n"
                          "expect job j stage 2 signal SIGTERM\n"
                          "expect inbox parent unordered contains \"a\" \"b\"\n"
                          "expect inbox parent last id job j\n"
                          "expect session alt parent none\n",
                      "sbx.scn");
  REQUIRE(s);
  CHECK(s->sandbox);
  REQUIRE(s->env.size() == 1);
  CHECK(s->env[0] == std::make_pair(std::string("API_TOKEN"), std::string("abc123456")));
  REQUIRE(s->turns.size() == 3);
  auto& acts = s->turns[2].actions;
  REQUIRE(acts.size() == 3);
  CHECK(acts[0].what == scn::action::kind::job);
  CHECK(acts[0].text == "gate hold; false | cat");
  CHECK(acts[0].target == "j");
  CHECK(acts[1].what == scn::action::kind::job_wait);
  CHECK(acts[2].what == scn::action::kind::fork);
  CHECK(s->gates == std::vector<std::string>{"hold"});  // a job command's gate counts
  REQUIRE(s->steps.size() == 8);                        // the prefix's session step first
  CHECK(s->steps[1].what == scn::step::kind::job_read);
  CHECK(s->steps[1].text == "cancel");
  CHECK(s->steps[2].what == scn::step::kind::wait_jobs);
  CHECK(s->steps[4].expect.what == scn::expectation::kind::job_stage_signal);
  CHECK(s->steps[4].expect.stage == 2);
  CHECK(s->steps[4].expect.number == 15);
  CHECK(s->steps[5].expect.texts == std::vector<std::string>{"a", "b"});
  CHECK(s->steps[6].expect.job == "j");
  CHECK(s->steps[7].expect.text == "none");
}

TEST_CASE("an order-free inbox check fails when two texts can only match one row", "[scenario]") {
  test::scratch_dir dir("scenario-unordered");
  auto f = write_file(dir, "unordered.scn",
                      std::string(k_ok_prefix) +
                          "prompt parent \"go\"\n"
                          "wait quiescent\n"
                          "expect inbox parent any contains \"done\"\n"
                          "expect inbox parent unordered contains \"done\" \"done\"\n"
                          "expect inbox parent none contains \"done\"\n");
  auto r = run_tether({"scenario", f, "--dir", dir.file("run")});
  INFO(r.output);
  CHECK(r.exit_code == 1);
  CHECK(r.output.find("  ok    line 6: expect inbox parent any contains \"done\"") !=
        std::string::npos);
  CHECK(r.output.find("  FAIL  line 7: expect inbox parent unordered contains") !=
        std::string::npos);
  CHECK(r.output.find("  FAIL  line 8: expect inbox parent none contains \"done\"") !=
        std::string::npos);
  CHECK(r.output.find("| [1] <subagent") != std::string::npos);  // the bodies it found
}

TEST_CASE("a job step by a session whose turn has moved on is refused as not found", "[scenario]") {
  test::scratch_dir dir("scenario-notowner");
  auto f = write_file(dir, "notowner.scn",
                      "sandbox\n"
                      "session s \"S\"\n"
                      "on s 1: job \"echo once\" as j; say \"launched\"\n"
                      "prompt s \"go\"\n"
                      "wait jobs\n"
                      "expect job j state completed\n"
                      "prompt s \"a second turn\"\n"
                      "wait quiescent\n"
                      "job j status\n"
                      "expect job j state completed\n");
  auto r = run_tether({"scenario", f, "--dir", dir.file("run"), "--timeout", "30"});
  INFO(r.output);
  CHECK(r.exit_code == 1);
  CHECK(r.output.find("  ok    line 6: expect job j state completed") != std::string::npos);
  CHECK(r.output.find("  FAIL  line 9: job j status — job 'job_") != std::string::npos);
  CHECK(r.output.find("' not found") != std::string::npos);
  CHECK(r.output.find("line 10") == std::string::npos);  // a failed step ends the scenario
}
