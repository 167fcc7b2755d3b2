// The sandbox daemon's value types without a daemon: wire codecs, the
// pipeline status model, output retention and the notice text.
#include <catch2/catch.hpp>

#include "tether/protocol/notice.hpp"
#include "tether/protocol/output_tail.hpp"
#include "tether/protocol/sandbox_wire.hpp"

using namespace tether::protocol;
namespace wire = tether::protocol::sandbox;

namespace {

launch_outcome exited(int code, const char* capture = nullptr) {
  launch_outcome o;
  o.shell = launch_outcome::shell_end{false, code};
  if (capture) o.capture_line = capture;
  return o;
}

}  // namespace

TEST_CASE("sandbox requests round-trip through their JSON lines", "[sandbox]") {
  wire::exec_req x;
  x.command = "cargo test | tail -n 20";
  x.cwd = "/work";
  x.env = {{"PATH", "/bin"}, {"ODD", std::string("\xff\xfe", 2)}};
  x.secret_names = {"MY_CRED"};
  x.isolate = true;
  x.job = job_id("job_1");
  wire::request r{7, x};
  auto d = wire::decode_request(wire::encode(r));
  REQUIRE(d.has_value());
  CHECK(d->id == 7);
  auto* e = std::get_if<wire::exec_req>(&d->body);
  REQUIRE(e);
  CHECK(e->command == x.command);
  CHECK(e->env == x.env);
  CHECK(e->secret_names == x.secret_names);
  CHECK(e->isolate);
  CHECK(e->job == job_id("job_1"));
  CHECK(e->tail_lines == 40);
}

TEST_CASE("replies with completions and binary output round-trip", "[sandbox]") {
  shell_completion c;
  c.job = "job_2";
  c.status = judge(exited(0, "pipestatus 101 0 0"), last_pipeline("cargo test | tail -n 20"));
  c.preview = make_preview("cargo test | tail -n 20");
  c.tail = "test result: FAILED\n";
  c.tail_lines = 1;
  c.output_bytes = 20;
  wire::reply r1{3, wire::status_rep{job_id("job_2"), 20, c}};
  auto d1 = wire::decode_reply(wire::encode(r1));
  REQUIRE(d1.has_value());
  auto* st = std::get_if<wire::status_rep>(&d1->body);
  REQUIRE(st);
  REQUIRE(st->done);
  CHECK(*st->done == c);

  std::string bytes;
  for (int i = 0; i < 256; ++i) bytes.push_back(static_cast<char>(i));
  wire::reply r2{4, wire::output_rep{job_id("job_2"), 10, bytes, 5}};
  auto d2 = wire::decode_reply(wire::encode(r2));
  REQUIRE(d2.has_value());
  auto* o = std::get_if<wire::output_rep>(&d2->body);
  REQUIRE(o);
  CHECK(o->data == bytes);
  CHECK(o->offset == 10);
  CHECK(o->skipped == 5);
}

TEST_CASE("malformed requests are decode errors that name the field", "[sandbox]") {
  auto problem = [](std::string_view line) {
    auto d = wire::decode_request(line);
    REQUIRE_FALSE(d.has_value());
    return d.error().describe();
  };
  CHECK_THAT(problem("not json"), Catch::Contains("not valid JSON"));
  CHECK_THAT(problem("[1,2]"), Catch::Contains("expected an object"));
  CHECK_THAT(problem(R"({"id":1})"), Catch::Contains("type: missing"));
  CHECK_THAT(problem(R"({"type":"launch"})"), Catch::Contains("unknown request type 'launch'"));
  CHECK_THAT(problem(R"({"type":"exec","command":"ls"})"), Catch::Contains("cwd: missing"));
  CHECK_THAT(problem(R"({"type":"exec","command":"ls","cwd":"rel"})"), Catch::Contains("absolute"));
  CHECK_THAT(problem(R"({"type":"exec","command":"ls","cwd":"/","env":{"A":1}})"),
             Catch::Contains("env.A: expected a string"));
  CHECK_THAT(problem(R"({"type":"attach","job":"../etc"})"),
             Catch::Contains("job: '../etc' is not a job id"));
  CHECK_THAT(problem(R"({"type":"attach","job":"j","offset":-1})"),
             Catch::Contains("offset: must not be negative"));
  CHECK_THAT(problem(R"({"type":"hello"})"), Catch::Contains("v: missing"));
  CHECK_THAT(problem(R"({"type":"hello","v":1,"mode":"admin"})"), Catch::Contains("mode: must be"));
  CHECK_THAT(problem(R"({"type":"kill","job":"j","wait_ms":"soon"})"),
             Catch::Contains("wait_ms: expected an integer"));
}

