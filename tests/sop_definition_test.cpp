// SOP definitions (docs/sop.md, Definitions): a definition round-trips
// through JSON exactly, omitted fields take the documented defaults, and a
// file or directory that does not parse or check is refused whole, naming
// the file, the field as a dotted path and the problem.
#include <catch2/catch.hpp>
#include <fstream>

#include "catch_result.hpp"
#include "support.hpp"
#include "tether/protocol/sop.hpp"

using namespace tether;
using protocol::sop_definition;
using protocol::sop_step;
using protocol::sop_step_kind;
using protocol::sop_timeout_action;

namespace {

// A definition with every field away from its default.
sop_definition full_definition() {
  sop_definition d;
  d.name = "deploy-web.v2";
  d.description = "Build, review, approve and deploy the web tier";
  d.agent = "ops";
  d.max_concurrent = 2;
  d.max_payload_bytes = 1024;
  d.approvers = {"alice", "bob"};
  d.approval_timeout_ms = 60000;
  d.on_timeout = sop_timeout_action::cancel;

  sop_step build;
  build.name = "build";
  build.command = "make -C web";
  build.cwd = "/srv/web";
  build.on_failure = "notify";
  build.retries = 0;
  build.max_visits = 3;
  build.timeout_ms = 0;
  build.max_output_bytes = 1024;
  build.idempotent = true;

  sop_step review;
  review.name = "review";
  review.kind = sop_step_kind::prompt;
  review.prompt = "Review the build log and say whether to ship.";
  review.retries = 1;
  review.timeout_ms = 30000;

  sop_step approve;
  approve.name = "approve";
  approve.kind = sop_step_kind::approval;
  approve.next = "deploy";
  approve.on_failure = "end";
  approve.approvers = {"carol"};
  approve.approval_timeout_ms = 0;
  approve.on_timeout = sop_timeout_action::auto_approve;

  sop_step deploy;
  deploy.name = "deploy";
  deploy.command = "./deploy.sh";
  deploy.next = "end";
  deploy.max_visits = 100000;

  sop_step notify;
  notify.name = "notify";
  notify.kind = sop_step_kind::checkpoint;
  notify.next = "fail";

  d.steps = {build, review, approve, deploy, notify};
  return d;
}

// The error parse_sop reports for `text`, as "field: problem".
std::string error_of(const std::string& text) {
  auto d = protocol::parse_sop(text);
  INFO(text);
  REQUIRE_FALSE(d);
  return d.error().describe();
}

// A one-step SOP whose step has the extra members `step_extra` and whose
// top level has `top_extra` (each "" or starting with a comma).
std::string one_step(const std::string& step_extra, const std::string& top_extra = "") {
  return R"({"name": "s", "steps": [{"name": "a", "command": "true")" + step_extra + "}]" +
         top_extra + "}";
}

std::string approval_sop(const std::string& top_extra, const std::string& step_extra) {
  return R"({"name": "s")" + top_extra + R"(, "steps": [{"name": "gate", "kind": "approval")" +
         step_extra + "}]}";
}

void write_file(const std::filesystem::path& p, const std::string& text) {
  std::ofstream out(p, std::ios::binary);
  out << text;
  REQUIRE(out);
}

std::string sop_named(const std::string& name) {
  return R"({"name": ")" + name + R"(", "steps": [{"name": "a", "command": "true"}]})";
}

}  // namespace

TEST_CASE("a SOP definition round-trips through JSON exactly, every field set", "[sop_def]") {
  auto d = full_definition();
  REQUIRE_FALSE(protocol::check(d));
  auto back = protocol::sop_from_json(protocol::to_json(d));
  REQUIRE(back);
  CHECK(*back == d);
  auto parsed = protocol::parse_sop(protocol::to_text(protocol::to_json(d)));
  REQUIRE(parsed);
  CHECK(*parsed == d);
  // Every field is written, the step overrides left to the SOP as null.
  sop_definition small;
  small.name = "small";
  small.steps.push_back(sop_step{.name = "only", .command = "true"});
  auto j = protocol::to_json(small);
  const auto& step = j.at("steps").at(0).as_object();
  CHECK(step.size() == 15);
  CHECK(step.at("approval_timeout_ms").is_null());
  CHECK(step.at("on_timeout").is_null());
  CHECK(j.as_object().size() == 9);
  auto small_back = protocol::sop_from_json(j);
  REQUIRE(small_back);
  CHECK(*small_back == small);
}

