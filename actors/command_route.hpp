#pragma once
// Command routes: one way for commands to reach a sandbox.
//
// The platform route is the sandbox daemon's own socket (a client_route over
// a sandbox::client). An optional adapter route attaches to the same
// sandbox, which the platform already owns. Which route a request takes, the
// fallback after repeated infrastructure failures and the lease a route's
// timeout extends are the sandbox channel's (actors/sandbox_channel.hpp);
// a route only carries requests.
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "tether/sandbox/client.hpp"

namespace tether::actors {

namespace wire = protocol::sandbox;
using boost::asio::awaitable;
using protocol::job_id;

class command_route {
 public:
  virtual ~command_route() = default;
  virtual std::string name() const = 0;
  virtual awaitable<result<wire::started_rep>> exec(wire::exec_req r) = 0;
  /// Resolves with the job's completion (an unknown status is -1, never 0).
  virtual awaitable<result<protocol::shell_completion>> wait(job_id job) = 0;
  /// Resolves once no process of the job is left (confirmed by the daemon).
  virtual awaitable<result<protocol::shell_completion>> kill(job_id job) = 0;
  /// Lets the daemon drop a completed job's record: the host's terminal
  /// receipt for it is durable. A route that cannot answers an error.
  virtual awaitable<result<std::vector<job_id>>> expire(job_id job);
  /// How long one request on this route may take; the lease is extended to cover it.
  virtual std::optional<std::chrono::milliseconds> timeout() const { return std::nullopt; }
  /// Ends the route's connections: requests in flight complete with an error.
  virtual void close() {}
};

/// A route over one daemon connection (the platform's own, or an adapter's).
class client_route : public command_route {
 public:
  client_route(std::string name, std::unique_ptr<sandbox::client> c)
      : name_(std::move(name)), c_(std::move(c)) {}
  std::string name() const override { return name_; }
  awaitable<result<wire::started_rep>> exec(wire::exec_req r) override;
  awaitable<result<protocol::shell_completion>> wait(job_id job) override;
  awaitable<result<protocol::shell_completion>> kill(job_id job) override;
  awaitable<result<std::vector<job_id>>> expire(job_id job) override;
  void close() override { c_->close(); }
  sandbox::client& client() { return *c_; }

 private:
  std::string name_;
  std::unique_ptr<sandbox::client> c_;
};

/// A connection-level failure (the route, not the command): counted towards
/// the fallback. An answer from the daemon (error::answered), even a refusal
/// or an I/O error on its side, is not one.
bool is_infrastructure_failure(const error& e);

}  // namespace tether::actors
