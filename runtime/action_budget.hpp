#pragma once
// One action budget shared down a tree of sessions (docs/policy.md): a
// top-level session's turns, its subagents', their forks' and its delegates'
// all count against it, so spawning children cannot bypass it. A sliding
// window: at most `max_actions` actions in any `window`.
//
// Thread-safe (sessions of one tree run on different executors); the lock
// is held only to count.
#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>

namespace tether::runtime {

struct budget_options {
  std::int64_t max_actions = 0;  // 0: no budget
  std::chrono::milliseconds window = std::chrono::hours(1);
};

class action_budget {
 public:
  using clock = std::chrono::steady_clock;
  explicit action_budget(budget_options o) : opts_(o) {}

  /// Charges one action at `now`; false (nothing charged) when the window
  /// already holds max_actions.
  bool try_charge(clock::time_point now = clock::now()) {
    if (opts_.max_actions <= 0) return true;
    std::lock_guard lk(m_);
    expire(now);
    if (static_cast<std::int64_t>(times_.size()) >= opts_.max_actions) return false;
    times_.push_back(now);
    return true;
  }
  /// Actions counted in the window ending at `now`.
  std::int64_t used(clock::time_point now = clock::now()) {
    std::lock_guard lk(m_);
    expire(now);
    return static_cast<std::int64_t>(times_.size());
  }
  const budget_options& options() const { return opts_; }

 private:
  void expire(clock::time_point now) {
    while (!times_.empty() && now - times_.front() >= opts_.window) times_.pop_front();
  }
  const budget_options opts_;
  std::mutex m_;
  std::deque<clock::time_point> times_;
};

/// The budgets of a host, one per tree, by the id of the tree's root.
class action_budgets {
 public:
  explicit action_budgets(budget_options o) : opts_(o) {}
  std::shared_ptr<action_budget> of(const std::string& root) {
    std::lock_guard lk(m_);
    auto& b = budgets_[root];
    if (!b) b = std::make_shared<action_budget>(opts_);
    return b;
  }
  const budget_options& options() const { return opts_; }

 private:
  const budget_options opts_;
  std::mutex m_;
  std::map<std::string, std::shared_ptr<action_budget>> budgets_;
};

}  // namespace tether::runtime
