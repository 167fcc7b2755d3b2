#include "tether/runtime/executor_pool.hpp"

#include <cstdio>
#include <exception>

namespace tether::runtime {

namespace {
thread_local bool t_executor_thread = false;
}  // namespace

bool on_executor_thread() {
  return t_executor_thread;
}

executor_pool::executor_pool(std::size_t threads) {
  if (threads == 0) threads = std::max(1u, std::thread::hardware_concurrency());
  for (std::size_t i = 0; i < threads; ++i) {
    contexts_.push_back(std::make_unique<boost::asio::io_context>(1));
    guards_.emplace_back(contexts_.back()->get_executor());
  }
  for (std::size_t i = 0; i < threads; ++i) {
    threads_.emplace_back([ctx = contexts_[i].get()] {
      t_executor_thread = true;
      for (;;) {
        try {
          ctx->run();
          return;
        } catch (const std::exception& e) {
          // A handler outside any actor threw; keep the executor alive.
          std::fprintf(stderr, "tether: executor handler threw: %s\n", e.what());
        }
      }
    });
  }
}

executor_pool::~executor_pool() {
  stop();
}

void executor_pool::join() {
  guards_.clear();
  for (auto& t : threads_)
    if (t.joinable()) t.join();
}

void executor_pool::stop() {
  for (auto& c : contexts_) c->stop();
  join();
}

}  // namespace tether::runtime
