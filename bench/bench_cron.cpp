// bench_cron: finding and claiming due cron jobs (issue 13) on a table of
// 100,000 schedules, through the task store's claim compare-and-set
// (task_store::cron_claim_due, as the scheduler actor calls it), next to a raw
// SQLite loop doing the minimal writes of the same claims, in the same run, on
// the same disk, with the same sync mode (WAL and synchronous=FULL, the
// default: every COMMIT fsynced).
//
// Setup: a fresh database in a scratch directory; N runtime jobs (`every`
// one hour, shell `true`), inserted through the writer directly, 10,000 per
// transaction with the upsert cron_put does (cron_put itself, one commit per
// job, is timed on the first `put_sample` jobs and reported as puts/s). Every
// job is due at the bench's `now`: next_run spread over the N ms before it.
// The database is then copied (VACUUM INTO) for the raw side, so both sides
// start from the same rows.
//
// Figures, each side claiming every due job exactly once:
//   next_wake_ms     the first cron_next_wake() read on the full table (the
//                    due detection query the scheduler sleeps on), and again
//                    once every job is claimed (then the minimum lease);
//   batch1           the first `batch1_claims` jobs claimed one per
//                    transaction (limit 1);
//   batch64          the rest claimed 64 per transaction (limit 64, the
//                    scheduler's batch) until none is due; with the claims/s
//                    of its first and last tenth of calls, and CPU seconds.
// The raw side, on the copy, per transaction: BEGIN IMMEDIATE; the store's
// due SELECT (same SQL, same limit); per job `UPDATE cron_jobs SET
// claim_owner, claim_until, fence = fence + 1, updated_at WHERE name AND
// fence` and an INSERT of the run task row in `tasks` (same id, columns and
// payload); COMMIT.
// It skips what the store adds: decoding the spec, checking for an earlier
// run task, the writer's queue and savepoint, and the coroutine hop.
// Checks: every job claimed once on each side (fence 1, one run task each),
// no commit failed. Prints "ok" 1 or 0 (exits 1 unless ok).
//
// Output: one JSON figure per line (support.hpp), then one summary object
// {"bench":"cron",...} with the headline figures.
//
// Usage: bench_cron [--jobs N] [--quick] [--raw-first]
//        default N = 100000; --quick: N = 10000; --raw-first: the raw side
//        claims first. put_sample = min(500, N/10), batch1_claims =
//        min(1000, N/10). The database goes to a fresh directory under $TMPDIR.
// The due SELECT reads the partial index of unclaimed jobs (schema step 10),
// so a claimed job is never walked again: a drain of N due jobs is linear.
// (A first version indexed every enabled job, and each pass re-skipped the
// claimed ones with a table lookup: quadratic, minutes for 100,000.)
#include <SQLiteCpp/Database.h>
#include <SQLiteCpp/Statement.h>

#include <boost/json.hpp>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "support.hpp"
#include "tether/persistence/task_store.hpp"
#include "tether/persistence/writer.hpp"
#include "tether/protocol/cron.hpp"
#include "tether/protocol/json.hpp"
#include "tether/protocol/scope.hpp"
#include "tether/runtime/clock.hpp"
#include "tether/runtime/executor_pool.hpp"
#include "tether/runtime/sync_wait.hpp"

namespace {

using namespace tether;
namespace bench = tether::bench;
namespace fs = std::filesystem;
namespace json = boost::json;
using bench::clock;
using bench::number;

constexpr char k_bench[] = "bench_cron";
constexpr std::int64_t k_now = 1'800'000'000'000;  // the bench's "now" (2027-01-15)
constexpr std::int64_t k_every = 3'600'000;
constexpr std::int64_t k_lease = k_now + 600'000;
constexpr const char* k_owner = "bench-claimant";
// The store's query for unclaimed due jobs (no lease expires in the bench).
constexpr const char* k_due_sql =
    "SELECT name, spec, next_run, fence FROM cron_jobs WHERE enabled = 1 AND claim_owner IS "
    "NULL AND next_run <= ? ORDER BY next_run, name LIMIT ?";

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "bench_cron: %s\n", what.c_str());
  std::exit(1);
}

