#include "tether/actors/command_route.hpp"

#include "tether/runtime/clock.hpp"

namespace tether::actors {

awaitable<result<wire::started_rep>> client_route::exec(wire::exec_req r) {
  co_return co_await c_->exec(std::move(r));
}

awaitable<result<protocol::shell_completion>> client_route::wait(job_id job) {
  auto r = co_await c_->wait(job);
  c_->forget(job);
  co_return r;
}

awaitable<result<protocol::shell_completion>> client_route::kill(job_id job) {
  co_return co_await c_->kill(std::move(job));
}

awaitable<result<std::vector<job_id>>> command_route::expire(job_id job) {
  co_return error{errc::refused, "route '" + name() + "' cannot expire job '" + job.str() +
                                     "'; the daemon keeps its record until its own bound"};
}

awaitable<result<std::vector<job_id>>> client_route::expire(job_id job) {
  co_return co_await c_->expire(std::move(job));
}

bool sandbox_lease::extend_to(std::int64_t until_ms) {
  if (until_ms <= until_ms_) return false;
  until_ms_ = until_ms;
  return true;
}

bool is_infrastructure_failure(const error& e) {
  if (e.answered) return false;  // the daemon answered: the route works
  switch (e.code) {
    case errc::io:
    case errc::closed:
    case errc::timeout:
    case errc::stopped:
    case errc::dropped:
    case errc::failed:
      return true;
    default:
      return false;
  }
}

routed_channel::routed_channel(std::shared_ptr<command_route> platform,
                               std::shared_ptr<command_route> adapter, int max_failures,
                               std::shared_ptr<sandbox_lease> lease)
    : platform_(std::move(platform)),
      adapter_(std::move(adapter)),
      max_failures_(max_failures < 1 ? 1 : max_failures),
      lease_(std::move(lease)) {
  if (!adapter_) fell_back_ = true;
}

std::string routed_channel::name() const {
  return fell_back_ ? platform_->name() : adapter_->name();
}

template <class T, class Call>
awaitable<result<T>> routed_channel::route(Call call) {
  while (!fell_back_) {
    if (auto t = adapter_->timeout(); t && lease_)
      lease_->extend_to(runtime::now_ms() + t->count());
    auto r = co_await call(*adapter_);
    if (r || !is_infrastructure_failure(r.error())) {
      if (!fell_back_) failures_ = 0;
      co_return r;
    }
    // Calls that were in flight when another one made the channel fall back
    // do not count again (and do not warn twice): they just move over.
    if (fell_back_) break;
    if (++failures_ >= max_failures_) {
      fell_back_ = true;
      if (on_fallback)
        on_fallback("route '" + adapter_->name() + "' failed " + std::to_string(failures_) +
                    " times in a row (last: " + r.error().message + "); falling back to '" +
                    platform_->name() + "' on the same sandbox");
    }
  }
  co_return co_await call(*platform_);
}

awaitable<result<wire::started_rep>> routed_channel::exec(wire::exec_req r) {
  auto call = [r = std::move(r)](command_route& c) { return c.exec(r); };
  co_return co_await route<wire::started_rep>(std::move(call));
}

awaitable<result<protocol::shell_completion>> routed_channel::wait(job_id job) {
  auto call = [job = std::move(job)](command_route& c) { return c.wait(job); };
  co_return co_await route<protocol::shell_completion>(std::move(call));
}

awaitable<result<protocol::shell_completion>> routed_channel::kill(job_id job) {
  auto call = [job = std::move(job)](command_route& c) { return c.kill(job); };
  co_return co_await route<protocol::shell_completion>(std::move(call));
}

awaitable<result<std::vector<job_id>>> routed_channel::expire(job_id job) {
  auto call = [job = std::move(job)](command_route& c) { return c.expire(job); };
  co_return co_await route<std::vector<job_id>>(std::move(call));
}

}  // namespace tether::actors
