#pragma once
// Shared by bench_settle and bench_latency: the session names of a fan-out
// (P parents, each with C background children), the "[period N]" marker a
// child's answer carries, and the parent agent that spawns its children on a
// prompt until a deadline and takes no turn on a report.
#include <atomic>
#include <boost/asio/awaitable.hpp>
#include <string>
#include <vector>

#include "support.hpp"
#include "tether/actors/host.hpp"

namespace tether::bench {

inline std::string parent_name(std::size_t p) {
  return "ses_parent" + std::to_string(p);
}
inline std::string child_name(std::size_t p, std::size_t c) {
  return "ses_p" + std::to_string(p) + "_c" + std::to_string(c);
}
inline std::string marker(int period) {
  return "[period " + std::to_string(period) + "]";
}

/// What the parents spawned, and until when they may.
struct spawn_state {
  explicit spawn_state(std::size_t parents) : spawned(parents) {}
  std::vector<std::atomic<std::size_t>> spawned;  // per parent: children 0..n-1 exist
  std::atomic<std::size_t> parent_drains{0};
  std::atomic<clock::rep> deadline{clock::time_point::max().time_since_epoch().count()};
  bool open() const { return clock::now().time_since_epoch().count() < deadline.load(); }
};

/// A parent: on a prompt it spawns its children in the background, one after
/// the other as a model's tool calls would, until the deadline; a report
/// gets no turn (it still drains and acknowledges its inbox).
class parent_agent : public actors::agent {
 public:
  parent_agent(std::size_t index, std::size_t children, spawn_state* st)
      : index_(index), children_(children), st_(st) {}

  boost::asio::awaitable<void> drain(actors::agent_context& ctx, actors::drain_input in) override {
    ++st_->parent_drains;
    for (auto& m : in.inputs) {
      if (m.kind != "prompt") continue;
      for (std::size_t c = 0; c < children_ && st_->open(); ++c) {
        actors::spawn_request req;
        req.child = protocol::session_id(child_name(index_, c));
        req.description = "bench child " + std::to_string(c);
        req.prompt = "start " + marker(1);
        auto r = co_await ctx.spawn_background(std::move(req));
        if (!r) throw error_exception(r.error());
        st_->spawned[index_].store(c + 1);
      }
    }
  }

 private:
  std::size_t index_;
  std::size_t children_;
  spawn_state* st_;
};

}  // namespace tether::bench
