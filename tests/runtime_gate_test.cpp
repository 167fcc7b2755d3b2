// The gate for a service's work in flight and the pauses of its retries:
// what a service's stop() relies on to say that nothing of it is left
// running, and that no backoff holds it up.
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <catch2/catch.hpp>
#include <optional>

#include "support.hpp"
#include "tether/runtime/gate.hpp"
#include "tether/runtime/retry.hpp"

using namespace tether;
using boost::asio::awaitable;

TEST_CASE(
    "a closing gate refuses new work at once and its close resolves when the last holder leaves",
    "[runtime][gate]") {
  boost::asio::io_context io;
  runtime::gate g;
  auto a = g.enter();
  auto b = g.enter();
  REQUIRE(a);
  REQUIRE(b);
  CHECK(g.count() == 2);
  auto closing = g.close();
  CHECK(g.closed());
  CHECK_FALSE(g.enter());  // refused before the close is even awaited
  CHECK(g.count() == 2);
  bool drained = false;
  auto wait = [&]() -> awaitable<void> {
    co_await std::move(closing);
    drained = true;
  };
  boost::asio::co_spawn(io, wait, boost::asio::detached);
  io.poll();
  CHECK_FALSE(drained);
  a.reset();
  io.poll();
  CHECK_FALSE(drained);  // one holder is still in flight
  b.reset();
  io.run();
  CHECK(drained);
  CHECK(g.count() == 0);
}

TEST_CASE(
    "a gate closed with nothing in flight resolves at once, and closing it again waits for the "
    "same drain",
    "[runtime][gate]") {
  boost::asio::io_context io;
  runtime::gate g;
  int drained = 0;
  auto wait = [&]() -> awaitable<void> {
    co_await g.close();
    co_await g.close();
    ++drained;
  };
  boost::asio::co_spawn(io, wait, boost::asio::detached);
  io.run();
  CHECK(drained == 1);
}

TEST_CASE("a holder moved away leaves the gate once, from where it ended up", "[runtime][gate]") {
  runtime::gate g;
  auto a = g.enter();
  {
    runtime::gate::holder b = std::move(a);
    CHECK_FALSE(a);
    CHECK(g.count() == 1);
  }
  CHECK(g.count() == 0);
}

TEST_CASE("stopping a service's retry pauses ends the pause in flight at once and refuses the next",
          "[runtime][gate]") {
  boost::asio::io_context io;
  runtime::retry_pauses pauses(io.get_executor());
  std::optional<bool> first, second;
  auto retry = [&]() -> awaitable<void> {
    first = co_await pauses.pause(7);  // a one-second pause
    second = co_await pauses.pause(0);
  };
  boost::asio::co_spawn(io, retry, boost::asio::detached);
  io.poll();
  CHECK_FALSE(first.has_value());  // pausing
  pauses.stop();
  io.poll();  // runs only what is ready: the pause was ended, not waited out
  REQUIRE(first.has_value());
  CHECK_FALSE(*first);
  REQUIRE(second.has_value());
  CHECK_FALSE(*second);
  io.run();
}
