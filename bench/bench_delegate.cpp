// bench_delegate: delegated-task settlements per second through the
// settlement-intent protocol, next to the same writes without the intent, in
// the same run, on the same disk, with the same sync mode (WAL and
// synchronous=FULL, the default: every COMMIT fsynced).
//
// One settlement, as actors/delegates.cpp does it (the real task_store calls):
//   intent     admit_delegate (row, running) -> write_intent -> publish_artifact
//              (temp file, fsync, rename, directory fsync) -> promote_intent (one
//              transaction: terminal state, artifact reference and digest,
//              terminal receipt, the intent deleted);
//   no_intent  admit_delegate -> publish_artifact -> settle_delegate(completed):
//              the one terminal compare-and-set the store has for a delegate
//              without an intent. It writes the same terminal state and receipt;
//              its completion carries no artifact reference (settle_delegate
//              takes none), about 150 bytes fewer in the row, which if anything
//              favours this side.
// Both sides build the same envelope and digest and the same scrubbed,
// bounded notice. The workers run on one single-threaded executor, as the
// delegates actor's workers do (host: pool().at(0)), so an artifact's fsyncs
// block that executor as they do in delegates.cpp; the store's writes go
// through the single writer, which batches whatever is queued into one commit.
//
// `in_flight` workers settle at once (1: serial; 32: concurrent). The two
// sides alternate in rounds (intent first in even rounds, no_intent first in
// odd ones), so neither gets a warm cache or a quiet disk the other did not.
// A figure is the side's settlements over the sum of its rounds' seconds.
//
// Checks after the timed rounds: every task is completed with one pending
// terminal receipt; the intent side's rows name an artifact whose bytes match
// the digest; no intent is left; no commit failed. Prints "ok" 1 or 0 (and
// exits 1 unless ok).
//
// Usage: bench_delegate [N [IN_FLIGHT ...]]   N tasks per side for each
//        IN_FLIGHT (default 2000, and 1 and 32 in flight). The database and
//        artifacts go to a fresh directory under $TMPDIR (default /tmp).
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "support.hpp"
#include "tether/actors/delegates.hpp"
#include "tether/persistence/task_store.hpp"
#include "tether/persistence/writer.hpp"
#include "tether/protocol/scrub.hpp"
#include "tether/runtime/artifact.hpp"
#include "tether/runtime/clock.hpp"
#include "tether/runtime/executor_pool.hpp"
#include "tether/runtime/one_shot.hpp"
#include "tether/runtime/owner_identity.hpp"
#include "tether/runtime/sync_wait.hpp"
#include "tether/sandbox/client.hpp"

namespace {

using namespace tether;
namespace asio = boost::asio;
namespace bench = tether::bench;
namespace fs = std::filesystem;
using asio::awaitable;
using bench::clock;
using persistence::delegate_state;
using protocol::job_id;

constexpr char k_bench[] = "bench_delegate";
constexpr int k_rounds = 10;
constexpr const char* k_agent = "worker";

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "bench_delegate: %s\n", what.c_str());
  std::exit(1);
}

// What every settlement shares: the store, the workspace, who owns the tasks.
struct rig {
  persistence::task_store* store = nullptr;
  fs::path workspace;  // artifacts go to workspace/delegates/<task>.json
  std::string owner;   // this process (runtime::current_process_identity)
  protocol::owner_scope scope;
  protocol::scrubber scrub;
  std::string output;  // the runner's answer, the same for every task
  std::size_t serial = 0;
};

// One side's figures, summed over its rounds.
struct tally {
  std::size_t settled = 0;
  double seconds = 0;
  std::uint64_t transactions = 0;
  std::vector<double> latency_ms;  // admit to terminal commit, per task
  double rate() const { return static_cast<double>(settled) / seconds; }
};

