#include "tether/embed/embedded.hpp"

#include <array>
#include <boost/asio/use_awaitable.hpp>
#include <cstdio>
#include <set>
#include <stdexcept>
#include <utility>

namespace tether {

namespace asio = boost::asio;

// ---- enums ----------------------------------------------------------------------

namespace {

template <class E, std::size_t N>
using names = std::array<std::pair<E, std::string_view>, N>;

constexpr names<role, 2> k_roles{{{role::user, "user"}, {role::assistant, "assistant"}}};
constexpr names<message_kind, 6> k_kinds{{{message_kind::prompt, "prompt"},
                                          {message_kind::steer, "steer"},
                                          {message_kind::report, "report"},
                                          {message_kind::notice, "notice"},
                                          {message_kind::answer, "answer"},
                                          {message_kind::control, "control"}}};
constexpr names<message_status, 2> k_statuses{
    {{message_status::completed, "completed"}, {message_status::error, "error"}}};
constexpr names<task_kind, 2> k_task_kinds{
    {{task_kind::subagent, "subagent"}, {task_kind::shell, "shell"}}};
constexpr names<task_state, 6> k_task_states{{{task_state::admitted, "admitted"},
                                              {task_state::running, "running"},
                                              {task_state::completed, "completed"},
                                              {task_state::failed, "failed"},
                                              {task_state::cancelled, "cancelled"},
                                              {task_state::lost, "lost"}}};
constexpr names<job_policy, 2> k_policies{
    {{job_policy::withhold, "withhold"}, {job_policy::report_now, "report_now"}}};

template <class E, std::size_t N>
std::string_view name_of(const names<E, N>& table, E v) {
  for (auto& [e, n] : table)
    if (e == v) return n;
  return "unknown";
}

template <class E, std::size_t N>
bool parse_in(const names<E, N>& table, std::string_view s, E& out) {
  for (auto& [e, n] : table)
    if (n == s) {
      out = e;
      return true;
    }
  return false;
}

}  // namespace

std::string_view to_string(role v) {
  return name_of(k_roles, v);
}
std::string_view to_string(message_kind v) {
  return name_of(k_kinds, v);
}
std::string_view to_string(message_status v) {
  return name_of(k_statuses, v);
}
std::string_view to_string(task_kind v) {
  return name_of(k_task_kinds, v);
}
std::string_view to_string(task_state v) {
  return name_of(k_task_states, v);
}
std::string_view to_string(job_policy v) {
  return name_of(k_policies, v);
}
bool parse(std::string_view s, role& out) {
  return parse_in(k_roles, s, out);
}
bool parse(std::string_view s, message_kind& out) {
  return parse_in(k_kinds, s, out);
}
bool parse(std::string_view s, message_status& out) {
  return parse_in(k_statuses, s, out);
}
bool parse(std::string_view s, task_kind& out) {
  return parse_in(k_task_kinds, s, out);
}
bool parse(std::string_view s, task_state& out) {
  return parse_in(k_task_states, s, out);
}
bool parse(std::string_view s, job_policy& out) {
  return parse_in(k_policies, s, out);
}

task_state to_task_state(persistence::job_status s) {
  switch (s) {
    case persistence::job_status::running:
      return task_state::running;
    case persistence::job_status::completed:
      return task_state::completed;
    case persistence::job_status::error:
      return task_state::failed;
    case persistence::job_status::cancelled:
      return task_state::cancelled;
  }
  return task_state::failed;
}

task_state to_task_state(persistence::owned_state s) {
  switch (s) {
    case persistence::owned_state::admitted:
      return task_state::admitted;
    case persistence::owned_state::running:
      return task_state::running;
    case persistence::owned_state::completed:
      return task_state::completed;
    case persistence::owned_state::failed:
      return task_state::failed;
    case persistence::owned_state::cancelled:
      return task_state::cancelled;
    case persistence::owned_state::lost:
      return task_state::lost;
  }
  return task_state::lost;
}

result<message> to_message(const persistence::message_row& row) {
  message m;
  m.seq = row.seq;
  m.text = row.text;
  auto bad = [&](std::string_view field, const std::string& value) {
    return error{errc::corrupt, "message seq " + std::to_string(row.seq) + " has unknown " +
                                    std::string(field) + " '" + value + "'"};
  };
  if (!parse(row.role, m.role)) return bad("role", row.role);
  if (!parse(row.kind, m.kind)) return bad("kind", row.kind);
  if (!parse(row.status, m.status)) return bad("status", row.status);
  return m;
}

// ---- agents ---------------------------------------------------------------------

awaitable<result<session_id>> turn::spawn_background(std::string agent, std::string description,
                                                     std::string prompt) {
  actors::spawn_request req;
  req.agent = std::move(agent);
  req.description = std::move(description);
  req.prompt = std::move(prompt);
  co_return co_await ctx_.spawn_background(std::move(req));
}

awaitable<result<std::string>> turn::spawn_foreground(std::string agent, std::string description,
                                                      std::string prompt) {
  actors::spawn_request req;
  req.agent = std::move(agent);
  req.description = std::move(description);
  req.prompt = std::move(prompt);
  co_return co_await ctx_.spawn_foreground(std::move(req));
}

awaitable<result<protocol::job_id>> turn::delegate(std::string agent, std::string prompt,
                                                   std::filesystem::path workspace) {
  actors::delegate_request req;
  req.agent = std::move(agent);
  req.prompt = std::move(prompt);
  req.workspace = std::move(workspace);
  co_return co_await ctx_.delegate_background(std::move(req));
}

namespace {

class fn_agent : public agent {
 public:
  explicit fn_agent(agent_fn fn) : fn_(std::move(fn)) {}
  awaitable<void> run(turn& t) override { return fn_(t); }

