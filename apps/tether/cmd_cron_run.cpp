// tether cron run --db FILE [--file JOBS.json] [--catch-up on|off]
//                 [--virtual START_MS --until END_MS]
//
// Runs the cron scheduler of a host on FILE (created if missing) with the
// schedule file JOBS.json reconciled at start. Shell jobs run through the
// local sandbox daemon, in the database's directory unless the job names
// one; a prompt job's agent answers "done: <prompt>".
// With --virtual, the clock starts at START_MS and leaps to each next run
// (no wall time passes), and the command returns once nothing is due before
// END_MS and every run ended: the demo's and the crash matrix's way to run
// a schedule. Without it, it runs on the system clock until SIGINT or SIGTERM.
// Prints one line per job at the end: name, next run, last status.
#include "cmd_cron_run.hpp"

#include <signal.h>

#include <charconv>
#include <filesystem>
#include <iostream>

#include "answering_agent.hpp"
#include "tether/actors/host.hpp"
#include "tether/runtime/sync_wait.hpp"

namespace tether::cli {

namespace fs = std::filesystem;

namespace {

int usage(const std::string& problem) {
  std::cerr << "tether cron run: " << problem
            << "\nusage: tether cron run --db FILE [--file JOBS.json] [--catch-up on|off] "
               "[--virtual START_MS --until END_MS]\n";
  return 2;
}

bool parse_ms(const std::string& s, std::int64_t& out) {
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  return ec == std::errc() && p == s.data() + s.size();
}

template <class T>
T sync(actors::host& h, boost::asio::awaitable<T> a) {
  return runtime::sync_wait(h.pool().at(0), std::move(a));
}

}  // namespace

int cron_run(const args& a) {
  std::string db, file;
  std::optional<std::int64_t> start, until;
  bool catch_up = true;
  for (std::size_t i = 0; i < a.size(); ++i) {
    auto value = [&](const char* flag) -> std::optional<std::string> {
      if (i + 1 >= a.size()) return std::nullopt;
      (void)flag;
      return a[++i];
    };
    std::optional<std::string> v;
    if (a[i] == "--db" && (v = value("--db"))) {
      db = *v;
    } else if (a[i] == "--file" && (v = value("--file"))) {
      file = *v;
    } else if (a[i] == "--catch-up" && (v = value("--catch-up"))) {
      if (*v != "on" && *v != "off") return usage("--catch-up takes on or off, not '" + *v + "'");
      catch_up = *v == "on";
    } else if ((a[i] == "--virtual" || a[i] == "--until") && (v = value("--virtual"))) {
      std::int64_t ms = 0;
      if (!parse_ms(*v, ms)) return usage(a[i - 1] + " takes milliseconds, not '" + *v + "'");
      (a[i - 1] == "--virtual" ? start : until) = ms;
    } else {
      return usage("unexpected argument '" + a[i] + "'");
    }
  }
  if (db.empty()) return usage("--db is required");
  if (start.has_value() != until.has_value()) return usage("--virtual and --until go together");
  actors::host_options o;
  o.db_path = db;
  o.create_db = !fs::exists(db);
  o.agents = std::make_shared<answering_factory>();
  actors::cron_options c;
  c.file = file;
  // A shell job that names no directory works beside the database.
  c.cwd = fs::absolute(fs::path(db)).parent_path().string();
  c.catch_up = catch_up;
  if (start) {
    c.clock = std::make_shared<runtime::virtual_clock>(*start);
    c.stop_at = until;
  }
  o.cron = c;
  // Without a virtual clock: until SIGINT or SIGTERM, taken by sigwait below.
  // Blocked before the host's threads start, so that they inherit the mask.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  if (!start) pthread_sigmask(SIG_BLOCK, &set, nullptr);
  auto h = actors::host::open(o);
  if (!h) {
    std::cerr << "tether cron run: " << h.error().message << "\n";
    return 3;
  }
  auto boot = sync(**h, (*h)->boot());
  if (!boot) {
    std::cerr << "tether cron run: " << boot.error().message << "\n";
    return 3;
  }
  auto* cron = (*h)->cron();
  if (boot->cron) {
    auto& f = boot->cron->file;
    std::cout << "schedule file: " << f.added.size() << " added, " << f.changed.size()
              << " changed, " << f.removed.size() << " removed; claims cleared "
              << boot->cron->claims_cleared << ", caught up " << boot->cron->caught_up
              << ", skipped " << boot->cron->skipped << "\n";
  }
  if (start) {
    sync(**h, cron->finished());
  } else {
    int sig = 0;
    sigwait(&set, &sig);
  }
  auto jobs = sync(**h, cron->jobs());
  (*h)->shutdown();
  if (!jobs) {
    std::cerr << "tether cron run: " << jobs.error().message << "\n";
    return 3;
  }
  for (auto& j : *jobs)
    std::cout << j.spec.name << "\tnext "
              << (j.next_run ? protocol::format_utc(*j.next_run) : std::string("-")) << "\tlast "
              << (j.last_status.empty() ? std::string("-") : j.last_status) << "\n";
  return 0;
}

}  // namespace tether::cli
