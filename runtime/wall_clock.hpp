#pragma once
// The wall clock a scheduler sleeps on (docs/cron.md). Schedules are in wall
// time, so a monotonic deadline is not trusted for them: the system clock
// sleeps on a CLOCK_REALTIME timerfd armed at the absolute wall time with
// TFD_TIMER_CANCEL_ON_SET, which wakes at that wall time however the clock
// was stepped meanwhile and reports a discontinuous change of the clock (a
// jump, forward or back) as `jumped`. The manual clock is the same interface
// driven by a test (set, advance, jump); the virtual clock leaps to each
// deadline at once (demos and crash tests of schedules: no wall time passes).
//
// One sleeper at a time per clock; interrupt() may come from any thread, and
// an interrupt that arrives while nobody sleeps ends the next sleep at once.
#include <boost/asio/awaitable.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>

namespace tether::runtime {

class wall_clock {
 public:
  enum class wake { due, jumped, interrupted };
  virtual ~wall_clock() = default;
  /// Milliseconds since the Unix epoch.
  virtual std::int64_t now_ms() = 0;
  /// Waits on `ex` until now_ms() >= at_ms (due), the clock jumped, or
  /// interrupt() was called.
  virtual boost::asio::awaitable<wake> sleep_until(boost::asio::io_context::executor_type ex,
                                                   std::int64_t at_ms) = 0;
  virtual void interrupt() = 0;
  /// True for a clock whose time moves only when a sleeper waits (virtual):
  /// a scheduler lets its runs in flight end before it sleeps on it.
  virtual bool leaps() const { return false; }
};

/// CLOCK_REALTIME, through a timerfd (Linux).
std::shared_ptr<wall_clock> system_wall_clock();

/// A clock a test drives. now starts at `start_ms`.
class manual_clock : public wall_clock {
 public:
  explicit manual_clock(std::int64_t start_ms) : now_(start_ms) {}
  std::int64_t now_ms() override;
  boost::asio::awaitable<wake> sleep_until(boost::asio::io_context::executor_type ex,
                                           std::int64_t at_ms) override;
  void interrupt() override;
  /// Moves the time to `ms` (forward, continuously): a sleeper whose
  /// deadline passed wakes `due`.
  void set(std::int64_t ms);
  void advance(std::int64_t ms) { set(now_ms() + ms); }
  /// Steps the time to `ms` discontinuously (either way): a sleeper wakes `jumped`.
  void jump(std::int64_t ms);

 private:
  void poke(wake why);
  /// Why a sleep to `deadline` ends now, if it does. REQUIRES: m_ held.
  std::optional<wake> woken(std::int64_t deadline);
  std::mutex m_;
  std::int64_t now_;
  std::shared_ptr<boost::asio::steady_timer> timer_;  // the sleeper's, while one sleeps
  bool pending_interrupt_ = false;
  bool pending_jump_ = false;
};

/// A clock that leaps: sleep_until sets the time to the deadline and
/// returns at once (an interrupt still ends it first). now starts at `start_ms`.
class virtual_clock : public wall_clock {
 public:
  explicit virtual_clock(std::int64_t start_ms) : now_(start_ms) {}
  std::int64_t now_ms() override;
  boost::asio::awaitable<wake> sleep_until(boost::asio::io_context::executor_type ex,
                                           std::int64_t at_ms) override;
  void interrupt() override;
  bool leaps() const override { return true; }

 private:
  std::mutex m_;
  std::int64_t now_;
  bool pending_interrupt_ = false;
};

}  // namespace tether::runtime
