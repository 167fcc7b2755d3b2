// bench_sessions: resident memory per idle session with all of its actors
// (issue 15, target 7: at most 2 KiB each with 100,000 loaded), next to a
// baseline measured in the same run.
//
// 1. Rows: N sessions are created on a fresh database through a host
//    (create_session, 512 in flight, group-committed), then that host shuts
//    down. Figure: create_per_s.
// 2. Loaded: a second host opens the file and boots (boot reads every
//    session row: the directory holds each one, and a read connection's page
//    cache is warm). Then host::load() brings every session's actors up,
//    512 in flight: the session actor (with its run coordinator) and its inbox
//    actor, each idle with an empty mailbox. RSS is read (after malloc_trim)
//    before and after: session_rss is the difference over N, bytes per
//    session. Also rss_after_boot_per_session: the process's RSS after boot
//    over N (the directory, caches, the runtime's threads), for context.
// Baseline, first, in the same process (freed before the hosts start):
//    actor_rss: 2N minimal runtime::actor objects (a trivial handler, one
//    message handled each, held in a vector), bytes per two actors: what the
//    session's two mailboxes cost at the least.
//
// Checks: every load succeeded and returned a distinct actor; the figure is
// printed as JSON lines (support.hpp) and one summary object.
//
// Usage: bench_sessions [--sessions N] [--quick]   default N = 100000;
//        --quick: N = 10000. The database goes to a fresh directory under /tmp.
#include <malloc.h>
#include <unistd.h>

#include <atomic>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "host_support.hpp"
#include "support.hpp"
#include "tether/actors/host.hpp"
#include "tether/runtime/actor.hpp"
#include "tether/runtime/one_shot.hpp"
#include "tether/runtime/sync_wait.hpp"

namespace {

using namespace tether;
namespace asio = boost::asio;
namespace bench = tether::bench;
namespace fs = std::filesystem;
using asio::awaitable;
using bench::clock;
using bench::sync;
using protocol::session_id;

constexpr char k_bench[] = "bench_sessions";
constexpr std::size_t k_in_flight = 512;

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "bench_sessions: %s\n", what.c_str());
  std::exit(1);
}

std::string name_of(std::size_t i) {
  char b[32];
  std::snprintf(b, sizeof b, "s-%07zu", i);
  return b;
}

long long trimmed_rss() {
  ::malloc_trim(0);
  return bench::rss_bytes();
}

// ---- the baseline: minimal actors ----

struct nothing {};
class minimal : public runtime::actor<minimal, nothing> {
 public:
  using runtime::actor<minimal, nothing>::actor;
  void handle(nothing&) { ++handled; }
  int handled = 0;
};

double actor_baseline(std::size_t pairs) {
  asio::io_context io(1);
  std::vector<std::shared_ptr<minimal>> all;
  all.reserve(2 * pairs);
  long long before = trimmed_rss();
  for (std::size_t i = 0; i < 2 * pairs; ++i) {
    auto a = std::make_shared<minimal>(io.get_executor(), runtime::actor_options{"m"});
    if (!a->tell(nothing{})) die("tell to a minimal actor failed");
    all.push_back(std::move(a));
    if (i % 1024 == 1023) io.poll();
  }
  io.restart();
  io.run();
  long long after = trimmed_rss();
  for (auto& a : all)
    if (a->handled != 1) die("a minimal actor did not handle its one message");
  return static_cast<double>(after - before) / static_cast<double>(pairs);
}

// ---- N operations, k_in_flight at a time, on the host's executors ----

// A coroutine's state lives in its parameters (COROUTINES.md: never in a
// lambda's captures, which die with the closure).
template <class Op>
awaitable<void> worker(std::atomic<std::size_t>* next, std::atomic<std::size_t>* left,
                       std::shared_ptr<runtime::one_shot<int>> done, std::size_t n, Op op) {
  for (std::size_t i = (*next)++; i < n; i = (*next)++) co_await op(i);
  if (--*left == 0) done->set(0);
}

template <class Op>
void in_flight(actors::host& h, std::size_t n, Op op) {
  std::atomic<std::size_t> next{0}, left{k_in_flight};
  auto done = runtime::one_shot<int>::make();
  for (std::size_t w = 0; w < k_in_flight; ++w)
    asio::co_spawn(h.pool().next(), worker(&next, &left, done, n, op), asio::detached);
  sync(h, done->async_wait(asio::use_awaitable));
}

