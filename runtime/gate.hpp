#pragma once
// The one primitive for a service's work in flight (Seastar's gate): every
// coroutine of a service enters the gate and holds it while it runs; close()
// refuses new entries and resolves once every holder has left, so stop() can
// say that nothing of the service is left on an executor.
//
// Thread-safe: enter and leave from any thread; close() awaited from any
// coroutine (it resumes on its awaiter's executor).
#include <boost/asio/awaitable.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <memory>
#include <mutex>
#include <optional>
#include <utility>

#include "tether/runtime/one_shot.hpp"

namespace tether::runtime {

class gate {
 public:
  /// Held while one piece of work runs; leaves the gate when destroyed.
  class holder {
   public:
    holder() = default;
    explicit holder(gate* g) : g_(g) {}
    holder(holder&& o) noexcept : g_(std::exchange(o.g_, nullptr)) {}
    holder& operator=(holder&& o) noexcept {
      if (this != &o) {
        reset();
        g_ = std::exchange(o.g_, nullptr);
      }
      return *this;
    }
    holder(const holder&) = delete;
    holder& operator=(const holder&) = delete;
    ~holder() { reset(); }
    explicit operator bool() const { return g_ != nullptr; }
    void reset() {
      if (auto g = std::exchange(g_, nullptr)) g->leave();
    }

   private:
    gate* g_ = nullptr;
  };

  gate() = default;
  gate(const gate&) = delete;
  gate& operator=(const gate&) = delete;

  /// A holder, or an empty one once the gate is closed (the work must not start).
  holder enter() {
    std::lock_guard lk(m_);
    if (closed_) return holder{};
    ++count_;
    return holder{this};
  }

  bool closed() const {
    std::lock_guard lk(m_);
    return closed_;
  }

  /// How many holders are in flight (for tests and logs).
  long count() const {
    std::lock_guard lk(m_);
    return count_;
  }

  /// Refuses new entries at once (not when awaited) and returns what
  /// resolves once every holder has left. Idempotent: every caller waits for
  /// the same drain.
  boost::asio::awaitable<void> close() {
    std::shared_ptr<one_shot<int>> drained;
    {
      std::lock_guard lk(m_);
      closed_ = true;
      if (!drained_) {
        drained_ = one_shot<int>::make();
        if (count_ == 0) drained_->set(0);
      }
      drained = drained_;
    }
    return wait(std::move(drained));
  }

 private:
  static boost::asio::awaitable<void> wait(std::shared_ptr<one_shot<int>> drained) {
    co_await drained->async_wait(boost::asio::use_awaitable);
  }

  void leave() {
    std::shared_ptr<one_shot<int>> done;
    {
      std::lock_guard lk(m_);
      if (--count_ == 0 && drained_) done = drained_;
    }
    if (done) done->set(0);
  }

  mutable std::mutex m_;
  long count_ = 0;
  bool closed_ = false;
  std::shared_ptr<one_shot<int>> drained_;
};

}  // namespace tether::runtime