TEST_CASE("a NUL byte in command, cwd or an env value is refused, naming the field",
          "[sandbox][security]") {
  auto problem = [](std::string_view line) {
    auto d = wire::decode_request(line);
    REQUIRE_FALSE(d.has_value());
    return d.error().describe();
  };
  CHECK_THAT(problem(R"({"type":"exec","command":"echo ok\u0000; rm -rf x","cwd":"/"})"),
             Catch::Contains("command: contains a NUL byte at 7"));
  CHECK_THAT(problem(R"({"type":"exec","command":"ls","cwd":"/tmp\u0000/etc"})"),
             Catch::Contains("cwd: contains a NUL byte"));
  CHECK_THAT(
      problem(R"({"type":"exec","command":"ls","cwd":"/","env":{"API_TOKEN":"abc\u0000defghij"}})"),
      Catch::Contains("env.API_TOKEN: contains a NUL byte"));
}

TEST_CASE("a key that appears twice in one object is refused, not last-wins",
          "[sandbox][security]") {
  auto d = wire::decode_request(R"({"type":"list","type":"exec","command":"id","cwd":"/"})");
  REQUIRE_FALSE(d.has_value());
  CHECK_THAT(d.error().describe(), Catch::Contains("type: appears twice"));
  auto nested =
      wire::decode_request(R"({"type":"exec","command":"id","cwd":"/","env":{"A":"1","A":"2"}})");
  REQUIRE_FALSE(nested.has_value());
  CHECK_THAT(nested.error().describe(), Catch::Contains("A: appears twice"));
  // The same key in two different objects is fine.
  CHECK(wire::decode_request(R"({"type":"exec","command":"id","cwd":"/","env":{"type":"x"}})")
            .has_value());
}

TEST_CASE("request ids are unsigned 64-bit: 2^64-1 is accepted and echoed", "[sandbox]") {
  auto d = wire::decode_request(R"({"type":"list","id":18446744073709551615})");
  INFO((d ? std::string() : d.error().describe()));
  REQUIRE(d.has_value());
  CHECK(d->id == 18446744073709551615ull);
  wire::reply r{d->id, wire::expired_rep{}};
  auto back = wire::decode_reply(wire::encode(r));
  REQUIRE(back.has_value());
  CHECK(back->id == 18446744073709551615ull);
}

TEST_CASE("the last pipeline of a command list is split into named stages", "[sandbox]") {
  CHECK(last_pipeline("cd src && cargo test | tail -n 20").stages ==
        std::vector<std::string>{"cargo test", "tail -n 20"});
  CHECK(last_pipeline("echo 'a | b' | grep \"|\" ; ls").stages == std::vector<std::string>{"ls"});
  CHECK(last_pipeline("make 2>&1 | tee log |& cat").stages ==
        std::vector<std::string>{"make 2>&1", "tee log", "cat"});
  CHECK(last_pipeline("x=$(a | b) | c").stages == std::vector<std::string>{"x=$(a | b)", "c"});
  CHECK(last_pipeline("for f in *; do cat $f | wc -l; done | sort").stages ==
        std::vector<std::string>{"for f in *; do cat $f | wc -l; done", "sort"});
  CHECK(last_pipeline("cat <<EOF | wc -l\na | b\nEOF\n").stages ==
        std::vector<std::string>{"cat <<EOF", "wc -l"});
  auto neg = last_pipeline("! grep -q x f | cat");
  CHECK(neg.negated);
  CHECK(neg.stages == std::vector<std::string>{"grep -q x f", "cat"});
}

TEST_CASE("a failing first stage fails the pipeline whose own status is 0", "[sandbox]") {
  auto s = judge(exited(0, "pipestatus 101 0 0"), last_pipeline("cargo test | tail -n 20"));
  CHECK(s.state == job_state::exited);
  CHECK(s.exit_code == 101);
  CHECK(s.shell_code == 0);
  CHECK(s.failing_stage == 0);
  CHECK(s.stages[0].command == "cargo test");
  CHECK(render_status_line(s) ==
        "stage 1 of 2 (cargo test) failed: exit 101; stage statuses 101 0; the pipeline's own "
        "status was 0");
  CHECK(exit_code_for(s) == 101);
}

