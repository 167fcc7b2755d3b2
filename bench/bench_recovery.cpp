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
//
// The raw baseline (issue 15, target 6: all admitted within 1.2x of it, boot
// returned within 1.5x), measured in the same run on copies of the same
// seeded file (built once, checkpointed and fsynced, so every run starts from
// the same durable bytes): a plain SQLite program (SQLiteCpp, WAL,
// synchronous=FULL, the runtime's other write-connection pragmas: foreign
// keys, temp_store, cache_size; prepared statements) writing what admitting
// the owed reports must durably write at minimum, as admit_in_tx writes it:
// one SELECT of the owed rows (outstanding_jobs' WHERE and ORDER BY, only the
// columns needed), each parent's rows together in the order read; per
// transaction and parent, its seq and last admission order; per report, the
// inbox row (INSERT OR IGNORE, the same columns and values) and its terminal
// receipt pending -> acked (the same UPDATE). Timed from that SELECT to the
// last COMMIT. raw_insert: 512 reports per transaction (deliver_owed's
// chunk); raw_one_tx: one transaction for all, the disk's ceiling. It leaves
// out what only the runtime does: opening the host, the other boot reads
// (sessions, pending receipts), actors, mailboxes, the writer's queue and
// its savepoints, the parents' wakes and drains. It checks its own counts
// (every row read, inserted and acknowledged once) and exits 1 if they are
// off. A summary JSON line per layout ends the output.
//
// Each measurement (the runtime's, and each raw baseline's) runs in a process
// of its own, as a separate program would: this program exec'd again with
// --measure. None starts with a heap, page cache or allocator another
// measurement (or the seeding) warmed; the first measurement in one process
// used to pay for that alone (the runtime's, about 0.2 s of its open).
#include <SQLiteCpp/Database.h>
#include <SQLiteCpp/Statement.h>
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <boost/asio/io_context.hpp>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <limits>
#include <sstream>

#include "raw_admit.hpp"
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
constexpr std::size_t k_chunk = 512;  // reports per admit in host::deliver_owed

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
  w->reset();
  // The whole database in the main file, so that a copy of it is all of it.
  SQLite::Database db(path, SQLite::OPEN_READWRITE);
  db.exec("PRAGMA wal_checkpoint(TRUNCATE)");
}

void fsync_file(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0 || ::fsync(fd) != 0) die("cannot fsync " + path);
  ::close(fd);
}

// A run's own copy of the seeded file, on disk before it starts: a COMMIT or
// checkpoint of the run must not pay for flushing the copy.
void copy_db(const std::string& from, const std::string& to) {
  std::error_code ec;
  if (std::filesystem::file_size(from + "-wal", ec) > 0 && !ec)
    die(from + " still has a WAL after its checkpoint");
  std::filesystem::copy_file(from, to, std::filesystem::copy_options::overwrite_existing, ec);
  if (ec) die("copying " + from + " to " + to + ": " + ec.message());
  fsync_file(to);
}

