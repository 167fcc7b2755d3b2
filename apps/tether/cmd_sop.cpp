// tether sop validate DIR
// tether sop run --db FILE --dir DIR [--start-once SOP [--input TEXT]] [--drive-as WHO]
//               [--approve RUN --as WHO] [--cancel RUN --as WHO]
//
// `validate` loads a directory of SOP files (docs/sop.md) and prints each
// SOP's steps, or the first error (file, field, problem) and exits 1.
//
// `run` boots a host on FILE (created if missing) with an SOP engine on DIR:
// runs left by an earlier process are claimed again and resumed (a step in
// flight resolved through its task). Shell steps run through the local
// sandbox daemon, beside the database; a prompt step's agent answers
// "done: <prompt>". Then:
//   --start-once SOP  starts a run of SOP unless one exists (a rerun after a
//                     crash does not start a second);
//   --approve RUN     approves RUN's approval as WHO (--as);
//   --cancel RUN      cancels RUN as WHO;
//   --drive-as WHO    approves every approval and resumes every checkpoint as
//                     WHO until every run is terminal (the demo's and the
//                     crash matrix's operator).
// It returns once the engine is quiet (every run terminal or parked) and
// prints one line per run: id, SOP, state, step, revision.
#include <filesystem>
#include <iostream>

#include "answering_agent.hpp"
#include "command.hpp"
#include "tether/actors/host.hpp"
#include "tether/protocol/sop.hpp"
#include "tether/runtime/sync_wait.hpp"

