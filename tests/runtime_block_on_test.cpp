// runtime::block_on, the one blocking wait of tests, tools, main() and the
// embedding API's blocking calls (embedded::block, embedded::close).
#include <catch2/catch.hpp>
#include <semaphore>
#include <string>
#include <thread>

#include "tether/runtime/sync_wait.hpp"

using namespace tether;

TEST_CASE("a blocking wait returns its value while the handler's thread still holds the handler",
          "[runtime]") {
  // The handler's thread calls it, then keeps the handler until the waiter
  // has returned with the value: the wait owes nothing to the handler's
  // lifetime, and that thread touches nothing of the waiter's after the call.
  std::binary_semaphore returned{0};
  std::thread handler_thread;
  const std::string sent(64, 'x');  // past the small-string buffer: a heap block
  auto got = runtime::block_on<std::string>([&](auto done) {
    handler_thread = std::thread([done = std::move(done), &returned, &sent]() mutable {
      done(sent);
      returned.acquire();
    });  // `done` is destroyed when this thread's function ends
  });
  CHECK(got == sent);  // returned while the handler's thread still holds the handler
  returned.release();
  handler_thread.join();
}
