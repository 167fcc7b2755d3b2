#pragma once
// Shared by the bench drivers that run a whole host: waiting on it from the
// driver's thread, and an agent factory whose agents do nothing (for benches
// whose sessions are never prompted, or whose work is not a model's).
#include <boost/asio/awaitable.hpp>
#include <memory>

#include "tether/actors/host.hpp"
#include "tether/runtime/sync_wait.hpp"

namespace tether::bench {

/// Runs `a` on the host's first executor and waits for it on this thread
/// (never an executor thread).
template <class T>
T sync(actors::host& h, boost::asio::awaitable<T> a) {
  return runtime::sync_wait(h.pool().at(0), std::move(a));
}

/// Agents that answer nothing: each drain returns at once.
class idle_agents : public actors::agent_factory {
  class idle : public actors::agent {
   public:
    boost::asio::awaitable<void> drain(actors::agent_context&, actors::drain_input) override {
      co_return;
    }
  };

 public:
  std::shared_ptr<actors::agent> make(const actors::session_row&) override {
    return std::make_shared<idle>();
  }
};

}  // namespace tether::bench