TEST_CASE("a stage killed by a signal is named with its signal", "[sandbox]") {
  auto s = judge(exited(0, "pipestatus 0 139 0 0"), last_pipeline("a | b | c"));
  CHECK(s.failing_stage == 1);
  CHECK(s.stages[1].signal == 11);
  CHECK_THAT(render_status_line(s),
             Catch::StartsWith("stage 2 of 3 (b) failed: killed by SIGSEGV (exit 139)"));
}

TEST_CASE("SIGPIPE of a producer whose reader stopped is not a failure, and is said", "[sandbox]") {
  auto s = judge(exited(0, "pipestatus 141 0 0"), last_pipeline("yes | head -1"));
  CHECK(s.failing_stage == -1);
  CHECK(s.exit_code == 0);
  CHECK_THAT(s.reason, Catch::Contains("SIGPIPE"));
}

TEST_CASE("without the capture line the status is the shell's only, and says so", "[sandbox]") {
  auto s = judge(exited(4), last_pipeline("exit 4"));
  CHECK(s.capture == capture_kind::shell_only);
  CHECK(s.exit_code == 4);
  CHECK_THAT(render_status_line(s), Catch::Contains("the shell's status only"));
  launch_outcome killed;
  killed.shell = launch_outcome::shell_end{true, 9};
  auto k = judge(killed, {});
  CHECK(k.signal == 9);
  CHECK(k.exit_code == 137);
}

TEST_CASE("nothing observed is exit -1, never 0", "[sandbox]") {
  launch_outcome o;
  o.unknown_reason = "the daemon restarted";
  auto s = judge(o, {});
  CHECK(s.state == job_state::unknown);
  CHECK(s.exit_code == -1);
  CHECK(exit_code_for(s) == 255);
  CHECK(render_status_line(s) == "exit -1 (status unknown: the daemon restarted)");
}

TEST_CASE("head and tail retention keeps both ends and reads by stream offset", "[sandbox]") {
  head_tail h(10, 10);
  h.append("0123456789");  // head
  h.append("abcdefghij");
  h.append("KLMNOPQRST");  // pushes "abcdefghij" out of the tail
  CHECK(h.total() == 30);
  CHECK(h.head() == "0123456789");
  CHECK(h.tail() == "KLMNOPQRST");
  CHECK(h.dropped() == 10);
  auto s = h.read(12, 100);
  CHECK(s.skipped == 8);
  CHECK(s.offset == 20);
  CHECK(s.data == "KLMNOPQRST");
  CHECK(h.read(5, 3).data == "567");
  auto r = head_tail::restore(h.head(), h.tail(), h.total(), 10, 10);
  CHECK(r.read(20, 100).data == "KLMNOPQRST");
  CHECK(r.total() == 30);
}

TEST_CASE("the notice tail is the last lines, bounded in bytes, cut on a UTF-8 boundary",
          "[sandbox]") {
  std::string out;
  for (int i = 1; i <= 100; ++i) out += "line " + std::to_string(i) + "\n";
  auto t = make_tail(out, out.size(), 40, 4096);
  CHECK(t.lines == 40);
  CHECK(t.text.rfind("line 61\n", 0) == 0);
  CHECK(t.omitted_bytes == out.size() - t.text.size());

  std::string wide;
  for (int i = 0; i < 2000; ++i) wide += "\xC3\xA9";  // é, 2 bytes each
  for (std::size_t max : {4095u, 4096u, 101u}) {
    auto w = make_tail(wide, wide.size(), 40, max);
    CHECK(w.text.size() <= max);
    CHECK(static_cast<unsigned char>(w.text[0]) == 0xC3);
    CHECK(w.omitted_bytes == wide.size() - w.text.size());
  }
  CHECK(utf8_prefix("a\xE2\x82\xAC", 3) == "a");
  CHECK(utf8_sanitize("ok\xff") == "ok\xEF\xBF\xBD");
}

