// bench_recovery: a host boots on a database that owes 100,000 reports (the
// settle transactions committed, the process died before any was admitted);
// how long until every one is in its parent's inbox.
//
// The database is written directly, in one transaction through the single
// writer: parents, their children (idle, no claim) and one terminal
// background job row per report with its rendered body, as task_store
// writes them. Two layouts: 1,000 parents x 100 children and one parent x
// 100,000 children (one report per child in both, so the session count is
// the same and only the fan-in differs).
//
// Timed from before host::open (open, boot, deliveries):
//   first_admitted: the admitted hook fired for the first report.
//   all_admitted: the admitted hook (host_options.observer) has fired for the
//     last report: the goal is <= 3 s.
//   boot_returned: boot() returned: every report admitted and its outbox row
//     completed (deleted), parents woken.
//   quiescent: every parent also drained its inbox into its transcript and
//     acknowledged it.
// Checks: one inbox row per report in the right parent's inbox, acknowledged
// and in its transcript once; the admitted hook fired once per report; boot
// counted them all delivered; the jobs table is empty. Prints "ok" 1 or 0.
#include <SQLiteCpp/Database.h>
#include <SQLiteCpp/Statement.h>

#include <boost/asio/io_context.hpp>
#include <cstdlib>
#include <ctime>
#include <filesystem>

#include "support.hpp"
#include "tether/actors/host.hpp"
#include "tether/persistence/task_store.hpp"
#include "tether/protocol/json.hpp"
#include "tether/protocol/report.hpp"
#include "tether/protocol/scope.hpp"
#include "tether/runtime/clock.hpp"
#include "tether/runtime/sync_wait.hpp"

namespace {

using namespace tether;
namespace asio = boost::asio;
namespace bench = tether::bench;
using asio::awaitable;
using bench::clock;
using protocol::notification_id;
using protocol::session_id;

constexpr char k_bench[] = "bench_recovery";
constexpr std::size_t k_threads = 2;
constexpr std::size_t k_reports = 100000;

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "bench_recovery: %s\n", what.c_str());
  std::exit(1);
}

using bench::cpu_seconds;

struct layout {
  std::string tag;
  std::size_t parents = 1000;
  std::size_t children = 100;  // per parent, one report each
  std::size_t reports() const { return parents * children; }
};

std::string parent_name(std::size_t p) {
  return "ses_parent" + std::to_string(p);
}
std::string child_name(std::size_t p, std::size_t c) {
  return "ses_p" + std::to_string(p) + "_c" + std::to_string(c);
}
// The parent is readable from the id, for the check.
std::string report_id(std::size_t p, std::size_t c) {
  return "msg_p" + std::to_string(p) + "_c" + std::to_string(c);
}

// The owed state, written as task_store's settle leaves it.
void write_owed(SQLite::Database& db, const layout& l) {
  auto now = runtime::now_ms();
  SQLite::Statement ses(db,
                        "INSERT INTO sessions (id, parent_id, description, agent, status, "
                        "idle_outcome, time_idle, seq, created_at) "
                        "VALUES (?, ?, ?, 'general', 'idle', ?, ?, ?, ?)");
  SQLite::Statement msg(db,
                        "INSERT INTO messages (session_id, seq, role, kind, status, payload) "
                        "VALUES (?, ?, ?, ?, 'completed', ?)");
  SQLite::Statement job(
      db,
      "INSERT INTO tasks (id, notification_id, kind, mode, parent_id, child_id, "
      "generation, state, body, payload, created_at, updated_at) "
      "VALUES (?, ?, 'subagent', 'background', ?, ?, ?, 'completed', ?, ?, ?, ?)");
  // Each report's outbox, as a settle leaves it: the pending terminal receipt.
  SQLite::Statement receipt(db,
                            "INSERT INTO receipts (id, task_id, transition, scope, body, state, "
                            "created_at, updated_at) VALUES (?, ?, 'completed', ?, ?, 'pending', "
                            "?, ?)");
  auto add_session = [&](const std::string& id, const std::optional<std::string>& parent,
                         const std::string& description, std::int64_t seq) {
    ses.reset();
    ses.bind(1, id);
    if (parent)
      ses.bind(2, *parent);
    else
      ses.bind(2);
    ses.bind(3, description);
    ses.bind(4, "completed");
    ses.bind(5, now);
    ses.bind(6, seq);
    ses.bind(7, now);
    ses.exec();
  };
  auto add_message = [&](const std::string& s, std::int64_t seq, const char* role, const char* kind,
                         const std::string& text) {
    msg.reset();
    msg.bind(1, s);
    msg.bind(2, seq);
    msg.bind(3, role);
    msg.bind(4, kind);
    msg.bind(5, protocol::to_text(protocol::json::object{{"text", text}}));
    msg.exec();
  };
  std::int64_t generation = 0;
  for (std::size_t p = 0; p < l.parents; ++p) {
    auto parent = parent_name(p);
    add_session(parent, std::nullopt, "bench parent", 1);
    add_message(parent, 1, "user", "prompt", "spawn your children");
    for (std::size_t c = 0; c < l.children; ++c) {
      auto child = child_name(p, c);
      std::string description = "bench child " + std::to_string(c);
      std::string answer = child + " answers: the work is done.";
      add_session(child, parent, description, 2);
      add_message(child, 1, "user", "prompt", "start");
      add_message(child, 2, "assistant", "answer", answer);
      auto body = protocol::render_report(session_id(child), protocol::report_state::completed,
                                          description, answer);
      auto nid = report_id(p, c);
      job.reset();
      job.bind(1, "job_" + nid.substr(4));
      job.bind(2, nid);
      job.bind(3, parent);
      job.bind(4, child);
      job.bind(5, ++generation);
      job.bind(6, body);
      job.bind(7, protocol::to_text(protocol::json::object{{"description", description}}));
      job.bind(8, now);
      job.bind(9, now);
      job.exec();
      protocol::owner_scope scope;
      scope.tenant = protocol::tenant_id("default");
      scope.thread = session_id(parent);
      auto task = "job_" + nid.substr(4);
      receipt.reset();
      receipt.bind(1, task + "/completed");
      receipt.bind(2, task);
      receipt.bind(3, protocol::to_text(protocol::to_json(scope)));
      receipt.bind(4, body);
      receipt.bind(5, now);
      receipt.bind(6, now);
      receipt.exec();
    }
  }
}

