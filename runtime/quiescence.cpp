#include "tether/runtime/quiescence.hpp"

#include <boost/asio/use_awaitable.hpp>

namespace tether::runtime {

void quiescence::add(int delta, bool job) {
  std::vector<std::shared_ptr<one_shot<int>>> ready;
  {
    std::lock_guard lk(m_);
    (job ? jobs_active_ : active_) += delta;
    for (auto it = waiters_.begin(); it != waiters_.end();) {
      if (active_ == 0 && (!it->jobs || jobs_active_ == 0)) {
        ready.push_back(it->done);
        it = waiters_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (auto& w : ready) w->set(0);
}

boost::asio::awaitable<void> quiescence::wait(bool jobs) {
  auto w = one_shot<int>::make();
  {
    std::lock_guard lk(m_);
    if (active_ == 0 && (!jobs || jobs_active_ == 0)) co_return;
    waiters_.push_back({w, jobs});
  }
  co_await w->async_wait(boost::asio::use_awaitable);
}

}  // namespace tether::runtime