std::string job_name(std::size_t i) {
  char b[32];
  std::snprintf(b, sizeof b, "job-%06zu", i);
  return b;
}

protocol::cron_job_spec spec_of(std::size_t i, std::int64_t anchor) {
  protocol::cron_job_spec s;
  s.name = job_name(i);
  s.agent = "bench";
  s.when = protocol::every_schedule{k_every, anchor};
  s.kind = protocol::cron_action_kind::shell;
  s.command = "true";
  return s;
}

// Job i is due at now - (n - i): all due, oldest first in index order.
std::int64_t next_run_of(std::size_t i, std::size_t n) {
  return k_now - static_cast<std::int64_t>(n - i);
}

double ms_since(clock::time_point t0) {
  return bench::seconds_since(t0) * 1000.0;
}

using bench::cpu_seconds;

struct phase {
  std::size_t claims = 0;
  std::uint64_t transactions = 0;
  double seconds = 0;
  double cpu = 0;  // process CPU seconds (all threads: the writer's included)
  // Per call: (claims so far, seconds so far), to compare the first and the
  // last tenth of the calls (the due SELECT skips the claimed rows).
  std::vector<std::pair<std::size_t, double>> marks;
  double rate() const { return seconds > 0 ? static_cast<double>(claims) / seconds : NAN; }
  double tenth_rate(bool last) const {
    if (marks.size() < 20) return NAN;
    std::size_t k = marks.size() / 10;
    auto a = last ? marks[marks.size() - 1 - k] : std::pair<std::size_t, double>{0, 0.0};
    auto b = last ? marks.back() : marks[k - 1];
    return static_cast<double>(b.first - a.first) / (b.second - a.second);
  }
};

// ---- the store side ----

// Claims up to `max_claims` (0: until none is due) with `limit` per call.
phase store_claims(persistence::task_store& store, persistence::writer& w,
                   runtime::executor_pool& pool, int limit, std::size_t max_claims) {
  phase p;
  auto before = w.stats().transactions;
  auto c0 = cpu_seconds();
  auto t0 = clock::now();
  for (;;) {
    int l = limit;
    if (max_claims) {
      if (p.claims >= max_claims) break;
      l = static_cast<int>(std::min<std::size_t>(limit, max_claims - p.claims));
    }
    auto got = runtime::sync_wait(pool.at(0), store.cron_claim_due(k_now, k_owner, k_lease, l));
    if (!got) die("cron_claim_due: " + got.error().message);
    if (got->empty()) break;
    for (auto& c : *got)
      if (c.fence != 1 || c.attempt != 0 || c.reclaimed) die("unexpected claim " + c.task.str());
    p.claims += got->size();
    p.marks.emplace_back(p.claims, bench::seconds_since(t0));
  }
  p.seconds = bench::seconds_since(t0);
  p.cpu = cpu_seconds() - c0;
  p.transactions = w.stats().transactions - before;
  return p;
}

// ---- the raw side ----

struct raw_db {
  SQLite::Database db;
  SQLite::Statement due, cas, run;
  std::string scope_prefix;
  explicit raw_db(const std::string& path)
      : db(path, SQLite::OPEN_READWRITE),
        due(db, k_due_sql),
        cas(db,
            "UPDATE cron_jobs SET claim_owner = ?, claim_until = ?, fence = fence + 1, "
            "updated_at = ? WHERE name = ? AND fence = ?"),
        run(db,
            "INSERT INTO tasks (id, kind, state, tenant, thread, turn, scope, payload, owner, "
            "lease_until, created_at, updated_at) VALUES (?, 'cron_run', 'admitted', ?, ?, ?, ?, "
            "?, ?, ?, ?, ?)") {}
};

void open_pragmas(SQLite::Database& db) {
  db.setBusyTimeout(5000);
  db.exec("PRAGMA journal_mode = WAL");
  db.exec("PRAGMA synchronous = FULL");
  db.exec("PRAGMA foreign_keys = ON");
  db.exec("PRAGMA temp_store = MEMORY");
  db.exec("PRAGMA cache_size = -32768");
}