void build(const std::string& path, const layout& l) {
  persistence::db_options o;
  o.path = path;
  auto w = persistence::writer::open(o);
  if (!w) die("writer::open failed: " + w.error().message);
  asio::io_context io(1);
  auto op = [&l](SQLite::Database& db) { write_owed(db, l); };
  std::string name = "write " + std::to_string(l.reports()) + " owed reports";
  auto r = runtime::run_to_completion(io, (*w)->write(std::move(name), 0, std::move(op)));
  if (!r) die("building the database failed: " + r.error().message);
  (*w)->stop();
}

// A parent's agent takes no turn on a report.
class quiet_agent : public actors::agent {
 public:
  awaitable<void> drain(actors::agent_context&, actors::drain_input) override { co_return; }
};
class quiet_agents : public actors::agent_factory {
 public:
  std::shared_ptr<actors::agent> make(const persistence::session_row&) override {
    return std::make_shared<quiet_agent>();
  }
};

class admit_counter : public actors::run_observer {
 public:
  void admitted(const session_id&, const notification_id&) override {
    auto now = clock::now();
    std::lock_guard lk(m_);
    if (count_++ == 0) first_ = now;
    last_ = now;
  }
  struct seen {
    std::size_t count;
    clock::time_point first, last;
  };
  seen get() {
    std::lock_guard lk(m_);
    return {count_, first_, last_};
  }

 private:
  std::mutex m_;
  std::size_t count_ = 0;
  clock::time_point first_{}, last_{};
};

struct outcome {
  double first_admitted = 0;  // seconds from before host::open
  double all_admitted = 0;
  double boot_returned = 0;
  double quiescent = 0;
  double open = 0;
  double cpu = 0;
  bool ok = false;
};

bool check(const std::string& path, const layout& l, std::size_t hooks, int delivered) {
  SQLite::Database db(path, SQLite::OPEN_READONLY);
  bool ok = true;
  auto fail = [&](const std::string& what) {
    std::fprintf(stderr, "bench_recovery: %s: check failed: %s\n", l.tag.c_str(), what.c_str());
    ok = false;
  };
  auto n = l.reports();
  // Delivered tasks stay, terminal; none may still owe its report.
  auto outstanding = persistence::task_reader(path).outstanding_jobs();
  if (auto jobs = outstanding ? static_cast<std::int64_t>(outstanding->size()) : -1; jobs != 0)
    fail(std::to_string(jobs) + " tasks still running or owing their report");
  if (hooks != n)
    fail("the admitted hook fired " + std::to_string(hooks) + " times for " + std::to_string(n) +
         " reports");
  if (delivered != static_cast<int>(n))
    fail("boot counted " + std::to_string(delivered) + " delivered, expected " + std::to_string(n));
  std::size_t rows = 0;
  SQLite::Statement q(db, "SELECT session_id, notification_id, state FROM inbox");
  while (q.executeStep()) {
    ++rows;
    std::string parent = q.getColumn(0).getString();
    std::string nid = q.getColumn(1).getString();
    // msg_p<P>_c<C> belongs to ses_parent<P>.
    auto cut = nid.find("_c");
    if (nid.rfind("msg_p", 0) != 0 || cut == std::string::npos ||
        "ses_parent" + nid.substr(5, cut - 5) != parent) {
      fail("report " + nid + " is in the inbox of " + parent);
      break;
    }
    if (q.getColumn(2).getString() != "acked") {
      fail("report " + nid + " was not acknowledged");
      break;
    }
  }
  auto distinct = db.execAndGet("SELECT count(DISTINCT notification_id) FROM inbox").getInt64();
  auto in_transcripts =
      db.execAndGet("SELECT count(*) FROM messages WHERE kind = 'report'").getInt64();
  if (rows != n || static_cast<std::size_t>(distinct) != n)
    fail(std::to_string(rows) + " inbox rows (" + std::to_string(distinct) +
         " distinct), expected " + std::to_string(n));
  if (static_cast<std::size_t>(in_transcripts) != n)
    fail(std::to_string(in_transcripts) + " reports in transcripts, expected " + std::to_string(n));
  return ok;
}

