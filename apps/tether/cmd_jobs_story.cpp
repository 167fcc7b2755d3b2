// `tether jobs-story`: owned background jobs end to end, for the delivery
// crash matrix and as a worked example. One turn launches three real commands
// through the job queue into a sandbox daemon: one succeeds, one fails in its
// first pipeline stage after waiting on a gate, one is cancelled at once. The
// turn withholds its completion until every receipt was steered into it.
//
//   tether jobs-story --story DIR   run it from the start (exit 0 when done)
//   tether jobs-story --resume DIR  restart on DIR's database after a crash
//
// Every command appends its letter to DIR/side-effects, so a test can prove
// that no command ran twice. The sandbox daemon lives in DIR/sandbox unless
// --sandbox SBX names another state directory; it is started if none serves it.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <iostream>

#include "command.hpp"
#include "tether/actors/host.hpp"
#include "tether/runtime/sync_wait.hpp"

namespace tether::cli {
namespace {

namespace fs = std::filesystem;
using actors::agent_context;
using actors::drain_input;
using boost::asio::awaitable;
using protocol::session_id;

constexpr const char* k_session = "ses_owner";

struct story_paths {
  fs::path dir, sandbox;
  std::string side() const { return (dir / "side-effects").string(); }
  std::string gate() const { return (dir / "gate").string(); }
};

// Launches under stable keys, so a turn replayed after a crash gets the same
// jobs back instead of running anything twice.
class story_agent : public actors::agent {
 public:
  explicit story_agent(story_paths p) : p_(std::move(p)) {}

  awaitable<void> drain(agent_context& ctx, drain_input in) override {
    bool prompted = false;
    int notices = 0;
    for (auto& i : in.inputs) {
      prompted |= i.kind == "prompt";
      notices += i.kind == "notice";
    }
    if (!prompted) {
      co_await ctx.say("Noted " + std::to_string(notices) + " job notice(s).");
      co_return;
    }
    auto a = launch("a", "echo A >> " + p_.side() + "; echo built");
    auto ra = co_await ctx.launch_job(std::move(a));
    if (!ra) throw std::runtime_error("launch a: " + ra.error().message);
    auto b = launch("b", "read -r _ < " + p_.gate() + "; echo B >> " + p_.side() + "; false | cat");
    auto rb = co_await ctx.launch_job(std::move(b));
    if (!rb) throw std::runtime_error("launch b: " + rb.error().message);
    auto c = launch("c", "echo C >> " + p_.side() + "; exec sleep 30");
    auto rc = co_await ctx.launch_job(std::move(c));
    if (!rc) throw std::runtime_error("launch c: " + rc.error().message);
    launched->set(0);
    auto cancelled = co_await ctx.cancel_job(*rc);
    if (!cancelled) throw std::runtime_error("cancel c: " + cancelled.error().message);
    co_await ctx.say("Started a build and a test run; cancelled the third job.");
  }

  std::shared_ptr<runtime::one_shot<int>> launched = runtime::one_shot<int>::make();

 private:
  static actors::launch_request launch(std::string key, std::string command) {
    actors::launch_request r;
    r.command = std::move(command);
    r.key = std::move(key);
    return r;
  }
  story_paths p_;
};

struct story_factory : actors::agent_factory {
  std::shared_ptr<story_agent> agent;
  std::shared_ptr<actors::agent> make(const persistence::session_row&) override { return agent; }
};

template <class T>
T sync(actors::host& h, awaitable<T> a) {
  return runtime::sync_wait(h.pool().at(0), std::move(a));
}

result<std::unique_ptr<actors::host>> open_host(const story_paths& p,
                                                std::shared_ptr<story_factory> f, bool create) {
  actors::host_options o;
  o.create_db = create;  // a story's first run creates its database
  o.db_path = (p.dir / "tether.db").string();
  o.agents = std::move(f);
  o.jobs.sandbox_dir = p.sandbox.string();
  o.jobs.cwd = p.dir.string();
  return actors::host::open(o);
}

// Waits until the turn has settled and no job or delivery is left.
void run_out(actors::host& h) {
  auto idle = sync(h, h.wait_idle(session_id(k_session)));
  if (!idle) std::cerr << "wait_idle: " << idle.error().message << "\n";
  sync(h, h.jobs().wait_idle());
  sync(h, h.wait_quiescent(true));
}

int story(const story_paths& p, bool resume) {
  fs::create_directories(p.dir);
  ::mkfifo(p.gate().c_str(), 0600);
  auto f = std::make_shared<story_factory>();
  f->agent = std::make_shared<story_agent>(p);
  auto h = open_host(p, f, !resume);
  if (!h) {
    std::cerr << "tether jobs-story: " << h.error().message << "\n";
    return 3;
  }
  auto boot = sync(**h, (*h)->boot());
  if (!boot) {
    std::cerr << "tether jobs-story: " << boot.error().message << "\n";
    return 3;
  }
  if (resume) {
    // A waiting job, old or new, finds a line at the gate: holding the FIFO
    // open read-write means no open() blocks.
    int gate = ::open(p.gate().c_str(), O_RDWR | O_NONBLOCK);
    if (gate >= 0)
      for (int i = 0; i < 4; ++i) [[maybe_unused]] auto n = ::write(gate, "go\n", 3);
    auto exists = (*h)->store().session(session_id(k_session));
    if (exists && *exists) run_out(**h);
    sync(**h, (*h)->jobs().wait_idle());
    if (gate >= 0) ::close(gate);
    (*h)->shutdown();
    return 0;
  }
  auto s = sync(**h, (*h)->create_session("jobs story", session_id(k_session)));
  if (!s) {
    std::cerr << "tether jobs-story: " << s.error().message << "\n";
    return 4;
  }
  auto pr = sync(**h, (*h)->prompt(*s, "Build and test, in the background please."));
  if (!pr) {
    std::cerr << "tether jobs-story: " << pr.error().message << "\n";
    return 4;
  }
  sync(**h, f->agent->launched->async_wait(boost::asio::use_awaitable));
  // Job b waits on the gate: let it through (open() meets its reader).
  int gate = ::open(p.gate().c_str(), O_WRONLY);
  if (gate >= 0) {
    [[maybe_unused]] auto n = ::write(gate, "go\n", 3);
    ::close(gate);
  }
  run_out(**h);
  (*h)->shutdown();
  return 0;
}

int jobs_story(const args& a) {
  story_paths p;
  bool resume = false;
  for (std::size_t i = 0; i + 1 < a.size(); i += 2) {
    if (a[i] == "--story" || a[i] == "--resume") {
      p.dir = a[i + 1];
      resume = a[i] == "--resume";
    } else if (a[i] == "--sandbox") {
      p.sandbox = a[i + 1];
    } else {
      p.dir.clear();
      break;
    }
  }
  if (p.dir.empty() || a.size() % 2 != 0) {
    std::cerr << "usage: tether jobs-story (--story DIR | --resume DIR) [--sandbox SBX]\n";
    return 2;
  }
  if (p.sandbox.empty()) p.sandbox = p.dir / "sandbox";
  return story(p, resume);
}

registrar jobs_story_cmd{{"jobs-story",
                          "(--story DIR | --resume DIR) [--sandbox SBX]: one turn's owned\n"
                          "                 background jobs end to end (the delivery crash matrix)",
                          jobs_story}};

}  // namespace
}  // namespace tether::cli
