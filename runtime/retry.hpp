#pragma once
// Pauses between the attempts of work that must not be given up while the
// process runs (a terminal write, a settle, a turn's stop): a doubling delay,
// capped, that ends early when its timer is cancelled (a stop).
#include <algorithm>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <chrono>
#include <memory>
#include <mutex>
#include <set>

namespace tether::runtime {

/// The pause before retry number `attempt` (0 = the first retry): 10 ms,
/// doubling, at most 1 s.
inline std::chrono::milliseconds retry_delay(int attempt) {
  long long ms = 10LL << std::clamp(attempt, 0, 7);
  return std::chrono::milliseconds(std::min(ms, 1000LL));
}

/// Waits retry_delay(attempt) on `timer`. timer.cancel() (on its executor)
/// ends the wait at once; the caller then rechecks why it should stop.
inline boost::asio::awaitable<void> pause_before_retry(boost::asio::steady_timer& timer,
                                                       int attempt) {
  timer.expires_after(retry_delay(attempt));
  co_await timer.async_wait(boost::asio::as_tuple(boost::asio::use_awaitable));
}

/// The pauses of one service's retries: each runs on its own timer, and
/// stop() ends every pause in flight at once and every later one before it
/// starts, so a stopping service is not held by a backoff. Thread-safe.
class retry_pauses {
 public:
  template <class Executor>
  explicit retry_pauses(Executor ex) : ex_(ex) {}

  /// Pauses before retry `attempt`; false once stopped (the caller gives up).
  boost::asio::awaitable<bool> pause(int attempt) {
    auto t = std::make_shared<boost::asio::steady_timer>(ex_);
    {
      std::lock_guard lk(m_);
      if (stopped_) co_return false;
      timers_.insert(t);
    }
    co_await pause_before_retry(*t, attempt);
    std::lock_guard lk(m_);
    timers_.erase(t);
    co_return !stopped_;
  }

  /// Ends every pause. REQUIRES: called on the pauses' executor (a timer's
  /// cancel is not thread-safe). Idempotent.
  void stop() {
    std::set<std::shared_ptr<boost::asio::steady_timer>> pausing;
    {
      std::lock_guard lk(m_);
      stopped_ = true;
      pausing = timers_;
    }
    for (auto& t : pausing) t->cancel();
  }

 private:
  boost::asio::any_io_executor ex_;
  std::mutex m_;
  bool stopped_ = false;
  std::set<std::shared_ptr<boost::asio::steady_timer>> timers_;
};

}  // namespace tether::runtime