 private:
  agent_fn fn_;
};

// The runtime's agent interface over the facade's: typed inputs, one turn.
class adapter : public actors::agent {
 public:
  adapter(std::shared_ptr<tether::agent> a, std::string name)
      : a_(std::move(a)), name_(std::move(name)) {}

  awaitable<void> drain(actors::agent_context& ctx, actors::drain_input in) override {
    if (!a_) {
      std::string why = "no agent named '" + name_ + "' is registered with this host";
      co_await ctx.fail(std::move(why));
      co_return;
    }
    std::vector<message> inputs;
    for (auto& row : in.inputs) {
      auto m = to_message(row);
      // Throwing ends the busy period in "error" with this text.
      if (!m) throw std::runtime_error(m.error().message);
      inputs.push_back(std::move(*m));
    }
    turn t(ctx, std::move(inputs), in.drain_index, in.scope == actors::wake_scope::steer);
    co_await a_->run(t);
  }

 private:
  std::shared_ptr<tether::agent> a_;
  std::string name_;
};

class registry : public actors::agent_factory {
 public:
  explicit registry(std::map<std::string, std::shared_ptr<tether::agent>> agents)
      : agents_(std::move(agents)) {}

  std::shared_ptr<actors::agent> make(const persistence::session_row& s) override {
    auto it = agents_.find(s.agent);
    return std::make_shared<adapter>(it == agents_.end() ? nullptr : it->second, s.agent);
  }

