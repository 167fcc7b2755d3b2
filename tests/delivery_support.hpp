#pragma once
// A host whose job queue runs commands in a real tether-sandboxd (our child,
// in a scratch directory), with helpers to read receipts and transcripts.
#include "report_support.hpp"
#include "sandbox_support.hpp"

#include <sys/stat.h>

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
    auto r = f.host->receipts().receipts_of(j);
    REQUIRE(r);
    return *r;
  }
  /// The state of `<job>/<t>`, or "none".
  std::string receipt_state_of(const job_id& j, protocol::transition t) {
    auto r = f.host->receipts().receipt_by_id(protocol::make_event_id(j, t));
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
    auto r = f.host->receipts().job(j);
    REQUIRE(r);
    REQUIRE(*r);
    return (*r)->state;
  }

  sandbox_daemon daemon;
  report_fixture f;
  std::string work;
};

}  // namespace tether::test
