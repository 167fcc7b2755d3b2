#pragma once
// Runs an awaitable to completion from plain code: on a private io_context, or
// on an executor that other threads already run. For tests, tools and main().
#include <boost/asio/awaitable.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/use_future.hpp>
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

/// Spawns `a` on an executor served by other threads and blocks until done.
template <class Executor, class T>
T sync_wait(const Executor& ex, boost::asio::awaitable<T> a) {
  auto f = boost::asio::co_spawn(ex, std::move(a), boost::asio::use_future);
  return f.get();
}

}  // namespace tether::runtime
