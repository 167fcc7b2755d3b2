#pragma once
// Command routes: how commands reach a sandbox.
//
// The platform route is the sandbox daemon's own socket (a sandbox::client).
// An optional adapter route attaches to the same sandbox, which the platform
// already owns. A failing route is a channel failure, not a sandbox failure:
// after `max_failures` infrastructure failures in a row the routed channel
// falls back to the platform route on the same sandbox, and nothing here can
// retire or replace the sandbox. Requests are safe to repeat on another route
// because exec is idempotent by job id and kill and wait are idempotent.
//
// A route's timeout may extend the sandbox's lease, never shorten it.
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

/// How long the platform keeps the sandbox. Only ever extended from a route.
class sandbox_lease {
 public:
  explicit sandbox_lease(std::int64_t until_ms = 0) : until_ms_(until_ms) {}
  std::int64_t until_ms() const { return until_ms_; }
  /// Moves the end to `until_ms` if that is later; returns whether it moved.
  bool extend_to(std::int64_t until_ms);

 private:
  std::int64_t until_ms_;
};

/// A connection-level failure (the route, not the command): counted towards
/// the fallback. An answer from the daemon (error::answered), even a refusal
/// or an I/O error on its side, is not one.
bool is_infrastructure_failure(const error& e);

/// The adapter route while it works, the platform route after it failed
/// `max_failures` times in a row. Lives on one executor.
class routed_channel : public command_route {
 public:
  routed_channel(std::shared_ptr<command_route> platform, std::shared_ptr<command_route> adapter,
                 int max_failures, std::shared_ptr<sandbox_lease> lease);

  std::string name() const override;
  awaitable<result<wire::started_rep>> exec(wire::exec_req r) override;
  awaitable<result<protocol::shell_completion>> wait(job_id job) override;
  awaitable<result<protocol::shell_completion>> kill(job_id job) override;
  awaitable<result<std::vector<job_id>>> expire(job_id job) override;
  void close() override {
    if (adapter_) adapter_->close();
    platform_->close();
  }

  bool fell_back() const { return fell_back_; }
  int failures_in_a_row() const { return failures_; }
  /// Called once when the channel falls back (for logs).
  std::function<void(const std::string&)> on_fallback;

 private:
  template <class T, class Call>
  awaitable<result<T>> route(Call call);

  std::shared_ptr<command_route> platform_;
  std::shared_ptr<command_route> adapter_;
  int max_failures_;
  std::shared_ptr<sandbox_lease> lease_;
  int failures_ = 0;
  bool fell_back_ = false;
};

}  // namespace tether::actors
