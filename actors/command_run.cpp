#include "tether/actors/command_run.hpp"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <filesystem>

#include "tether/protocol/output_tail.hpp"
#include "tether/protocol/scrub.hpp"
#include "tether/sandbox/client.hpp"

namespace tether::actors {

namespace asio = boost::asio;

namespace {
std::string quote(const std::string& s) {
  return "'" + s + "'";
}
}  // namespace

std::optional<std::string> shell_refusal(const protocol::session_policy& policy,
                                         const std::string& agent, const std::string& cwd) {
  if (!policy.shells || !policy.allows_tool(protocol::tool_shell))
    return "the policy of agent " + quote(agent) + " does not allow shells";
  if (!policy.allows_path(cwd))
    return "the work directory " + cwd + " is outside the writable paths of agent " + quote(agent) +
           "'s policy";
  return std::nullopt;
}

asio::awaitable<command_outcome> run_command(runtime::executor ex,
                                             std::shared_ptr<sandbox_channel> channel,
                                             command_spec spec,
                                             const protocol::session_policy& policy,
                                             std::string agent, std::function<void()> after_exec) {
  command_outcome out;
  if (auto why = shell_refusal(policy, agent, spec.cwd)) {
    out.status = "refused";
    out.error = *why;
    co_return out;
  }
  if (!channel) {
    out.status = "error";
    out.error = "no sandbox channel: shell commands cannot be dispatched";
    co_return out;
  }
  auto opened = co_await channel->open();
  if (!opened) {
    out.status = "error";
    out.error = "the sandbox could not be opened: " + opened.error().message;
    co_return out;
  }
  auto id = spec.id;
  if (!spec.attach_only) {
    protocol::sandbox::exec_req er;
    er.command = spec.command;
    er.cwd = spec.cwd;
    er.env = sandbox::current_environment();
    for (auto& kv : spec.env) er.env.push_back(kv);
    er.job = id;
    er.isolate = policy.isolate_shells();
    er.allow_network = er.isolate && policy.network;
    er.tail_bytes = static_cast<std::int64_t>(spec.max_output_bytes);
    er.tail_lines = 10000;  // the daemon's most: the bound is in bytes
    auto started = co_await channel->dispatch(id, std::move(er));
    if (!started) {
      out.status = "error";
      out.error = "the command was not started: " + started.error().message;
      co_return out;
    }
    if (after_exec) after_exec();
  }
  // The timeout: a watchdog kills the command (confirmed) once it passes.
  auto fired = std::make_shared<bool>(false);
  std::shared_ptr<asio::steady_timer> watchdog;
  if (spec.timeout_ms > 0) {
    watchdog = std::make_shared<asio::steady_timer>(ex);
    watchdog->expires_after(std::chrono::milliseconds(spec.timeout_ms));
    auto w = [watchdog, fired, channel, id]() -> asio::awaitable<void> {
      auto [ec] = co_await watchdog->async_wait(asio::as_tuple(asio::use_awaitable));
      if (ec) co_return;
      *fired = true;
      (void)co_await channel->kill(id);
    };
    asio::co_spawn(ex, std::move(w), asio::detached);
  }
  auto done = co_await channel->follow(id);
  if (watchdog) watchdog->cancel();
  if (!done) {
    if (spec.attach_only && done.error().code == errc::not_found) {
      out.status = "lost";
      out.error = "the sandbox daemon has no record of it: " + done.error().message;
    } else {
      out.status = "error";
      out.error = "its completion could not be read: " + done.error().message;
    }
    co_return out;
  }
  // The tail the daemon kept is scrubbed; it is bounded to the caller's
  // limit here, and marked when the daemon omitted some of the output.
  const auto& st = done->status;
  out.exit = st.exit_code;
  out.output = protocol::bounded_text(done->tail, spec.max_output_bytes);
  static constexpr std::string_view k_marker = "...[truncated]";
  if (done->tail_omitted_bytes > 0 && !out.output.ends_with(k_marker)) {
    auto keep =
        spec.max_output_bytes > k_marker.size() ? spec.max_output_bytes - k_marker.size() : 0;
    out.output = protocol::bounded_text(out.output.substr(0, keep), keep);
    out.output += k_marker;
  }
  if (*fired) {
    out.status = "timed_out";
    out.error = "timed out after " + std::to_string(spec.timeout_ms) + " ms; killed";
  } else if (st.exit_code == 0 && st.capture == protocol::capture_kind::per_stage) {
    out.status = "ok";
  } else if (st.exit_code == 0 && st.capture == protocol::capture_kind::shell_only) {
    out.status = "degraded";
    out.error = "exit 0 from the shell, but no per-stage status was captured";
  } else {
    out.status = "error";
    out.error = protocol::render_status_line(st);
  }
  co_return out;
}

asio::awaitable<command_outcome> run_prompt(runtime::executor ex,
                                            asio::awaitable<result<std::string>> running,
                                            std::int64_t timeout_ms, std::size_t max_output_bytes,
                                            std::shared_ptr<asio::cancellation_signal> sig) {
  command_outcome out;
  auto fired = std::make_shared<bool>(false);
  std::shared_ptr<asio::steady_timer> watchdog;
  if (timeout_ms > 0) {
    watchdog = std::make_shared<asio::steady_timer>(ex);
    watchdog->expires_after(std::chrono::milliseconds(timeout_ms));
    auto w = [watchdog, fired, sig]() -> asio::awaitable<void> {
      auto [ec] = co_await watchdog->async_wait(asio::as_tuple(asio::use_awaitable));
      if (ec) co_return;
      *fired = true;
      sig->emit(asio::cancellation_type::terminal);
    };
    asio::co_spawn(ex, std::move(w), asio::detached);
  }
  result<std::string> answer = error{errc::failed, "the prompt runner did not answer"};
  try {
    answer = co_await asio::co_spawn(
        ex, std::move(running), asio::bind_cancellation_slot(sig->slot(), asio::use_awaitable));
  } catch (const std::exception& e) {
    answer = error{errc::failed, std::string("the prompt run was interrupted: ") + e.what()};
  }
  if (watchdog) watchdog->cancel();
  protocol::scrubber scrub(protocol::scrub_rules::from_env(sandbox::current_environment()));
  if (*fired) {
    out.status = "timed_out";
    out.error = "timed out after " + std::to_string(timeout_ms) + " ms";
  } else if (!answer) {
    out.status = "error";
    out.error = protocol::bounded_text(scrub.scrub(answer.error().message), 2000);
  } else {
    out.status = "ok";
    out.output = protocol::bounded_text(scrub.scrub(*answer), max_output_bytes);
  }
  co_return out;
}

}  // namespace tether::actors
