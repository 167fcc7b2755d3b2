#pragma once
// The agent of the CLI's scheduled and procedural hosts (`tether cron run`,
// `tether sop run`): a prompt is answered "done: <prompt>".
#include <memory>

#include "tether/actors/host.hpp"

namespace tether::cli {

struct answering_agent : actors::agent {
  boost::asio::awaitable<void> drain(actors::agent_context& ctx, actors::drain_input in) override {
    for (auto& m : in.inputs)
      if (m.kind == "prompt") (void)co_await ctx.say("done: " + m.text);
  }
};

struct answering_factory : actors::agent_factory {
  std::shared_ptr<actors::agent> make(const persistence::session_row&) override {
    return std::make_shared<answering_agent>();
  }
};

}  // namespace tether::cli