phase raw_claims(raw_db& r, int limit, std::size_t max_claims) {
  phase p;
  auto c0 = cpu_seconds();
  auto t0 = clock::now();
  struct due {
    std::string name, spec;
    std::int64_t next_run, fence;
  };
  std::vector<due> found;
  for (;;) {
    int l = limit;
    if (max_claims) {
      if (p.claims >= max_claims) break;
      l = static_cast<int>(std::min<std::size_t>(limit, max_claims - p.claims));
    }
    r.db.exec("BEGIN IMMEDIATE");
    found.clear();
    r.due.bind(1, k_now);
    r.due.bind(2, l);
    while (r.due.executeStep())
      found.push_back({r.due.getColumn(0).getString(), r.due.getColumn(1).getString(),
                       r.due.getColumn(2).getInt64(), r.due.getColumn(3).getInt64()});
    r.due.reset();
    std::size_t n = 0;
    for (auto& d : found) {
      auto now = runtime::now_ms();
      r.cas.bind(1, k_owner);
      r.cas.bind(2, k_lease);
      r.cas.bind(3, now);
      r.cas.bind(4, d.name);
      r.cas.bind(5, d.fence);
      bool won = r.cas.exec() == 1;
      r.cas.reset();
      if (!won) continue;
      protocol::owner_scope scope;
      scope.tenant = protocol::tenant_id("default");
      scope.thread = protocol::session_id("cron:" + d.name);
      scope.turn = protocol::turn_id(std::to_string(d.next_run));
      json::object payload{{"job", d.name}, {"occurrence", d.next_run}, {"fence", d.fence + 1},
                           {"attempt", 0},  {"agent", "bench"},         {"action", "shell"}};
      r.run.bind(1, persistence::cron_run_id(d.name, d.next_run).str());
      r.run.bind(2, scope.tenant.str());
      r.run.bind(3, scope.thread.str());
      r.run.bind(4, scope.turn.str());
      r.run.bind(5, protocol::to_text(protocol::to_json(scope)));
      r.run.bind(6, protocol::to_text(payload));
      r.run.bind(7, k_owner);
      r.run.bind(8, k_lease);
      r.run.bind(9, now);
      r.run.bind(10, now);
      r.run.exec();
      r.run.reset();
      ++n;
    }
    r.db.exec("COMMIT");
    ++p.transactions;
    if (found.empty()) break;
    p.claims += n;
    p.marks.emplace_back(p.claims, bench::seconds_since(t0));
  }
  p.seconds = bench::seconds_since(t0);
  p.cpu = cpu_seconds() - c0;
  return p;
}

// ---- checks ----

bool check(const std::string& path, std::size_t n, const char* side) {
  SQLite::Database db(path, SQLite::OPEN_READONLY);
  auto claimed = db.execAndGet(
                       "SELECT count(*) FROM cron_jobs WHERE fence = 1 AND claim_owner = "
                       "'bench-claimant'")
                     .getInt64();
  auto runs =
      db.execAndGet("SELECT count(*) FROM tasks WHERE kind = 'cron_run' AND state = 'admitted'")
          .getInt64();
  bool ok = static_cast<std::size_t>(claimed) == n && static_cast<std::size_t>(runs) == n;
  if (!ok)
    std::fprintf(stderr, "bench_cron: check failed (%s): %lld claimed, %lld run tasks, %zu jobs\n",
                 side, static_cast<long long>(claimed), static_cast<long long>(runs), n);
  return ok;
}

std::string make_temp_dir() {
  std::string tmpl = (fs::temp_directory_path() / "tether-bench-cron-XXXXXX").string();
  if (!::mkdtemp(tmpl.data())) die("cannot create a temp dir under " + tmpl);
  return tmpl;
}

void emit_phase(const std::string& f, const phase& p) {
  bench::emit(k_bench, f + "_claims", static_cast<double>(p.claims), "claims");
  bench::emit(k_bench, f + "_claims_per_s", p.rate(), "claims/s");
  bench::emit(k_bench, f + "_seconds", p.seconds, "s");
  bench::emit(k_bench, f + "_transactions", static_cast<double>(p.transactions), "commits");
  bench::emit(k_bench, f + "_cpu_seconds", p.cpu, "s");
  bench::emit(k_bench, f + "_first_tenth_claims_per_s", p.tenth_rate(false), "claims/s");
  bench::emit(k_bench, f + "_last_tenth_claims_per_s", p.tenth_rate(true), "claims/s");
}

