// Subagent jobs under the receipt model: their transitions yield receipts
// bound to the parent's turn, delivered by the report path, and only the
// parent may cancel its child.
#include "report_support.hpp"

using namespace tether;
using namespace tether::test;

namespace {

struct receipt_line {
  std::string id, transition, state, scope;
};

// Every receipt of the database, straight from the table.
std::vector<receipt_line> all_receipts(report_fixture& f) {
  SQLite::Database db(f.dir.file("tether.db"), SQLite::OPEN_READONLY);
  SQLite::Statement q(db,
                      "SELECT id, transition, state, scope FROM receipts ORDER BY created_at, id");
  std::vector<receipt_line> out;
  while (q.executeStep())
    out.push_back({q.getColumn(0).getString(), q.getColumn(1).getString(),
                   q.getColumn(2).getString(), q.getColumn(3).getString()});
  return out;
}

}  // namespace

TEST_CASE(
    "a background subagent's transitions yield receipts bound to its parent's turn, "
    "acknowledged with its report",
    "[delivery][subagent]") {
  report_fixture f("subagent-receipts");
  f.on("child", 1, {say("audit done")});
  f.parent_spawns("child");
  f.quiet();
  auto rs = all_receipts(f);
  REQUIRE(rs.size() == 2);
  CHECK(rs[0].transition == "started");
  CHECK(rs[0].state == "acked");
  CHECK(rs[1].transition == "completed");
  CHECK(rs[1].state == "acked");  // its report is in the parent's inbox
  auto job = rs[0].id.substr(0, rs[0].id.find('/'));
  CHECK(rs[1].id == job + "/completed");
  auto scope = protocol::parse_json(rs[1].scope);
  REQUIRE(scope);
  auto s = protocol::scope_from_json(*scope);
  REQUIRE(s);
  CHECK(s->tenant.str() == "default");
  CHECK(s->thread.str() == "parent");
  auto parent = f.host->store().session(session_id("parent"));
  REQUIRE(parent);
  REQUIRE(*parent);
  REQUIRE((*parent)->turn);
  // The parent has had one turn since (the report woke it): the owner is the
  // turn that spawned the child, the first one.
  CHECK_FALSE(s->turn.empty());
  CHECK(s->turn != *(*parent)->turn);
}

TEST_CASE("a silenced link's terminal receipt is dropped, never delivered",
          "[delivery][subagent]") {
  report_fixture f("subagent-silenced");
  f.on("child", 1, {say("nobody hears this")});
  f.parent_spawns("child", false);
  f.quiet();
  auto rs = all_receipts(f);
  REQUIRE(rs.size() == 2);
  CHECK(rs[1].transition == "completed");
  CHECK(rs[1].state == "dropped");
  CHECK(f.inbox("parent").empty());
}

TEST_CASE(
    "a session cancelling a session that is not its child is told 'not found' and the other "
    "runs on",
    "[delivery][subagent]") {
  report_fixture f("subagent-stranger-cancel");
  f.spawn_blocking_child();  // "parent" owns "child", which blocks until cancelled
  auto answer = runtime::one_shot<result<void>>::make();
  f.code("stranger")->fn = [answer](agent_context& ctx,
                                    drain_input) -> boost::asio::awaitable<void> {
    auto cancelled = co_await ctx.cancel_child(session_id("child"));
    answer->set(cancelled);
    co_return;
  };
  auto s = f.sync(f.host->create_session("stranger", session_id("stranger")));
  REQUIRE(s);
  REQUIRE(f.sync(f.host->prompt(*s, "cancel someone else's child")));
  auto r = f.sync(answer->async_wait(boost::asio::use_awaitable));
  REQUIRE_FALSE(r);
  CHECK(r.error().code == errc::not_found);
  CHECK(r.error().message == "session 'child' not found");
  REQUIRE(f.sync(f.host->wait_idle(*s)));
  CHECK(f.host->is_busy(session_id("child")));  // still running its busy period
  f.host->interrupt(session_id("child"));
  f.quiet();
  auto rs = all_receipts(f);
  REQUIRE(rs.size() == 2);
  CHECK(rs[1].transition == "cancelled");
}
