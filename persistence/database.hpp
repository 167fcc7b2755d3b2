#pragma once
// Opening a tether database: identity (application_id), schema version
// (user_version) and migrations, pragmas, and the read connections.
#include <SQLiteCpp/Database.h>
#include <SQLiteCpp/Statement.h>

#include <boost/asio/awaitable.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/thread_pool.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include "tether/runtime/error.hpp"
#include "tether/runtime/one_shot.hpp"

namespace tether::persistence {

/// 'TETH': marks a database as ours.
constexpr std::int32_t k_application_id = 0x54455448;

enum class sync_mode {
  full,    // default: a COMMIT is on disk when it returns
  normal,  // opt-in only: WAL+NORMAL can lose the last commits on power loss
};

struct db_options {
  std::string path;
  sync_mode sync = sync_mode::full;
  std::size_t max_batch = 1024;            // requests per transaction
  std::size_t max_batch_bytes = 8u << 20;  // payload bytes per transaction
  /// WAL frames (pages) after a commit at which the writer asks its
  /// checkpointer thread to copy the WAL back into the database file (off the
  /// commit path; SQLite's own automatic checkpoint runs inside a commit, at
  /// 1,000). Each time the WAL is copied back and restarts, whoever waits for
  /// the writer waits for the last of the copy (the database file's sync): at
  /// 1,000 frames that was 14-33 times in bench_commit's 3 s with 1,024
  /// requesters, often enough to set its p99 (11.2-13.0 ms in five runs,
  /// against 6.1-8.5 ms at 8,000 with 2-4 such waits; the same run's plain
  /// program with no checkpoint at all: 2.6-4.5 ms). A bigger WAL also copies
  /// hot pages back less often: bench_latency's closed-loop rate was 9,490 and
  /// 9,798 reports/s at 8,000 against 7,706 and 7,649 at 1,000. The WAL file
  /// grows to about 33 MB (8,000 pages of 4 KiB with their frame headers)
  /// before a copy starts, twice that at the bound (writer.cpp), and is cut
  /// back to 64 MiB when it restarts (journal_size_limit). 0: SQLite's
  /// automatic checkpoint, inside the commits.
  int checkpoint_frames = 8000;
  /// The caller is creating a database: an existing empty (zero-length) file
  /// becomes a new one. Without it an empty file is refused (a truncated
  /// database is not adopted as a new one); a missing file is created either
  /// way. A file created here is 0600, and so are its side files.
  bool create = false;
};

/// The schema version this build writes.
int latest_schema_version();

/// Opens the write connection: refuses (leaving the file untouched) a
/// database of another application or of a newer schema, then sets the
/// pragmas and runs pending migrations in one transaction.
result<std::unique_ptr<SQLite::Database>> open_for_write(const db_options& opts);

/// Checks, through a read-only connection, that `path` is a tether database
/// this build can read; returns its schema version. Never creates, migrates
/// or writes the file: a missing file, another application's database or a
/// schema other than this build's is refused with what was found.
result<int> check_readable(const std::string& path);

/// A pool of read-only connections. Reads never wait on the writer (WAL).
class reader_pool {
 public:
  explicit reader_pool(std::string path) : path_(std::move(path)) {}

  /// A read connection with its prepared statements.
  struct connection {
    std::unique_ptr<SQLite::Database> db;
    std::unordered_map<std::string, std::unique_ptr<SQLite::Statement>> cache;
  };

  class lease {
   public:
    lease(reader_pool* p, std::unique_ptr<connection> c) : p_(p), c_(std::move(c)) {}
    lease(lease&&) = default;
    ~lease();
    SQLite::Database& operator*() { return *c_->db; }
    SQLite::Database* operator->() { return c_->db.get(); }
    /// A statement prepared once per connection; comes back reset, bindings
    /// cleared. Every one is reset again when the lease ends, so no read
    /// snapshot outlives it.
    SQLite::Statement& statement(const std::string& sql);

   private:
    reader_pool* p_;
    std::unique_ptr<connection> c_;
  };

  /// A connection for the caller's exclusive use until the lease ends.
  lease acquire();

  /// Waits for the reads in flight and ends the read threads (a later
  /// offload() starts them again). A read completes by posting to its
  /// caller's executor, and post() still touches that io_context after the
  /// handler may have run: whoever destroys the executors joins the reads
  /// first (host::shutdown, once its executors stopped).
  void join();

  /// Runs `fn` (a read through this pool, returning a result<T>) on the
  /// pool's own read threads and resumes the caller on its executor once it
  /// returned: an actor awaits its reads instead of blocking its executor on
  /// SQLite. Name the lambda in a statement of its own before awaiting (GCC 12
  /// destroys a capturing lambda temporary inside co_await twice).
  template <class F>
  boost::asio::awaitable<std::invoke_result_t<F&>> offload(F fn) {
    auto shot = start(std::move(fn));
    co_return co_await shot->async_take(boost::asio::use_awaitable);
  }

  /// Queues `fn` on the read threads now and returns where its result will
  /// be: reads started side by side, in the order they are started, and
  /// awaited later, once (shot->async_take: the result is moved to its one
  /// reader, never copied). What `fn` refers to must outlive the
  /// read, whether or not anyone awaits it (join() waits for it).
  template <class F>
  std::shared_ptr<runtime::one_shot<std::invoke_result_t<F&>>> start(F fn) {
    using R = std::invoke_result_t<F&>;
    auto shot = runtime::one_shot<R>::make();
    auto job = [fn = std::move(fn), shot]() mutable {
      try {
        shot->set(fn());
      } catch (const std::exception& e) {
        shot->set(R(error{errc::io, std::string("read failed: ") + e.what()}));
      }
    };
    boost::asio::post(read_threads(), std::move(job));
    return shot;
  }

 private:
  boost::asio::thread_pool& read_threads();

  std::string path_;
  std::mutex m_;
  std::vector<std::unique_ptr<connection>> free_;
  // Started on the first offload(); declared last, so it is joined before
  // the connections it reads through go.
  std::unique_ptr<boost::asio::thread_pool> threads_;
};

/// How many statements were prepared or run through a reader_pool on an
/// actor's executor thread (runtime::on_executor_thread()) since the process
/// started: the rule is none (an actor offload()s its reads). Set
/// TETHER_TRACE_EXECUTOR_READS=1 to print each one's SQL on stderr.
std::uint64_t reads_on_executor();

/// "what SQLite said", with the extended code.
std::string sqlite_message(const std::exception& e);

/// A row that does not parse: refused, naming table, key and problem, and left as it is.
error corrupt_row(std::string_view table, const std::string& key, const std::string& problem);

/// Every persisted field a boot decides on is checked in two steps, in the
/// caller's connections (read only): an unknown state word, a busy session
/// without its turn or claim, a message without text, an empty tenant, an
/// owned job whose columns disagree with its scope, a negative or
/// non-integer counter. First each table of validated_tables() is scanned
/// once for any row failing any of its checks (table_has_bad_row: several
/// connections may share the tables); then, only if a table was flagged,
/// refuse_first_bad_row() runs the checks one by one over the flagged tables
/// and refuses the first row that does not validate with corrupt_row(),
/// naming table, key and field. Nothing is changed.
const std::vector<std::string>& validated_tables();
result<bool> table_has_bad_row(SQLite::Database& db, const std::string& table);
result<void> refuse_first_bad_row(SQLite::Database& db, const std::vector<std::string>& flagged);

/// A read that SQLite failed: what was being read, and what SQLite said.
error read_error(std::string_view what, const std::exception& e);

}  // namespace tether::persistence
