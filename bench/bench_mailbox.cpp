// bench_mailbox: what an actor's mailbox costs next to a raw Asio channel doing
// the same work in the same run, and what an idle actor weighs.
//
// Each pair (actor, raw channel) is sized to about k_run_seconds per run, then
// run k_reps times interleaved; the best rate of each is printed, so noise from
// other processes on the machine hurts both sides alike.
//
//   tell: a coroutine sends n numbers one way; at most k_window are in flight
//         (the channel's capacity; the actor's sender waits on a mark told
//         after every half window).
//   ask:  a coroutine makes n round trips one after the other; also with a
//         30 s timeout (the process's deadline thread), and with the
//         steady_timer per ask that timeouts cost before it ("timeout_cost":
//         time per ask with a timeout over time per ask without).
//   one executor: everything on one io_context run by this thread.
//   two executors: sender on executor_pool(2).at(0), receiver on .at(1).
//
// Last, the ask race on one executor runs again in k_processes processes of
// its own (this program, exec'd with --measure ask), one after the other;
// each one's ratios are printed and their median ("_median_of_5_processes").
// From one run of this bench to the next (each a process), the coroutine
// handler's ratio on one executor ranged from 0.77 to 1.02 on the bench
// machine, the actor's rate from 1.6 to 2.2 and the raw pair's from 2.0 to
// 2.2 million round trips/s: one process's figure is one draw of that.
#include <malloc.h>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/experimental/channel.hpp>
#include <boost/asio/experimental/concurrent_channel.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_future.hpp>
#include <cstdlib>
#include <functional>
#include <future>
#include <optional>

#include "support.hpp"
#include "tether/runtime/actor.hpp"
#include "tether/runtime/executor_pool.hpp"
#include "tether/runtime/sync_wait.hpp"

namespace {

using namespace tether;
using namespace tether::runtime;
namespace bench = tether::bench;
using bench::clock;
using boost::system::error_code;

constexpr char k_bench[] = "bench_mailbox";
constexpr std::size_t k_window = 1024;
constexpr double k_run_seconds = 0.25;
constexpr int k_reps = 3;
constexpr int k_processes = 5;
constexpr std::size_t k_idle_actors = 100000;

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "bench_mailbox: %s\n", what.c_str());
  std::exit(1);
}

// ---- the actor side -------------------------------------------------------

struct ping {
  std::uint64_t n = 0;
};
struct mark {  // told after a burst of pings; set once they were all handled
  std::shared_ptr<one_shot<int>> done;
};
struct query {  // answers how many queries it has handled, this one included
  reply_to<std::uint64_t> reply;
};
struct tally {  // answers how many pings it has handled
  reply_to<std::uint64_t> reply;
};
using sink_msg = std::variant<ping, mark, query, tally>;

struct sink_state {
  std::uint64_t pings = 0;
  std::uint64_t sum = 0;
  std::uint64_t queries = 0;

  void on(sink_msg& m) {
    if (auto* p = std::get_if<ping>(&m)) {
      ++pings;
      sum += p->n;
    } else if (auto* k = std::get_if<mark>(&m)) {
      k->done->set(1);
    } else if (auto* q = std::get_if<query>(&m)) {
      q->reply.send(++queries);
    } else if (auto* t = std::get_if<tally>(&m)) {
      t->reply.send(pings);
    }
  }
};

/// A plain-function handler: a turn is one post and a loop.
class sync_sink : public actor<sync_sink, sink_msg>, public sink_state {
 public:
  using actor::actor;
  void handle(sink_msg& m) { on(m); }
};

/// A coroutine handler: a turn is one post and one co_spawn.
class coro_sink : public actor<coro_sink, sink_msg>, public sink_state {
 public:
  using actor::actor;
  awaitable<void> handle(sink_msg& m) {
    on(m);
    co_return;
  }
};

// Tells n pings in bursts of half the window; before the next burst it waits
// for the mark of the one before, so at most k_window pings are in flight.
template <class Sink>
awaitable<void> tell_pings(std::shared_ptr<Sink> s, std::uint64_t n) {
  std::shared_ptr<one_shot<int>> before;
  std::uint64_t i = 0;
  while (i < n) {
    for (auto end = std::min(n, i + k_window / 2); i < end; ++i) {
      ping p{i};
      if (!s->tell(std::move(p))) die("tell failed");
    }
    auto done = one_shot<int>::make();
    mark m{done};
    if (!s->tell(std::move(m))) die("tell failed");
    if (before) co_await before->async_wait(asio::use_awaitable);
    before = std::move(done);
  }
  if (before) co_await before->async_wait(asio::use_awaitable);
}