TEST_CASE("a SOP file's omitted fields take the documented defaults", "[sop_def]") {
  auto d = protocol::parse_sop(R"({"name": "s", "steps": [
      {"name": "a", "command": "true"},
      {"name": "b", "kind": "approval"},
      {"name": "c", "kind": "checkpoint", "next": "a", "on_failure": "end"}]})");
  REQUIRE(d);
  CHECK(d->description.empty());
  CHECK(d->agent.empty());
  CHECK(d->max_concurrent == 4);
  CHECK(d->max_payload_bytes == 8192);
  CHECK(d->approvers.empty());
  CHECK(d->approval_timeout_ms == 300000);
  CHECK(d->on_timeout == sop_timeout_action::escalate);
  const auto& a = d->steps[0];
  CHECK(a.kind == sop_step_kind::shell);
  CHECK(a.cwd.empty());
  CHECK(a.retries == 2);
  CHECK(a.max_visits == 256);
  CHECK(a.timeout_ms == 120000);
  CHECK(a.max_output_bytes == 16384);
  CHECK_FALSE(a.idempotent);
  CHECK_FALSE(d->steps[1].approval_timeout_ms);
  CHECK_FALSE(d->steps[1].on_timeout);
  // Transitions: "" is the next step (end after the last) and fail.
  CHECK(d->success_target(0) == "b");
  CHECK(d->failure_target(0) == "fail");
  CHECK(d->success_target(2) == "a");
  CHECK(d->failure_target(2) == "end");
  CHECK(d->index_of("c") == 2u);
  CHECK_FALSE(d->index_of("end"));
  // An approval step without overrides takes the SOP's.
  CHECK(d->approvers_of(1).empty());
  CHECK(d->approval_timeout_of(1) == 300000);
  CHECK(d->on_timeout_of(1) == sop_timeout_action::escalate);
  CHECK(protocol::to_string(sop_step_kind::checkpoint) == "checkpoint");
  CHECK(protocol::to_string(sop_timeout_action::auto_approve) == "auto_approve");
}

TEST_CASE("an approval step's own approvers, timeout and action override the SOP's", "[sop_def]") {
  auto d = full_definition();
  auto approve = *d.index_of("approve");
  CHECK(d.approvers_of(approve) == std::vector<std::string>{"carol"});
  CHECK(d.approval_timeout_of(approve) == 0);
  CHECK(d.on_timeout_of(approve) == sop_timeout_action::auto_approve);
  CHECK(d.success_target(approve) == "deploy");
  CHECK(d.success_target(*d.index_of("deploy")) == "end");
  CHECK(d.failure_target(*d.index_of("build")) == "notify");
  d.steps[approve].approvers.clear();
  d.steps[approve].approval_timeout_ms.reset();
  d.steps[approve].on_timeout.reset();
  CHECK(d.approvers_of(approve) == std::vector<std::string>{"alice", "bob"});
  CHECK(d.approval_timeout_of(approve) == 60000);
  CHECK(d.on_timeout_of(approve) == sop_timeout_action::cancel);
}

TEST_CASE("an unknown key is refused, naming it and the known ones", "[sop_def]") {
  CHECK(error_of(one_step("", R"(, "colour": "red")")) ==
        "colour: unknown field (known: name, description, agent, max_concurrent, "
        "max_payload_bytes, approvers, approval_timeout_ms, on_timeout, steps)");
  CHECK(error_of(one_step(R"(, "timeout": 5)")) ==
        "steps[0] (a).timeout: unknown field (known: name, kind, command, cwd, prompt, next, "
        "on_failure, retries, max_visits, timeout_ms, max_output_bytes, idempotent, approvers, "
        "approval_timeout_ms, on_timeout)");
}