std::string phase_json(const phase& p) {
  return "{\"claims\":" + number(static_cast<double>(p.claims)) +
         ",\"claims_per_s\":" + number(p.rate()) + ",\"seconds\":" + number(p.seconds) +
         ",\"transactions\":" + number(static_cast<double>(p.transactions)) +
         ",\"cpu_seconds\":" + number(p.cpu) +
         ",\"first_tenth_claims_per_s\":" + number(p.tenth_rate(false)) +
         ",\"last_tenth_claims_per_s\":" + number(p.tenth_rate(true)) + "}";
}

}  // namespace

int main(int argc, char** argv) {
  std::size_t n = 100000;
  bool raw_first = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--quick") == 0)
      n = 10000;
    else if (std::strcmp(argv[i], "--jobs") == 0 && i + 1 < argc)
      n = std::strtoul(argv[++i], nullptr, 10);
    else if (std::strcmp(argv[i], "--raw-first") == 0)
      raw_first = true;
    else
      die("usage: bench_cron [--jobs N] [--quick] [--raw-first]");
  }
  if (n < 100) die("--jobs must be at least 100");
  const std::size_t put_sample = std::min<std::size_t>(500, n / 10);
  const std::size_t batch1_claims = std::min<std::size_t>(1000, n / 10);

  fs::path dir = make_temp_dir();
  persistence::db_options db;
  db.path = (dir / "tether.db").string();
  db.sync = persistence::sync_mode::full;
  db.create = true;
  auto w = persistence::writer::open(db);
  if (!w) die("opening " + db.path + ": " + w.error().message);
  persistence::task_store store(**w, db.path);
  runtime::executor_pool pool(1);

  bench::emit_text(k_bench, "sync_mode", "full", "mode");
  bench::emit(k_bench, "jobs", static_cast<double>(n), "jobs");

  // Insert: the first put_sample through cron_put, one commit each.
  auto t0 = clock::now();
  for (std::size_t i = 0; i < put_sample; ++i) {
    persistence::cron_job_row row;
    row.spec = spec_of(i, next_run_of(i, n));
    row.next_run = next_run_of(i, n);
    auto r = runtime::sync_wait(pool.at(0), store.cron_put(std::move(row)));
    if (!r) die("cron_put: " + r.error().message);
  }
  double put_s = bench::seconds_since(t0);
  bench::emit(k_bench, "cron_put_jobs", static_cast<double>(put_sample), "jobs");
  bench::emit(k_bench, "cron_put_per_s", static_cast<double>(put_sample) / put_s, "puts/s");
  // The rest through the writer directly, 10,000 upserts per transaction.
  t0 = clock::now();
  constexpr std::size_t k_insert_batch = 10000;
  for (std::size_t lo = put_sample; lo < n; lo += k_insert_batch) {
    std::size_t hi = std::min(n, lo + k_insert_batch);
    auto fn = [lo, hi, n](SQLite::Database& d) -> result<void> {
      auto& st = persistence::cached_statement(
          d,
          "INSERT INTO cron_jobs (name, source, spec, enabled, next_run, fence, created_at, "
          "updated_at) VALUES (?, 'runtime', ?, 1, ?, 0, ?, ?) ON CONFLICT (name) DO UPDATE SET "
          "spec = excluded.spec, enabled = excluded.enabled, next_run = excluded.next_run, "
          "updated_at = excluded.updated_at");
      auto now = runtime::now_ms();
      for (std::size_t i = lo; i < hi; ++i) {
        auto spec = spec_of(i, next_run_of(i, n));
        st.bind(1, spec.name);
        st.bind(2, protocol::to_text(protocol::to_json(spec)));
        st.bind(3, next_run_of(i, n));
        st.bind(4, now);
        st.bind(5, now);
        st.exec();
        st.reset();
      }
      return {};
    };
    auto r = runtime::sync_wait(pool.at(0), (*w)->write("insert cron jobs", hi - lo, fn));
    if (!r) die("inserting jobs: " + r.error().message);
  }
  double bulk_s = bench::seconds_since(t0);
  bench::emit_text(k_bench, "insert_method",
                   "cron_put for the first cron_put_jobs, then the writer: 10000 upserts/commit",
                   "text");
  bench::emit(k_bench, "bulk_insert_per_s", static_cast<double>(n - put_sample) / bulk_s, "jobs/s");

  // The copy for the raw side.
  fs::path raw_path = dir / "raw.db";
  {
    SQLite::Database src(db.path, SQLite::OPEN_READONLY);
    src.exec("VACUUM INTO '" + raw_path.string() + "'");
  }

  // next_wake on the full table (first read: the reader's statement prepared).
  t0 = clock::now();
  auto wake = store.cron_next_wake();
  double wake_first_ms = ms_since(t0);
  if (!wake || !*wake || **wake != next_run_of(0, n)) die("cron_next_wake: unexpected answer");
  t0 = clock::now();
  (void)store.cron_next_wake();
  double wake_again_ms = ms_since(t0);
  bench::emit(k_bench, "next_wake_ms", wake_first_ms, "ms");
  bench::emit(k_bench, "next_wake_again_ms", wake_again_ms, "ms");

  // Store: limit 1 for the first batch1_claims, then limit 64 until none due.
  // Raw, on the copy (after the store's claims, or before with --raw-first).
  phase s1, s64, r1, r64;
  auto run_raw = [&] {
    raw_db r(raw_path.string());
    open_pragmas(r.db);
    r1 = raw_claims(r, 1, batch1_claims);
    r64 = raw_claims(r, 64, 0);
  };
  if (raw_first) run_raw();
  s1 = store_claims(store, **w, pool, 1, batch1_claims);
  s64 = store_claims(store, **w, pool, 64, 0);
  t0 = clock::now();
  auto wake2 = store.cron_next_wake();
  double wake_claimed_ms = ms_since(t0);
  if (!wake2 || !*wake2 || **wake2 != k_lease) die("cron_next_wake after claims: unexpected");
  if (!raw_first) run_raw();
  bench::emit_text(k_bench, "order", raw_first ? "raw_first" : "store_first", "text");

  emit_phase("batch1_store", s1);
  emit_phase("batch1_raw", r1);
  bench::emit(k_bench, "batch1_ratio", s1.rate() / r1.rate(), "store/raw");
  emit_phase("batch64_store", s64);
  emit_phase("batch64_raw", r64);
  bench::emit(k_bench, "batch64_ratio", s64.rate() / r64.rate(), "store/raw");
  bench::emit(k_bench, "next_wake_all_claimed_ms", wake_claimed_ms, "ms");

  pool.join();
  store.join_reads();
  (*w)->stop();
  bool ok = (*w)->stats().failed_commits == 0 && s1.claims + s64.claims == n &&
            r1.claims + r64.claims == n && check(db.path, n, "store") &&
            check(raw_path.string(), n, "raw");
  bench::emit(k_bench, "ok", ok ? 1 : 0, "bool");

  std::printf(
      "{\"bench\":\"cron\",\"jobs\":%zu,\"order\":\"%s\",\"sync\":\"full\",\"claim_batch\":64,"
      "\"claims_per_s\":%s,"
      "\"raw_claims_per_s\":%s,\"ratio\":%s,\"store\":%s,\"raw\":%s,\"batch1\":{\"store\":%s,"
      "\"raw\":%s,\"ratio\":%s},\"next_wake_ms\":%s,\"next_wake_again_ms\":%s,"
      "\"next_wake_all_claimed_ms\":%s,\"cron_put_per_s\":%s,\"ok\":%s}\n",
      n, raw_first ? "raw_first" : "store_first", number(s64.rate()).c_str(),
      number(r64.rate()).c_str(), number(s64.rate() / r64.rate()).c_str(), phase_json(s64).c_str(),
      phase_json(r64).c_str(), phase_json(s1).c_str(), phase_json(r1).c_str(),
      number(s1.rate() / r1.rate()).c_str(), number(wake_first_ms).c_str(),
      number(wake_again_ms).c_str(), number(wake_claimed_ms).c_str(),
      number(static_cast<double>(put_sample) / put_s).c_str(), ok ? "true" : "false");
  std::fflush(stdout);
  std::error_code ec;
  fs::remove_all(dir, ec);
  return ok ? 0 : 1;
}
