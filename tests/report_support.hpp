#pragma once
// A host on a scratch database with scripted agents, for report-path tests.
#include "catch_result.hpp"
#include "support.hpp"

#include "tether/actors/host.hpp"
#include "tether/actors/scripted_agent.hpp"

namespace tether::test {

using actors::script_action;
using actors::script_turn;
using protocol::session_id;

inline script_action say(std::string t) { return {script_action::kind::say, std::move(t)}; }
inline script_action fail(std::string t) { return {script_action::kind::fail, std::move(t)}; }
inline script_action shell(std::string cmd) { return {script_action::kind::shell, std::move(cmd)}; }
inline script_action spawn(std::string child, std::string description, std::string prompt,
                           bool background = true, std::optional<bool> notify = {}) {
  script_action a{script_action::kind::spawn, std::move(prompt)};
  a.child = std::move(child);
  a.description = std::move(description);
  a.background = background;
  a.notify = notify;
  return a;
}

class report_fixture {
 public:
  explicit report_fixture(const std::string& tag, std::size_t threads = 2)
      : dir_(tag), threads_(threads), agents(std::make_shared<actors::scripted_agents>()) {
    open();
  }
  ~report_fixture() { close(); }

  void open() {
    actors::host_options o;
    o.db_path = dir_.file("tether.db");
    o.threads = threads_;
    o.agents = agents;
    o.log = [this](const std::string& w) {
      std::lock_guard lk(m_);
      warnings.push_back(w);
    };
    auto h = actors::host::open(o);
    REQUIRE(h);
    host = std::move(*h);
    auto rep = sync(host->boot());
    REQUIRE(rep);
    boot = *rep;
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
  void settle_all() { sync(host->wait_quiescent()); }

  session_id top(const std::string& name) {
    auto r = sync(host->create_session("top " + name, session_id(name)));
    REQUIRE(r);
    return *r;
  }
  void prompt(const session_id& s, std::string text) { REQUIRE(sync(host->prompt(s, std::move(text)))); }
  void on(const std::string& s, int ordinal, std::vector<script_action> actions) {
    agents->on_input(session_id(s), ordinal, script_turn{std::move(actions)});
  }
  std::vector<persistence::inbox_row> inbox(const std::string& s) {
    auto r = host->store().inbox(session_id(s));
    REQUIRE(r);
    return *r;
  }
  std::vector<persistence::message_row> reports_in_transcript(const std::string& s) {
    auto r = host->store().messages(session_id(s));
    REQUIRE(r);
    std::vector<persistence::message_row> out;
    for (auto& m : *r)
      if (m.kind == "report") out.push_back(m);
    return out;
  }
  std::string path() const { return dir_.file("tether.db"); }
  const scratch_dir& dir() const { return dir_; }

  std::shared_ptr<actors::scripted_agents> agents;
  std::unique_ptr<actors::host> host;
  actors::boot_report boot;
  std::vector<std::string> warnings;

 private:
  scratch_dir dir_;
  std::size_t threads_;
  std::mutex m_;
};

}  // namespace tether::test