TEST_CASE("a step kind or timeout action that is not one of the named ones is refused",
          "[sop_def]") {
  CHECK(error_of(one_step(R"(, "kind": "bash")")) ==
        "steps[0] (a).kind: 'bash' is not one of shell, prompt, approval, checkpoint");
  CHECK(error_of(one_step("", R"(, "on_timeout": "approve")")) ==
        "on_timeout: 'approve' is not one of escalate, cancel, auto_approve");
  CHECK(error_of(one_step(R"(, "kind": 3)")) == "steps[0] (a).kind: expected a string, got int64");
}

TEST_CASE("each step kind needs its own fields and refuses the others'", "[sop_def]") {
  CHECK(error_of(R"({"name": "s", "steps": [{"name": "a", "cwd": "/tmp"}]})") ==
        "steps[0] (a).command: a shell step needs a command");
  CHECK(error_of(R"({"name": "s", "steps": [{"name": "a", "command": ""}]})") ==
        "steps[0] (a).command: a shell step needs a command");
  CHECK(error_of(R"({"name": "s", "steps": [{"name": "p", "kind": "prompt"}]})") ==
        "steps[0] (p).prompt: a prompt step needs a prompt");
  CHECK(error_of(R"({"name": "s", "steps": [{"name": "p", "kind": "prompt", "prompt": "hi",
                     "command": "true"}]})") ==
        "steps[0] (p).command: a prompt step has no command");
  CHECK(error_of(one_step(R"(, "prompt": "hi")")) ==
        "steps[0] (a).prompt: a shell step has no prompt");
  CHECK(error_of(one_step(R"(, "cwd": "srv/web")")) ==
        "steps[0] (a).cwd: 'srv/web' is not an absolute path");
  CHECK(error_of(approval_sop(R"(, "approvers": ["alice"])", R"(, "command": "true")")) ==
        "steps[0] (gate).command: an approval step has no command");
  CHECK(
      error_of(R"({"name": "s", "steps": [{"name": "c", "kind": "checkpoint", "prompt": "x"}]})") ==
      "steps[0] (c).prompt: a checkpoint step has no prompt");
  CHECK(error_of(one_step(R"(, "approvers": ["alice"])")) ==
        "steps[0] (a).approvers: only an approval step has approvers");
  CHECK(error_of(one_step(R"(, "on_timeout": "cancel")")) ==
        "steps[0] (a).on_timeout: only an approval step has a timeout action");
  // A command of 64 KiB is accepted; one byte more is refused.
  sop_definition d;
  d.name = "big";
  d.steps.push_back(sop_step{.name = "a", .command = std::string(65536, 'x')});
  CHECK_FALSE(protocol::check(d));
  d.steps[0].command += 'x';
  auto e = protocol::check(d);
  REQUIRE(e);
  CHECK(e->describe() == "steps[0] (a).command: is 65537 bytes, more than 65536");
}

TEST_CASE(
    "a transition naming a missing step is refused, and end, fail and step names are accepted",
    "[sop_def]") {
  CHECK(error_of(R"({"name": "s", "steps": [{"name": "build", "command": "true"},
                     {"name": "deploy", "command": "true", "next": "verify"}]})") ==
        R"(steps[1] (deploy).next: 'verify' is not a step of this SOP, "end" or "fail")");
  CHECK(error_of(one_step(R"(, "on_failure": "End")")) ==
        R"(steps[0] (a).on_failure: 'End' is not a step of this SOP, "end" or "fail")");
  CHECK(protocol::parse_sop(R"({"name": "s", "steps": [
      {"name": "a", "command": "true", "next": "fail", "on_failure": "b"},
      {"name": "b", "command": "true", "next": "a", "on_failure": "end"}]})"));
}

