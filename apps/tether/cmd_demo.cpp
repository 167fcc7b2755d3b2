// `tether demo`: the seed's Figure 1 story with the real runtime, then the
// same story in a child process that is SIGKILLed mid-settle and restarted;
// then a turn's owned jobs in a sandbox daemon, and a delegated task whose
// host is SIGKILLed between its artifact and its promotion.
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <sstream>

#include "command.hpp"
#include "tether/actors/host.hpp"
#include "tether/persistence/task_store.hpp"
#include "tether/runtime/artifact.hpp"
#include "tether/runtime/sync_wait.hpp"
#include "tether/sandbox/daemon_process.hpp"
#include "tether/sandbox/state_dir.hpp"
#include "tether/testing/scripted_agent.hpp"

namespace tether::cli {
namespace {

using protocol::session_id;
using testing::script_action;
using testing::script_turn;
namespace fs = std::filesystem;

constexpr const char* k_parent = "ses_parent";
constexpr const char* k_child = "ses_audit";
constexpr const char* k_crash_at = "report.settle.after_commit:2";

script_action act(script_action::kind k, std::string text) {
  return {k, std::move(text)};
}

std::shared_ptr<testing::scripted_agents> story_agents() {
  using k = script_action::kind;
  auto agents = std::make_shared<testing::scripted_agents>();
  script_action spawn{k::spawn, "Check that every route answers."};
  spawn.child = k_child;
  spawn.description = "Audit routes";
  spawn.agent = "explore";
  agents->on_input(session_id(k_parent), 1,
                   {{spawn, act(k::say, "I started a background audit of the routes.")}});
  agents->on_input(session_id(k_child), 1,
                   {{act(k::shell, "check-routes --all"),
                     act(k::say, "Started the route check in the background.")}});
  agents->on_input(session_id(k_child), 2,
                   {{act(k::say, "Route check finished: 14 routes checked, 0 broken.")}});
  agents->on_input(session_id(k_parent), 2, {{act(k::say, "Noted: the audit is still running.")}});
  agents->on_input(session_id(k_parent), 3,
                   {{act(k::say, "The audit is done: no broken routes.")}});
  return agents;
}

// The background shell is a real process that waits on a fifo, so the demo
// decides when "the shell exits" without sleeping.
void prepare_dir(const fs::path& dir) {
  fs::create_directories(dir / "bin");
  auto script = dir / "bin" / "check-routes";
  std::ofstream(script) << "#!/bin/bash\nread -r _ < \"" << (dir / "gate").string()
                        << "\"\necho \"GET /health 200\"\necho \"routes: 14 checked, 0 broken\"\n";
  fs::permissions(script, fs::perms::owner_all);
  ::mkfifo((dir / "gate").c_str(), 0600);
  std::string path =
      (dir / "bin").string() + ":" + (std::getenv("PATH") ? std::getenv("PATH") : "");
  ::setenv("PATH", path.c_str(), 1);
}

// Puts a line at the gate for the shell and returns the fifo's descriptor
// (-1 if it could not be opened), to be closed once the shell is done with
// it. Held open read-write, so neither this open() nor the shell's blocks:
// a shell that never started (a failed spawn, a busy period that could not
// open) leaves no reader, and the story must still end rather than wait for
// one; a shell that opens the fifo later finds the line waiting.
int open_gate(const fs::path& dir) {
  int fd = ::open((dir / "gate").c_str(), O_RDWR | O_NONBLOCK);
  if (fd >= 0) {
    [[maybe_unused]] auto n = ::write(fd, "go\n", 3);
  }
  return fd;
}

result<std::unique_ptr<actors::host>> open_host(const fs::path& dir,
                                                std::shared_ptr<testing::scripted_agents> agents,
                                                bool create = false) {
  actors::host_options o;
  o.create_db = create;  // only a story's first run creates its database
  o.db_path = (dir / "tether.db").string();
  o.agents = std::move(agents);
  return actors::host::open(o);
}

template <class T>
T sync(actors::host& h, boost::asio::awaitable<T> a) {
  return runtime::sync_wait(h.pool().at(0), std::move(a));
}

// Runs the story up to the end; returns false with a message if a step failed.
bool run_story(actors::host& h, const fs::path& dir, std::string& why) {
  auto boot = sync(h, h.boot());
  if (!boot) return why = boot.error().message, false;
  auto p = sync(h, h.create_session("Figure 1", session_id(k_parent)));
  if (!p) return why = p.error().message, false;
  auto pr = sync(h, h.prompt(*p, "Audit the routes, in the background please."));
  if (!pr) return why = pr.error().message, false;
  sync(h, h.wait_quiescent(false));  // report 1 delivered; the shell still runs
  int gate = open_gate(dir);         // the shell exits and wakes the child
  if (gate < 0)
    return why = "the story's gate " + (dir / "gate").string() + ": " + std::strerror(errno), false;
  sync(h, h.wait_quiescent(true));  // report 2 delivered
  ::close(gate);
  // Quiescent is not done: a step that failed (its error logged) leaves
  // the host with nothing to do and the story short of its end.
  auto reports = h.store().inbox(session_id(k_parent));
  if (!reports) return why = "the parent's inbox: " + reports.error().message, false;
  if (reports->size() != 2)
    return why = "the story ended with " + std::to_string(reports->size()) +
                 " of its 2 reports in the parent's inbox",
           false;
  return true;
}

struct inbox_check {
  int reports = 0;
  int with_running_list = 0;
  int duplicates_in_transcript = 0;
  bool all_acked = true;
  std::vector<persistence::inbox_row> rows;
};

inbox_check check_inbox(actors::host& h) {
  inbox_check c;
  auto rows = h.store().inbox(session_id(k_parent));
  auto msgs = h.store().messages(session_id(k_parent));
  if (!rows || !msgs) return c;
  c.rows = *rows;
  for (auto& r : *rows) {
    ++c.reports;
    c.all_acked &= r.acked;
    if (r.body.find("Background work still running:\n- shell (") != std::string::npos)
      ++c.with_running_list;
    int seen = 0;
    for (auto& m : *msgs) seen += (m.kind == "report" && m.text == r.body) ? 1 : 0;
    if (seen != 1) ++c.duplicates_in_transcript;
  }
  return c;
}

void print_inbox(const inbox_check& c) {
  std::cout << "\nParent inbox (" << k_parent << "):\n";
  for (auto& r : c.rows) {
    std::cout << "  [" << r.nid.str() << "] " << (r.acked ? "acknowledged" : "pending") << "\n";
    std::string line;
    std::istringstream in(r.body);
    while (std::getline(in, line)) std::cout << "    " << line << "\n";
  }
}

bool expect(bool ok, const std::string& what, int& failures) {
  std::cout << (ok ? "  ok    " : "  FAIL  ") << what << "\n";
  if (!ok) ++failures;
  return ok;
}

// `demo --story DIR`: runs the story from the start (exit 0 when it completed).
int story_child(const fs::path& dir) {
  prepare_dir(dir);
  auto h = open_host(dir, story_agents(), /*create=*/true);
  if (!h) {
    std::cerr << h.error().message << "\n";
    return 3;
  }
  std::string why;
  if (!run_story(**h, dir, why)) {
    std::cerr << why << "\n";
    return 4;
  }
  return 0;
}

// `demo --resume DIR`: restarts on a story's database after a crash: boots,
// lets any shell that waits on the gate exit, and runs until nothing is left.
int resume_child(const fs::path& dir) {
  prepare_dir(dir);
  auto h = open_host(dir, story_agents());
  if (!h) {
    std::cerr << h.error().message << "\n";
    return 3;
  }
  auto boot = sync(**h, (*h)->boot());
  if (!boot) {
    std::cerr << boot.error().message << "\n";
    return 3;
  }
  // Any shell of the story, old or replayed, finds a line waiting at the gate:
  // holding the fifo open read-write means no open() here or there blocks.
  int gate = ::open((dir / "gate").c_str(), O_RDWR | O_NONBLOCK);
  if (gate >= 0)
    for (int i = 0; i < 16; ++i) [[maybe_unused]] auto n = ::write(gate, "go\n", 3);
  sync(**h, (*h)->wait_quiescent(true));
  if (gate >= 0) ::close(gate);
  return 0;
}

// Runs this `tether` with `args` in a child process, with TETHER_CRASH_AT set
// when `crash_at` is given; returns the raw wait status. With `out`, the
// child's stdout is collected there instead of shared with ours.
int run_self(const std::vector<std::string>& args, const char* crash_at,
             std::string* out = nullptr) {
  std::cout.flush();  // what we printed comes before what the child prints
  std::fflush(stdout);
  int fds[2] = {-1, -1};
  if (out && ::pipe(fds) != 0) fds[0] = fds[1] = -1;
  pid_t pid = ::fork();
  if (pid == 0) {
    if (crash_at) ::setenv("TETHER_CRASH_AT", crash_at, 1);
    if (fds[1] >= 0) {
      ::dup2(fds[1], STDOUT_FILENO);
      ::close(fds[0]);
      ::close(fds[1]);
    }
    std::string self = self_dir() + "/tether";
    std::vector<char*> argv{self.data()};
    for (auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    ::execv(self.c_str(), argv.data());
    ::_exit(127);
  }
  if (fds[1] >= 0) {
    ::close(fds[1]);
    char buf[4096];
    for (;;) {
      auto n = ::read(fds[0], buf, sizeof buf);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      out->append(buf, static_cast<std::size_t>(n));
    }
    ::close(fds[0]);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  return status;
}

int run_jobs_story(const std::string& mode, const fs::path& dir, const fs::path& sandbox,
                   const char* crash_at) {
  return run_self({"jobs-story", mode, dir.string(), "--sandbox", sandbox.string()}, crash_at);
}

struct jobs_check {
  int jobs = 0, terminal_receipts = 0, undelivered = 0, notices = 0, side_effects = 0;
  std::map<std::string, int> ran;
};

// Prints each job of the story's turn with its receipts; counts what the checks need.
jobs_check print_jobs(const fs::path& dir) {
  jobs_check c;
  auto db = (dir / "tether.db").string();
  auto w = persistence::writer::open(persistence::db_options{db});
  if (!w) {
    std::cout << "  cannot open " << db << ": " << w.error().message << "\n";
    return c;
  }
  persistence::task_store store(**w, db);
  session_id owner("ses_owner");
  auto s = store.session(owner);
  auto msgs = store.messages(owner);
  if (s && *s && (*s)->turn && msgs) {
    auto jobs = store.jobs_of_turn(owner, *(*s)->turn);
    for (auto& j : jobs ? *jobs : std::vector<persistence::owned_job>{}) {
      ++c.jobs;
      std::cout << "  " << j.id.str() << "  " << persistence::to_string(j.state) << "  ("
                << j.preview << ")\n";
      auto rs = store.receipts_of(j.id);
      for (auto& r : rs ? *rs : std::vector<persistence::receipt>{}) {
        std::cout << "    receipt " << r.id.str() << ": " << persistence::to_string(r.state)
                  << "\n";
        if (r.transition == protocol::transition::started) continue;
        ++c.terminal_receipts;
        c.undelivered += r.state == persistence::receipt_state::pending ||
                         r.state == persistence::receipt_state::dropped;
      }
    }
    std::cout << "  Turn transcript:\n";
    for (auto& m : *msgs) {
      c.notices += m.kind == "notice";
      auto first = m.text.substr(0, m.text.find('\n'));
      std::cout << "    " << m.seq << ". " << m.role << " " << m.kind << ": " << first << "\n";
    }
  }
  std::ifstream side(dir / "side-effects");
  std::string l;
  while (std::getline(side, l))
    if (!l.empty()) c.ran[l]++;
  for (auto& [k, n] : c.ran) c.side_effects = std::max(c.side_effects, n);
  (*w)->stop();
  return c;
}

// Part 3: a turn's own background jobs in a real sandbox daemon, live and
// across a SIGKILL between a receipt's hand-over and its acknowledgement.
void jobs_part(const fs::path& root, int& failures) {
  std::cout << "\nOwned jobs: one turn launches three real commands into a sandbox daemon\n"
               "(a build that succeeds, a test run whose first stage fails, a job it cancels);\n"
               "the turn stays open until every receipt was steered into it.\n";
  sandbox::daemon_options d;
  d.state_dir = (root / "sandbox").string();
  d.binary = self_dir() + "/tether-sandboxd";
  d.detach = false;
  auto daemon = sandbox::ensure_daemon(d);
  if (!daemon) {
    expect(false, "sandbox daemon started: " + daemon.error().message, failures);
    return;
  }
  fs::path live = root / "jobs-live";
  int st = run_jobs_story("--story", live, d.state_dir, nullptr);
  expect(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the jobs story ran to the end", failures);
  auto c = print_jobs(live);
  std::cout << "\nChecks:\n";
  expect(c.jobs == 3 && c.terminal_receipts == 3 && c.undelivered == 0,
         "each job has one terminal receipt, delivered or read by its owner", failures);
  expect(c.notices == 2, "two notices were steered into the turn (the cancel was read inline)",
         failures);

  fs::path crashed = root / "jobs-crash";
  const char* at = "delivery.ack.after_commit:1";
  std::cout << "\nCrash and restart: the jobs story with TETHER_CRASH_AT=" << at << "\n";
  st = run_jobs_story("--story", crashed, d.state_dir, at);
  expect(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL,
         "the host died by SIGKILL after a receipt was admitted and acknowledged, before the "
         "turn was steered",
         failures);
  st = run_jobs_story("--resume", crashed, d.state_dir, nullptr);
  expect(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the restarted host reattached and finished",
         failures);
  auto after = print_jobs(crashed);
  std::cout << "\nChecks after the restart:\n";
  expect(after.jobs == 3 && after.terminal_receipts == 3 && after.undelivered == 0,
         "each job still has exactly one terminal receipt, none left pending", failures);
  expect(after.side_effects == 1, "no command ran twice (side-effect file)", failures);
  if (auto r = sandbox::stop_daemon(*daemon); !r)
    std::cout << "  stopping the sandbox daemon: " << r.error().message << "\n";
}

// What a delegate story left on disk: its one task, intents, receipts, notices.
struct delegate_check {
  std::optional<persistence::delegate_task> task;
  int intents = 0, terminal_receipts = 0, undelivered = 0, notices = 0;
  std::string notice;           // the originator's notice, as its transcript holds it
  bool artifact_valid = false;  // the file's SHA-256 is the recorded (or intended) digest
  std::string why;              // set when the store could not be read
};

delegate_check read_delegate(const fs::path& dir) {
  delegate_check c;
  auto db = (dir / "tether.db").string();
  if (auto v = persistence::check_readable(db); !v) return c.why = v.error().message, c;
  persistence::task_reader store(db);
  auto tasks = store.delegates();
  auto intents = store.settlement_intents();
  if (!tasks || !intents || tasks->size() != 1)
    return c.why = "expected one delegated task in " + db, c;
  c.task = tasks->front();
  c.intents = static_cast<int>(intents->size());
  // Before promotion the digest is the intent's; after, the row's.
  std::optional<std::string> path = c.task->artifact, digest = c.task->digest;
  if (!intents->empty()) path = intents->front().artifact, digest = intents->front().digest;
  if (path && digest) {
    auto bytes = runtime::read_artifact(*path, 1u << 20);
    c.artifact_valid = bytes && runtime::sha256_digest(*bytes) == *digest;
  }
  auto rs = store.receipts_of(c.task->id);
  for (auto& r : rs ? *rs : std::vector<persistence::receipt>{}) {
    if (r.transition == protocol::transition::started) continue;
    ++c.terminal_receipts;
    c.undelivered += r.state == persistence::receipt_state::pending ||
                     r.state == persistence::receipt_state::dropped;
  }
  auto head = "[delegated task " + c.task->id.str() + " (worker) completed]";
  auto msgs = store.messages(session_id("ses_origin"));
  for (auto& m : msgs ? *msgs : std::vector<persistence::message_row>{})
    if (m.text.find(head) != std::string::npos) {
      ++c.notices;
      c.notice = m.text;
    }
  return c;
}

void print_lines(const std::string& text, const char* indent) {
  std::istringstream in(text);
  std::string l;
  while (std::getline(in, l)) std::cout << indent << l << "\n";
}

// Part 4: a background delegated task whose host is SIGKILLed after its
// artifact was published and before the promotion (`tether delegate-story`,
// docs/delegation.md); the restart's recovery finishes the settlement.
void delegate_part(const fs::path& root, int& failures) {
  const char* at = "delegate.artifact.after_publish:1";
  fs::path dir = root / "delegate";
  std::cout << "\nDelegated task: session ses_origin hands \"Summarise the failing tests.\" to\n"
               "agent \"worker\" in the background. Its settlement is an intent first (the digest\n"
               "of the exact bytes), then the artifact file (fsynced), then one transaction that\n"
               "promotes it. The host is SIGKILLed between the artifact and the promotion\n"
               "(TETHER_CRASH_AT="
            << at << ").\n";
  std::string said;
  int st = run_self({"delegate-story", "--story", dir.string()}, at, &said);
  print_lines(said, "  host: ");
  expect(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL,
         "the host died by SIGKILL after publishing the artifact, before promoting it", failures);
  auto before = read_delegate(dir);
  if (!before.task) {
    expect(false, "the task is on disk: " + before.why, failures);
    return;
  }
  std::cout << "  on disk after the kill: task " << before.task->id.str() << " "
            << persistence::to_string(before.task->state) << ", " << before.intents
            << " settlement intent,\n    its artifact "
            << (before.artifact_valid ? "on disk and matching the intent's digest"
                                      : "missing or not matching the intent's digest")
            << ", " << before.notices << " notice(s) for ses_origin\n";
  expect(before.task->state == persistence::delegate_state::running && before.intents == 1 &&
             before.artifact_valid && before.notices == 0,
         "the task is still running with its intent and its published artifact; no notice yet",
         failures);
  said.clear();
  st = run_self({"delegate-story", "--resume", dir.string()}, nullptr, &said);
  print_lines(said, "  restart: ");
  expect(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the restarted host booted and finished", failures);
  auto after = read_delegate(dir);
  if (!after.task) {
    expect(false, "the task is on disk: " + after.why, failures);
    return;
  }
  std::cout << "  after the restart: task " << after.task->id.str() << " "
            << persistence::to_string(after.task->state) << "\n    artifact "
            << after.task->artifact.value_or("(none)") << "\n    " << after.task->bytes
            << " bytes, " << after.task->digest.value_or("no digest") << "\n";
  std::cout << "  the notice in ses_origin's transcript:\n";
  print_lines(after.notice, "    ");
  std::cout << "\nChecks after the restart:\n";
  expect(said.find("recovered: promoted 1,") != std::string::npos &&
             after.task->state == persistence::delegate_state::completed && after.artifact_valid &&
             after.intents == 0,
         "recovery checked the artifact against its digest and promoted it, once", failures);
  expect(after.terminal_receipts == 1 && after.undelivered == 0 && after.notices == 1,
         "the originator's notice was delivered once (one terminal receipt, one notice)", failures);
}

// Part 5: a schedule (a job due every second, on a virtual clock) whose
// host is SIGKILLed after a run's command was sent to the sandbox daemon and
// before its completion was followed (`tether cron run`, docs/cron.md); the
// restart takes the run over, following the same command, and finishes the
// schedule: every occurrence ran once, none lost, none twice.
void cron_part(const fs::path& root, int& failures) {
  const char* at = "cron.dispatch.after_exec:2";
  fs::path dir = root / "cron";
  fs::create_directories(dir);
  constexpr std::int64_t start = 1'800'000'000'000, until = start + 4000;
  std::ofstream(dir / "jobs.json") << R"({"jobs": [{"name": "tick", "agent": "ops",
  "schedule": {"every_ms": 1000, "anchor_ms": 1800000000000},
  "command": "echo \"$TETHER_CRON_OCCURRENCE\" >> side.txt", "retries": 0}]})";
  std::vector<std::string> run{"cron",      "run",
                               "--db",      (dir / "tether.db").string(),
                               "--file",    (dir / "jobs.json").string(),
                               "--virtual", std::to_string(start),
                               "--until",   std::to_string(until)};
  std::cout
      << "\nScheduled work: job \"tick\" runs `echo $TETHER_CRON_OCCURRENCE >> side.txt` every\n"
         "second of a simulated clock, for five occurrences. Each occurrence is claimed\n"
         "(a lease and a fencing token) and sent to the sandbox daemon under its attempt's\n"
         "id. The host is SIGKILLed after the second occurrence's command was sent\n"
         "(TETHER_CRASH_AT="
      << at << ").\n";
  std::string said;
  int st = run_self(run, at, &said);
  print_lines(said, "  host: ");
  expect(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL,
         "the host died by SIGKILL with the second occurrence's command sent", failures);
  auto lines = [&dir] {
    std::vector<std::string> out;
    std::ifstream in(dir / "side.txt");
    for (std::string l; std::getline(in, l);) out.push_back(l);
    return out;
  };
  said.clear();
  st = run_self(run, nullptr, &said);
  print_lines(said, "  restart: ");
  expect(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the restarted host ran the schedule to its end",
         failures);
  auto got = lines();
  std::cout << "  side.txt after the restart:\n";
  for (auto& l : got) std::cout << "    " << l << "\n";
  std::vector<std::string> want;
  for (std::int64_t t = start; t <= until; t += 1000) want.push_back(std::to_string(t));
  expect(got == want, "every occurrence ran exactly once: none lost, none twice", failures);
  if (auto r = sandbox::stop_daemon_in(sandbox::local_state_dir_for((dir / "tether.db").string()));
      !r)
    std::cout << "  stopping the local sandbox daemon: " << r.error().message << "\n";
}

void sop_part(const fs::path& root, int& failures) {
  const char* at = "sop.park.after_commit:1";
  fs::path dir = root / "sop";
  fs::create_directories(dir / "sops");
  std::ofstream(dir / "sops" / "deploy.json") << R"({"name": "deploy", "agent": "ops",
  "approvers": ["alice"], "steps": [
    {"name": "build", "kind": "shell", "command": "echo built >> side.txt"},
    {"name": "approve", "kind": "approval"},
    {"name": "ship", "kind": "shell", "command": "echo shipped >> side.txt"}]})";
  auto db = (dir / "tether.db").string();
  auto sops = (dir / "sops").string();
  std::cout << "\nAn SOP run: \"deploy\" builds, waits for alice's approval, then ships. The\n"
               "host is SIGKILLed once the run parked at the approval (TETHER_CRASH_AT="
            << at
            << "); a restarted host finds it still waiting, holding no claim; then\n"
               "alice's approval arrives and the run ships once.\n";
  std::string said;
  int st = run_self({"sop", "run", "--db", db, "--dir", sops, "--start-once", "deploy"}, at, &said);
  print_lines(said, "  host: ");
  expect(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL,
         "the host died by SIGKILL with the run waiting for approval", failures);
  said.clear();
  st = run_self({"sop", "run", "--db", db, "--dir", sops}, nullptr, &said);
  print_lines(said, "  restart: ");
  std::string id;
  {
    std::istringstream in(said);
    for (std::string l; std::getline(in, l);)
      if (l.find("\twaiting_approval\t") != std::string::npos) id = l.substr(0, l.find('\t'));
  }
  expect(WIFEXITED(st) && WEXITSTATUS(st) == 0 && !id.empty(),
         "after the restart the run is still waiting for approval", failures);
  said.clear();
  st = run_self({"sop", "run", "--db", db, "--dir", sops, "--approve", id, "--as", "alice"},
                nullptr, &said);
  print_lines(said, "  approved by alice: ");
  expect(WIFEXITED(st) && WEXITSTATUS(st) == 0 && said.find("\tcompleted\t") != std::string::npos,
         "the approved run completed", failures);
  std::vector<std::string> got;
  {
    std::ifstream in(dir / "side.txt");
    for (std::string l; std::getline(in, l);) got.push_back(l);
  }
  std::cout << "  side.txt:\n";
  for (auto& l : got) std::cout << "    " << l << "\n";
  expect(got == std::vector<std::string>{"built", "shipped"},
         "each step ran exactly once: built once, shipped once", failures);
  if (auto r = sandbox::stop_daemon_in(sandbox::local_state_dir_for(db)); !r)
    std::cout << "  stopping the local sandbox daemon: " << r.error().message << "\n";
}

