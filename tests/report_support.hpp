#pragma once
// A host on a scratch database with scripted (or code) agents and a counting
// observer, for report-path tests.
#include <SQLiteCpp/Database.h>
#include <SQLiteCpp/Statement.h>

#include <atomic>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <map>
#include <mutex>

#include "catch_result.hpp"
#include "support.hpp"
#include "tether/actors/host.hpp"
#include "tether/testing/scripted_agent.hpp"

namespace tether::test {

using actors::agent_context;
using actors::drain_input;
using actors::wake_scope;
using protocol::session_id;
using testing::script_action;
using testing::script_turn;

inline script_action say(std::string t) {
  return {script_action::kind::say, std::move(t)};
}
inline script_action spawn(std::string child, std::string description, std::string prompt,
                           bool background = true, std::optional<bool> notify = {}) {
  script_action a{script_action::kind::spawn, std::move(prompt)};
  a.child = std::move(child);
  a.description = std::move(description);
  a.background = background;
  a.notify = notify;
  return a;
}

/// Suspends until the awaiting drain is cancelled (an interrupt or shutdown).
inline boost::asio::awaitable<void> until_cancelled() {
  boost::asio::steady_timer t(co_await boost::asio::this_coro::executor);
  t.expires_at(boost::asio::steady_timer::time_point::max());
  co_await t.async_wait(boost::asio::use_awaitable);
}

// Counts what the coordinator does, per session.
struct counting_observer : actors::run_observer {
  std::mutex m;
  std::map<std::string, int> started_count, settled_count;
  std::map<std::string, std::vector<std::int64_t>> started_seqs;
  std::function<boost::asio::awaitable<void>(const session_id&)> on_settling;
  // Called after a settle committed, before its report is delivered.
  std::function<void(const session_id&)> on_settled;
  // Called on the session's executor after a busy period began.
  std::function<void(const session_id&)> on_started;
  // Called when a report was admitted into its parent's inbox: by the inbox
  // on the parent's executor before the admit is answered (a boot's delivery
  // waits for it), or, for a report its settle admitted, by the child on its
  // executor after its `settled`.
  std::function<void(const session_id&)> on_admitted;

