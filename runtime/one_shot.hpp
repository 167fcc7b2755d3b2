#pragma once
// A value set once from any thread and awaited by any number of coroutines.
// The first set() wins; later ones report false and are discarded. Waiters
// resume on their own executor, never inside set().
#include <boost/asio/any_completion_handler.hpp>
#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/associated_cancellation_slot.hpp>
#include <boost/asio/associated_executor.hpp>
#include <boost/asio/async_result.hpp>
#include <boost/asio/post.hpp>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <utility>
#include <vector>

namespace tether::runtime {

template <class T>
class one_shot : public std::enable_shared_from_this<one_shot<T>> {
 public:
  /// `on_cancel` makes the value a cancelled waiter completes the whole one_shot with.
  explicit one_shot(std::function<T()> on_cancel = {}) : on_cancel_(std::move(on_cancel)) {}

  static std::shared_ptr<one_shot> make(std::function<T()> on_cancel = {}) {
    return std::make_shared<one_shot>(std::move(on_cancel));
  }

  bool set(T v) {
    std::vector<waiter> ws;
    {
      std::lock_guard lk(m_);
      if (value_) return false;
      value_.emplace(std::move(v));
      ws.swap(waiters_);
    }
    for (auto& w : ws) complete(std::move(w), *value_);
    return true;
  }

  bool ready() const {
    std::lock_guard lk(m_);
    return value_.has_value();
  }

  /// Completes with a copy of the value once set. Honours the awaiter's
  /// cancellation slot when an on_cancel value was given.
  template <class Token>
  auto async_wait(Token&& token) {
    return wait(std::forward<Token>(token), false);
  }

  /// Completes with the value itself, moved out once set, instead of a copy:
  /// for a one_shot that has exactly one waiter, ever (a read's result handed
  /// to the coroutine that started it). No other waiter may follow it.
  template <class Token>
  auto async_take(Token&& token) {
    return wait(std::forward<Token>(token), true);
  }

 private:
  struct waiter {
    boost::asio::any_completion_handler<void(T)> handler;
    boost::asio::any_io_executor ex;
    bool take = false;
  };

  template <class Token>
  auto wait(Token&& token, bool take) {
    return boost::asio::async_initiate<Token, void(T)>(
        [self = this->shared_from_this(), take](auto handler) {
          boost::asio::any_io_executor ex = boost::asio::get_associated_executor(handler);
          waiter w{std::move(handler), std::move(ex), take};
          // Assign to the erased handler's slot: type-erasure installs its own
          // cancellation state in the original slot.
          auto slot = w.handler.get_cancellation_slot();
          if (slot.is_connected() && self->on_cancel_) {
            std::weak_ptr<one_shot> weak = self;
            slot.assign([weak](boost::asio::cancellation_type) {
              if (auto s = weak.lock()) s->set(s->on_cancel_());
            });
          }
          std::unique_lock lk(self->m_);
          if (self->value_) {
            lk.unlock();
            complete(std::move(w), *self->value_);
            return;
          }
          self->waiters_.push_back(std::move(w));
        },
        token);
  }

  static void complete(waiter w, T& v) {
    auto ex = w.ex;
    // The value handed over is a T built from the kept one (the kept value
    // itself, moved, for the one taker; else a copy), not a const T: moved
    // out of a const T, a boost::system::result<bool> is built by its
    // converting constructor from the result's explicit operator bool, so a
    // false value arrived as true.
    T out = w.take ? T(std::move(v)) : T(std::as_const(v));
    boost::asio::post(ex, [h = std::move(w.handler), v = std::move(out)]() mutable {
      auto slot = boost::asio::get_associated_cancellation_slot(h);
      if (slot.is_connected()) slot.clear();
      std::move(h)(std::move(v));
    });
  }

  mutable std::mutex m_;
  std::optional<T> value_;
  std::vector<waiter> waiters_;
  std::function<T()> on_cancel_;
};

}  // namespace tether::runtime
