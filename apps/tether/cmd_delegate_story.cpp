// `tether delegate-story`: one background delegated task end to end, for the
// delegate crash matrix and as a worked example (docs/delegation.md). A
// session opens a goal and delegates a task to agent "worker" under it, whose
// runner answers at once; the task's row, settlement intent, artifact and
// promotion follow, and its notice reaches the session's transcript. Then
// the goal is closed, and its notice follows.
//
//   tether delegate-story --story DIR   run it from the start (exit 0 when done)
//   tether delegate-story --resume DIR  restart on DIR's database after a crash:
//                                       boot's recovery settles the task, and
//                                       a goal the crash left open is closed
//
// The goal's id is kept in DIR/goal (written before the task starts).
// The artifact goes to DIR/workspace/delegates/<task>.json.
#include <filesystem>
#include <fstream>
#include <iostream>

#include "command.hpp"
#include "tether/actors/host.hpp"
#include "tether/runtime/sync_wait.hpp"

namespace tether::cli {
namespace {

namespace fs = std::filesystem;
using boost::asio::awaitable;
using protocol::session_id;

constexpr const char* k_origin = "ses_origin";

// The originating session: reads its notices and says nothing else.
struct quiet_agent : actors::agent {
  awaitable<void> drain(actors::agent_context&, actors::drain_input) override { co_return; }
};

struct quiet_factory : actors::agent_factory {
  std::shared_ptr<actors::agent> make(const persistence::session_row&) override {
    return std::make_shared<quiet_agent>();
  }
};

template <class T>
T sync(actors::host& h, awaitable<T> a) {
  return runtime::sync_wait(h.pool().at(0), std::move(a));
}

// Closes the story's goal unless it is closed already (a crash after its
// close committed: boot resent the notice). False on an error, said.
bool close_goal(actors::host& h, const protocol::job_id& goal) {
  auto g = sync(h, h.goal(session_id(k_origin), goal));
  if (g && g->state != "running") return true;
  auto closed = g ? sync(h, h.close_goal(session_id(k_origin), goal, "completed")) : g;
  if (closed) return true;
  std::cerr << "tether delegate-story: goal " << goal.str() << ": " << closed.error().message
            << "\n";
  return false;
}

int story(const fs::path& dir, bool resume) {
  fs::create_directories(dir);
  actors::host_options o;
  o.create_db = !resume;
  o.db_path = (dir / "tether.db").string();
  o.agents = std::make_shared<quiet_factory>();
  o.jobs.sandbox_dir = (dir / "sandbox").string();
  o.run_delegate = [](actors::delegate_call c, protocol::job_id) -> awaitable<result<std::string>> {
    co_return "findings for: " + c.prompt;
  };
  auto h = actors::host::open(o);
  if (!h) {
    std::cerr << "tether delegate-story: " << h.error().message << "\n";
    return 3;
  }
  auto boot = sync(**h, (*h)->boot());
  if (!boot) {
    std::cerr << "tether delegate-story: " << boot.error().message << "\n";
    return 3;
  }
  if (resume) {
    auto& d = boot->delegation;
    std::cout << "recovered: promoted " << d.promoted << ", failed " << d.failed << ", lost "
              << d.lost << ", timed out " << d.timed_out << ", stale " << d.stale << "\n";
    std::string goal;
    std::ifstream(dir / "goal") >> goal;
    bool ok = goal.empty() || close_goal(**h, protocol::job_id(goal));
    sync(**h, (*h)->wait_quiescent(false));
    (*h)->shutdown();
    return ok ? 0 : 5;
  }
  auto s = sync(**h, (*h)->create_session("delegate story", session_id(k_origin)));
  if (!s) {
    std::cerr << "tether delegate-story: " << s.error().message << "\n";
    return 4;
  }
  auto goal = sync(**h, (*h)->create_goal(*s, "delegate story"));
  if (!goal) {
    std::cerr << "tether delegate-story: " << goal.error().message << "\n";
    return 4;
  }
  std::ofstream(dir / "goal") << goal->str() << "\n";
  actors::delegate_call c;
  c.goal = *goal;
  c.caller.tenant = protocol::tenant_id("default");
  c.caller.thread = *s;
  c.caller.turn = protocol::turn_id("turn_story");
  c.agent = "worker";
  c.prompt = "Summarise the failing tests.";
  c.workspace = fs::absolute(dir / "workspace");
  auto id = sync(**h, (*h)->delegation().start_task(c));
  if (!id) {
    std::cerr << "tether delegate-story: " << id.error().message << "\n";
    return 4;
  }
  // Flushed: a crash point later in the story must not take this line with it.
  std::cout << "delegated " << id->str() << std::endl;
  sync(**h, (*h)->delegation().worker_ended(*id));
  bool ok = close_goal(**h, *goal);
  sync(**h, (*h)->wait_quiescent(false));
  (*h)->shutdown();
  return ok ? 0 : 5;
}

int delegate_story(const args& a) {
  if (a.size() != 2 || (a[0] != "--story" && a[0] != "--resume")) {
    std::cerr << "usage: tether delegate-story (--story DIR | --resume DIR)\n";
    return 2;
  }
  return story(a[1], a[0] == "--resume");
}

registrar delegate_story_cmd{{"delegate-story",
                              "(--story DIR | --resume DIR): one background delegated task end\n"
                              "                 to end (the delegate crash matrix)",
                              delegate_story}};

}  // namespace
}  // namespace tether::cli