// Settles one delegated task the way delegates.cpp does (see the header).
awaitable<void> settle_one(rig* r, bool intent, job_id id) {
  auto& store = *r->store;
  persistence::delegate_task t;
  t.id = id;
  t.scope = r->scope;
  t.agent = k_agent;
  t.preview = "Summarise the failing tests.";
  t.workspace = r->workspace.string();
  t.owner = r->owner;
  t.lease_until = runtime::now_ms() + 60000;
  auto admitted = co_await store.admit_delegate(std::move(t));
  if (!admitted) die("admit_delegate: " + admitted.error().message);

  auto bytes = actors::delegates::envelope(id, k_agent, r->output);
  auto dir = r->workspace / "delegates";
  auto name = id.str() + ".json";
  auto body = actors::delegates::notice_text(id, k_agent, delegate_state::completed,
                                             r->scrub.scrub(r->output), 2000);
  if (intent) {
    persistence::settlement_intent in;
    in.task = id;
    in.owner = r->owner;
    in.state = delegate_state::completed;
    in.artifact = (dir / name).string();
    in.digest = runtime::sha256_digest(bytes);
    in.bytes = static_cast<std::int64_t>(bytes.size());
    auto w = co_await store.write_intent(std::move(in));
    if (!w || !*w) die("write_intent " + id.str() + ": " + (w ? "not written" : w.error().message));
    auto p = runtime::publish_artifact(dir, name, bytes);
    if (!p) die(p.error().message);
    auto promoted = co_await store.promote_intent(id, std::move(body));
    if (!promoted || !promoted->promoted)
      die("promote_intent " + id.str() + ": " +
          (promoted ? "not promoted" : promoted.error().message));
  } else {
    (void)runtime::sha256_digest(bytes);  // the digest is computed on both sides
    auto p = runtime::publish_artifact(dir, name, bytes);
    if (!p) die(p.error().message);
    auto s = co_await store.settle_delegate(id, r->owner, delegate_state::completed, "",
                                            std::move(body));
    if (!s || !*s)
      die("settle_delegate " + id.str() + ": " + (s ? "not settled" : s.error().message));
  }
}

// A worker: settles tasks until the round's quota is taken.
awaitable<void> worker(rig* r, bool intent, std::string tag, std::size_t* next, std::size_t n,
                       std::vector<double>* latency_ms) {
  while (*next < n) {
    ++*next;
    job_id id("dlg_bench_" + tag + "_" + std::to_string(++r->serial));
    auto t0 = clock::now();
    co_await settle_one(r, intent, std::move(id));
    latency_ms->push_back(std::chrono::duration<double, std::milli>(clock::now() - t0).count());
  }
}

// One round of one side: n settlements, `in_flight` at once; returns seconds.
awaitable<double> run_round(rig* r, bool intent, std::size_t n, std::size_t in_flight,
                            std::vector<double>* latency_ms) {
  auto ex = co_await asio::this_coro::executor;
  auto all_done = runtime::one_shot<int>::make();
  auto left = std::make_shared<std::size_t>(in_flight);
  auto next = std::make_shared<std::size_t>(0);
  auto t0 = clock::now();
  for (std::size_t k = 0; k < in_flight; ++k) {
    auto finish = [left, all_done](std::exception_ptr e) {
      if (e) die("a worker threw");
      if (--*left == 0) all_done->set(0);
    };
    auto w = worker(r, intent, intent ? "i" : "p", next.get(), n, latency_ms);
    asio::co_spawn(ex, std::move(w), std::move(finish));
  }
  co_await all_done->async_wait(asio::use_awaitable);
  co_return bench::seconds_since(t0);
}

struct pair_of {
  tally intent, plain;
};

pair_of measure(rig& r, runtime::executor_pool& pool, persistence::writer& w, std::size_t n,
                std::size_t in_flight) {
  pair_of out;
  auto per_round = [&](int i) {
    return n / k_rounds + (static_cast<std::size_t>(i) < n % k_rounds ? 1 : 0);
  };
  for (int i = 0; i < k_rounds; ++i) {
    std::size_t m = per_round(i);
    if (m == 0) continue;
    for (int j = 0; j < 2; ++j) {
      bool intent = (i + j) % 2 == 0;  // even rounds: intent first
      auto& t = intent ? out.intent : out.plain;
      auto before = w.stats().transactions;
      t.seconds +=
          runtime::sync_wait(pool.at(0), run_round(&r, intent, m, in_flight, &t.latency_ms));
      t.transactions += w.stats().transactions - before;
      t.settled += m;
    }
  }
  return out;
}

void emit_side(const std::string& f, tally& t) {
  bench::emit(k_bench, f + "_settlements_per_s", t.rate(), "settlements/s");
  bench::emit(k_bench, f + "_seconds", t.seconds, "s");
  bench::emit(k_bench, f + "_commits_per_settlement",
              static_cast<double>(t.transactions) /
                  static_cast<double>(std::max<std::size_t>(1, t.settled)),
              "commits/settlement");
  bench::emit(k_bench, f + "_p50", bench::percentile(t.latency_ms, 50), "ms");
  bench::emit(k_bench, f + "_p99", bench::percentile(t.latency_ms, 99), "ms");
}

