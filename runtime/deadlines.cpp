#include "tether/runtime/deadlines.hpp"

#include <vector>

namespace tether::runtime {

deadlines& deadlines::instance() {
  // Never destroyed: entries hold executors of io_contexts that static
  // destruction may already have taken, and the thread sleeps until exit.
  static deadlines* d = new deadlines;
  return *d;
}

deadlines::deadlines() : thread_([this] { loop(); }) {}

deadlines::ticket deadlines::arm(entry e) {
  auto at = clock::now() + e.after;
  bool wake = false;
  ticket t;
  {
    std::lock_guard lk(m_);
    t = ticket{at, ++seq_};
    entries_.emplace(key{at, t.seq}, std::move(e));
    if (at < sleeping_until_) {  // the thread would sleep past this deadline
      sleeping_until_ = at;
      wake = true;
    }
  }
  if (wake) cv_.notify_one();
  return t;
}

void deadlines::remove(const ticket& t) {
  decltype(entries_)::node_type gone;  // released after the lock: it may end the asker's work
  std::lock_guard lk(m_);
  gone = entries_.extract(key{t.at, t.seq});
}

std::size_t deadlines::pending() {
  std::lock_guard lk(m_);
  return entries_.size();
}

void deadlines::loop() {
  std::unique_lock lk(m_);
  for (;;) {
    auto now = clock::now();
    if (!entries_.empty() && entries_.begin()->first.first <= now) {
      std::vector<entry> due;
      auto it = entries_.begin();
      for (; it != entries_.end() && it->first.first <= now; ++it)
        due.push_back(std::move(it->second));
      entries_.erase(entries_.begin(), it);
      lk.unlock();
      for (auto& e : due)
        if (auto target = e.target.lock()) e.expire(target.get(), e.name, e.after);
      due.clear();  // each executor's work ends after its expiry was posted
      lk.lock();
      continue;
    }
    // Until the earliest entry; with none, until the wake already planned
    // (so that the next arm of the same timeout need not wake the thread),
    // or until told.
    auto next = !entries_.empty()       ? entries_.begin()->first.first
                : sleeping_until_ > now ? sleeping_until_
                                        : clock::time_point::max();
    sleeping_until_ = next;
    if (next == clock::time_point::max())
      cv_.wait(lk);
    else
      cv_.wait_until(lk, next);
  }
}

}  // namespace tether::runtime
