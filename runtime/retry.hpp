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

}  // namespace tether::runtime