 private:
  std::map<std::string, std::shared_ptr<tether::agent>> agents_;
};

}  // namespace

options& options::add_agent(std::string name, agent_fn fn) {
  return add_agent(std::move(name), fn ? std::make_shared<fn_agent>(std::move(fn)) : nullptr);
}

options& options::add_agent(std::string name, std::shared_ptr<agent> a) {
  agents[std::move(name)] = std::move(a);
  return *this;
}

// ---- the host -------------------------------------------------------------------

embedded::embedded(std::unique_ptr<actors::host> h) : host_(std::move(h)) {}

result<std::unique_ptr<embedded>> embedded::open(options opts) {
  if (opts.agents.empty())
    return error{errc::invalid,
                 "options.agents is empty: register at least one agent with add_agent(); "
                 "nothing was opened"};
  for (auto& [name, a] : opts.agents)
    if (!a)
      return error{errc::invalid,
                   "agent '" + name + "' is empty (a null agent or callable); nothing was opened"};
  std::set<std::string> names;
  for (auto& [name, a] : opts.agents) names.insert(name);
  actors::host_options ho = std::move(opts.advanced);
  ho.db_path = std::move(opts.db_path);
  ho.create_db = opts.new_database;
  ho.threads = opts.threads;
  ho.log = std::move(opts.log);
  ho.agents = std::make_shared<registry>(std::move(opts.agents));
  auto h = actors::host::open(std::move(ho));
  if (!h) return h.error();
  std::unique_ptr<embedded> e(new embedded(std::move(*h)));
  e->agents_ = std::move(names);
  auto boot = runtime::sync_wait(e->executor(), e->host_->boot());
  if (!boot) return boot.error();  // `e` closes on its way out
  e->boot_ = std::move(*boot);
  return e;
}

embedded::~embedded() {
  if (auto r = close(); !r) {
    // Joining the executors from one of them cannot end: leave the runtime
    // running rather than deadlock or crash inside a destructor.
    host_->warn(r.error().message + "; the embedded host was destroyed there and is leaked");
    if (closer_.joinable()) closer_.detach();
    (void)host_.release();
    return;
  }
  if (closer_.joinable()) closer_.join();
}

bool embedded::on_executor_thread() const {
  auto& pool = host_->pool();
  for (std::size_t i = 0; i < pool.size(); ++i)
    if (pool.at(i).running_in_this_thread()) return true;
  return false;
}

error embedded::refused_on_executor(std::string_view call) {
  return error{errc::refused,
               "tether::embedded::" + std::string(call) +
                   " was called on one of the host's own executor threads (inside an agent's "
                   "turn, or a continuation resumed there), where it would wait for itself; "
                   "call it from the embedding application's own thread. Nothing was done"};
}

std::optional<error> embedded::stopped(std::string_view what) const {
  std::lock_guard lk(m_);
  if (!closing_) return std::nullopt;
  return error{errc::stopped, std::string(what) + " refused: the host is shut down"};
}

bool embedded::on_close(std::shared_ptr<void> owner, std::function<void()> end) {
  {
    std::lock_guard lk(m_);
    if (!closing_) {
      std::erase_if(on_close_, [](auto& p) { return p.first.expired(); });
      on_close_.emplace_back(owner, std::move(end));
      return true;
    }
  }
  end();
  return false;
}

void embedded::begin_shutdown() {
  std::vector<std::pair<std::weak_ptr<void>, std::function<void()>>> ends;
  {
    std::lock_guard lk(m_);
    if (closing_) return;
    closing_ = true;
    ends.swap(on_close_);
    // host::shutdown() joins the executors: it runs on a thread of its own,
    // so a coroutine awaiting shutdown() never blocks the thread it is on.
    closer_ = std::thread([h = host_.get(), done = closed_] {
      h->shutdown();
      done->set(0);
    });
  }
  for (auto& [owner, end] : ends)
    if (!owner.expired()) end();
}

awaitable<result<void>> embedded::shutdown() {
  if (on_executor_thread()) co_return refused_on_executor("shutdown()");
  begin_shutdown();
  co_await closed_->async_wait(asio::use_awaitable);
  co_return result<void>{};
}

result<void> embedded::close() {
  if (on_executor_thread()) return refused_on_executor("close()");
  begin_shutdown();
  (void)runtime::block_on<int>([this](auto done) { closed_->async_wait(std::move(done)); });
  return {};
}

awaitable<result<session_id>> embedded::create_session(
    std::string description, std::string agent, std::optional<protocol::session_policy> policy) {
  if (auto e = stopped("create_session")) co_return *e;
  if (!agents_.count(agent)) {
    std::string known;
    for (auto& n : agents_) known += (known.empty() ? "" : ", ") + n;
    co_return error{errc::invalid, "no agent named '" + agent +
                                       "' is registered with this host (registered: " + known +
                                       "); no session was created"};
  }
  co_return co_await host_->create_session(std::move(description), std::nullopt, std::move(agent),
                                           protocol::tenant_id("default"), std::move(policy));
}

awaitable<result<std::int64_t>> embedded::prompt(session_id s, std::string text) {
  if (auto e = stopped("prompt")) co_return *e;
  co_return co_await host_->prompt(std::move(s), std::move(text), false);
}

awaitable<result<std::int64_t>> embedded::steer(session_id s, std::string text) {
  if (auto e = stopped("steer")) co_return *e;
  co_return co_await host_->prompt(std::move(s), std::move(text), true);
}

result<void> embedded::interrupt(const session_id& s) {
  if (auto e = stopped("interrupt")) return *e;
  auto sess = host_->get(s);
  if (!sess) return sess.error();
  host_->interrupt(s);
  return {};
}

awaitable<result<int>> embedded::delete_session(session_id s) {
  if (auto e = stopped("delete_session")) co_return *e;
  auto d = co_await host_->delete_session(std::move(s));
  if (!d) co_return d.error();
  co_return d->jobs_cancelled;
}

awaitable<result<void>> embedded::set_job_policy(session_id s, bool notify, job_policy policy) {
  if (auto e = stopped("set_job_policy")) co_return *e;
  co_return co_await host_->set_job_policy(std::move(s), notify, std::string(to_string(policy)));
}

result<std::vector<message>> embedded::transcript(const session_id& s) {
  if (auto e = stopped("transcript")) return *e;
  auto rows = host_->store().messages(s);
  if (!rows) return rows.error();
  std::vector<message> out;
  out.reserve(rows->size());
  for (auto& r : *rows) {
    auto m = to_message(r);
    if (!m)
      return error{m.error().code, "transcript of session '" + s.str() + "': " + m.error().message +
                                       "; nothing was returned"};
    out.push_back(std::move(*m));
  }
  return out;
}

result<std::vector<inbox_entry>> embedded::inbox(const session_id& s) {
  if (auto e = stopped("inbox")) return *e;
  auto rows = host_->store().inbox(s);
  if (!rows) return rows.error();
  std::vector<inbox_entry> out;
  out.reserve(rows->size());
  for (auto& r : *rows) out.push_back({r.nid, r.from, r.body, r.acked});
  return out;
}

std::vector<running_task> embedded::running(const session_id& s) {
  std::vector<running_task> out;
  if (stopped("running")) return out;
  for (auto& item : host_->outstanding(s)) {
    running_task t;
    if (!parse(item.kind, t.kind)) continue;  // a kind this API does not name yet
    t.detail = item.detail;
    t.label = item.label;
    out.push_back(std::move(t));
  }
  return out;
}

awaitable<result<void>> embedded::wait_idle(session_id s) {
  if (auto e = stopped("wait_idle")) co_return *e;
  co_return co_await host_->wait_idle(std::move(s));
}

namespace {
awaitable<result<void>> quiet(actors::host& h, bool shells) {
  co_await h.wait_quiescent(shells);
  co_return result<void>{};
}
}  // namespace

awaitable<result<void>> embedded::wait_quiescent(bool shells) {
  if (auto e = stopped("wait_quiescent")) co_return *e;
  auto w = start_guarded(quiet(*host_, shells), "wait_quiescent()");
  co_return co_await w->async_wait(asio::use_awaitable);
}

}  // namespace tether