TEST_CASE("step names are unique, well formed and never end or fail", "[sop_def]") {
  CHECK(error_of(R"({"name": "s", "steps": [{"name": "a", "command": "true"},
                     {"name": "b", "command": "true"}, {"name": "a", "command": "false"}]})") ==
        "steps[2] (a).name: duplicate of steps[0] (a)");
  CHECK(error_of(R"({"name": "s", "steps": [{"name": "end", "command": "true"}]})") ==
        "steps[0] (end).name: 'end' is reserved (a transition target)");
  CHECK(error_of(R"({"name": "s", "steps": [{"name": "fail", "command": "true"}]})") ==
        "steps[0] (fail).name: 'fail' is reserved (a transition target)");
  CHECK(error_of(R"({"name": "s", "steps": [{"name": "a b", "command": "true"}]})") ==
        "steps[0] (a b).name: 'a b' is not 1..64 of A-Z a-z 0-9 _ . -");
  CHECK(error_of(R"({"name": "s", "steps": [{"command": "true"}]})") == "steps[0].name: missing");
  CHECK(error_of(R"({"name": "", "steps": [{"name": "a", "command": "true"}]})") ==
        "name: '' is not 1..64 of A-Z a-z 0-9 _ . -");
  CHECK(error_of(R"({"name": ")" + std::string(65, 'n') +
                 R"(", "steps": [{"name": "a", "command": "true"}]})")
            .rfind("name: ", 0) == 0);
  CHECK(error_of(R"({"name": "s", "steps": []})") == "steps: a SOP needs at least one step");
  CHECK(error_of(R"({"name": "s"})") == "steps: missing");
  CHECK(error_of(R"({"name": "s", "steps": [3]})") == "steps[0]: expected an object, got int64");
}

TEST_CASE(
    "numbers out of bounds are refused naming the field, and the bounds themselves are accepted",
    "[sop_def]") {
  struct edge {
    std::string step, top, error;  // error "" = accepted
  };
  const std::vector<edge> edges = {
      {R"(, "retries": 0)", "", ""},
      {R"(, "retries": 100)", "", ""},
      {R"(, "retries": 101)", "", "steps[0] (a).retries: must be in 0..100, not 101"},
      {R"(, "retries": -1)", "", "steps[0] (a).retries: must be in 0..100, not -1"},
      {R"(, "max_visits": 1)", "", ""},
      {R"(, "max_visits": 100000)", "", ""},
      {R"(, "max_visits": 0)", "", "steps[0] (a).max_visits: must be in 1..100000, not 0"},
      {R"(, "max_visits": 100001)", "",
       "steps[0] (a).max_visits: must be in 1..100000, not 100001"},
      {R"(, "timeout_ms": 0)", "", ""},
      {R"(, "timeout_ms": -1)", "", "steps[0] (a).timeout_ms: must be >= 0, not -1"},
      {R"(, "max_output_bytes": 1)", "", ""},
      {R"(, "max_output_bytes": 1048576)", "", ""},
      {R"(, "max_output_bytes": 0)", "",
       "steps[0] (a).max_output_bytes: must be in 1..1048576, not 0"},
      {R"(, "max_output_bytes": 1048577)", "",
       "steps[0] (a).max_output_bytes: must be in 1..1048576, not 1048577"},
      {R"(, "retries": 4294967298)", "", "steps[0] (a).retries: must be in 0..100, not 4294967298"},
      {R"(, "retries": 1.5)", "", "steps[0] (a).retries: expected an integer, got double"},
      {"", R"(, "max_concurrent": 1)", ""},
      {"", R"(, "max_concurrent": 10000)", ""},
      {"", R"(, "max_concurrent": 0)", "max_concurrent: must be in 1..10000, not 0"},
      {"", R"(, "max_concurrent": 10001)", "max_concurrent: must be in 1..10000, not 10001"},
      {"", R"(, "max_payload_bytes": 0)", ""},
      {"", R"(, "max_payload_bytes": 1048576)", ""},
      {"", R"(, "max_payload_bytes": -1)", "max_payload_bytes: must be in 0..1048576, not -1"},
      {"", R"(, "max_payload_bytes": 1048577)",
       "max_payload_bytes: must be in 0..1048576, not 1048577"},
      {"", R"(, "approval_timeout_ms": 0)", ""},
      {"", R"(, "approval_timeout_ms": -1)", "approval_timeout_ms: must be >= 0, not -1"},
      {"", R"(, "approvers": ["alice", ""])", "approvers[1]: an approver is a non-empty name"},
      {"", R"(, "approvers": ["alice", 7])", "approvers[1]: expected a string, got int64"},
      {"", R"(, "approvers": "alice")", "approvers: expected an array, got string"},
  };
  for (const auto& e : edges) {
    auto text = one_step(e.step, e.top);
    INFO(text);
    auto d = protocol::parse_sop(text);
    if (e.error.empty()) {
      CHECK(d);
    } else {
      REQUIRE_FALSE(d);
      CHECK(d.error().describe() == e.error);
    }
  }
  CHECK(error_of(approval_sop(R"(, "approvers": ["alice"])", R"(, "approval_timeout_ms": -5)")) ==
        "steps[0] (gate).approval_timeout_ms: must be >= 0, not -5");
  CHECK(error_of(approval_sop("", R"(, "approvers": ["alice", ""])")) ==
        "steps[0] (gate).approvers[1]: an approver is a non-empty name");
  // check() names the same fields on a definition built in code.
  auto d = full_definition();
  d.steps[3].retries = 101;
  auto e = protocol::check(d);
  REQUIRE(e);
  CHECK(e->describe() == "steps[3] (deploy).retries: must be in 0..100, not 101");
  d = full_definition();
  d.max_payload_bytes = 2 * 1024 * 1024;
  e = protocol::check(d);
  REQUIRE(e);
  CHECK(e->describe() == "max_payload_bytes: must be in 0..1048576, not 2097152");
}

