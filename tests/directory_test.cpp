// The session directory (actors/directory.hpp) and the count of work in
// flight (runtime/quiescence.hpp): the two pieces of shared state the host
// wires in, each with its own lock.
#include "tether/actors/directory.hpp"

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/use_future.hpp>
#include <catch2/catch.hpp>
#include <chrono>

#include "tether/runtime/quiescence.hpp"

using namespace tether;
using protocol::session_id;

namespace {
const std::string k_token = "ghp_aBcDeFgHiJkLmNoPqRsTuVwXyZ0123456789";
}

TEST_CASE("the still-running list names busy background descendants with scrubbed labels",
          "[directory]") {
  actors::session_directory d{protocol::scrubber()};
  session_id root("root"), a("a"), b("b"), c("c"), grand("grand");
  d.add(root, std::nullopt, "general", "top");
  d.add(a, root, "explore", "audit with " + k_token);
  d.add(b, root, "explore", "settling one");
  d.add(c, root, "explore", "foreground one");
  d.add_child(a, grand);
  d.phase(a, true, false, false);
  d.phase(b, true, true, false);  // settling: not listed
  d.phase(c, true, false, true);  // a foreground call: not listed
  d.phase(grand, true, false, false);

  auto under = d.running_under(root);
  CHECK(under.sessions == std::set<session_id>{root, a, b, c, grand});
  REQUIRE(under.subagents.size() == 2);  // a and its child, in tree order
  std::set<std::string> details;
  for (auto& i : under.subagents) {
    CHECK(i.kind == "subagent");
    CHECK(i.label.find("ghp_") == std::string::npos);
    details.insert(i.detail);
  }
  CHECK(details == std::set<std::string>{"explore, sessionID: a", ", sessionID: grand"});
  CHECK(d.is_busy(a));
  CHECK_FALSE(d.is_busy(root));

  d.remove(a);  // deleted: neither it nor its place under root stays
  auto after = d.running_under(root);
  CHECK(after.sessions == std::set<session_id>{root, b, c});
  CHECK(after.subagents.empty());
}

TEST_CASE("quiescence resolves a waiter once the counts it waits on are zero", "[directory]") {
  boost::asio::io_context io;
  runtime::quiescence q;
  q.add(+1);        // a session's work
  q.add(+1, true);  // a live job
  auto sessions_only = boost::asio::co_spawn(io, q.wait(false), boost::asio::use_future);
  auto everything = boost::asio::co_spawn(io, q.wait(true), boost::asio::use_future);
  auto ready = [](std::future<void>& f) {
    return f.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
  };
  io.poll();  // both waiters registered; nothing else can run
  CHECK_FALSE(ready(sessions_only));
  CHECK_FALSE(ready(everything));
  q.add(-1);
  io.restart();
  io.poll();  // the sessions-only waiter resumes and ends
  CHECK(ready(sessions_only));
  CHECK_FALSE(ready(everything));
  q.add(-1, true);
  io.restart();
  io.poll();
  CHECK(ready(everything));
}
