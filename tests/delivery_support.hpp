#pragma once
// A host whose job queue runs commands in a real tether-sandboxd (our child,
// in a scratch directory), with helpers to read receipts and transcripts.
#include <sys/stat.h>

#include "report_support.hpp"
#include "sandbox_support.hpp"

namespace tether::test {

using actors::job_view;
using actors::launch_request;
using persistence::owned_state;
using persistence::receipt_state;
using protocol::job_id;

inline launch_request job(std::string command, bool background = true) {
  launch_request r;
  r.command = std::move(command);
  r.background = background;
  return r;
}

class delivery_fixture {
 public:
  explicit delivery_fixture(const std::string& tag) : daemon(tag + "-sbx"), f(tag) {
    work = f.dir.file("work");
    std::filesystem::create_directories(work);
    configure();
    f.restart();
  }

  /// Points the job queue at the daemon (no daemon is started by the host).
  void configure() {
    f.jobs.sandbox_dir = daemon.options().state_dir;
    f.jobs.start_daemon = false;
    f.jobs.cwd = work;
  }

  /// A FIFO in the work directory: `cat NAME` in a job blocks until release().
  std::string fifo(const std::string& name) {
    auto p = work + "/" + name;
    REQUIRE(::mkfifo(p.c_str(), 0600) == 0);
    return p;
  }
  void release(const std::string& fifo_path) { release_fifo(fifo_path); }

  actors::host& host() { return *f.host; }
  template <class T>
  T sync(boost::asio::awaitable<T> a) {
    return f.sync(std::move(a));
  }

  session_id session(const std::string& id, std::string tenant = "default") {
    auto s = f.sync(f.host->create_session(id, session_id(id)));
    REQUIRE(s);
    if (tenant != "default") {
      f.close();
      SQLite::Database db(f.dir.file("tether.db"), SQLite::OPEN_READWRITE);
      SQLite::Statement st(db, "UPDATE sessions SET tenant = ? WHERE id = ?");
      st.bind(1, tenant);
      st.bind(2, id);
      REQUIRE(st.exec() == 1);
      f.open();
    }
    return *s;
  }

  std::vector<persistence::receipt> receipts(const job_id& j) {
    auto r = f.host->store().receipts_of(j);
    REQUIRE(r);
    return *r;
  }
  /// The state of `<job>/<t>`, or "none".
  std::string receipt_state_of(const job_id& j, protocol::transition t) {
    auto r = f.host->store().receipt_by_id(protocol::make_event_id(j, t));
    REQUIRE(r);
    return *r ? std::string(persistence::to_string((*r)->state)) : "none";
  }
  /// Transcript messages of kind `kind` that mention `text`.
  int transcript_count(const std::string& s, const std::string& kind, const std::string& text) {
    auto msgs = f.host->store().messages(session_id(s));
    REQUIRE(msgs);
    int n = 0;
    for (auto& m : *msgs)
      if (m.kind == kind && m.text.find(text) != std::string::npos) ++n;
    return n;
  }
  owned_state state_of(const job_id& j) {
    auto r = f.host->store().job(j);
    REQUIRE(r);
    REQUIRE(*r);
    return (*r)->state;
  }

  sandbox_daemon daemon;
  report_fixture f;
  std::string work;
};

// An agent that launches `command` on its first drain and records what the
// later drains were given.
struct launcher {
  std::shared_ptr<runtime::one_shot<result<job_id>>> launched =
      runtime::one_shot<result<job_id>>::make();
  std::mutex m;
  std::vector<std::string> seen_kinds;  // kinds of inputs in drains after the first

  void install(delivery_fixture& d, const std::string& s, launch_request req,
               std::function<boost::asio::awaitable<void>(agent_context&, job_id)> then = {}) {
    d.f.code(s)->fn = [this, req, then](agent_context& ctx,
                                        drain_input in) -> boost::asio::awaitable<void> {
      bool first = false;
      {
        std::lock_guard lk(m);
        for (auto& i : in.inputs)
          if (i.kind == "prompt" && !launched->ready()) first = true;
        if (!first)
          for (auto& i : in.inputs) seen_kinds.push_back(i.kind);
      }
      if (!first) co_return;
      auto r = co_await ctx.launch_job(req);
      launched->set(r);
      if (r && then) co_await then(ctx, *r);
      co_await ctx.say("launched");
    };
  }
  job_id id(delivery_fixture& d) {
    auto r = d.sync(launched->async_wait(boost::asio::use_awaitable));
    REQUIRE(r);
    return *r;
  }
  int seen(const std::string& kind) {
    std::lock_guard lk(m);
    return static_cast<int>(std::count(seen_kinds.begin(), seen_kinds.end(), kind));
  }
};

}  // namespace tether::test
