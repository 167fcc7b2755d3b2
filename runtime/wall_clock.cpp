#include "tether/runtime/wall_clock.hpp"

#include <sys/timerfd.h>
#include <unistd.h>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <stdexcept>
#include <string>

namespace tether::runtime {

namespace asio = boost::asio;

namespace {

/// One timerfd per sleep: armed at the absolute wall time, cancelled by a
/// clock step (read() fails with ECANCELED), or by interrupt() (the
/// descriptor's wait is cancelled on its executor).
class system_clock_impl : public wall_clock {
 public:
  std::int64_t now_ms() override {
    return std::chrono::duration_cast<std::chrono::milliseconds>(
               std::chrono::system_clock::now().time_since_epoch())
        .count();
  }

  asio::awaitable<wake> sleep_until(asio::io_context::executor_type ex,
                                    std::int64_t at_ms) override {
    int fd = ::timerfd_create(CLOCK_REALTIME, TFD_NONBLOCK | TFD_CLOEXEC);
    if (fd < 0) throw std::runtime_error(std::string("timerfd_create: ") + std::strerror(errno));
    auto sd = std::make_shared<asio::posix::stream_descriptor>(ex, fd);
    itimerspec its{};
    if (at_ms < 1) at_ms = 1;  // zero would disarm
    its.it_value.tv_sec = at_ms / 1000;
    its.it_value.tv_nsec = (at_ms % 1000) * 1000000;
    if (::timerfd_settime(fd, TFD_TIMER_ABSTIME | TFD_TIMER_CANCEL_ON_SET, &its, nullptr) != 0) {
      if (errno == ECANCELED) co_return wake::jumped;
      throw std::runtime_error(std::string("timerfd_settime: ") + std::strerror(errno));
    }
    {
      std::lock_guard lk(m_);
      if (pending_interrupt_) {
        pending_interrupt_ = false;
        co_return wake::interrupted;
      }
      sleeper_ = sd;
    }
    for (;;) {
      auto [ec] = co_await sd->async_wait(asio::posix::stream_descriptor::wait_read,
                                          asio::as_tuple(asio::use_awaitable));
      bool interrupted = false;
      {
        std::lock_guard lk(m_);
        if (pending_interrupt_) {
          pending_interrupt_ = false;
          interrupted = true;
        }
        if (interrupted || ec) sleeper_.reset();
      }
      if (interrupted || ec) co_return wake::interrupted;
      std::uint64_t expirations = 0;
      auto n = ::read(fd, &expirations, sizeof expirations);
      if (n < 0 && errno == EAGAIN) continue;
      {
        std::lock_guard lk(m_);
        sleeper_.reset();
      }
      if (n < 0 && errno == ECANCELED) co_return wake::jumped;
      co_return wake::due;
    }
  }

  void interrupt() override {
    std::shared_ptr<asio::posix::stream_descriptor> sd;
    {
      std::lock_guard lk(m_);
      pending_interrupt_ = true;
      sd = sleeper_;
    }
    if (sd) asio::post(sd->get_executor(), [sd] { sd->cancel(); });
  }

 private:
  std::mutex m_;
  std::shared_ptr<asio::posix::stream_descriptor> sleeper_;
  bool pending_interrupt_ = false;
};

}  // namespace

std::shared_ptr<wall_clock> system_wall_clock() {
  return std::make_shared<system_clock_impl>();
}

// ---- manual_clock ----

std::int64_t manual_clock::now_ms() {
  std::lock_guard lk(m_);
  return now_;
}

std::optional<wall_clock::wake> manual_clock::woken(std::int64_t deadline) {
  if (pending_interrupt_) {
    pending_interrupt_ = false;
    return wake::interrupted;
  }
  if (pending_jump_) {
    pending_jump_ = false;
    return wake::jumped;
  }
  if (now_ >= deadline) return wake::due;
  return std::nullopt;
}

asio::awaitable<wall_clock::wake> manual_clock::sleep_until(asio::io_context::executor_type ex,
                                                            std::int64_t at_ms) {
  auto timer = std::make_shared<asio::steady_timer>(ex, asio::steady_timer::time_point::max());
  {
    std::lock_guard lk(m_);
    if (auto w = woken(at_ms)) co_return *w;
    timer_ = timer;
  }
  for (;;) {
    co_await timer->async_wait(asio::as_tuple(asio::use_awaitable));
    std::lock_guard lk(m_);
    if (auto w = woken(at_ms)) {
      timer_.reset();
      co_return *w;
    }
    timer->expires_at(asio::steady_timer::time_point::max());
  }
}

void manual_clock::poke(wake why) {
  std::shared_ptr<asio::steady_timer> t;
  {
    std::lock_guard lk(m_);
    if (why == wake::interrupted) pending_interrupt_ = true;
    if (why == wake::jumped) pending_jump_ = true;
    t = timer_;
  }
  if (t) asio::post(t->get_executor(), [t] { t->cancel(); });
}

void manual_clock::interrupt() {
  poke(wake::interrupted);
}

void manual_clock::set(std::int64_t ms) {
  {
    std::lock_guard lk(m_);
    now_ = ms;
  }
  poke(wake::due);
}

void manual_clock::jump(std::int64_t ms) {
  {
    std::lock_guard lk(m_);
    now_ = ms;
  }
  poke(wake::jumped);
}

// ---- virtual_clock ----

std::int64_t virtual_clock::now_ms() {
  std::lock_guard lk(m_);
  return now_;
}

asio::awaitable<wall_clock::wake> virtual_clock::sleep_until(asio::io_context::executor_type,
                                                             std::int64_t at_ms) {
  std::lock_guard lk(m_);
  if (pending_interrupt_) {
    pending_interrupt_ = false;
    co_return wake::interrupted;
  }
  if (at_ms > now_) now_ = at_ms;
  co_return wake::due;
}

void virtual_clock::interrupt() {
  std::lock_guard lk(m_);
  pending_interrupt_ = true;
}

}  // namespace tether::runtime