TEST_CASE("a key given twice in one object is refused", "[sop_def]") {
  CHECK(
      error_of(R"({"name": "s", "steps": [{"name": "a", "command": "true", "command": "rm"}]})") ==
      "the key 'command' appears twice in one object");
  CHECK(error_of(R"({"name": "s", "name": "t", "steps": [{"name": "a", "command": "true"}]})") ==
        "the key 'name' appears twice in one object");
}

TEST_CASE("a syntax error names its line and column", "[sop_def]") {
  const std::string text =
      "{\n"
      "  \"name\": \"s\",\n"
      "  \"steps\": [\n"
      "    {\"name\": \"a\" \"command\": \"true\"}\n"
      "  ]\n"
      "}\n";
  auto problem = error_of(text);
  CHECK(problem.rfind("not valid JSON at line 4, column 18 (", 0) == 0);
  // Cut short: the error is at the end of the text.
  CHECK(error_of("{\n\"name\": \"s\",\n\"steps\": [")
            .rfind("not valid JSON at line 3, column 11 (", 0) == 0);
  CHECK(error_of("{} {}").rfind("not valid JSON at line 1, column 4 (", 0) == 0);
  CHECK(error_of("").rfind("not valid JSON at line 1, column 1 (", 0) == 0);
}

TEST_CASE("an approval step that nobody may approve and no timeout ends is refused", "[sop_def]") {
  const std::string never =
      "steps[0] (gate).approvers: nobody may approve (neither the step nor the SOP names an "
      "approver) and the approval timeout is 0 (none): the wait could never end; name an "
      "approver or set approval_timeout_ms";
  CHECK(error_of(approval_sop(R"(, "approval_timeout_ms": 0)", "")) == never);
  CHECK(error_of(approval_sop("", R"(, "approval_timeout_ms": 0)")) == never);
  // Whatever the action: a timeout of 0 never fires it.
  CHECK(error_of(approval_sop("", R"(, "approval_timeout_ms": 0, "on_timeout": "cancel")")) ==
        never);
  // An approver, or a timeout that fires, can end the wait.
  CHECK(protocol::parse_sop(
      approval_sop(R"(, "approvers": ["alice"], "approval_timeout_ms": 0)", "")));
  CHECK(protocol::parse_sop(
      approval_sop(R"(, "approval_timeout_ms": 0)", R"(, "approvers": ["alice"])")));
  CHECK(protocol::parse_sop(approval_sop("", "")));  // escalates every 300000 ms; a cancel ends it
  CHECK(protocol::parse_sop(
      approval_sop(R"(, "approval_timeout_ms": 0)",
                   R"(, "approval_timeout_ms": 1000, "on_timeout": "cancel")")));
}