namespace tether::cli {

namespace fs = std::filesystem;

namespace {

constexpr const char* k_usage =
    "usage: tether sop validate DIR\n"
    "       tether sop run --db FILE --dir DIR [--start-once SOP [--input TEXT]]\n"
    "                      [--drive-as WHO] [--approve RUN --as WHO] [--cancel RUN --as WHO]\n";

int usage_error(const std::string& problem) {
  std::cerr << "tether sop: " << problem << "\n" << k_usage;
  return 2;
}

template <class T>
T sync(actors::host& h, boost::asio::awaitable<T> a) {
  return runtime::sync_wait(h.pool().at(0), std::move(a));
}

int validate(const args& a) {
  if (a.size() != 2) return usage_error("validate takes one directory");
  auto defs = protocol::load_sop_dir(a[1]);
  if (!defs) {
    std::cerr << "tether sop validate: " << defs.error().describe() << "\n";
    return 1;
  }
  for (auto& d : *defs) {
    std::cout << d.name << " (agent " << (d.agent.empty() ? "-" : d.agent) << ", at most "
              << d.max_concurrent << " at once)\n";
    for (std::size_t i = 0; i < d.steps.size(); ++i)
      std::cout << "  " << d.steps[i].name << "  " << protocol::to_string(d.steps[i].kind) << "  → "
                << d.success_target(i) << " | on failure → " << d.failure_target(i) << "\n";
  }
  std::cout << a[1] << ": " << defs->size() << " SOP" << (defs->size() == 1 ? "" : "s")
            << ", valid\n";
  return 0;
}

bool terminal(const std::string& state) {
  return state == "completed" || state == "failed" || state == "cancelled";
}

int run(const args& a) {
  std::string db, dir, start_once, input, drive_as, approve, cancel, as;
  for (std::size_t i = 1; i < a.size(); ++i) {
    auto take = [&](std::string& out) {
      if (i + 1 >= a.size()) return false;
      out = a[++i];
      return true;
    };
    bool ok = (a[i] == "--db" && take(db)) || (a[i] == "--dir" && take(dir)) ||
              (a[i] == "--start-once" && take(start_once)) || (a[i] == "--input" && take(input)) ||
              (a[i] == "--drive-as" && take(drive_as)) || (a[i] == "--approve" && take(approve)) ||
              (a[i] == "--cancel" && take(cancel)) || (a[i] == "--as" && take(as));
    if (!ok) return usage_error("unexpected argument '" + a[i] + "'");
  }
  if (db.empty() || dir.empty()) return usage_error("--db and --dir are required");
  if ((!approve.empty() || !cancel.empty()) && as.empty())
    return usage_error("--approve and --cancel need --as WHO");
  actors::host_options o;
  o.db_path = db;
  o.create_db = !fs::exists(db);
  o.agents = std::make_shared<answering_factory>();
  actors::sop_options s;
  s.dir = dir;
  // A shell step that names no directory works beside the database.
  s.cwd = fs::absolute(fs::path(db)).parent_path().string();
  o.sop = s;
  auto h = actors::host::open(o);
  if (!h) {
    std::cerr << "tether sop run: " << h.error().message << "\n";
    return 3;
  }
  auto boot = sync(**h, (*h)->boot());
  if (!boot) {
    std::cerr << "tether sop run: " << boot.error().message << "\n";
    return 3;
  }
  auto& engine = *(*h)->sop();
  auto fail = [&](const std::string& what, const error& e) {
    std::cerr << "tether sop run: " << what << ": " << e.message << "\n";
    (*h)->shutdown();
    return 1;
  };
  if (!start_once.empty()) {
    auto all = sync(**h, engine.runs());
    if (!all) return fail("reading runs", all.error());
    bool have = false;
    for (auto& r : *all) have = have || r.sop == start_once;
    if (!have) {
      auto id = sync(**h, engine.start_run(start_once, input, "cli"));
      if (!id) return fail("starting a run of " + start_once, id.error());
      std::cout << "started " << id->str() << "\n";
    }
  }
  if (!approve.empty()) {
    auto r = sync(**h, engine.approve(protocol::job_id(approve), as, ""));
    if (!r) return fail("approving " + approve, r.error());
  }
  if (!cancel.empty()) {
    auto r = sync(**h, engine.cancel(protocol::job_id(cancel), as, "from the CLI"));
    if (!r) return fail("cancelling " + cancel, r.error());
  }
  for (;;) {
    sync(**h, engine.quiet(engine.clock().now_ms()));
    if (drive_as.empty()) break;
    auto all = sync(**h, engine.runs());
    if (!all) return fail("reading runs", all.error());
    int acted = 0, open = 0;
    for (auto& r : *all) {
      if (terminal(r.state)) continue;
      ++open;
      if (r.state == "waiting_approval") {
        auto d = sync(**h, engine.approve(r.id, drive_as, "approved by the CLI's driver"));
        if (!d) return fail("approving " + r.id.str(), d.error());
        std::cout << "approved " << r.id.str() << " at " << r.step << " as " << drive_as << "\n";
        ++acted;
      } else if (r.state == "paused_checkpoint") {
        auto d = sync(**h, engine.resume(r.id, drive_as));
        if (!d) return fail("resuming " + r.id.str(), d.error());
        std::cout << "resumed " << r.id.str() << " at " << r.step << " as " << drive_as << "\n";
        ++acted;
      }
    }
    if (open == 0) break;
    if (acted == 0) {
      std::cerr << "tether sop run: " << open
                << " run(s) are neither terminal nor waiting for the driver\n";
      (*h)->shutdown();
      return 1;
    }
  }
  auto all = sync(**h, engine.runs());
  (*h)->shutdown();
  if (!all) {
    std::cerr << "tether sop run: " << all.error().message << "\n";
    return 3;
  }
  for (auto& r : *all)
    std::cout << r.id.str() << "\t" << r.sop << "\t" << r.state << "\t" << r.step << "\trev "
              << r.revision << (r.durable ? "" : "\t(not durable)") << "\n";
  return 0;
}

int sop(const args& a) {
  if (a.empty()) return usage_error("missing a subcommand (validate or run)");
  if (a[0] == "validate") return validate(a);
  if (a[0] == "run") return run(a);
  if (a[0] == "-h" || a[0] == "--help") {
    std::cout << k_usage;
    return 0;
  }
  return usage_error("unknown subcommand '" + a[0] + "'");
}

registrar sop_cmd{{"sop",
                   "validate DIR | run --db FILE --dir DIR: SOP definitions, and an SOP engine\n"
                   "                 running, approving and resuming runs on a database "
                   "(docs/sop.md)",
                   sop}};

}  // namespace
}  // namespace tether::cli
