#pragma once
// A fixed set of single-threaded executors. Actors are pinned to one; hops on
// the same executor are cheap, hops across threads cost a wake-up.
#include <atomic>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <cstddef>
#include <memory>
#include <thread>
#include <vector>

namespace tether::runtime {

/// Whether the calling thread is one of an executor_pool's threads (an
/// actor's executor): code that must not block there (a SQLite read) checks.
bool on_executor_thread();

class executor_pool {
 public:
  using executor = boost::asio::io_context::executor_type;

  /// threads == 0 means one per core.
  explicit executor_pool(std::size_t threads = 0);
  ~executor_pool();
  executor_pool(const executor_pool&) = delete;
  executor_pool& operator=(const executor_pool&) = delete;

  std::size_t size() const { return contexts_.size(); }
  executor at(std::size_t i) const { return contexts_[i % contexts_.size()]->get_executor(); }
  /// Round-robin choice, for spreading new actors.
  executor next() { return at(next_.fetch_add(1, std::memory_order_relaxed)); }

  /// Lets the executors run out of work and joins their threads. Idempotent.
  void join();
  /// Stops the executors at once (pending handlers are dropped) and joins.
  void stop();

 private:
  using guard = boost::asio::executor_work_guard<executor>;
  std::vector<std::unique_ptr<boost::asio::io_context>> contexts_;
  std::vector<guard> guards_;
  std::vector<std::thread> threads_;
  std::atomic<std::size_t> next_{0};
};

}  // namespace tether::runtime