template <class Sink>
awaitable<std::uint64_t> ask_tally(std::shared_ptr<Sink> s) {
  tally t;
  auto r = co_await s->ask(std::move(t));
  if (!r) die("tally ask failed: " + r.error().message);
  co_return *r;
}

// How an ask is timed: no timeout; a 30 s timeout, far longer than the run,
// so its deadline is armed and removed on every ask (runtime/deadlines.hpp);
// or what a timeout cost before the deadline thread, a steady_timer per ask,
// armed before it and cancelled after the reply (the cancel posts the
// aborted wait).
enum class ask_timeout { none, deadline, timer_per_ask };

template <class Sink>
awaitable<std::uint64_t> ask_queries(std::shared_ptr<Sink> s, std::uint64_t n,
                                     ask_timeout how = ask_timeout::none) {
  auto ex = co_await asio::this_coro::executor;
  auto timeout = how == ask_timeout::deadline ? std::chrono::milliseconds(30000)
                                              : std::chrono::milliseconds(0);
  std::uint64_t last = 0;
  for (std::uint64_t i = 0; i < n; ++i) {
    std::optional<asio::steady_timer> t;
    if (how == ask_timeout::timer_per_ask) {
      t.emplace(ex, std::chrono::seconds(30));
      t->async_wait([](error_code) {});
    }
    query q;
    auto r = co_await s->ask(std::move(q), timeout);
    if (!r) die("ask failed: " + r.error().message);
    last = *r;
  }
  co_return last;
}

// ---- the raw channel side -------------------------------------------------

using number_sig = void(error_code, std::uint64_t);

struct single_thread {
  template <class Sig>
  using channel = asio::experimental::channel<Sig>;
};
struct across_threads {
  template <class Sig>
  using channel = asio::experimental::concurrent_channel<Sig>;
};

// Plain: one async_send per message. Eager: try_send first, await only when full.
template <bool Eager, class Channel>
awaitable<void> send_numbers(Channel& ch, std::uint64_t n) {
  for (std::uint64_t i = 0; i < n; ++i) {
    error_code ok;
    if (Eager && ch.try_send(ok, i)) continue;
    co_await ch.async_send(ok, i, asio::use_awaitable);
  }
}

// Plain: one async_receive per message. Eager: drain with try_receive first.
template <bool Eager, class Channel>
awaitable<std::uint64_t> receive_numbers(Channel& ch, std::uint64_t n) {
  std::uint64_t sum = 0, got = 0;
  auto take = [&](error_code, std::uint64_t v) {
    sum += v;
    ++got;
  };
  while (got < n) {
    if (Eager && ch.try_receive(take)) continue;
    auto v = co_await ch.async_receive(asio::use_awaitable);
    take({}, v);
  }
  co_return sum;
}

// The server of a request channel and a reply channel (capacity 1 each).
template <class Channel>
awaitable<void> serve_pair(Channel& requests, Channel& replies) {
  std::uint64_t answered = 0;
  for (;;) {
    auto [ec, v] = co_await requests.async_receive(asio::as_tuple(asio::use_awaitable));
    if (ec) co_return;  // closed: the client is done
    (void)v;
    if (!replies.try_send(error_code{}, ++answered)) die("reply channel full");
  }
}

template <class Channel>
awaitable<std::uint64_t> ask_pair(Channel& requests, Channel& replies, std::uint64_t n) {
  std::uint64_t last = 0;
  for (std::uint64_t i = 0; i < n; ++i) {
    error_code ok;
    co_await requests.async_send(ok, i, asio::use_awaitable);
    last = co_await replies.async_receive(asio::use_awaitable);
  }
  requests.close();
  co_return last;
}

// The server of a request channel whose requests carry their own reply
// channel, as an ask carries its one_shot.
template <class Threads>
struct per_request {
  using reply_channel = typename Threads::template channel<number_sig>;
  using request_channel =
      typename Threads::template channel<void(error_code, std::shared_ptr<reply_channel>)>;