outcome run(const std::string& dir, const layout& l) {
  std::string path = dir + "/" + l.tag + ".db";
  build(path, l);
  auto counter = std::make_shared<admit_counter>();
  actors::host_options opts;
  opts.db_path = path;
  opts.sync = persistence::sync_mode::full;
  opts.threads = k_threads;
  opts.agents = std::make_shared<quiet_agents>();
  opts.observer = counter;
  opts.log = [](const std::string& w) {
    std::fprintf(stderr, "bench_recovery: host: %s\n", w.c_str());
  };

  outcome o;
  double cpu0 = cpu_seconds();
  auto t0 = clock::now();
  auto h = actors::host::open(opts);
  if (!h) die("host::open failed: " + h.error().message);
  o.open = bench::seconds_since(t0);
  auto& host = **h;
  auto rep = runtime::sync_wait(host.pool().at(0), host.boot());
  if (!rep) die("boot failed: " + rep.error().message);
  o.boot_returned = bench::seconds_since(t0);
  runtime::sync_wait(host.pool().at(0), host.wait_quiescent(false));
  o.quiescent = bench::seconds_since(t0);
  o.cpu = cpu_seconds() - cpu0;
  auto seen = counter->get();
  o.first_admitted = std::chrono::duration<double>(seen.first - t0).count();
  o.all_admitted = std::chrono::duration<double>(seen.last - t0).count();
  host.shutdown();
  h->reset();
  o.ok = check(path, l, seen.count, rep->delivered);
  return o;
}

void emit_run(const layout& l, const outcome& o) {
  const std::string f = l.tag;
  auto n = static_cast<double>(l.reports());
  bench::emit(k_bench, f + "_reports", n, "reports");
  bench::emit(k_bench, f + "_all_admitted", o.all_admitted, "s");
  bench::emit(k_bench, f + "_admit_rate", n / o.all_admitted, "reports/s");
  bench::emit(k_bench, f + "_open", o.open, "s");
  bench::emit(k_bench, f + "_first_admitted", o.first_admitted, "s");
  bench::emit(k_bench, f + "_boot_returned", o.boot_returned, "s");
  bench::emit(k_bench, f + "_quiescent", o.quiescent, "s");
  bench::emit(k_bench, f + "_cpu_us_per_report", o.cpu * 1e6 / n, "us");
  bench::emit(k_bench, f + "_ok", o.ok ? 1 : 0, "bool");
}

std::string make_temp_dir() {
  std::string tmpl =
      (std::filesystem::temp_directory_path() / "tether-bench-recovery-XXXXXX").string();
  if (!::mkdtemp(tmpl.data())) die("cannot create a temp dir under /tmp");
  return tmpl;
}

}  // namespace

// Usage: bench_recovery             both layouts
//        bench_recovery P C         P parents x C children
int main(int argc, char** argv) {
  std::string dir = make_temp_dir();
  std::vector<layout> layouts;
  if (argc >= 3) {
    layouts.push_back(
        {"custom", std::strtoul(argv[1], nullptr, 10), std::strtoul(argv[2], nullptr, 10)});
  } else {
    layouts.push_back({"parents_1000", 1000, k_reports / 1000});
    layouts.push_back({"parents_1", 1, k_reports});
  }
  bool ok = true;
  for (auto& l : layouts) {
    auto o = run(dir, l);
    emit_run(l, o);
    ok = ok && o.ok;
  }
  bench::emit(k_bench, "ok", ok ? 1 : 0, "bool");
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  return ok ? 0 : 1;
}