TEST_CASE("a SOP directory loads every *.json file, by file name", "[sop_def]") {
  test::scratch_dir dir("sop-def-load");
  write_file(dir.path() / "b.json", sop_named("zeta"));
  write_file(dir.path() / "a.json", sop_named("alpha"));
  write_file(dir.path() / "README.md", "not a SOP");
  write_file(dir.path() / "old.json.bak", "{");
  std::filesystem::create_directory(dir.path() / "drafts.json");
  auto sops = protocol::load_sop_dir(dir.path().string());
  REQUIRE(sops);
  REQUIRE(sops->size() == 2);
  CHECK((*sops)[0].name == "alpha");
  CHECK((*sops)[1].name == "zeta");
  test::scratch_dir empty("sop-def-empty");
  auto none = protocol::load_sop_dir(empty.path().string());
  REQUIRE(none);
  CHECK(none->empty());
}

TEST_CASE("a SOP directory with one bad file loads nothing and names the file", "[sop_def]") {
  test::scratch_dir dir("sop-def-bad");
  write_file(dir.path() / "a.json", sop_named("alpha"));
  write_file(
      dir.path() / "b.json",
      R"({"name": "beta", "steps": [{"name": "a", "command": "true"}, {"name": "b", "kind": "ssh"}]})");
  write_file(dir.path() / "c.json", sop_named("gamma"));
  auto sops = protocol::load_sop_dir(dir.path().string());
  REQUIRE_FALSE(sops);
  const auto b = (dir.path() / "b.json").string();
  CHECK(sops.error().field == b + ": steps[1] (b).kind");
  CHECK(sops.error().problem == "'ssh' is not one of shell, prompt, approval, checkpoint");

  write_file(dir.path() / "b.json", "{\n  \"name\": \"beta\",\n  \"steps\": [}\n");
  sops = protocol::load_sop_dir(dir.path().string());
  REQUIRE_FALSE(sops);
  CHECK(sops.error().field == b);
  CHECK(sops.error().problem.rfind("not valid JSON at line 3, column 13 (", 0) == 0);
}

TEST_CASE("two files defining one SOP name are refused, naming both", "[sop_def]") {
  test::scratch_dir dir("sop-def-dup");
  write_file(dir.path() / "deploy.json", sop_named("deploy"));
  write_file(dir.path() / "deploy-copy.json", sop_named("deploy"));
  auto sops = protocol::load_sop_dir(dir.path().string());
  REQUIRE_FALSE(sops);
  CHECK(sops.error().field == (dir.path() / "deploy.json").string() + ": name");
  CHECK(sops.error().problem ==
        "the SOP 'deploy' is also defined by " + (dir.path() / "deploy-copy.json").string());
}

TEST_CASE("a missing SOP directory, or a file in its place, is an error naming it", "[sop_def]") {
  test::scratch_dir dir("sop-def-missing");
  auto missing = (dir.path() / "sops").string();
  auto r = protocol::load_sop_dir(missing);
  REQUIRE_FALSE(r);
  CHECK(r.error().describe() == missing + ": no such directory; no SOP was loaded");
  write_file(dir.path() / "sops", "");
  r = protocol::load_sop_dir(missing);
  REQUIRE_FALSE(r);
  CHECK(r.error().describe() == missing + ": is not a directory; no SOP was loaded");
  // A dangling link named *.json was meant as a SOP: refused, not skipped.
  auto link = dir.path() / "linked";
  std::filesystem::create_directory(link);
  std::filesystem::create_symlink(dir.path() / "nowhere.json", link / "gone.json");
  r = protocol::load_sop_dir(link.string());
  REQUIRE_FALSE(r);
  CHECK(r.error().field == (link / "gone.json").string());
  CHECK(r.error().problem.find("cannot be read") != std::string::npos);
}

TEST_CASE("the example SOP directory is valid", "[sop_def]") {
  auto sops = protocol::load_sop_dir(std::string(TETHER_SOURCE_DIR) + "/examples/sop");
  INFO((sops ? std::string() : sops.error().describe()));
  REQUIRE(sops);
  REQUIRE(sops->size() == 1);
  const auto& d = (*sops)[0];
  CHECK(d.name == "deploy");
  REQUIRE(d.steps.size() == 3);
  CHECK(d.steps[1].kind == sop_step_kind::approval);
  CHECK(d.approvers_of(1) == std::vector<std::string>{"alice"});
  CHECK(d.success_target(2) == "end");
}