  static awaitable<void> serve(request_channel& requests) {
    std::uint64_t answered = 0;
    for (;;) {
      auto [ec, reply] = co_await requests.async_receive(asio::as_tuple(asio::use_awaitable));
      if (ec) co_return;
      if (!reply->try_send(error_code{}, ++answered)) die("reply channel full");
    }
  }

  static awaitable<std::uint64_t> ask(request_channel& requests, std::uint64_t n) {
    auto ex = co_await asio::this_coro::executor;
    std::uint64_t last = 0;
    for (std::uint64_t i = 0; i < n; ++i) {
      auto reply = std::make_shared<reply_channel>(ex, 1);
      error_code ok;
      co_await requests.async_send(ok, reply, asio::use_awaitable);
      last = co_await reply->async_receive(asio::use_awaitable);
    }
    requests.close();
    co_return last;
  }
};

// ---- where a run happens --------------------------------------------------

/// One io_context, run by this thread: a() sends or asks, b() receives.
struct one_executor {
  using threads = single_thread;
  static constexpr const char* tag = "one_executor";
  asio::io_context io{1};
  executor a() { return io.get_executor(); }
  executor b() { return io.get_executor(); }
  template <class T>
  T wait(std::future<T> f) {
    io.restart();
    io.run();
    return f.get();
  }
};

/// Two executors of a pool, each with its own thread.
struct two_executors {
  using threads = across_threads;
  static constexpr const char* tag = "two_executors";
  executor_pool& pool;
  executor a() { return pool.at(0); }
  executor b() { return pool.at(1); }
  template <class T>
  T wait(std::future<T> f) {
    return f.get();
  }
};

template <class Sink, class Place>
double actor_tell(Place& pl, std::uint64_t n) {
  auto s = std::make_shared<Sink>(pl.b(), actor_options{"sink"});
  auto t0 = clock::now();
  pl.wait(asio::co_spawn(pl.a(), tell_pings(s, n), asio::use_future));
  double t = bench::seconds_since(t0);
  auto got = pl.wait(asio::co_spawn(pl.a(), ask_tally(s), asio::use_future));
  if (got != n)
    die("actor handled " + std::to_string(got) + " of " + std::to_string(n) + " told pings");
  return t;
}

template <bool Eager, class Place>
double raw_tell(Place& pl, std::uint64_t n) {
  typename Place::threads::template channel<number_sig> ch(pl.b(), k_window);
  auto t0 = clock::now();
  auto sent = asio::co_spawn(pl.a(), send_numbers<Eager>(ch, n), asio::use_future);
  auto sum = pl.wait(asio::co_spawn(pl.b(), receive_numbers<Eager>(ch, n), asio::use_future));
  pl.wait(std::move(sent));
  double t = bench::seconds_since(t0);
  if (sum != n * (n - 1) / 2) die("raw channel lost numbers");
  return t;
}

template <class Sink, class Place>
double actor_ask(Place& pl, std::uint64_t n, ask_timeout how = ask_timeout::none) {
  auto s = std::make_shared<Sink>(pl.b(), actor_options{"sink"});
  auto t0 = clock::now();
  auto asks = ask_queries(s, n, how);
  auto last = pl.wait(asio::co_spawn(pl.a(), std::move(asks), asio::use_future));
  double t = bench::seconds_since(t0);
  if (last != n) die("actor answered " + std::to_string(last) + " of " + std::to_string(n));
  return t;
}

template <class Place>
double raw_ask_pair(Place& pl, std::uint64_t n) {
  using channel = typename Place::threads::template channel<number_sig>;
  channel requests(pl.b(), 1), replies(pl.a(), 1);
  auto t0 = clock::now();
  auto served = asio::co_spawn(pl.b(), serve_pair(requests, replies), asio::use_future);
  auto last = pl.wait(asio::co_spawn(pl.a(), ask_pair(requests, replies, n), asio::use_future));
  pl.wait(std::move(served));
  double t = bench::seconds_since(t0);
  if (last != n) die("raw pair answered " + std::to_string(last) + " of " + std::to_string(n));
  return t;
}

