#pragma once
// An actor is state, a mailbox and a receive loop pinned to one executor.
//
// Idle actors hold no coroutine frame: a tell into an empty mailbox posts one
// turn onto the executor; the turn drains what is queued (a bounded batch, so a
// busy actor cannot starve its neighbours) and ends (a turn of coroutine
// handlers that answered an ask without suspending first waits one round of
// the executor for the asker's next message: see drain_async). Handlers are either plain
// functions (`void handle(Msg&)`) or coroutines (`awaitable<void> handle(Msg&)`);
// a coroutine handler runs to completion before the next message is taken, so
// an actor's state is never touched by two handlers at once.
//
// Asks: a message type with a member `reply_to<R> reply;` can be asked. The
// reply is awaitable, honours a timeout and cancellation, and never hangs:
// stop(), a handler that throws, or a handler that drops the message all
// complete it with an error.
#include <atomic>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <chrono>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

#include "tether/runtime/deadlines.hpp"
#include "tether/runtime/error.hpp"
#include "tether/runtime/one_shot.hpp"

namespace tether::runtime {

namespace asio = boost::asio;
using asio::awaitable;
using executor = asio::io_context::executor_type;
using actor_id = std::uint64_t;

/// What a supervisor decides for an actor whose handler threw.
enum class directive { restart, stop };

/// Told, on the failing actor's executor, that a handler threw.
class supervisor {
 public:
  virtual ~supervisor() = default;
  virtual directive on_failure(actor_id id, const std::string& name, const std::string& what) = 0;
};

/// The sending half of an ask: exactly one of send()/fail() takes effect.
/// Destroying it unanswered fails the ask, so no asker waits forever.
template <class R>
class reply_to {
 public:
  using value_type = R;
  using state = one_shot<result<R>>;

  reply_to() = default;
  explicit reply_to(std::shared_ptr<state> s) : s_(std::move(s)) {}
  reply_to(reply_to&&) noexcept = default;
  reply_to& operator=(reply_to&& o) noexcept {
    if (this != &o) {
      drop();
      s_ = std::move(o.s_);
    }
    return *this;
  }
  ~reply_to() { drop(); }

  void send(result<R> v) {
    if (auto s = std::exchange(s_, nullptr)) s->set(std::move(v));
  }
  template <class U = R>
  requires std::is_void_v<U>
  void send() { send(result<void>{}); }
  void fail(error e) { send(result<R>(std::move(e))); }
  explicit operator bool() const { return s_ != nullptr; }

 private:
  void drop() {
    if (s_) fail(error{errc::dropped, "the actor discarded the request without replying"});
  }
  std::shared_ptr<state> s_;
};

template <class M>
concept askable = requires(M m) {
  m.reply;
};

template <class M>
using reply_value_t = typename decltype(std::declval<M&>().reply)::value_type;

namespace detail {
/// Fails the reply of a message (if it has one) with e.
template <class Msg>
void fail_reply(Msg& m, const error& e) {
  auto one = [&](auto& alt) {
    if constexpr (askable<std::remove_cvref_t<decltype(alt)>>) alt.reply.fail(e);
  };
  if constexpr (requires { std::visit(one, m); })
    std::visit(one, m);
  else
    one(m);
}

/// Whether a message is an ask (has a reply).
template <class Msg>
bool is_ask(const Msg& m) {
  auto one = [](const auto& alt) { return askable<std::remove_cvref_t<decltype(alt)>>; };
  if constexpr (requires { std::visit(one, m); })
    return std::visit(one, m);
  else
    return one(m);
}

std::string describe(std::exception_ptr e);
actor_id next_actor_id();
}  // namespace detail

struct actor_options {
  std::string name;
  supervisor* sup = nullptr;      // not owned; must outlive the actor
  std::size_t turn_budget = 256;  // messages per turn before yielding the executor
};

/// CRTP base: Derived implements `handle(Msg&)` (void or awaitable<void>) and may
/// override `void on_restart()` to reset its state after a supervised restart.
template <class Derived, class Msg>
class actor : public std::enable_shared_from_this<Derived> {
 public:
  using message_type = Msg;

  actor(executor ex, actor_options opts = {})
      : ex_(ex), id_(detail::next_actor_id()), opts_(std::move(opts)) {}
  virtual ~actor() = default;
  actor(const actor&) = delete;
  actor& operator=(const actor&) = delete;

  actor_id id() const { return id_; }
  const std::string& name() const { return opts_.name; }
  executor get_executor() const { return ex_; }

  /// Fire-and-forget from any thread. Fails with errc::closed once stopping.
  result<void> tell(Msg m) {
    {
      std::lock_guard lk(m_);
      if (closing_)
        return error{errc::closed,
                     "mailbox of actor '" + name() + "' is closed; message not queued"};
      queue_.push_back(std::move(m));
      if (scheduled_) return {};
      scheduled_ = true;
    }
    schedule();
    return {};
  }

