// `tether inspect DB [--json]`: what a tether database holds, read through a
// read-only connection: sessions, owed reports (terminal job rows), job rows,
// every session's inbox, owned jobs and their receipts. Never creates,
// migrates or writes the file. `--task ID` and `--lifecycle`: one task
// against its kind's lifecycle, and the lifecycle table (inspect_lifecycle.hpp).
#include <algorithm>
#include <iostream>
#include <optional>
#include <sstream>

#include "command.hpp"
#include "inspect_lifecycle.hpp"
#include "tether/actors/sop.hpp"
#include "tether/persistence/task_store.hpp"
#include "tether/protocol/json.hpp"

namespace tether::cli {
namespace {

namespace json = boost::json;
using persistence::inbox_row;
using persistence::job_row;
using persistence::job_status;
using persistence::session_row;

struct snapshot {
  std::string path;
  int schema_version = 0;
  std::vector<session_row> sessions;
  std::vector<job_row> jobs;
  std::vector<std::pair<std::string, std::vector<inbox_row>>> inboxes;  // by session
  std::vector<persistence::owned_job> owned;
  std::vector<persistence::history_task> history;  // kinds no longer run (local_shell)
  std::vector<persistence::receipt> receipts;
  std::vector<persistence::cron_job_row> cron;  // scheduled jobs (docs/cron.md)
  std::vector<persistence::sop_run_row> sop;    // SOP runs (docs/sop.md)
};

result<snapshot> read_snapshot(const std::string& path) {
  auto version = persistence::check_readable(path);
  if (!version) return version.error();
  persistence::task_reader reader(path);
  snapshot s{path, *version, {}, {}, {}, {}, {}, {}, {}, {}};
  auto sessions = reader.sessions();
  if (!sessions) return sessions.error();
  s.sessions = std::move(*sessions);
  auto jobs = reader.jobs();
  if (!jobs) return jobs.error();
  s.jobs = std::move(*jobs);
  for (auto& row : s.sessions) {
    auto inbox = reader.inbox(row.id);
    if (!inbox) return inbox.error();
    s.inboxes.emplace_back(row.id.str(), std::move(*inbox));
  }
  auto owned = reader.all_jobs();
  if (!owned) return owned.error();
  s.owned = std::move(*owned);
  auto history = reader.history_tasks();
  if (!history) return history.error();
  s.history = std::move(*history);
  auto rs = reader.all_receipts();
  if (!rs) return rs.error();
  s.receipts = std::move(*rs);
  if (s.schema_version >= 10) {  // schema step 10 made the table
    auto cron = reader.cron_jobs();
    if (!cron) return cron.error();
    s.cron = std::move(*cron);
  }
  if (s.schema_version >= 11) {  // schema step 11: revisions and events
    auto sop = reader.sop_runs(false);
    if (!sop) return sop.error();
    s.sop = std::move(*sop);
  }
  return s;
}

std::string opt(const std::optional<protocol::session_id>& id) {
  return id ? id->str() : "-";
}
std::string notify_word(const std::optional<bool>& n) {
  return !n ? "default" : *n ? "on" : "off";
}
// A delivered report's task stays, terminal: owed only while its terminal
// receipt is pending.
bool owed(const job_row& j) {
  return j.owed;
}

json::value opt_json(const std::optional<protocol::session_id>& id) {
  return id ? json::value(id->str()) : json::value(nullptr);
}

json::object to_json(const snapshot& s) {
  json::array sessions, tasks, owed_reports;
  for (auto& r : s.sessions) {
    json::object o;
    o["id"] = r.id.str();
    o["parent"] = opt_json(r.parent);
    o["notify"] = r.notify ? json::value(*r.notify) : json::value(nullptr);
    o["state"] = r.busy ? "busy" : "idle";
    o["claim"] = r.time_suspended ? json::value(*r.time_suspended) : json::value(nullptr);
    o["resume_attempts"] = r.resume_attempts;
    o["seq"] = r.seq;
    o["description"] = r.description;
    o["agent"] = r.agent;
    o["revert_staged"] = r.revert_staged;
    o["input_cursor"] = r.input_cursor;
    o["idle_outcome"] = r.idle_outcome ? json::value(*r.idle_outcome) : json::value(nullptr);
    sessions.push_back(std::move(o));
  }
  // Every task of every kind in one array, in the store's one state vocabulary.
  for (auto& j : s.jobs) {
    json::object o;
    o["id"] = j.id.str();
    o["kind"] = j.kind;
    o["state"] = persistence::task_state_word(j.status);
    o["owner"] = opt_json(j.parent);
    o["notification_id"] = j.nid.str();
    o["mode"] = j.mode;
    o["parent"] = opt_json(j.parent);
    o["child"] = opt_json(j.child);
    o["generation"] = j.generation;
    o["description"] = j.description;
    o["body"] = j.body ? json::value(*j.body) : json::value(nullptr);
    if (owed(j)) owed_reports.push_back(o);
    tasks.push_back(std::move(o));
  }
  for (auto& j : s.owned) {
    json::object o;
    o["id"] = j.id.str();
    o["kind"] = "shell";
    o["state"] = persistence::to_string(j.state);
    o["owner"] = j.scope.thread.str();
    o["scope"] = protocol::to_json(j.scope);
    o["command"] = j.preview;
    o["channel"] = j.channel;
    tasks.push_back(std::move(o));
  }
  for (auto& h : s.history) {
    json::object o;
    o["id"] = h.id;
    o["kind"] = h.kind;
    o["state"] = h.state;
    o["owner"] = opt_json(h.owner);
    o["mode"] = h.mode;
    tasks.push_back(std::move(o));
  }
  json::object inbox;
  for (auto& [id, rows] : s.inboxes) {
    json::array a;
    for (auto& r : rows) {
      json::object o;
      o["notification_id"] = r.nid.str();
      o["from"] = opt_json(r.from);
      o["state"] = r.acked ? "acked" : "pending";
      o["body"] = r.body;
      a.push_back(std::move(o));
    }
    inbox[id] = std::move(a);
  }
  json::array receipts;
  for (auto& r : s.receipts) {
    json::object o;
    o["id"] = r.id.str();
    o["job"] = r.job.str();
    o["transition"] = protocol::to_string(r.transition);
    o["state"] = persistence::to_string(r.state);
    o["scope"] = protocol::to_json(r.scope);
    o["body"] = r.body;
    receipts.push_back(std::move(o));
  }
  json::object out;
  out["database"] = s.path;
  out["schema_version"] = s.schema_version;
  out["sessions"] = std::move(sessions);
  out["owed_reports"] = std::move(owed_reports);
  out["tasks"] = std::move(tasks);
  out["inbox"] = std::move(inbox);
  out["receipts"] = std::move(receipts);
  json::array cron;
  for (auto& j : s.cron) {
    json::object o;
    o["name"] = j.spec.name;
    o["source"] = j.source;
    o["spec"] = protocol::to_json(j.spec);
    o["enabled"] = j.spec.enabled;
    o["next_run"] = j.next_run ? json::value(*j.next_run) : json::value(nullptr);
    o["last_status"] = j.last_status;
    o["last_run"] = j.last_run ? json::value(*j.last_run) : json::value(nullptr);
    o["claim_owner"] = j.claim_owner;
    o["claim_until"] = j.claim_until;
    o["fence"] = j.fence;
    cron.push_back(std::move(o));
  }
  out["cron_jobs"] = std::move(cron);
  json::array sop;
  for (auto& r : s.sop) {
    auto v = actors::sop_engine::view_of(r, true);
    json::object o;
    o["id"] = r.id.str();
    o["sop"] = r.sop;
    o["state"] = v.state;  // pending, running, waiting_approval, paused_checkpoint or terminal
    o["step"] = v.step;
    o["revision"] = r.revision;
    o["claim_owner"] = r.owner;
    o["claim_until"] = r.lease_until;
    o["error"] = v.error;
    sop.push_back(std::move(o));
  }
  out["sop_runs"] = std::move(sop);
  return out;
}

// Prints rows as left-aligned columns under a header.
void table(std::ostream& out, const std::vector<std::vector<std::string>>& rows) {
  std::vector<std::size_t> w;
  for (auto& r : rows)
    for (std::size_t i = 0; i < r.size(); ++i) {
      if (w.size() <= i) w.push_back(0);
      w[i] = std::max(w[i], r[i].size());
    }
  for (auto& r : rows) {
    std::string line = " ";
    for (std::size_t i = 0; i < r.size(); ++i)
      line += " " + r[i] + (i + 1 < r.size() ? std::string(w[i] - r[i].size(), ' ') : "");
    out << line << "\n";
  }
}

void body(std::ostream& out, const std::string& text) {
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) out << "      | " << line << "\n";
}

void print_text(std::ostream& out, const snapshot& s) {
  out << "database " << s.path << " (schema version " << s.schema_version << ", read-only)\n";
  out << "\nsessions (" << s.sessions.size() << ")\n";
  std::vector<std::vector<std::string>> rows{
      {"id", "parent", "notify", "state", "claim", "resumes", "seq", "revert"}};
  for (auto& r : s.sessions)
    rows.push_back({r.id.str(), opt(r.parent), notify_word(r.notify), r.busy ? "busy" : "idle",
                    r.time_suspended ? std::to_string(*r.time_suspended) : "-",
                    std::to_string(r.resume_attempts), std::to_string(r.seq),
                    r.revert_staged ? "staged" : "-"});
  if (!s.sessions.empty()) table(out, rows);

  auto n_owed = std::count_if(s.jobs.begin(), s.jobs.end(), owed);
  out << "\nowed reports (" << n_owed << "): terminal job rows, not yet in their parent's inbox\n";
  for (auto& j : s.jobs) {
    if (!owed(j)) continue;
    out << "  " << j.nid.str() << "  " << opt(j.child) << " -> " << opt(j.parent) << "  "
        << to_string(j.status) << "  (" << j.mode << ", job " << j.id.str() << ")\n";
    body(out, j.body.value_or(""));
  }

  out << "\ninbox\n";
  for (auto& [id, inbox] : s.inboxes) {
    if (inbox.empty()) continue;
    auto pending = std::count_if(inbox.begin(), inbox.end(), [](auto& r) { return !r.acked; });
    out << "  " << id << " (" << inbox.size() << ", " << pending << " pending)\n";
    for (auto& r : inbox) {
      out << "    " << r.nid.str() << "  from " << opt(r.from) << "  "
          << (r.acked ? "acked" : "pending") << "\n";
      body(out, r.body);
    }
  }
}

void print_tasks(std::ostream& out, const snapshot& s) {
  // Every task of every kind, in one table.
  out << "\ntasks (" << s.jobs.size() + s.owned.size() + s.history.size() << ")\n";
  std::vector<std::vector<std::string>> rows{
      {"id", "kind", "state", "owner", "child", "turn", "sandbox", "generation", "what"}};
  for (auto& j : s.jobs)
    rows.push_back({j.id.str(), j.kind, persistence::task_state_word(j.status), opt(j.parent),
                    opt(j.child), "-", "-", std::to_string(j.generation), j.description});
  for (auto& j : s.owned)
    rows.push_back({j.id.str(), "shell", std::string(persistence::to_string(j.state)),
                    j.scope.thread.str(), "-", j.scope.turn.str(), j.scope.sandbox.str(),
                    std::to_string(j.scope.generation), j.preview});
  for (auto& h : s.history)
    rows.push_back({h.id, h.kind, h.state, opt(h.owner), "-", "-", "-", "-",
                    h.kind == "local_shell" ? "(history: a kind this build no longer runs)" : "-"});
  if (rows.size() > 1) table(out, rows);
  auto pending = std::count_if(s.receipts.begin(), s.receipts.end(), [](auto& r) {
    return r.state == persistence::receipt_state::pending;
  });
  out << "\nreceipts (" << s.receipts.size() << ", " << pending << " pending)\n";
  rows = {{"id", "state", "thread", "turn", "generation"}};
  for (auto& r : s.receipts)
    rows.push_back({r.id.str(), std::string(persistence::to_string(r.state)), r.scope.thread.str(),
                    r.scope.turn.str(), std::to_string(r.scope.generation)});
  if (!s.receipts.empty()) table(out, rows);
  if (s.cron.empty()) return;
  // Scheduled jobs: when each runs next, how it last ended, who holds it.
  out << "\ncron jobs (" << s.cron.size() << ")\n";
  rows = {{"name", "source", "enabled", "next run", "last status", "last run", "claim", "lease",
           "fence"}};
  auto when = [](const std::optional<std::int64_t>& ms) {
    return ms ? protocol::format_utc(*ms) : std::string("-");
  };
  for (auto& j : s.cron)
    rows.push_back({j.spec.name, j.source, j.spec.enabled ? "yes" : "no", when(j.next_run),
                    j.last_status.empty() ? "-" : j.last_status, when(j.last_run),
                    j.claim_owner.empty() ? "-" : j.claim_owner,
                    j.claim_owner.empty() ? "-" : protocol::format_utc(j.claim_until),
                    std::to_string(j.fence)});
  table(out, rows);
}

void print_sop(std::ostream& out, const snapshot& s) {
  if (s.sop.empty()) return;
  // SOP runs, in their own state words (the task table says running for a
  // parked run; this says what it waits for).
  out << "\nSOP runs (" << s.sop.size() << ")\n";
  std::vector<std::vector<std::string>> rows{
      {"id", "sop", "state", "step", "revision", "claim", "lease"}};
  for (auto& r : s.sop) {
    auto v = actors::sop_engine::view_of(r, true);
    rows.push_back({r.id.str(), r.sop, v.state, v.step.empty() ? "-" : v.step,
                    std::to_string(r.revision), r.owner.empty() ? "-" : r.owner,
                    r.owner.empty() ? "-" : protocol::format_utc(r.lease_until)});
  }
  table(out, rows);
}

constexpr const char* k_usage = "usage: tether inspect DB [--json] [--task ID | --lifecycle]\n";

int inspect(const args& a) {
  std::string path;
  std::optional<std::string> task;
  bool as_json = false, lifecycle = false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const auto& arg = a[i];
    if (arg == "--json") {
      as_json = true;
    } else if (arg == "--lifecycle" && !task) {
      lifecycle = true;
    } else if (arg == "--task" && !lifecycle && !task && i + 1 < a.size() && !a[i + 1].empty()) {
      task = a[++i];
    } else if (path.empty() && !arg.empty() && arg[0] != '-') {
      path = arg;
    } else {
      std::cerr << k_usage;
      return 2;
    }
  }
  if (path.empty()) {
    std::cerr << k_usage;
    return 2;
  }
  if (lifecycle) return inspect_lifecycle(path, as_json);
  if (task) return inspect_task(path, *task, as_json);
  auto s = read_snapshot(path);
  if (!s) {
    std::cerr << "tether inspect: " << s.error().message << "\n";
    return 1;
  }
  if (as_json)
    std::cout << protocol::to_text(to_json(*s)) << "\n";
  else {
    print_text(std::cout, *s);
    print_tasks(std::cout, *s);
    print_sop(std::cout, *s);
  }
  return 0;
}

registrar inspect_cmd{
    {"inspect",
     "DB [--json]: sessions, owed reports, every task, inboxes and receipts;\n"
     "                 DB --task ID [--json]: one task against its kind's lifecycle;\n"
     "                 DB --lifecycle [--json]: every kind's lifecycle (all read-only)",
     inspect}};

}  // namespace
}  // namespace tether::cli