void remove_db(const std::string& path) {
  std::error_code ec;
  for (const char* side : {"", "-wal", "-shm"}) std::filesystem::remove(path + side, ec);
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

outcome run(const std::string& path, const layout& l) {
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

// The raw baseline (see the header): what admitting the owed reports writes,
// by a plain program, `chunk` reports per transaction.
struct raw_outcome {
  double seconds = 0;  // from the SELECT of the owed rows to the last COMMIT
  double cpu = 0;
  std::size_t transactions = 0;
};

raw_outcome raw_admit(const std::string& path, const layout& l, std::size_t chunk) {
  const std::string what = "raw baseline (" + l.tag + ", " +
                           (chunk == std::numeric_limits<std::size_t>::max()
                                ? std::string("one transaction")
                                : std::to_string(chunk) + " per transaction") +
                           "): ";
  SQLite::Database db(path, SQLite::OPEN_READWRITE);
  db.exec("PRAGMA journal_mode = WAL");
  db.exec("PRAGMA synchronous = FULL");
  db.exec("PRAGMA foreign_keys = ON");
  db.exec("PRAGMA temp_store = MEMORY");
  db.exec("PRAGMA cache_size = -32768");
  // outstanding_jobs: running rows and rows whose terminal receipt is pending.
  SQLite::Statement owed(db,
                         "SELECT id, notification_id, parent_id, child_id, body, state FROM tasks "
                         "WHERE kind = 'subagent' AND (state IN ('admitted', 'running') OR id IN "
                         "(SELECT task_id FROM receipts WHERE state = 'pending' AND "
                         "transition != 'started')) ORDER BY created_at, id");
  bench::raw_admit admits(db);
  struct owed_row {
    std::string nid, parent, child, body;
  };
  std::vector<owed_row> rows;
  std::size_t running = 0, inserted = 0, acknowledged = 0;
  raw_outcome o;
  double cpu0 = cpu_seconds();
  auto t0 = clock::now();
  while (owed.executeStep()) {
    auto state = owed.getColumn(5).getString();
    if (state == "admitted" || state == "running") {
      ++running;  // owes nothing yet
      continue;
    }
    rows.push_back({owed.getColumn(1).getString(), owed.getColumn(2).getString(),
                    owed.getColumn(3).getString(), owed.getColumn(4).getString()});
  }
  owed.reset();
  // Each parent's reports together, in the order read (the outbox's order).
  std::stable_sort(rows.begin(), rows.end(),
                   [](const owed_row& a, const owed_row& b) { return a.parent < b.parent; });
  for (std::size_t at = 0; at < rows.size();) {
    std::size_t end = at + std::min(chunk, rows.size() - at);
    db.exec("BEGIN IMMEDIATE");
    auto now = runtime::now_ms();
    const std::string* parent = nullptr;
    std::int64_t at_seq = 0, ord = 0;
    for (; at < end; ++at) {
      const auto& r = rows[at];
      if (!parent || *parent != r.parent) {
        parent = &r.parent;
        if (!admits.position(r.parent, at_seq, ord))
          die(what + "parent '" + r.parent + "' is not in sessions");
      }
      inserted += static_cast<std::size_t>(
          admits.admit(r.parent, r.nid, r.child, r.body, at_seq, now, ++ord, acknowledged));
    }
    db.exec("COMMIT");
    ++o.transactions;
  }
  o.seconds = bench::seconds_since(t0);
  o.cpu = cpu_seconds() - cpu0;

  auto n = l.reports();
  auto count = [&db](const char* sql) {
    return static_cast<std::size_t>(db.execAndGet(sql).getInt64());
  };
  auto expect = [&](const std::string& name, std::size_t got, std::size_t want) {
    if (got != want)
      die(what + std::to_string(got) + " " + name + ", expected " + std::to_string(want));
  };
  expect("running rows read", running, 0);
  expect("owed rows read", rows.size(), n);
  expect("inbox rows inserted", inserted, n);
  expect("receipts acknowledged", acknowledged, n);
  expect("inbox rows on disk", count("SELECT count(*) FROM inbox"), n);
  expect("distinct reports in the inbox",
         count("SELECT count(DISTINCT notification_id) FROM inbox"), n);
  expect("terminal receipts acked on disk",
         count("SELECT count(*) FROM receipts WHERE transition != 'started' AND state = 'acked'"),
         n);
  expect("terminal receipts still pending",
         count("SELECT count(*) FROM receipts WHERE transition != 'started' AND "
               "state = 'pending'"),
         0);
  return o;
}

void emit_raw(const layout& l, const outcome& o, const raw_outcome& raw,
              const raw_outcome& one_tx) {
  const std::string f = l.tag;
  bench::emit(k_bench, f + "_raw_insert_s", raw.seconds, "s");
  bench::emit(k_bench, f + "_raw_insert_cpu_s", raw.cpu, "s");
  bench::emit(k_bench, f + "_raw_insert_transactions", static_cast<double>(raw.transactions),
              "transactions");
  bench::emit(k_bench, f + "_raw_one_tx_s", one_tx.seconds, "s");
  bench::emit(k_bench, f + "_raw_one_tx_cpu_s", one_tx.cpu, "s");
  bench::emit(k_bench, f + "_all_admitted_vs_raw", o.all_admitted / raw.seconds, "ratio");
  bench::emit(k_bench, f + "_boot_returned_vs_raw", o.boot_returned / raw.seconds, "ratio");
}

// The layout's closing line: the runtime's figures beside the raw baseline's.
void print_summary(const layout& l, const outcome& o, const raw_outcome& raw,
                   const raw_outcome& one_tx) {
  using bench::number;
  auto n = static_cast<double>(l.reports());
  double admitted_vs = o.all_admitted / raw.seconds, boot_vs = o.boot_returned / raw.seconds;
  std::printf(
      "{\"bench\":\"recovery\",\"layout\":\"%s\",\"parents\":%zu,\"children\":%zu,"
      "\"reports\":%zu,\"sync\":\"full\",\"chunk\":%zu,\"all_admitted_s\":%s,"
      "\"boot_returned_s\":%s,\"quiescent_s\":%s,\"raw_insert_s\":%s,\"raw_one_tx_s\":%s,"
      "\"cpu_us_per_report\":%s,\"raw_cpu_us_per_report\":%s,\"all_admitted_vs_raw\":%s,"
      "\"boot_returned_vs_raw\":%s,\"targets\":{\"all_admitted_vs_raw\":1.2,"
      "\"boot_returned_vs_raw\":1.5},\"target_met\":%s,\"ok\":%s}\n",
      l.tag.c_str(), l.parents, l.children, l.reports(), k_chunk, number(o.all_admitted).c_str(),
      number(o.boot_returned).c_str(), number(o.quiescent).c_str(), number(raw.seconds).c_str(),
      number(one_tx.seconds).c_str(), number(o.cpu * 1e6 / n).c_str(),
      number(raw.cpu * 1e6 / n).c_str(), number(admitted_vs).c_str(), number(boot_vs).c_str(),
      admitted_vs <= 1.2 && boot_vs <= 1.5 ? "true" : "false", o.ok ? "true" : "false");
  std::fflush(stdout);
}

outcome run_apart(const std::string& path, const layout& l) {
  auto v = bench::measure_apart(
      k_bench,
      {"--measure", "runtime", path, l.tag, std::to_string(l.parents), std::to_string(l.children)},
      7);
  outcome o;
  o.first_admitted = v[0], o.all_admitted = v[1], o.boot_returned = v[2], o.quiescent = v[3];
  o.open = v[4], o.cpu = v[5], o.ok = v[6] != 0;
  return o;
}

raw_outcome raw_apart(const std::string& path, const layout& l, std::size_t chunk) {
  auto v = bench::measure_apart(k_bench,
                                {"--measure", "raw", path, l.tag, std::to_string(l.parents),
                                 std::to_string(l.children), std::to_string(chunk)},
                                3);
  raw_outcome o;
  o.seconds = v[0], o.cpu = v[1], o.transactions = static_cast<std::size_t>(v[2]);
  return o;
}

// --measure runtime PATH TAG P C | --measure raw PATH TAG P C CHUNK: one
// measurement, its numbers on one line.
int measure(int argc, char** argv) {
  if (argc < 7) die("--measure needs WHAT PATH TAG PARENTS CHILDREN [CHUNK]");
  std::string what = argv[2], path = argv[3];
  layout l{argv[4], std::strtoul(argv[5], nullptr, 10), std::strtoul(argv[6], nullptr, 10)};
  if (what == "runtime") {
    auto o = run(path, l);
    std::printf("%.9g %.9g %.9g %.9g %.9g %.9g %d\n", o.first_admitted, o.all_admitted,
                o.boot_returned, o.quiescent, o.open, o.cpu, o.ok ? 1 : 0);
    return 0;
  }
  if (what == "raw" && argc >= 8) {
    auto o = raw_admit(path, l, std::strtoull(argv[7], nullptr, 10));
    std::printf("%.9g %.9g %zu\n", o.seconds, o.cpu, o.transactions);
    return 0;
  }
  die("--measure " + what + ": not a measurement (runtime, raw with a chunk)");
}

}  // namespace

// Usage: bench_recovery             both layouts
//        bench_recovery P C         P parents x C children
//        bench_recovery --measure ...  one measurement (this program runs it)
int main(int argc, char** argv) {
  if (argc >= 2 && std::string(argv[1]) == "--measure") return measure(argc, argv);
  std::string dir = bench::make_temp_dir("bench-recovery");
  std::vector<layout> layouts;
  if (argc >= 3) {
    layouts.push_back(
        {"custom", std::strtoul(argv[1], nullptr, 10), std::strtoul(argv[2], nullptr, 10)});
  } else {
    layouts.push_back({"parents_1000", 1000, k_reports / 1000});
    layouts.push_back({"parents_1", 1, k_reports});
  }
  bool ok = true;
  struct measured {
    outcome o;
    raw_outcome raw, one_tx;
  };
  std::vector<measured> results;
  for (auto& l : layouts) {
    // One seeded file; the runtime and each raw run get their own copy of it.
    std::string seed = dir + "/" + l.tag + ".seed.db", path = dir + "/" + l.tag + ".db";
    build(seed, l);
    measured m;
    copy_db(seed, path);
    m.o = run_apart(path, l);
    remove_db(path);
    emit_run(l, m.o);
    copy_db(seed, path);
    m.raw = raw_apart(path, l, k_chunk);
    remove_db(path);
    copy_db(seed, path);
    m.one_tx = raw_apart(path, l, std::numeric_limits<std::size_t>::max());
    remove_db(path);
    remove_db(seed);
    emit_raw(l, m.o, m.raw, m.one_tx);
    results.push_back(m);
    ok = ok && m.o.ok;
  }
  bench::emit(k_bench, "ok", ok ? 1 : 0, "bool");
  for (std::size_t i = 0; i < layouts.size(); ++i)
    print_summary(layouts[i], results[i].o, results[i].raw, results[i].one_tx);
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  return ok ? 0 : 1;
}