  /// Ask from any coroutine; resolves with the handler's reply, or with an error
  /// on timeout (zero = none), cancellation, stop or handler failure.
  /// Build the message as a named local first (COROUTINES.md, GCC bug 2):
  ///   get_count q; auto n = co_await a->ask(std::move(q));
  template <class M>
  requires askable<M> awaitable<result<reply_value_t<M>>> ask(
      M m, std::chrono::milliseconds timeout = {}) {
    using R = reply_value_t<M>;
    auto st = one_shot<result<R>>::make([n = name()] {
      return result<R>(error{errc::cancelled, "ask to actor '" + n + "' was cancelled"});
    });
    m.reply = reply_to<R>(st);
    Msg msg(std::move(m));
    if (auto r = tell(std::move(msg)); !r) co_return r.error();
    if (timeout.count() <= 0) co_return co_await st->async_wait(asio::use_awaitable);
    // The deadline is an entry on the process's deadline thread
    // (runtime/deadlines.hpp), removed when the reply comes first; it keeps
    // the asker's executor's work counted meanwhile, as a timer did.
    auto ex = co_await asio::this_coro::executor;
    deadlines::entry e{st, &expire_ask<R>, name(), timeout,
                       asio::prefer(ex, asio::execution::outstanding_work.tracked)};
    auto ticket = deadlines::instance().arm(std::move(e));
    auto r = co_await st->async_wait(asio::use_awaitable);
    deadlines::instance().remove(ticket);
    co_return r;
  }

  /// Stops taking messages, lets the running handler finish, fails every queued
  /// ask with errc::stopped, and resolves once that is done. Idempotent.
  awaitable<void> stop() {
    begin_stop();
    auto s = stopped_signal();
    co_await s->async_wait(asio::use_awaitable);
  }

  /// Non-awaiting form of stop(): requests it and returns at once.
  void begin_stop() {
    bool post = false;
    {
      std::lock_guard lk(m_);
      if (!closing_) {
        closing_ = true;
        if (!scheduled_) scheduled_ = post = true;
      }
    }
    if (post) schedule();
  }

  bool stopped() { return stopped_signal()->ready(); }

 protected:
  void on_restart() {}

 private:
  static constexpr bool async_handler =
      !std::is_void_v<decltype(std::declval<Derived&>().handle(std::declval<Msg&>()))>;

  template <class R>
  static void expire_ask(void* target, const std::string& name, std::chrono::milliseconds after) {
    static_cast<one_shot<result<R>>*>(target)->set(
        error{errc::timeout, "ask to actor '" + name + "' got no reply within " +
                                 std::to_string(after.count()) + " ms"});
  }

  void schedule() {
    auto self = this->shared_from_this();
    if constexpr (async_handler) {
      // co_spawn may start the coroutine inline; post so a tell never runs a
      // handler on the caller's stack.
      asio::post(ex_, [self = std::move(self)]() mutable {
        auto ex = self->ex_;
        asio::co_spawn(ex, self->drain_async(std::move(self)), asio::detached);
      });
    } else {
      asio::post(ex_, [self = std::move(self)] { self->drain_sync(); });
    }
  }

  // Takes at most `budget` queued messages; false once empty or stopping
  // (queued asks are then failed). REQUIRES: called on the actor's executor.
  bool take(std::vector<Msg>& batch, std::size_t budget) {
    std::unique_lock lk(m_);
    if (!closing_ && head_ < queue_.size()) {
      std::size_t n = std::min(budget, queue_.size() - head_);
      if (head_ == 0 && n == queue_.size()) {
        batch.swap(queue_);
      } else {
        batch.assign(std::make_move_iterator(queue_.begin() + head_),
                     std::make_move_iterator(queue_.begin() + head_ + n));
        head_ += n;
        if (head_ == queue_.size()) {
          queue_.clear();
          head_ = 0;
        }
      }
      return true;
    }
    if (!closing_) {
      scheduled_ = false;
      return false;
    }
    auto rest = take_rest_locked();
    lk.unlock();
    finish_stop(rest, 0, error{errc::stopped, "actor '" + name() + "' stopped before answering"});
    return false;
  }

  // Whether a message waits (or a stop): take() would find something to do.
  bool queued() {
    std::lock_guard lk(m_);
    return closing_ || head_ < queue_.size();
  }

  // Everything still queued. REQUIRES: m_ held.
  std::vector<Msg> take_rest_locked() {
    std::vector<Msg> rest;
    if (head_ == 0) {
      rest.swap(queue_);
    } else {
      rest.assign(std::make_move_iterator(queue_.begin() + head_),
                  std::make_move_iterator(queue_.end()));
      queue_.clear();
      head_ = 0;
    }
    return rest;
  }

