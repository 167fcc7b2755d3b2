#pragma once
// Runs an awaitable to completion from plain code: on a private io_context, or
// on an executor that other threads already run. For tests, tools and main().
//
// A thread that blocks here waits on a mutex and a condition variable, not on
// a std::future: libstdc++ makes a future ready inside its shared library,
// which ThreadSanitizer does not see, so every value handed over through one
// reads to it as a data race (`make test SANITIZE=thread`).
#include <boost/asio/awaitable.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/use_future.hpp>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <optional>
#include <type_traits>
#include <utility>

namespace tether::runtime {

/// Runs `a` on `io` (which must not be running elsewhere) until it and all
/// work it started complete; rethrows what it threw.
template <class T>
T run_to_completion(boost::asio::io_context& io, boost::asio::awaitable<T> a) {
  auto f = boost::asio::co_spawn(io, std::move(a), boost::asio::use_future);
  io.restart();
  io.run();
  return f.get();
}

/// Blocks the calling thread until `start(handler)` has called `handler` once
/// with a T, from any thread, and returns that T. `start` must not throw once
/// it has handed the handler on.
///
/// The state lives on this thread's stack and the handler holds only its
/// address: the handler's last touch of it is the unlock, after which this
/// thread alone reads and destroys it, however long the handler's thread
/// keeps the handler. No allocation, and no ordering left to a reference
/// count.
template <class T, class Start>
T block_on(Start&& start) {
  struct state {
    std::mutex m;
    std::condition_variable cv;
    std::optional<T> value;
  } st;
  std::forward<Start>(start)([s = &st](T v) {
    std::lock_guard lk(s->m);
    s->value.emplace(std::move(v));
    s->cv.notify_one();
  });
  std::unique_lock lk(st.m);
  st.cv.wait(lk, [&] { return st.value.has_value(); });
  return std::move(*st.value);
}

/// Spawns `a` on an executor served by other threads and blocks until done;
/// rethrows what it threw.
template <class Executor, class T>
T sync_wait(const Executor& ex, boost::asio::awaitable<T> a) {
  if constexpr (std::is_void_v<T>) {
    auto e = block_on<std::exception_ptr>(
        [&](auto done) { boost::asio::co_spawn(ex, std::move(a), std::move(done)); });
    if (e) std::rethrow_exception(e);
  } else {
    // What it threw, or what it returned (co_spawn hands T() with an exception).
    auto [e, v] = block_on<std::pair<std::exception_ptr, T>>([&](auto done) {
      boost::asio::co_spawn(ex, std::move(a), [done = std::move(done)](std::exception_ptr e, T v) {
        done({e, std::move(v)});
      });
    });
    if (e) std::rethrow_exception(e);
    return std::move(v);
  }
}

}  // namespace tether::runtime
