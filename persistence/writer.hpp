#pragma once
// The single writer: one actor that owns the only write connection, on its own
// thread. Requests are named write operations. The receive loop takes the first
// request, drains more up to a count and a byte bound, and runs them in one
// BEGIN IMMEDIATE transaction. A failing request rolls back alone and gets its
// own error: the batch runs first without savepoints; a request that fails
// having changed no row is simply answered with its error, and if one fails
// after changing rows, the transaction is rolled back and the batch runs
// again with each request inside its own SAVEPOINT (so a request may run
// twice, the first run undone; it is called as const and must change nothing
// but the database). Only after COMMIT returns is any
// requester answered; if COMMIT fails, every requester of the batch gets that
// error; if SQLite rolls the whole transaction back inside a request (a full
// disk, an I/O error, no memory), the batch ends there and every requester gets
// that error, the later ones unrun. Nothing is ever answered as committed that
// is not, and nothing committed is answered as failed.
//
// Checkpoints (copying the WAL back into the database file and syncing it) do
// not run inside a commit: SQLite's automatic checkpoint is replaced by a WAL
// hook that wakes a checkpointer thread with its own connection, which runs
// a PASSIVE checkpoint beside the writer's transactions. A checkpoint of
// 1,000 frames took 10-15 ms, and inside the commit every requester of that
// batch and of the next waited for it (bench_commit's p99 with 1,024
// requesters). The checkpointer copies what was committed when it began, so
// it seldom leaves the WAL wholly copied when a transaction begins, the only
// moment SQLite restarts the WAL from its start. It runs again while an
// eighth of the size or more was committed meanwhile; once less is left, the
// writer copies that itself at the end of a commit that no request is queued
// behind (the copy syncs the database file, and whoever waits behind it
// waits for that), and the next transaction restarts the WAL. At twice the
// size (under load without a pause, or the checkpointer could not run) the
// writer copies what it can itself anyway: the WAL stays bounded.
//
// Answers: a request submitted with a home executor (every write()) is
// answered and destroyed on it, the requests of one executor in one
// hand-off per batch; one without (submit()) is answered on this thread.
#include <SQLiteCpp/Database.h>
#include <SQLiteCpp/Statement.h>

#include <atomic>
#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

struct sqlite3;

#include "tether/persistence/database.hpp"
#include "tether/runtime/error.hpp"
#include "tether/runtime/one_shot.hpp"

namespace tether::persistence {

namespace asio = boost::asio;
using asio::awaitable;

namespace detail {
struct request {
  virtual ~request() = default;
  std::string name;
  std::size_t bytes = 0;
  /// The requester's executor, when it has one: the request is answered and
  /// destroyed there (see writer::run_batch), not on the writer thread.
  std::optional<asio::any_io_executor> home;
  // Runs inside the batch's transaction (on a re-run, inside the request's
  // savepoint). An error (returned or thrown) has what it wrote rolled back.
  // May be called twice, the first run rolled back.
  virtual result<void> run(SQLite::Database& db) = 0;
  virtual void answer() = 0;              // after COMMIT: the value, or run()'s error
  virtual void fail(const error& e) = 0;  // the batch did not commit
};

template <class T>
struct unwrap_result {
  using type = T;
};
template <class T>
struct unwrap_result<result<T>> {
  using type = T;
};
}  // namespace detail

/// A statement prepared once per writer connection and reused by every
/// request that runs the same SQL. REQUIRES: called inside a write operation
/// (on the writer thread). The cache is keyed by the text's address (pass a
/// literal or a constant, or every call prepares anew) and a hit is checked
/// against the statement's text. It comes back reset,
/// bindings cleared; the writer resets every statement handed out again after
/// each request and before each COMMIT.
SQLite::Statement& cached_statement(SQLite::Database& db, const char* sql);

/// Counters for tests and benches.
struct writer_stats {
  std::uint64_t transactions = 0;  // COMMITs attempted
  std::uint64_t requests = 0;
  std::uint64_t failed_commits = 0;
  std::uint64_t batches_rerun = 0;       // a request failed after writing: run again, in savepoints
  std::uint64_t checkpoints = 0;         // PASSIVE checkpoints the checkpointer ran
  std::uint64_t writer_checkpoints = 0;  // catch-ups the writer ran between transactions
  int wal_frames = 0;                    // frames in the WAL after the last commit
  // Frames (pages) the batches appended to the WAL: what each commit wrote
  // and synced (SQLite's SQLITE_DBSTATUS_CACHE_WRITE, per batch).
  std::uint64_t frames_written = 0;
};

class writer {
 public:
  /// Opens (creating if needed), checks identity and schema, migrates, and
  /// starts the writer thread.
  static result<std::unique_ptr<writer>> open(const db_options& opts);
  ~writer();
  writer(const writer&) = delete;
  writer& operator=(const writer&) = delete;

  /// Queues `fn(db)` (returning T or result<T>) as one write operation and
  /// returns a handle that resolves after its transaction committed. With a
  /// `home` executor the handle is set, and the request destroyed, on it
  /// (one hand-off per executor per batch); without one, on the writer
  /// thread.
  template <class F>
  auto submit(std::string name, std::size_t bytes, F fn,
              std::optional<asio::any_io_executor> home = std::nullopt) {
    using raw = std::invoke_result_t<const F&, SQLite::Database&>;
    using T = typename detail::unwrap_result<raw>::type;
    auto st = runtime::one_shot<result<T>>::make();
    auto req = std::make_unique<op<T, F>>(std::move(fn), st);
    req->name = std::move(name);
    req->bytes = bytes;
    req->home = std::move(home);
    enqueue(std::move(req));
    return st;
  }