  void finish_stop(std::vector<Msg>& msgs, std::size_t from, const error& e) {
    for (std::size_t i = from; i < msgs.size(); ++i) detail::fail_reply(msgs[i], e);
    msgs.clear();
    stopped_signal()->set(0);
  }

  // Returns false if the actor must stop (supervisor said so).
  bool on_failure(Msg& m, std::exception_ptr ep, std::vector<Msg>& batch, std::size_t i) {
    std::string what = detail::describe(ep);
    error e{errc::failed, "actor '" + name() + "' (id " + std::to_string(id_) +
                              ") failed handling a message: " + what};
    detail::fail_reply(m, e);
    directive d = opts_.sup ? opts_.sup->on_failure(id_, name(), what) : directive::stop;
    if (d == directive::restart) {
      static_cast<Derived*>(this)->on_restart();
      return true;
    }
    std::vector<Msg> rest;
    {
      std::lock_guard lk(m_);
      closing_ = true;
      rest = take_rest_locked();
    }
    finish_stop(batch, i + 1, e);
    finish_stop(rest, 0, e);
    return false;
  }

  void drain_sync() {
    std::vector<Msg> batch;
    std::size_t budget = opts_.turn_budget;
    while (budget > 0 && take(batch, budget)) {
      for (std::size_t i = 0; i < batch.size(); ++i) {
        try {
          static_cast<Derived*>(this)->handle(batch[i]);
        } catch (...) {
          if (!on_failure(batch[i], std::current_exception(), batch, i)) return;
        }
        if (stop_requested(batch, i)) break;
      }
      budget = batch.size() >= budget ? 0 : budget - batch.size();
      batch.clear();
    }
    if (budget == 0) yield_turn();
  }

  awaitable<void> drain_async(std::shared_ptr<Derived> self) {
    std::vector<Msg> batch;
    std::size_t budget = opts_.turn_budget;
    bool answered = false;  // the last batch held an ask
    for (bool yielded = false; budget > 0; yielded = false) {
      // The last batch answered an ask, the queue is empty and no handler
      // since the turn began (or since the last such round) suspended: one
      // round of the executor before the turn ends. The reply posted its
      // asker's resumption; if the asker asks again meanwhile, this turn takes
      // it instead of a new turn being spawned. It costs no post: a turn that
      // was never suspended ends with one anyway (co_spawn posts before
      // completing a coroutine that never suspended); Asio 1.26's flag of its
      // awaitable threads says whether one was. Only after an ask: frames
      // kept over a round by every actor told at once would raise the heap
      // that idle actors leave.
      asio::detail::awaitable_thread_has_context_switched flag;  // a named local (COROUTINES.md)
      if (answered && !queued()) {
        bool& suspended = co_await flag;
        if (!suspended) {
          co_await asio::post(ex_, asio::use_awaitable);
          yielded = true;
        }
      }
      if (!take(batch, budget)) break;
      if (yielded) {
        bool& suspended = co_await flag;
        suspended = false;  // as co_spawn set it at the start: the next round may yield too
      }
      answered = false;
      for (std::size_t i = 0; i < batch.size(); ++i) {
        answered = answered || detail::is_ask(batch[i]);
        std::exception_ptr ep;
        try {
          co_await self->handle(batch[i]);
        } catch (...) {
          ep = std::current_exception();
        }
        if (ep && !on_failure(batch[i], ep, batch, i)) co_return;
        if (stop_requested(batch, i)) break;
      }
      budget = batch.size() >= budget ? 0 : budget - batch.size();
      batch.clear();
    }
    if (budget == 0) yield_turn();
  }

  // After message i: if stop() was called, the rest of the batch is failed
  // here and take() fails what is still queued.
  bool stop_requested(std::vector<Msg>& batch, std::size_t i) {
    if (!closing_.load(std::memory_order_relaxed)) return false;
    error e{errc::stopped, "actor '" + name() + "' stopped before answering"};
    for (std::size_t j = i + 1; j < batch.size(); ++j) detail::fail_reply(batch[j], e);
    return true;
  }

  // Budget spent with messages maybe still queued: stay scheduled, go to the
  // back of the executor's queue.
  void yield_turn() { schedule(); }

  executor ex_;
  actor_id id_;
  actor_options opts_;
  std::mutex m_;
  std::vector<Msg> queue_;  // messages before head_ were taken already
  std::size_t head_ = 0;
  bool scheduled_ = false;
  std::atomic<bool> closing_ = false;
  // Created on first use: an idle actor that is never stopped pays nothing.
  std::shared_ptr<one_shot<int>> stopped_signal() {
    std::lock_guard lk(m_);  // never called with m_ held
    if (!stopped_) stopped_ = one_shot<int>::make();
    return stopped_;
  }
  std::shared_ptr<one_shot<int>> stopped_;
};

}  // namespace tether::runtime