// Every task completed with one pending terminal receipt; the intent side's
// artifacts match their digests; no intent left.
bool check(persistence::task_store& store, std::size_t expected) {
  bool ok = true;
  auto fail = [&](const std::string& what) {
    std::fprintf(stderr, "bench_delegate: check failed: %s\n", what.c_str());
    ok = false;
  };
  auto rows = store.delegates();
  if (!rows) die("reading the tasks: " + rows.error().message);
  std::size_t completed = 0, with_artifact = 0;
  for (auto& t : *rows) {
    if (t.state != delegate_state::completed) {
      fail(t.id.str() + " is " + std::string(persistence::to_string(t.state)));
      continue;
    }
    ++completed;
    bool intent_side = t.id.str().rfind("dlg_bench_i_", 0) == 0;
    if (intent_side != t.artifact.has_value())
      fail(t.id.str() + (intent_side ? " has no artifact reference" : " has one"));
    if (t.artifact && t.digest) {
      auto bytes = runtime::read_artifact(*t.artifact, 1 << 20);
      if (!bytes || runtime::sha256_digest(*bytes) != *t.digest)
        fail(t.id.str() + "'s artifact does not match its digest");
      else
        ++with_artifact;
    }
  }
  if (completed != expected)
    fail(std::to_string(completed) + " completed tasks, expected " + std::to_string(expected));
  if (with_artifact * 2 != expected)
    fail(std::to_string(with_artifact) + " valid artifacts, expected " +
         std::to_string(expected / 2));
  auto pending = store.pending_receipts();
  if (!pending || pending->size() != expected)
    fail("pending terminal receipts: " +
         (pending ? std::to_string(pending->size()) : pending.error().message) + ", expected " +
         std::to_string(expected));
  auto intents = store.settlement_intents();
  if (!intents || !intents->empty()) fail("settlement intents left");
  return ok;
}

std::string make_temp_dir() {
  std::string tmpl =
      (std::filesystem::temp_directory_path() / "tether-bench-delegate-XXXXXX").string();
  if (!::mkdtemp(tmpl.data())) die("cannot create a temp dir under " + tmpl);
  return tmpl;
}

}  // namespace

int main(int argc, char** argv) {
  std::size_t n = argc >= 2 ? std::strtoul(argv[1], nullptr, 10) : 2000;
  std::vector<std::size_t> in_flight;
  for (int i = 2; i < argc; ++i) in_flight.push_back(std::strtoul(argv[i], nullptr, 10));
  if (in_flight.empty()) in_flight = {1, 32};
  if (n == 0) die("usage: bench_delegate [N [IN_FLIGHT ...]]");

  fs::path dir = make_temp_dir();
  persistence::db_options db;
  db.path = (dir / "tether.db").string();
  db.sync = persistence::sync_mode::full;
  db.create = true;
  auto w = persistence::writer::open(db);
  if (!w) die("opening " + db.path + ": " + w.error().message);
  persistence::task_store store(**w, db.path);
  runtime::executor_pool pool(1);  // the delegates actor's one executor

  rig r;
  r.store = &store;
  r.workspace = dir / "workspace";
  r.owner = runtime::to_string(runtime::current_process_identity());
  r.scope.tenant = protocol::tenant_id("default");
  r.scope.thread = protocol::session_id("ses_bench");
  r.scope.turn = protocol::turn_id("turn_bench");
  r.scrub = protocol::scrubber(protocol::scrub_rules::from_env(sandbox::current_environment()));
  r.output = "findings for: Summarise the failing tests.\n";
  while (r.output.size() < 1024) r.output += "- test_" + std::to_string(r.output.size()) + " ok\n";

  bench::emit_text(k_bench, "sync_mode", "full", "mode");
  bench::emit(k_bench, "rounds", k_rounds, "rounds");
  std::size_t total = 0;
  for (auto k : in_flight) {
    if (k == 0) die("IN_FLIGHT must be at least 1");
    auto f = k == 1 ? std::string("serial") : "in_flight_" + std::to_string(k);
    auto m = measure(r, pool, **w, n, k);
    total += m.intent.settled + m.plain.settled;
    bench::emit(k_bench, f + "_n", static_cast<double>(n), "tasks/side");
    bench::emit(k_bench, f + "_in_flight", static_cast<double>(k), "tasks");
    emit_side(f + "_intent", m.intent);
    emit_side(f + "_no_intent", m.plain);
    bench::emit(k_bench, f + "_ratio", m.intent.rate() / m.plain.rate(), "intent/no_intent");
  }
  pool.join();
  bool ok = check(store, total) && (*w)->stats().failed_commits == 0;
  bench::emit(k_bench, "ok", ok ? 1 : 0, "bool");
  store.join_reads();
  (*w)->stop();
  std::error_code ec;
  fs::remove_all(dir, ec);
  return ok ? 0 : 1;
}