int demo(const args& a) {
  if (a.size() == 2 && a[0] == "--story") return story_child(a[1]);
  if (a.size() == 2 && a[0] == "--resume") return resume_child(a[1]);
  if (!a.empty()) {
    std::cerr << "usage: tether demo\n";
    return 2;
  }
  char tmpl[] = "/tmp/tether-demo-XXXXXX";
  if (!::mkdtemp(tmpl)) {
    std::perror("mkdtemp");
    return 1;
  }
  fs::path root = tmpl;
  int failures = 0;

  // Part 1: the story, live.
  fs::path live = root / "live";
  prepare_dir(live);
  std::cout
      << "tether demo: a parent spawns a background child \"Audit routes\"; the child starts\n"
         "a background shell (an owned job of its turn, in a local sandbox daemon) and goes\n"
         "idle; the shell exits and its notice wakes the child.\n"
         "database: "
      << (live / "tether.db").string() << "\n";
  auto agents = story_agents();
  {
    auto h = open_host(live, agents, /*create=*/true);
    if (!h) {
      std::cerr << "tether demo: " << h.error().message << "\n";
      return 1;
    }
    std::string why;
    if (!run_story(**h, live, why)) {
      std::cerr << "tether demo: " << why << "\n";
      return 1;
    }
    std::cout << "\nTimeline:\n";
    int i = 0;
    for (auto& l : agents->log()) std::cout << "  " << ++i << ". " << l << "\n";
    auto c = check_inbox(**h);
    print_inbox(c);
    std::cout << "\nChecks:\n";
    expect(c.reports == 2, "the parent received 2 reports (one per busy period of the child)",
           failures);
    expect(c.with_running_list == 1, "report 1 lists the shell that was still running", failures);
    expect(c.all_acked && c.duplicates_in_transcript == 0,
           "each report is in the parent's transcript exactly once", failures);
    (*h)->shutdown();
  }

  // Part 2: the same story in a child process, SIGKILLed right after report
  // 2's settle committed (with its admit), before the parent was woken.
  fs::path crashed = root / "crash";
  prepare_dir(crashed);
  std::cout << "\nCrash and restart: the same story in a child process with TETHER_CRASH_AT="
            << k_crash_at << "\n";
  int status = run_self({"demo", "--story", crashed.string()}, k_crash_at);
  bool killed = WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL;
  expect(killed,
         "the child process died by SIGKILL after committing report 2 (the child idle, the "
         "report admitted into the parent's inbox in the same transaction), before waking the "
         "parent",
         failures);
  {
    auto agents2 = story_agents();
    auto h = open_host(crashed, agents2);
    if (!h) {
      std::cerr << "tether demo: " << h.error().message << "\n";
      return 1;
    }
    // Owed: terminal with its terminal receipt pending (a delivered report's
    // task stays in the store, terminal, and is not owed).
    auto owed = (*h)->store().jobs();
    int terminal = 0;
    if (owed)
      for (auto& j : *owed) terminal += j.owed;
    int unread = 0;
    if (auto rows = (*h)->store().inbox(session_id(k_parent)))
      for (auto& r : *rows) unread += r.acked ? 0 : 1;
    std::cout << "  on disk after the kill: " << terminal << " owed report(s) in the outbox, "
              << unread << " unread in the parent's inbox\n";
    auto boot = sync(**h, (*h)->boot());
    if (!boot) {
      std::cerr << "tether demo: " << boot.error().message << "\n";
      return 1;
    }
    sync(**h, (*h)->wait_quiescent(true));
    std::cout << "  restart: boot delivered " << boot->delivered << " owed report(s)\n";
    auto c = check_inbox(**h);
    print_inbox(c);
    std::cout << "\nChecks after the restart:\n";
    expect(terminal == 0 && unread == 1 && boot->delivered == 0,
           "nothing was left in the outbox: boot woke the parent for the report in its inbox",
           failures);
    expect(c.reports == 2, "the parent has both reports", failures);
    expect(c.all_acked && c.duplicates_in_transcript == 0, "each exactly once, none lost",
           failures);
    (*h)->shutdown();
  }
  jobs_part(root, failures);
  delegate_part(root, failures);
  cron_part(root, failures);
  sop_part(root, failures);
  // Parts 1 and 2 configured no sandbox: each host ran its shell in a local
  // daemon beside its database, detached; the demo's directory goes, so do they.
  for (auto& dir : {live, crashed})
    if (auto r =
            sandbox::stop_daemon_in(sandbox::local_state_dir_for((dir / "tether.db").string()));
        !r)
      std::cout << "  stopping the local sandbox daemon: " << r.error().message << "\n";
  std::error_code ec;
  fs::remove_all(root, ec);
  if (failures) {
    std::cout << "\ntether demo: " << failures << " check(s) failed\n";
    return 1;
  }
  std::cout
      << "\nOK: every busy period reported once, every job receipt and the delegated task's "
         "notice\ndelivered once, every scheduled occurrence run once, every SOP step run once, "
         "before\nand after a SIGKILL.\n";
  return 0;
}

registrar demo_cmd{{"demo",
                    "run the main job: the report-on-idle story, live and across a SIGKILL\n"
                    "                 (--story DIR / --resume DIR: one run or restart, for tests)",
                    demo}};

}  // namespace
}  // namespace tether::cli