  void started(const session_id& s, std::int64_t seq) override {
    {
      std::lock_guard lk(m);
      started_count[s.str()]++;
      started_seqs[s.str()].push_back(seq);
    }
    if (on_started) on_started(s);
  }
  void admitted(const session_id& parent, const protocol::notification_id&) override {
    if (on_admitted) on_admitted(parent);
  }
  boost::asio::awaitable<void> settling(const session_id& s) override {
    if (on_settling) co_await on_settling(s);
  }
  void settled(const session_id& s, std::optional<protocol::notification_id>) override {
    {
      std::lock_guard lk(m);
      settled_count[s.str()]++;
    }
    if (on_settled) on_settled(s);
  }
  int started_of(const std::string& s) {
    std::lock_guard lk(m);
    return started_count[s];
  }
  int settled_of(const std::string& s) {
    std::lock_guard lk(m);
    return settled_count[s];
  }
};

// An agent written in code: the test decides what each drain does.
struct code_agent : actors::agent {
  std::function<boost::asio::awaitable<void>(agent_context&, drain_input)> fn;
  boost::asio::awaitable<void> drain(agent_context& ctx, drain_input in) override {
    co_await fn(ctx, std::move(in));
  }
};

// Scripted agents for every session except those given code.
struct mixed_agents : actors::agent_factory {
  std::shared_ptr<testing::scripted_agents> scripted;
  std::map<std::string, std::shared_ptr<code_agent>> code;
  std::shared_ptr<actors::agent> make(const persistence::session_row& s) override {
    auto it = code.find(s.id.str());
    if (it != code.end()) return it->second;
    // Code for every session of an agent: code("agent:NAME").
    it = code.find("agent:" + s.agent);
    if (it != code.end()) return it->second;
    return scripted->make(s);
  }
};

class report_fixture {
 public:
  explicit report_fixture(const std::string& tag, int resume_budget = 3)
      : dir(tag), budget(resume_budget) {
    agents->scripted = std::make_shared<testing::scripted_agents>();
    open();
  }
  ~report_fixture() { close(); }
  void open() {
    actors::host_options o;
    o.db_path = dir.file("tether.db");
    o.threads = 2;
    o.agents = agents;
    o.observer = observer;
    o.resume_budget = budget;
    o.jobs = jobs;
    if (retention) o.task_retention = *retention;
    if (tune) tune(o);
    o.log = [this](const std::string& w) {
      std::lock_guard lk(m);
      warnings.push_back(w);
    };
    auto h = actors::host::open(o);
    REQUIRE(h);
    host = std::move(*h);
    auto b = sync(host->boot());
    REQUIRE(b);
    boot = *b;
  }
  void close() {
    if (host) host->shutdown();
    host.reset();
  }
  void restart() {
    close();
    open();
  }
  template <class T>
  T sync(boost::asio::awaitable<T> a) {
    return runtime::sync_wait(host->pool().at(0), std::move(a));
  }
  void quiet() { sync(host->wait_quiescent()); }
  /// How many transcript messages of `s` contain `text`.
  int messages_with(const std::string& s, const std::string& text) {
    auto msgs = host->store().messages(session_id(s));
    REQUIRE(msgs);
    int n = 0;
    for (auto& m : *msgs)
      if (m.text.find(text) != std::string::npos) ++n;
    return n;
  }
  void on(const std::string& s, int ordinal, std::vector<script_action> actions) {
    agents->scripted->on_input(session_id(s), ordinal, script_turn{std::move(actions)});
  }
  std::shared_ptr<code_agent> code(const std::string& s) {
    auto a = std::make_shared<code_agent>();
    agents->code[s] = a;
    return a;
  }
  // A parent that spawns `child` in the background on its first prompt.
  void parent_spawns(const std::string& child, std::optional<bool> notify = {}) {
    on("parent", 1, {spawn(child, "Audit routes", "go", true, notify)});
    auto p = sync(host->create_session("parent", session_id("parent")));
    REQUIRE(p);
    REQUIRE(sync(host->prompt(*p, "start")));
  }
  // A parent whose background child "child" blocks until cancelled; returns
  // once the child's drain is running.
  void spawn_blocking_child() {
    auto entered = runtime::one_shot<int>::make();
    code("child")->fn = [entered](agent_context&, drain_input) -> boost::asio::awaitable<void> {
      entered->set(1);
      co_await until_cancelled();
    };
    parent_spawns("child");
    sync(entered->async_wait(boost::asio::use_awaitable));
  }
  // Writes a terminal-or-not job row for parent 'p' straight into a closed database.
  void insert_job_row(const std::string& id, const std::string& status,
                      const std::string& payload) {
    SQLite::Database db(dir.file("tether.db"), SQLite::OPEN_READWRITE);
    db.exec("INSERT INTO sessions (id, created_at) VALUES ('p', 0)");
    SQLite::Statement st(
        db,
        "INSERT INTO tasks (id, notification_id, kind, mode, parent_id, state, body, "
        "payload, created_at, updated_at) VALUES (?, ?, 'subagent', 'background', "
        "'p', ?, 'b', ?, 0, 0)");
    st.bind(1, id);
    st.bind(2, "msg_" + id);
    st.bind(3, status);
    st.bind(4, payload);
    st.exec();
  }
  // Opens a host on the closed database and returns the error its boot refused with.
  error refused_boot() {
    actors::host_options o;
    o.db_path = dir.file("tether.db");
    o.agents = agents;
    o.jobs = jobs;
    auto h = actors::host::open(o);
    REQUIRE(h);
    auto b = runtime::sync_wait((*h)->pool().at(0), (*h)->boot());
    (*h)->shutdown();
    REQUIRE_FALSE(b);
    return b.error();
  }
  // Writes a none-mode report `id` ("owed report") owed to `parent` by
  // `child`, as a settle leaves one: terminal, its terminal receipt pending.
  void write_owed_report(const std::string& parent, const std::string& child,
                         const std::string& id = "msg_owed") {
    persistence::job_row owed;
    owed.id = protocol::job_id(id);
    owed.nid = protocol::notification_id(id);
    owed.mode = "none";
    owed.parent = session_id(parent);
    owed.child = session_id(child);
    owed.status = persistence::job_status::completed;
    owed.body = "owed report";
    owed.description = "Audit routes";
    REQUIRE(sync(host->store().write_job(owed)));
  }
  std::vector<persistence::inbox_row> inbox(const std::string& s) {
    auto r = host->store().inbox(session_id(s));
    REQUIRE(r);
    return *r;
  }

  scratch_dir dir;
  int budget;
  actors::job_queue_options jobs;  // set, then restart(), to run owned jobs
  std::shared_ptr<mixed_agents> agents = std::make_shared<mixed_agents>();
  std::shared_ptr<counting_observer> observer = std::make_shared<counting_observer>();
  std::unique_ptr<actors::host> host;
  actors::boot_report boot;
  /// The host's task retention; unset: the host's default.
  std::optional<std::optional<std::chrono::milliseconds>> retention;
  /// Last word on the host's options at each open.
  std::function<void(actors::host_options&)> tune;
  std::mutex m;
  std::vector<std::string> warnings;
};

/// Whether a warning containing every one of `parts` was logged.
inline bool warned(report_fixture& f, std::initializer_list<std::string> parts) {
  std::lock_guard lk(f.m);
  for (auto& w : f.warnings) {
    bool all = true;
    for (auto& p : parts) all = all && w.find(p) != std::string::npos;
    if (all) return true;
  }
  return false;
}

}  // namespace tether::test
