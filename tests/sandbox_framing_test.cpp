// The sandbox wire's one JSON-lines framing (sandbox/framing.hpp), which the
// daemon and the client both use: lines taken across reads, the line limit,
// CRLF and blank lines, and the encoder.
#include <string>
#include <vector>

#include "catch_result.hpp"
#include "tether/protocol/sandbox_wire.hpp"
#include "tether/sandbox/framing.hpp"

using tether::errc;
using tether::sandbox::frame;
using tether::sandbox::k_unbounded_line;
using tether::sandbox::line_splitter;
namespace wire = tether::protocol::sandbox;

namespace {

// Every line the splitter has complete, in order; an error as "error: MESSAGE".
std::vector<std::string> take_all(line_splitter& s) {
  std::vector<std::string> out;
  while (auto l = s.next()) out.push_back(*l ? **l : "error: " + l->error().message);
  return out;
}

using lines = std::vector<std::string>;

}  // namespace

TEST_CASE("several lines in one read are taken one by one, then the splitter waits for more",
          "[sandbox][framing]") {
  line_splitter s(wire::k_max_line, "request line");
  s.feed("{\"type\":\"hello\"}\n{\"type\":\"list\"}\n{\"type\":\"ex");
  CHECK(take_all(s) == lines{"{\"type\":\"hello\"}", "{\"type\":\"list\"}"});
  CHECK(s.buffered() == std::string("{\"type\":\"ex").size());
  CHECK_FALSE(s.next().has_value());
}

TEST_CASE("a line split across three reads is taken whole once its newline arrives",
          "[sandbox][framing]") {
  line_splitter s(wire::k_max_line, "request line");
  s.feed("{\"type\":");
  CHECK(take_all(s).empty());
  s.feed("\"attach\",\"job\"");
  CHECK(take_all(s).empty());
  s.feed(":\"j1\"}\nnext");
  CHECK(take_all(s) == lines{"{\"type\":\"attach\",\"job\":\"j1\"}"});
  CHECK(s.buffered() == 4);
}

TEST_CASE("the lines taken are the same wherever the reads cut the stream", "[sandbox][framing]") {
  // With a limit of 8: a CRLF line of exactly 8 is a line, one of 9 and a
  // blank one of 9 are over the limit, however the reads cut them.
  const std::string stream =
      "a1\r\nbb2\n\n  \n12345678\r\n123456789\n         \r\nccc3\r\n\t\nd4\n";
  const std::string refused = "error: line is longer than 8 bytes; it was discarded";
  const lines want{"a1", "bb2", "12345678", refused, refused, "ccc3", "d4"};
  for (std::size_t i = 0; i <= stream.size(); ++i)
    for (std::size_t j = i; j <= stream.size(); ++j) {
      line_splitter s(8, "line");
      lines got;
      const std::size_t cuts[] = {0, i, j, stream.size()};
      for (int r = 0; r < 3; ++r) {
        s.feed(std::string_view(stream).substr(cuts[r], cuts[r + 1] - cuts[r]));
        auto more = take_all(s);
        got.insert(got.end(), more.begin(), more.end());
      }
      INFO("reads cut at " << i << " and " << j);
      CHECK(got == want);
    }
}

TEST_CASE("a CR before the newline is dropped and a line of only spaces and tabs is skipped",
          "[sandbox][framing]") {
  line_splitter s(wire::k_max_line, "request line");
  s.feed("one\r\n\r\n \t \ntwo\r\nthree\rstill three\n");
  CHECK(take_all(s) == lines{"one", "two", "three\rstill three"});
}