  /// The awaitable form of submit(), answered on the awaiting coroutine's
  /// executor, its result moved to it (its one_shot has no other waiter).
  template <class F>
  auto write(std::string name, std::size_t bytes, F fn) -> awaitable<result<
      typename detail::unwrap_result<std::invoke_result_t<const F&, SQLite::Database&>>::type>> {
    asio::any_io_executor home = co_await asio::this_coro::executor;
    auto st = submit(std::move(name), bytes, std::move(fn), std::move(home));
    co_return co_await st->async_take(asio::use_awaitable);
  }

  /// Answers every queued request, then stops the thread. Later submits fail
  /// with errc::closed. Idempotent.
  void stop();

  writer_stats stats() const;
  const db_options& options() const { return opts_; }

  /// Test hook: the next n COMMITs fail (through sqlite3_commit_hook, so
  /// SQLite really rolls the transaction back).
  void inject_commit_failures(int n) { fail_commits_.store(n); }

  /// Test hook: while held, the checkpointer runs no checkpoint (the WAL
  /// grows past checkpoint_frames); releasing it lets a pending one run.
  void hold_checkpoints(bool held);
  /// Test hook: blocks until at least n checkpoints ran or `timeout` passed;
  /// returns whether they ran.
  bool wait_checkpoints(std::uint64_t n, std::chrono::milliseconds timeout) const;

 private:
  template <class T, class F>
  struct op final : detail::request {
    op(F f, std::shared_ptr<runtime::one_shot<result<T>>> s) : fn(std::move(f)), st(std::move(s)) {}
    F fn;
    std::shared_ptr<runtime::one_shot<result<T>>> st;
    result<T> value = error{errc::failed, "not run"};

    result<void> run(SQLite::Database& db) override {
      // As const: a run that is rolled back and run again (see run_batch)
      // finds its captures as they were (a mutable closure does not compile).
      const F& call = fn;
      if constexpr (std::is_void_v<T>) {
        if constexpr (std::is_void_v<std::invoke_result_t<const F&, SQLite::Database&>>) {
          call(db);
          value = {};
        } else {
          value = call(db);
        }
      } else {
        value = call(db);
      }
      if (!value) return value.error();
      return {};
    }
    void answer() override { st->set(std::move(value)); }
    void fail(const error& e) override { st->set(result<T>(e)); }
  };

  explicit writer(db_options opts, std::unique_ptr<SQLite::Database> db);
  void enqueue(std::unique_ptr<detail::request> r);
  void loop();
  void run_batch(std::deque<std::unique_ptr<detail::request>>& batch);
  // BEGIN IMMEDIATE; if it fails, every request of the batch is failed.
  bool begin(std::deque<std::unique_ptr<detail::request>>& batch);
  // One request, in a savepoint of its own or not; its error, if any.
  // `unusable`: its savepoint could not be rolled back or released.
  std::optional<error> run_one(detail::request& r, bool savepoint, bool& unusable);
  // Runs the batch's requests in the open transaction. Without savepoints,
  // stops at the first that fails after changing a row and returns false
  // (its writes so far are in the transaction); sets `lost` if SQLite rolled
  // the whole transaction back or a savepoint could not be undone.
  bool run_requests(std::deque<std::unique_ptr<detail::request>>& batch, bool savepoints,
                    std::vector<std::optional<error>>& errors, std::optional<error>& lost);
  static int commit_hook(void* self);
  static int wal_hook(void* self, sqlite3* db, const char* name, int frames);
  void checkpoint_loop();
  // The error every request of a batch gets when SQLite rolled the whole
  // transaction back while request `at` ran.
  static error whole_rollback(const detail::request& r, std::size_t at, std::size_t size,
                              const std::optional<error>& cause);

  static void exec(std::unique_ptr<SQLite::Statement>& st);

  db_options opts_;
  std::unique_ptr<SQLite::Database> db_;
  // Prepared once: a batch of 1000 requests runs them 2000 times.
  std::unique_ptr<SQLite::Statement> savepoint_, release_, rollback_to_;
  mutable std::mutex m_;
  std::condition_variable cv_;
  std::deque<std::unique_ptr<detail::request>> queue_;
  bool stopping_ = false;
  writer_stats stats_;
  std::atomic<int> fail_commits_{0};
  std::thread thread_;
  // The checkpointer: its own connection and thread, woken by wal_hook. Null
  // when a second connection cannot be opened (SQLite then checkpoints
  // inside the commit, as by default).
  std::unique_ptr<SQLite::Database> checkpoint_db_;
  mutable std::condition_variable checkpoint_cv_;  // under m_
  // idle -> wanted (by wal_hook) -> running -> idle.
  enum class checkpoint_phase { idle, wanted, running };
  checkpoint_phase checkpoint_ = checkpoint_phase::idle;
  int wal_copied_ = 0;  // frames the checkpointer copied since the WAL restarted
  bool checkpoints_held_ = false;
  std::thread checkpoint_thread_;
};

}  // namespace tether::persistence
