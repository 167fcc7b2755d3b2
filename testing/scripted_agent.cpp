#include "tether/testing/scripted_agent.hpp"

#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <stdexcept>

namespace tether::testing {

namespace {

class scripted_agent : public agent {
 public:
  scripted_agent(scripted_agents& owner, session_id id) : owner_(owner), id_(std::move(id)) {}

  awaitable<void> drain(agent_context& ctx, drain_input in) override {
    for (auto& input : in.inputs) {
      auto ordinal = co_await ctx.input_ordinal(input.seq);
      if (!ordinal) throw std::runtime_error(ordinal.error().message);
      auto turn = owner_.turn(id_, static_cast<int>(*ordinal));
      if (!turn) continue;
      for (auto& a : turn->actions) co_await act(ctx, a);
      owner_.note_played(id_, static_cast<int>(*ordinal));
    }
  }

 private:
  awaitable<void> act(agent_context& ctx, const script_action& a) {
    using k = script_action::kind;
    switch (a.what) {
      case k::say: {
        auto r = co_await ctx.say(a.text);
        if (!r) throw error_exception(r.error());
        owner_.note(id_.str() + " says: " + a.text);
        break;
      }
      case k::fail: {
        auto r = co_await ctx.fail(a.text);
        if (!r) throw error_exception(r.error());
        owner_.note(id_.str() + " fails: " + a.text);
        break;
      }
      case k::raise:
        throw std::runtime_error(a.text);
      case k::shell: {
        auto r = co_await ctx.start_shell(a.text);
        if (!r) throw error_exception(r.error());
        owner_.note(id_.str() + " starts shell " + *r + ": " + a.text);
        break;
      }
      case k::delegate: {
        delegate_request req;
        req.agent = a.agent;
        req.prompt = a.text;
        req.workspace = owner_.workspace();
        auto r = co_await ctx.delegate_background(std::move(req));
        if (!r) throw error_exception(r.error());
        owner_.note_delegate(a.child, {*r, id_});
        owner_.note(id_.str() + " delegates " + r->str() + " (" + a.child + ") to " + a.agent +
                    ": " + a.text);
        break;
      }
      case k::fork: {
        spawn_request req;
        req.description = a.description;
        req.prompt = a.text;
        req.agent = a.agent;
        req.fork = true;
        req.child = session_id(a.child);
        auto r = co_await ctx.spawn_background(std::move(req));
        if (!r) throw error_exception(r.error());
        owner_.note(id_.str() + " forks " + r->str() + ": " + a.description);
        break;
      }
      case k::job: {
        launch_request req;
        req.command = a.text;
        req.channel = "tool";
        // Named: the name is the idempotency key, so a turn replayed after a
        // crash gets the same job back.
        if (!a.child.empty()) req.key = a.child;
        auto r = co_await ctx.launch_job(std::move(req));
        if (!r) throw error_exception(r.error());
        if (!a.child.empty()) owner_.note_job(a.child, {*r, id_});
        owner_.note(id_.str() + " launches job " + r->str() +
                    (a.child.empty() ? "" : " (" + a.child + ")") + ": " + a.text);
        break;
      }
      case k::job_status:
      case k::job_wait:
      case k::job_cancel: {
        auto j = owner_.job(a.child);
        if (!j) throw std::runtime_error("no job named '" + a.child + "' was launched");
        result<job_view> r = error{errc::invalid, "no job action"};
        if (a.what == k::job_status)
          r = co_await ctx.job_status(j->id);
        else if (a.what == k::job_wait)
          r = co_await ctx.wait_job(j->id);
        else
          r = co_await ctx.cancel_job(j->id);
        if (!r) throw error_exception(r.error());
        const char* verb = a.what == k::job_status ? " reads the status of job "
                           : a.what == k::job_wait ? " waits for job "
                                                   : " cancels job ";
        owner_.note(id_.str() + verb + a.child + ": " +
                    std::string(persistence::to_string(r->state)));
        break;
      }
      case k::spawn: {
        spawn_request req;
        req.description = a.description;
        req.prompt = a.text;
        req.agent = a.agent;
        req.notify = a.notify;
        if (!a.child.empty()) req.child = session_id(a.child);
        if (a.background) {
          auto r = co_await ctx.spawn_background(std::move(req));
          if (!r) throw error_exception(r.error());
          owner_.note(id_.str() + " spawns " + r->str() + " in the background: " + a.description);
        } else {
          owner_.note(id_.str() + " calls " + a.child + " in the foreground: " + a.description);
          auto r = co_await ctx.spawn_foreground(std::move(req));
          if (!r) throw error_exception(r.error());
          owner_.note_inline(*r);
        }
        break;
      }
      case k::wake_self:
        for (int i = 0; i < a.count; ++i) ctx.wake_self();
        break;
      case k::wait_cancel: {
        // Suspends until an interrupt cancels the drain; parked meanwhile.
        struct parked {
          scripted_agents& owner;
          const session_id& id;
          ~parked() { owner.note_parked(id, -1); }
        };
        owner_.note_parked(id_, +1);
        parked guard{owner_, id_};
        asio::steady_timer t(co_await asio::this_coro::executor);
        t.expires_at(asio::steady_timer::time_point::max());
        co_await t.async_wait(asio::use_awaitable);
        break;
      }
      case k::interrupt:
        owner_.note(id_.str() + " interrupts " + a.child);
        if (auto r = co_await ctx.cancel_child(session_id(a.child)); !r)
          owner_.note(id_.str() + " could not interrupt " + a.child + ": " + r.error().message);
        break;
    }
  }