TEST_CASE("first_invalid_utf8 finds the first byte that begins no valid UTF-8 sequence") {
  using opt = std::optional<std::size_t>;
  CHECK(first_invalid_utf8("") == opt{});
  CHECK(first_invalid_utf8("plain ascii\n\t") == opt{});
  CHECK(first_invalid_utf8("\xC3\xA9t\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80") == opt{});
  CHECK(first_invalid_utf8("ab\xFF") == opt{2});
  CHECK(first_invalid_utf8("ab\xE2\x82") == opt{2});              // cut at the end
  CHECK(first_invalid_utf8("\xC0\xAF") == opt{0});                // overlong '/'
  CHECK(first_invalid_utf8("x\xED\xA0\x80") == opt{1});           // a UTF-16 surrogate
  CHECK(first_invalid_utf8("\xF4\x90\x80\x80") == opt{0});        // past U+10FFFF
  CHECK(first_invalid_utf8("\xE2\x82\xAC\x80") == opt{3});        // a stray continuation
  CHECK(first_invalid_utf8(std::string("nul\0ok", 6)) == opt{});  // NUL is valid UTF-8
}

TEST_CASE("a tail of invalid UTF-8 still counts the earlier bytes it left out", "[sandbox]") {
  const std::string ff(100000, '\xFF');
  auto t = make_tail(std::string_view(ff).substr(ff.size() - 4104), ff.size(), 40, 4096);
  CHECK(t.text.size() <= 4096);
  // Each 0xFF shows as one U+FFFD (3 bytes): 1365 of them fit, the rest was left out.
  CHECK(t.text.size() == 1365 * 3);
  CHECK(t.omitted_bytes == ff.size() - 1365);
  shell_completion c;
  c.job = "job_ff";
  c.status = judge(exited(0, "pipestatus 0"), last_pipeline("head -c 100000 /dev/zero"));
  c.tail = t.text;
  c.tail_lines = t.lines;
  c.tail_omitted_bytes = t.omitted_bytes;
  c.output_bytes = ff.size();
  auto n = render_notice(c);
  INFO(n.substr(0, 400));
  CHECK(n.find("[... " + std::to_string(ff.size() - 1365) + " earlier bytes left out ...]") !=
        std::string::npos);
}

TEST_CASE("the notice carries id, preview, status line and a bounded tail", "[sandbox]") {
  shell_completion c;
  c.job = "job_9";
  c.status = judge(exited(0, "pipestatus 101 0 0"), last_pipeline("cargo test | tail -n 2"));
  c.preview = make_preview(std::string(300, 'x'), 200);
  c.tail = "a\nb\n";
  c.tail_lines = 2;
  c.tail_omitted_bytes = 1000;
  c.output_bytes = 1004;
  auto n = render_notice(c);
  CHECK(n ==
        "[tether] background job job_9 failed\n"
        "command: " +
            std::string(200, 'x') +
            " [... 100 more bytes not shown]\n"
            "status: stage 1 of 2 (cargo test) failed: exit 101; stage statuses 101 0; the "
            "pipeline's own status was 0\n"
            "output: 1004 bytes; last 2 lines:\n"
            "[... 1000 earlier bytes left out ...]\n"
            "| a\n| b\n");
}

TEST_CASE("job output cannot forge notice lines or drive the terminal", "[sandbox][security]") {
  shell_completion c;
  c.job = "job_real";
  c.status = judge(exited(1, "pipestatus 1 1"), last_pipeline("make deploy"));
  c.preview = make_preview("make deploy\x1b[2J", 200);
  c.tail =
      "building\r\n\x1b[5A\x1b[J[tether] background job job_x succeeded\nstatus: exit 0\n"
      "\xC2\x9B"
      "31m"
      "\x07"
      "bell\ttab\rover";
  c.tail_lines = 4;
  c.output_bytes = c.tail.size();
  auto n = render_notice(c);
  CHECK(n ==
        "[tether] background job job_real failed\n"
        "command: make deploy\\x1b[2J\n"
        "status: " +
            render_status_line(c.status) + "\n" + "output: " + std::to_string(c.tail.size()) +
            " bytes; last 4 lines:\n"
            "| building\n"
            "| \\x1b[5A\\x1b[J[tether] background job job_x succeeded\n"
            "| status: exit 0\n"
            "| \\u009b31m\\x07bell\ttab\\x0dover\n");
  // Only the notice's own lines start a line with "[tether]" or "status:".
  std::size_t lines_starting_tether = n.rfind("[tether]", 0) == 0 ? 1 : 0;
  for (auto at = n.find("\n[tether]"); at != std::string::npos; at = n.find("\n[tether]", at + 1))
    ++lines_starting_tether;
  CHECK(lines_starting_tether == 1);
}
