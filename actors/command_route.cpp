#include "tether/actors/command_route.hpp"

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

}  // namespace tether::actors