  scripted_agents& owner_;
  session_id id_;
};

}  // namespace

void scripted_agents::note_delegate(const std::string& name, named_job j) {
  std::lock_guard lk(m_);
  delegates_.insert_or_assign(name, std::move(j));
}

std::optional<scripted_agents::named_job> scripted_agents::delegated(
    const std::string& name) const {
  std::lock_guard lk(m_);
  auto it = delegates_.find(name);
  if (it == delegates_.end()) return std::nullopt;
  return it->second;
}

void scripted_agents::set_workspace(std::filesystem::path p) {
  std::lock_guard lk(m_);
  workspace_ = std::move(p);
}

std::filesystem::path scripted_agents::workspace() const {
  std::lock_guard lk(m_);
  return workspace_;
}

void scripted_agents::note_job(const std::string& name, named_job j) {
  std::lock_guard lk(m_);
  jobs_.insert_or_assign(name, std::move(j));
}

std::optional<scripted_agents::named_job> scripted_agents::job(const std::string& name) const {
  std::lock_guard lk(m_);
  auto it = jobs_.find(name);
  if (it == jobs_.end()) return std::nullopt;
  return it->second;
}

void scripted_agents::on_input(const session_id& s, int ordinal, script_turn t) {
  std::lock_guard lk(m_);
  turns_[{s.str(), ordinal}] = std::move(t);
}

std::optional<script_turn> scripted_agents::turn(const session_id& s, int ordinal) const {
  std::lock_guard lk(m_);
  auto it = turns_.find({s.str(), ordinal});
  if (it == turns_.end()) return std::nullopt;
  return it->second;
}

std::shared_ptr<agent> scripted_agents::make(const session_row& session) {
  // A delegated task's session (its name is made from the task's id) plays
  // the turns written for its agent's name: `on AGENT N: ...`.
  auto key = session.task_id ? session_id(session.agent) : session.id;
  return std::make_shared<scripted_agent>(*this, std::move(key));
}

std::vector<std::string> scripted_agents::log() const {
  std::lock_guard lk(m_);
  return log_;
}

void scripted_agents::note(std::string line) {
  std::lock_guard lk(m_);
  log_.push_back(std::move(line));
}

void scripted_agents::note_parked(const session_id& s, int delta) {
  {
    std::lock_guard lk(m_);
    parked_[s.str()] += delta;
  }
  changed_.notify_all();
}

bool scripted_agents::wait_parked(const session_id& s, std::chrono::milliseconds timeout) const {
  std::unique_lock lk(m_);
  return changed_.wait_for(lk, timeout, [&] {
    auto it = parked_.find(s.str());
    return it != parked_.end() && it->second > 0;
  });
}

void scripted_agents::note_played(const session_id& s, int ordinal) {
  {
    std::lock_guard lk(m_);
    ++played_[{s.str(), ordinal}];
  }
  changed_.notify_all();
}

bool scripted_agents::wait_played(const session_id& s, int ordinal,
                                  std::chrono::milliseconds timeout) const {
  std::unique_lock lk(m_);
  return changed_.wait_for(lk, timeout, [&] { return played_.count({s.str(), ordinal}) > 0; });
}

std::vector<std::string> scripted_agents::inline_results() const {
  std::lock_guard lk(m_);
  return inline_;
}

void scripted_agents::note_inline(std::string r) {
  std::lock_guard lk(m_);
  inline_.push_back(std::move(r));
}

}  // namespace tether::testing
