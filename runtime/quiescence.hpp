#pragma once
// Counts work in flight (busy periods, wakes in mailboxes, deliveries, live
// jobs) so a caller can wait until nothing runs. Two counts: the sessions'
// work, and the job queue's; a waiter may ignore the second.
//
// Thread-safe: any thread adds or removes; waiters resume on their own
// executor (runtime::one_shot), never inside add().
#include <boost/asio/awaitable.hpp>
#include <memory>
#include <mutex>
#include <vector>

#include "tether/runtime/one_shot.hpp"

namespace tether::runtime {

class quiescence {
 public:
  /// Adds `delta` to the sessions' count, or with `job` to the job queue's.
  void add(int delta, bool job = false);
  /// Resolves once both counts are zero (the first only, unless `jobs`).
  boost::asio::awaitable<void> wait(bool jobs = true);

 private:
  struct waiter {
    std::shared_ptr<one_shot<int>> done;
    bool jobs;
  };
  std::mutex m_;
  long active_ = 0;
  long jobs_active_ = 0;
  std::vector<waiter> waiters_;
};

}  // namespace tether::runtime