template <class Place>
double raw_ask_per_request(Place& pl, std::uint64_t n) {
  using pr = per_request<typename Place::threads>;
  typename pr::request_channel requests(pl.b(), 1);
  auto t0 = clock::now();
  auto served = asio::co_spawn(pl.b(), pr::serve(requests), asio::use_future);
  auto last = pl.wait(asio::co_spawn(pl.a(), pr::ask(requests, n), asio::use_future));
  pl.wait(std::move(served));
  double t = bench::seconds_since(t0);
  if (last != n) die("raw per-request answered " + std::to_string(last));
  return t;
}

// ---- racing ---------------------------------------------------------------

struct contender {
  std::string figure;
  std::function<double(std::uint64_t)> run;  // returns elapsed seconds for n operations
};

/// Sizes each contender, runs them interleaved k_reps times, prints each best
/// rate (unless `print` is false) and returns them in order.
std::vector<double> race(const std::vector<contender>& cs, const char* unit, bool print = true) {
  std::vector<std::uint64_t> n;
  for (auto& c : cs) n.push_back(bench::size_for(c.run, k_run_seconds));
  std::vector<double> best(cs.size(), 0);
  for (int rep = 0; rep < k_reps; ++rep)
    for (std::size_t i = 0; i < cs.size(); ++i)
      best[i] = std::max(best[i], static_cast<double>(n[i]) / cs[i].run(n[i]));
  if (print)
    for (std::size_t i = 0; i < cs.size(); ++i) bench::emit(k_bench, cs[i].figure, best[i], unit);
  return best;
}

// Makes a fresh Place for every run (one_executor) or reuses the pool: `body`
// as a contender's run.
template <class Place, class Make, class Body>
std::function<double(std::uint64_t)> with_place(Make make, Body body) {
  return [make, body](std::uint64_t n) {
    auto pl = make();
    return body(*pl, n);
  };
}

// The ask race in Place: actor (plain handler), actor (coroutine handler),
// raw channel pair, raw channel per request, actor with a timeout, actor
// with a timer per ask; their best rates, printed unless `print` is false.
template <class Place, class Make>
std::vector<double> race_ask(Make make, bool print) {
  std::string p = Place::tag;
  auto with = [make](auto body) { return with_place<Place>(make, body); };
  return race(
      {
          {"ask_" + p + "_actor",
           with([](Place& pl, auto n) { return actor_ask<sync_sink>(pl, n); })},
          {"ask_" + p + "_actor_coroutine_handler",
           with([](Place& pl, auto n) { return actor_ask<coro_sink>(pl, n); })},
          {"ask_" + p + "_raw_channel_pair",
           with([](Place& pl, auto n) { return raw_ask_pair(pl, n); })},
          {"ask_" + p + "_raw_channel_per_request",
           with([](Place& pl, auto n) { return raw_ask_per_request(pl, n); })},
          {"ask_" + p + "_actor_with_timeout", with([](Place& pl, auto n) {
             return actor_ask<sync_sink>(pl, n, ask_timeout::deadline);
           })},
          {"ask_" + p + "_actor_with_timer_per_ask", with([](Place& pl, auto n) {
             return actor_ask<sync_sink>(pl, n, ask_timeout::timer_per_ask);
           })},
      },
      "round_trips/s", print);
}

template <class Place, class Make>
void race_place(Make make) {
  std::string p = Place::tag;
  auto with = [make](auto body) { return with_place<Place>(make, body); };
  auto tell = race(
      {
          {"tell_" + p + "_actor",
           with([](Place& pl, auto n) { return actor_tell<sync_sink>(pl, n); })},
          {"tell_" + p + "_actor_coroutine_handler",
           with([](Place& pl, auto n) { return actor_tell<coro_sink>(pl, n); })},
          {"tell_" + p + "_raw_channel",
           with([](Place& pl, auto n) { return raw_tell<false>(pl, n); })},
          {"tell_" + p + "_raw_channel_try_first",
           with([](Place& pl, auto n) { return raw_tell<true>(pl, n); })},
      },
      "msgs/s");
  bench::emit(k_bench, "tell_" + p + "_ratio", tell[0] / tell[2], "actor/raw");
  bench::emit(k_bench, "tell_" + p + "_ratio_coroutine_handler", tell[1] / tell[2], "actor/raw");
  bench::emit(k_bench, "tell_" + p + "_ratio_vs_try_first", tell[0] / tell[3], "actor/raw");

  auto ask = race_ask<Place>(make, true);
  bench::emit(k_bench, "ask_" + p + "_ratio", ask[0] / ask[2], "actor/raw");
  bench::emit(k_bench, "ask_" + p + "_ratio_coroutine_handler", ask[1] / ask[2], "actor/raw");
  bench::emit(k_bench, "ask_" + p + "_ratio_vs_per_request", ask[0] / ask[3], "actor/raw");
  // Time per ask with a timeout over time per ask without one (the target: at most 1.5).
  bench::emit(k_bench, "ask_" + p + "_timeout_cost", ask[0] / ask[4], "with/without");
  bench::emit(k_bench, "ask_" + p + "_timer_per_ask_cost", ask[0] / ask[5], "with/without");
}