TEST_CASE("a request line over the limit is refused naming the limit and the next line is read",
          "[sandbox][framing]") {
  line_splitter s(wire::k_max_line, "request line");
  std::string huge(wire::k_max_line + 1, 'x');
  s.feed(huge + "\n{\"type\":\"list\",\"id\":9}\n");
  CHECK(take_all(s) == lines{"error: request line is longer than 1048576 bytes; it was discarded",
                             "{\"type\":\"list\",\"id\":9}"});
  // A line of exactly the limit is a line.
  s.feed(std::string(wire::k_max_line, 'y') + "\n");
  auto at_limit = s.next();
  REQUIRE(at_limit);
  REQUIRE(*at_limit);
  CHECK((*at_limit)->size() == wire::k_max_line);
}

TEST_CASE("an over-long line arriving over many reads gets one error and is never buffered whole",
          "[sandbox][framing]") {
  line_splitter s(16, "request line");
  s.feed(std::string(10, 'x'));
  CHECK(take_all(s).empty());
  s.feed(std::string(10, 'x'));  // 20 bytes and no end: over the limit
  auto first = s.next();
  REQUIRE(first);
  REQUIRE_FALSE(*first);
  CHECK(first->error().code == errc::invalid);
  CHECK(first->error().message == "request line is longer than 16 bytes; it was discarded");
  for (int i = 0; i < 100; ++i) {
    s.feed(std::string(1000, 'x'));  // the same line goes on: dropped, no second error
    CHECK(take_all(s).empty());
    CHECK(s.buffered() == 0);
  }
  s.feed("xxx\nok\n");  // its end, then a good line
  CHECK(take_all(s) == lines{"ok"});
}

TEST_CASE("the client's splitter takes a reply longer than a request may be",
          "[sandbox][framing]") {
  // An attach chunk of 1 MiB is about 1.4 MiB in base64.
  line_splitter s(k_unbounded_line, "reply line");
  std::string reply(wire::k_max_line * 3 / 2, 'r');
  for (std::size_t at = 0; at < reply.size(); at += 65536)
    s.feed(std::string_view(reply).substr(at, 65536));
  s.feed("\n");
  auto got = take_all(s);
  REQUIRE(got.size() == 1);
  CHECK(got[0] == reply);
}

TEST_CASE("framing a line appends one newline", "[sandbox][framing]") {
  auto f = frame(R"({"type":"list","id":1})");
  REQUIRE(f);
  CHECK(*f == "{\"type\":\"list\",\"id\":1}\n");
  line_splitter s(wire::k_max_line, "request line");
  s.feed(*f);
  CHECK(take_all(s) == lines{R"({"type":"list","id":1})"});
}

TEST_CASE("framing refuses a line holding a newline, which would be read as two",
          "[sandbox][framing]") {
  auto f = frame("{\"type\":\"list\",\n\"id\":1}");
  REQUIRE_FALSE(f);
  CHECK(f.error().code == errc::invalid);
  CHECK_THAT(f.error().message,
             Catch::Contains("newline at byte 15 of 23") && Catch::Contains("nothing was sent"));
}

TEST_CASE("framing refuses a line that would not be read back as itself", "[sandbox][framing]") {
  auto cr = frame("{\"id\":1}\r");
  REQUIRE_FALSE(cr);
  CHECK_THAT(cr.error().message, Catch::Contains("carriage return"));
  auto blank = frame(" \t ");
  REQUIRE_FALSE(blank);
  CHECK_THAT(blank.error().message, Catch::Contains("only spaces and tabs"));
}

TEST_CASE("a reply encoded by the wire codec frames as one line", "[sandbox][framing]") {
  wire::error_rep e{"invalid", "a message\nwith a newline in it"};
  auto f = frame(wire::encode(wire::reply{7, std::move(e)}));
  REQUIRE(f);
  line_splitter s(k_unbounded_line, "reply line");
  s.feed(*f);
  auto got = take_all(s);
  REQUIRE(got.size() == 1);
  auto back = wire::decode_reply(got[0]);
  REQUIRE(back);
  CHECK(back->id == 7);
  auto* rep = std::get_if<wire::error_rep>(&back->body);
  REQUIRE(rep);
  CHECK(rep->message == "a message\nwith a newline in it");
}
