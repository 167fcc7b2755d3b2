// The inbox actor (actors/inbox.hpp): one per session, it admits under the
// inbox id (a repeat is dropped), tells its session before it answers the
// asker, and steers or wakes its session when asked.
#include <catch2/catch.hpp>

#include "catch_result.hpp"
#include "report_support.hpp"

using namespace tether;
using namespace tether::test;

TEST_CASE("an inbox admits a repeated id once and its session learns of the admit before the asker",
          "[inbox]") {
  report_fixture f("inbox_order");
  auto s = f.sync(f.host->create_session("owner", session_id("s")));
  REQUIRE(s);
  REQUIRE(f.sync(f.host->prompt(*s, "hello")));
  REQUIRE(f.sync(f.host->wait_idle(*s)));  // its drain took the (empty) inbox
  auto actor = f.host->get(*s);
  REQUIRE(actor);
  auto box = (*actor)->inbox();

  auto admit = [&] {
    std::vector<persistence::report_item> items{
        {protocol::notification_id("note_1"), std::nullopt, "the build finished"}};
    actors::inbox_msg::admit a{std::move(items), persistence::admit_receipts::notices, {}};
    return f.sync(box->ask(std::move(a)));
  };
  auto first = admit();
  REQUIRE(first);
  CHECK(*first == std::vector{persistence::admit_outcome::added});
  auto repeat = admit();
  REQUIRE(repeat);
  CHECK(*repeat == std::vector{persistence::admit_outcome::repeat});  // dropped by its id

  // A wake that finds nothing admitted since the last drain is dropped as
  // stale. This one is told after the admit was answered, so it must find
  // the admit already known to the session and open a busy period.
  actors::session_msg::wake w{actors::wake_scope::steer, true, false, true};
  REQUIRE((*actor)->tell(std::move(w)));
  REQUIRE(f.sync(f.host->wait_idle(*s)));
  CHECK(f.messages_with("s", "the build finished") == 1);
  auto inbox = f.inbox("s");
  REQUIRE(inbox.size() == 1);
  CHECK(inbox[0].acked);
}

TEST_CASE("an inbox hands a notice over by waking its idle session", "[inbox]") {
  report_fixture f("inbox_wake");
  auto s = f.sync(f.host->create_session("owner", session_id("s")));
  REQUIRE(s);
  auto actor = f.host->get(*s);
  REQUIRE(actor);
  std::vector<persistence::report_item> items{
      {protocol::notification_id("note_2"), std::nullopt, "tests passed"}};
  actors::inbox_msg::admit a{std::move(items), persistence::admit_receipts::notices, {}};
  REQUIRE(f.sync((*actor)->inbox()->ask(std::move(a))));
  f.host->hand_over(**actor, actors::wake_scope::input, true);
  f.quiet();  // the hand-over counts as activity until the session handled it
  CHECK(f.messages_with("s", "tests passed") == 1);
  auto inbox = f.inbox("s");
  REQUIRE(inbox.size() == 1);
  CHECK(inbox[0].acked);
}

TEST_CASE(
    "a session owed more reports than one take moves drains them all, in order, a bounded take "
    "per drain",
    "[inbox][regression]") {
  report_fixture f("inbox_bounded_take");
  // Every drain's report inputs, in the order the agent saw them.
  auto drains = std::make_shared<std::vector<std::vector<std::string>>>();
  f.code("parent")->fn = [drains](agent_context&, drain_input in) -> boost::asio::awaitable<void> {
    std::vector<std::string> reports;
    for (auto& i : in.inputs)
      if (i.kind == "report") reports.push_back(i.text);
    drains->push_back(std::move(reports));
    co_return;
  };
  REQUIRE(f.sync(f.host->create_session("parent", session_id("parent"))));
  const std::size_t limit = persistence::task_store::k_take_limit;
  const std::size_t n = limit + 5;
  actors::delivery_batch b;
  b.owner = session_id("parent");
  for (std::size_t i = 0; i < n; ++i)
    b.items.push_back({protocol::notification_id("msg_" + std::to_string(100000 + i)), std::nullopt,
                       std::nullopt, "report " + std::to_string(i)});
  auto handed = f.sync(f.host->delivery().deliver(std::move(b)));
  REQUIRE(handed);
  REQUIRE(*handed == static_cast<int>(n));
  f.quiet();

  std::vector<std::string> seen;
  std::size_t largest = 0;
  for (auto& d : *drains) {
    largest = std::max(largest, d.size());
    seen.insert(seen.end(), d.begin(), d.end());
  }
  CHECK(largest <= limit);  // no transaction moved more than one take's worth
  REQUIRE(seen.size() == n);
  for (std::size_t i = 0; i < n; ++i) CHECK(seen[i] == "report " + std::to_string(i));
  for (auto& row : f.inbox("parent")) CHECK(row.acked);
  CHECK(f.messages_with("parent", "report ") == static_cast<int>(n));
}