// ---- idle actors ----------------------------------------------------------

// RSS growth per actor for k_idle_actors coroutine-handler actors that each
// handled one ping (handled as they are created, the way actors come and go in
// a host), held by a vector of shared_ptrs, as a registry would hold them.
void idle_actors() {
  asio::io_context io(1);
  std::vector<std::shared_ptr<coro_sink>> actors;
  long long before = bench::rss_bytes();
  actors.reserve(k_idle_actors);
  for (std::size_t i = 0; i < k_idle_actors; ++i) {
    auto a =
        std::make_shared<coro_sink>(io.get_executor(), actor_options{"idle-" + std::to_string(i)});
    ping p{i};
    if (!a->tell(std::move(p))) die("tell to an idle actor failed");
    actors.push_back(std::move(a));
    if (i % 1024 == 1023) io.poll();
  }
  io.restart();
  io.run();
  long long after = bench::rss_bytes();
  ::malloc_trim(0);
  long long trimmed = bench::rss_bytes();
  for (auto& a : actors)
    if (a->pings != 1) die("an idle actor did not handle its one ping");
  double k = static_cast<double>(k_idle_actors);
  bench::emit(k_bench, "idle_actor_rss", static_cast<double>(after - before) / k, "bytes/actor");
  bench::emit(k_bench, "idle_actor_rss_after_malloc_trim",
              static_cast<double>(trimmed - before) / k, "bytes/actor");
  bench::emit(k_bench, "idle_actor_object_size", static_cast<double>(sizeof(coro_sink)), "bytes");
}

// --measure ask: the ask race on one executor alone, in this process; prints
// the coroutine handler's ratio to the raw channel pair, the plain handler's,
// and the timeout's cost, on one line.
int measure_ask() {
  auto ask = race_ask<one_executor>([] { return std::make_unique<one_executor>(); }, false);
  std::printf("%.6g %.6g %.6g\n", ask[1] / ask[2], ask[0] / ask[2], ask[0] / ask[4]);
  return 0;
}

// The ask race on one executor again, in k_processes processes of its own
// one after the other: each process's ratios, and their median.
void ask_apart() {
  std::vector<std::vector<double>> all(3);
  const char* names[] = {"ask_one_executor_ratio_coroutine_handler", "ask_one_executor_ratio",
                         "ask_one_executor_timeout_cost"};
  const char* units[] = {"actor/raw", "actor/raw", "with/without"};
  for (int i = 0; i < k_processes; ++i) {
    auto v = bench::measure_apart(k_bench, {"--measure", "ask"}, 3);
    for (std::size_t f = 0; f < 3; ++f) {
      all[f].push_back(v[f]);
      bench::emit(k_bench, std::string(names[f]) + "_process_" + std::to_string(i + 1), v[f],
                  units[f]);
    }
  }
  for (std::size_t f = 0; f < 3; ++f)
    bench::emit(k_bench,
                std::string(names[f]) + "_median_of_" + std::to_string(k_processes) + "_processes",
                bench::percentile(all[f], 50), units[f]);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 3 && std::string_view(argv[1]) == "--measure" && std::string_view(argv[2]) == "ask")
    return measure_ask();
  if (argc != 1) die("usage: bench_mailbox (no arguments)");
  // First, so the heap is not yet shaped by the throughput runs.
  idle_actors();
  race_place<one_executor>([] { return std::make_unique<one_executor>(); });
  executor_pool pool(2);
  race_place<two_executors>(
      [&pool] { return std::make_unique<two_executors>(two_executors{pool}); });
  pool.join();
  ask_apart();
  return 0;
}