actors::host_options options(const std::string& db, bool create) {
  actors::host_options o;
  o.db_path = db;
  o.create_db = create;
  o.agents = std::make_shared<bench::idle_agents>();
  o.log = [](const std::string& w) { die("the host warned: " + w); };
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  std::size_t n = 100000;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--quick") == 0)
      n = 10000;
    else if (std::strcmp(argv[i], "--sessions") == 0 && i + 1 < argc)
      n = std::strtoul(argv[++i], nullptr, 10);
    else
      die("usage: bench_sessions [--sessions N] [--quick]");
  }
  if (n < 1000) die("--sessions must be at least 1000");
  char tmpl[] = "/tmp/tether-bench-sessions-XXXXXX";
  if (!::mkdtemp(tmpl)) die("mkdtemp under /tmp failed");
  std::string dir = tmpl;
  std::string db = dir + "/tether.db";
  auto nd = static_cast<double>(n);
  bench::emit(k_bench, "sessions", nd, "sessions");

  double pair_rss = actor_baseline(n);
  bench::emit(k_bench, "actor_pair_rss", pair_rss, "bytes/2 actors");

  {
    auto h = actors::host::open(options(db, true));
    if (!h) die("host::open: " + h.error().message);
    auto& host = **h;
    if (auto b = sync(host, host.boot()); !b) die("boot: " + b.error().message);
    auto t0 = clock::now();
    in_flight(host, n, [&host](std::size_t i) -> awaitable<void> {
      auto r = co_await host.create_session("idle session", session_id(name_of(i)));
      if (!r) die("create_session: " + r.error().message);
    });
    bench::emit(k_bench, "create_per_s", nd / bench::seconds_since(t0), "sessions/s");
    host.shutdown();
  }

  long long rss_start = trimmed_rss();
  auto h = actors::host::open(options(db, false));
  if (!h) die("host::open: " + h.error().message);
  auto& host = **h;
  if (auto b = sync(host, host.boot()); !b) die("boot: " + b.error().message);
  long long rss_booted = trimmed_rss();
  std::vector<std::shared_ptr<actors::session>> loaded(n);
  std::mutex m;
  auto t0 = clock::now();
  in_flight(host, n, [&host, &loaded, &m](std::size_t i) -> awaitable<void> {
    auto r = co_await host.load(session_id(name_of(i)));
    if (!r) die("load: " + r.error().message);
    std::lock_guard lk(m);
    loaded[i] = std::move(*r);
  });
  double load_s = bench::seconds_since(t0);
  sync(host, host.wait_quiescent(false));
  long long rss_loaded = trimmed_rss();
  std::set<actors::session*> distinct;
  for (auto& s : loaded) distinct.insert(s.get());
  if (distinct.size() != n || distinct.count(nullptr)) die("a load returned no or a shared actor");
  loaded.clear();  // the host keeps them loaded

  double per_session = static_cast<double>(rss_loaded - rss_booted) / nd;
  bench::emit(k_bench, "load_per_s", nd / load_s, "sessions/s");
  bench::emit(k_bench, "rss_after_boot_per_session", static_cast<double>(rss_booted) / nd,
              "bytes/session");
  bench::emit(k_bench, "boot_rss_growth_per_session",
              static_cast<double>(rss_booted - rss_start) / nd, "bytes/session");
  bench::emit(k_bench, "session_rss", per_session, "bytes/session");
  bench::emit(k_bench, "session_rss_vs_actor_pair", per_session / pair_rss, "ratio");
  bench::emit(k_bench, "target_bytes", 2048, "bytes/session");
  std::printf(
      "{\"bench\":\"sessions\",\"sessions\":%zu,\"session_rss\":%.0f,\"actor_pair_rss\":%.0f,"
      "\"boot_rss_growth_per_session\":%.0f,\"target\":2048,\"target_met\":%s,\"ok\":true}\n",
      n, per_session, pair_rss, static_cast<double>(rss_booted - rss_start) / nd,
      per_session <= 2048 ? "true" : "false");
  std::fflush(stdout);
  host.shutdown();
  std::error_code ec;
  fs::remove_all(dir, ec);
  return 0;
}
