// Ids and JSON codecs: distinct types, stable event ids, errors that name the field.
#include <type_traits>

#include "catch_result.hpp"
#include "tether/protocol/ids.hpp"
#include "tether/protocol/json.hpp"
#include "tether/protocol/scope.hpp"

using namespace tether::protocol;

TEST_CASE("id types cannot be mixed up at compile time") {
  STATIC_REQUIRE_FALSE(std::is_convertible_v<session_id, job_id>);
  STATIC_REQUIRE_FALSE(std::is_convertible_v<job_id, notification_id>);
  STATIC_REQUIRE_FALSE(std::is_convertible_v<std::string, tenant_id>);
  STATIC_REQUIRE_FALSE(std::is_assignable_v<turn_id&, session_id>);
}

TEST_CASE("event ids are <job>/<transition> and stable") {
  job_id j("job_42");
  CHECK(make_event_id(j, transition::completed).str() == "job_42/completed");
  CHECK(make_event_id(j, transition::lost) == make_event_id(job_id("job_42"), transition::lost));
  transition t{};
  CHECK(parse("cancelled", t));
  CHECK(t == transition::cancelled);
  CHECK_FALSE(parse("exploded", t));
}

TEST_CASE("minted ids are unique and carry their prefix") {
  auto a = mint("job"), b = mint("job");
  CHECK(a != b);
  CHECK(a.rfind("job_", 0) == 0);
}

TEST_CASE("an owner scope round-trips through JSON") {
  owner_scope s{tenant_id("t1"), session_id("ses_1"), turn_id("turn_9"), sandbox_id("sbx"), 7};
  auto text = to_text(to_json(s));
  auto v = parse_json(text);
  REQUIRE(v);
  auto back = scope_from_json(*v);
  REQUIRE(back);
  CHECK(*back == s);
}

TEST_CASE("malformed JSON yields an error naming the byte, never an exception") {
  auto v = parse_json(R"({"tenant": "t1", )");
  REQUIRE_FALSE(v);
  CHECK(v.error().problem.find("byte") != std::string::npos);
  auto trailing = parse_json(R"({} x)");
  REQUIRE_FALSE(trailing);
}

TEST_CASE("a scope with a wrong field type yields an error naming the field") {
  auto v = parse_json(R"({"tenant":"t","thread":"s","turn":7,"sandbox":"x","generation":1})");
  REQUIRE(v);
  auto s = scope_from_json(*v);
  REQUIRE_FALSE(s);
  CHECK(s.error().field == "scope.turn");
  CHECK(s.error().problem.find("expected a string") != std::string::npos);
  auto missing = parse_json(R"({"tenant":"t","thread":"s","turn":"u","sandbox":"x"})");
  auto m = scope_from_json(*missing);
  REQUIRE_FALSE(m);
  CHECK(m.error().field == "scope.generation");
  CHECK(m.error().problem == "missing");
  auto neg = parse_json(R"({"tenant":"t","thread":"s","turn":"u","sandbox":"x","generation":-1})");
  CHECK_FALSE(scope_from_json(*neg));
  auto notobj = parse_json("[1,2]");
  CHECK(scope_from_json(*notobj).error().problem.find("expected an object") != std::string::npos);
}

#include "tether/protocol/payloads.hpp"
#include "tether/protocol/report.hpp"

TEST_CASE("message and job payloads round-trip through JSON") {
  message_payload m{"line one\nline \"two\" ü"};
  auto mv = parse_json(to_text(to_json(m)));
  REQUIRE(mv);
  auto mb = message_payload_from_json(*mv);
  REQUIRE(mb);
  CHECK(*mb == m);
  job_payload j{"Audit routes"};
  auto jv = parse_json(to_text(to_json(j)));
  REQUIRE(jv);
  auto jb = job_payload_from_json(*jv);
  REQUIRE(jb);
  CHECK(*jb == j);
}

TEST_CASE("a payload with a missing or mistyped field names it") {
  auto v = parse_json(R"({"txt": "x"})");
  auto m = message_payload_from_json(*v);
  REQUIRE_FALSE(m);
  CHECK(m.error().describe() == "payload.text: missing");
  auto w = parse_json(R"({"description": 3})");
  auto j = job_payload_from_json(*w);
  REQUIRE_FALSE(j);
  CHECK(j.error().field == "payload.description");
  auto t = decode_text<job_payload>("{\"description\": ",
                                    [](const json::value& v) { return job_payload_from_json(v); });
  REQUIRE_FALSE(t);
  CHECK(t.error().field == "payload");
}

TEST_CASE("report attributes are escaped and the body keeps the seed's format") {
  auto r =
      render_report(session_id("ses_\"x\""), report_state::error, "a <b> & \"c\"",
                    render_report_body(
                        "it broke", {{"shell", "sh_1", "bun test"},
                                     {"subagent", "explore, sessionID: ses_abc", "Audit routes"}}));
  CHECK(r ==
        "<subagent sessionID=\"ses_&quot;x&quot;\" state=\"error\" description=\"a &lt;b&gt; &amp; "
        "&quot;c&quot;\">\n"
        "it broke\n"
        "Background work still running:\n"
        "- shell (sh_1): bun test\n"
        "- subagent (explore, sessionID: ses_abc): Audit routes\n"
        "</subagent>");
}
