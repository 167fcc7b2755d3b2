#include "tether/persistence/writer.hpp"

#include <SQLiteCpp/Exception.h>
#include <sqlite3.h>

#include <algorithm>
#include <boost/asio/post.hpp>
#include <cstring>
#include <unordered_map>
#include <vector>

namespace tether::persistence {

namespace {
// One cache per writer thread; it dies with the thread, before the writer
// closes its connection. Keyed by the SQL text's address (every caller passes
// a literal or a constant that lives as long), so a lookup neither copies nor
// hashes the text; a hit is checked against the statement's own text, and a
// different text at an address seen before replaces it.
struct statement_cache {
  SQLite::Database* db = nullptr;
  std::unordered_map<const char*, std::unique_ptr<SQLite::Statement>> stmts;
  // Handed out since the last reset_cached_statements(): only these can be
  // mid-step, so only these are reset (not every statement of the cache).
  std::vector<SQLite::Statement*> used;
};
thread_local statement_cache t_cache;

// tryReset: reset() throws the error of a step that failed, which the
// request already answered for; thrown here, it ended the writer thread.
void reset_cached_statements() {
  for (auto* st : t_cache.used) (void)st->tryReset();
  t_cache.used.clear();
}
}  // namespace

SQLite::Statement& cached_statement(SQLite::Database& db, const char* sql) {
  if (t_cache.db != &db) {
    t_cache.used.clear();
    t_cache.stmts.clear();
    t_cache.db = &db;
  }
  auto& slot = t_cache.stmts[sql];
  if (slot && std::strcmp(slot->getQuery().c_str(), sql) != 0) {
    std::erase(t_cache.used, slot.get());
    slot.reset();
  }
  if (!slot) {
    slot = std::make_unique<SQLite::Statement>(db, sql);
  } else {
    (void)slot->tryReset();
    slot->clearBindings();
  }
  t_cache.used.push_back(slot.get());
  return *slot;
}

result<std::unique_ptr<writer>> writer::open(const db_options& opts) {
  auto db = open_for_write(opts);
  if (!db) return db.error();
  return std::unique_ptr<writer>(new writer(opts, std::move(*db)));
}

writer::writer(db_options opts, std::unique_ptr<SQLite::Database> db)
    : opts_(std::move(opts)),
      db_(std::move(db)),
      savepoint_(std::make_unique<SQLite::Statement>(*db_, "SAVEPOINT s")),
      release_(std::make_unique<SQLite::Statement>(*db_, "RELEASE s")),
      rollback_to_(std::make_unique<SQLite::Statement>(*db_, "ROLLBACK TO s")) {
  sqlite3_commit_hook(db_->getHandle(), &writer::commit_hook, this);
  // The checkpointer's connection. If it cannot be opened (an in-memory or
  // temporary database has no second connection to it), SQLite's automatic
  // checkpoint stays on the writer's commits.
  if (!opts_.path.empty() && opts_.path != ":memory:" && opts_.checkpoint_frames > 0) {
    try {
      checkpoint_db_ = std::make_unique<SQLite::Database>(
          opts_.path, SQLite::OPEN_READWRITE | SQLite::OPEN_NOMUTEX);
      // A connection opens the WAL at its first read; until then a checkpoint
      // through it finds no WAL and copies nothing.
      checkpoint_db_->exec("SELECT count(*) FROM sqlite_schema");
    } catch (const std::exception&) {
      checkpoint_db_.reset();
    }
  }
  if (checkpoint_db_) {
    sqlite3_wal_hook(db_->getHandle(), &writer::wal_hook, this);  // replaces the automatic one
    checkpoint_thread_ = std::thread([this] { checkpoint_loop(); });
  }
  thread_ = std::thread([this] { loop(); });
}

writer::~writer() {
  stop();
}

namespace {

// Set by wal_hook, inside a COMMIT on the writer's thread; run_batch, on that
// thread, runs the copy once the batch's answers are handed off.
thread_local bool t_catch_up_due = false;

// A committed (or failed) request and what it is answered.
struct outcome {
  std::unique_ptr<detail::request> r;
  std::optional<error> err;
  void deliver() {
    if (err)
      r->fail(*err);
    else
      r->answer();
  }
};

// One executor's answers of a batch, handed to it in one post. Run, it
// answers them in batch order and destroys the requests on that thread.
// Dropped unrun (its executor was stopped and its queue is being destroyed),
// its destructor answers them all the same: each waiter's resumption is then
// posted into that queue and destroyed with it, which frees the waiting
// coroutine, as when the writer thread answered it directly. (Unanswered, the
// coroutine frame and its one_shot would hold each other forever.)
class answers {
 public:
  explicit answers(std::vector<outcome> o) : outcomes_(std::move(o)) {}
  answers(answers&&) noexcept = default;
  answers& operator=(answers&&) = delete;
  ~answers() { deliver(); }
  void operator()() { deliver(); }

 private:
  void deliver() {
    auto all = std::move(outcomes_);  // none is answered twice
    outcomes_.clear();
    for (auto& o : all) o.deliver();
  }
  std::vector<outcome> outcomes_;
};

}  // namespace

int writer::wal_hook(void* self, sqlite3*, const char*, int frames) {
  auto* w = static_cast<writer*>(self);
  int size = w->opts_.checkpoint_frames;
  int small = std::max(1, size / 8);
  bool catch_up = false;
  {
    std::lock_guard lk(w->m_);
    if (frames < w->stats_.wal_frames) w->wal_copied_ = 0;  // the WAL restarted
    w->stats_.wal_frames = frames;
    auto phase = w->checkpoint_;
    int left = frames - w->wal_copied_;
    if (frames >= 2 * size && phase != checkpoint_phase::running) {
      // Twice the size: a load without a pause, or a checkpointer that did
      // not run. The writer copies what it can, whoever waits: the bound.
      catch_up = true;
    } else if (phase == checkpoint_phase::idle && w->wal_copied_ > 0 && left < small) {
      // The checkpointer copied all but a little: the writer copies that, so
      // the next transaction finds the WAL wholly copied and restarts it.
      // Only when no request is queued behind this commit: the copy syncs
      // the database file, and every queued request would wait for that (it
      // was bench_commit's p99 with 1,024 requesters). Under load the WAL
      // grows on until a pause, or until the bound above.
      catch_up = w->queue_.empty();
    } else if (phase == checkpoint_phase::idle && frames >= size) {
      w->checkpoint_ = checkpoint_phase::wanted;
      w->checkpoint_cv_.notify_all();
    }
  }
  // Not here, inside the COMMIT: run_batch copies once this batch's answers
  // are handed off, so its requesters do not wait for the sync either.
  if (catch_up) t_catch_up_due = true;
  return SQLITE_OK;
}

void writer::checkpoint_loop() {
  std::unique_lock lk(m_);
  for (;;) {
    checkpoint_cv_.wait(lk, [&] {
      return stopping_ || (checkpoint_ == checkpoint_phase::wanted && !checkpoints_held_);
    });
    if (stopping_) return;
    checkpoint_ = checkpoint_phase::running;
    lk.unlock();
    int log = 0, copied = 0;
    // PASSIVE: copies what no reader still needs, waits for no one. A failure
    // loses nothing (the WAL keeps every frame); a later commit asks again.
    int rc = sqlite3_wal_checkpoint_v2(checkpoint_db_->getHandle(), nullptr,
                                       SQLITE_CHECKPOINT_PASSIVE, &log, &copied);
    lk.lock();
    if (rc == SQLITE_OK) {
      stats_.checkpoints++;
      // The WAL may have restarted meanwhile (a catch-up at twice the size):
      // then what was copied is of the old one.
      wal_copied_ = copied <= stats_.wal_frames ? copied : 0;
    }
    checkpoint_ = checkpoint_phase::idle;
    checkpoint_cv_.notify_all();
  }
}

void writer::hold_checkpoints(bool held) {
  std::lock_guard lk(m_);
  checkpoints_held_ = held;
  checkpoint_cv_.notify_all();
}

bool writer::wait_checkpoints(std::uint64_t n, std::chrono::milliseconds timeout) const {
  std::unique_lock lk(m_);
  return checkpoint_cv_.wait_for(lk, timeout, [&] { return stats_.checkpoints >= n; });
}

void writer::exec(std::unique_ptr<SQLite::Statement>& st) {
  st->reset();
  st->exec();
}

int writer::commit_hook(void* self) {
  auto* w = static_cast<writer*>(self);
  int n = w->fail_commits_.load();
  while (n > 0) {
    if (w->fail_commits_.compare_exchange_weak(n, n - 1)) return 1;  // turn COMMIT into ROLLBACK
  }
  return 0;
}

void writer::enqueue(std::unique_ptr<detail::request> r) {
  {
    std::lock_guard lk(m_);
    if (!stopping_) {
      bool was_empty = queue_.empty();
      queue_.push_back(std::move(r));
      // The writer only sleeps on an empty queue.
      if (was_empty) cv_.notify_one();
      return;
    }
  }
  r->fail(
      error{errc::closed, "the persistence writer is stopped; '" + r->name + "' was not written"});
}

void writer::stop() {
  {
    std::lock_guard lk(m_);
    if (stopping_ && !thread_.joinable()) return;
    stopping_ = true;
    cv_.notify_one();
    checkpoint_cv_.notify_all();
  }
  if (thread_.joinable() && thread_.get_id() != std::this_thread::get_id()) thread_.join();
  if (checkpoint_thread_.joinable()) checkpoint_thread_.join();
}

writer_stats writer::stats() const {
  std::lock_guard lk(m_);
  return stats_;
}

void writer::loop() {
  std::deque<std::unique_ptr<detail::request>> batch;
  for (;;) {
    {
      std::unique_lock lk(m_);
      cv_.wait(lk, [&] { return !queue_.empty() || stopping_; });
      if (queue_.empty()) return;  // stopping, and everything was answered
      std::size_t bytes = 0;
      while (!queue_.empty() && batch.size() < opts_.max_batch &&
             (batch.empty() || bytes + queue_.front()->bytes <= opts_.max_batch_bytes)) {
        bytes += queue_.front()->bytes;
        batch.push_back(std::move(queue_.front()));
        queue_.pop_front();
      }
    }
    run_batch(batch);
    batch.clear();
  }
}

error writer::whole_rollback(const detail::request& r, std::size_t at, std::size_t size,
                             const std::optional<error>& cause) {
  return error{errc::io, "SQLite rolled back the whole transaction during '" + r.name + "' (" +
                             (cause ? cause->message : std::string("no error reported")) +
                             "); nothing of this batch of " + std::to_string(size) +
                             " requests was written, and the " + std::to_string(size - at - 1) +
                             " after it were not run"};
}

bool writer::begin(std::deque<std::unique_ptr<detail::request>>& batch) {
  try {
    // A ROLLBACK that failed after an earlier batch left its transaction
    // open: nothing of it was answered as committed; end it, or every later
    // BEGIN fails.
    if (sqlite3_get_autocommit(db_->getHandle()) == 0) db_->exec("ROLLBACK");
    db_->exec("BEGIN IMMEDIATE");
    return true;
  } catch (const std::exception& e) {
    // A batch that cannot even begin fails as a whole.
    error err{errc::io, "BEGIN IMMEDIATE failed: " + sqlite_message(e) +
                            "; nothing of this batch was written"};
    for (auto& r : batch) r->fail(err);
    std::lock_guard lk(m_);
    stats_.failed_commits++;
    return false;
  }
}

std::optional<error> writer::run_one(detail::request& r, bool savepoint, bool& unusable) {
  auto& db = *db_;
  std::optional<error> err;
  try {
    if (savepoint) exec(savepoint_);
    auto res = r.run(db);
    if (!res) err = res.error();
  } catch (const SQLite::Exception& e) {
    int code = e.getErrorCode();
    err = error{code == SQLITE_CONSTRAINT ? errc::conflict : errc::io,
                "'" + r.name + "' failed: " + sqlite_message(e) + "; it was rolled back alone"};
  } catch (const error_exception& e) {
    err = e.err();  // a request's own refusal, mid-transaction (its code kept)
  } catch (const std::exception& e) {
    err = error{errc::failed,
                "'" + r.name + "' threw: " + std::string(e.what()) + "; it was rolled back alone"};
  }
  // A request may leave a cached statement mid-step (a read it stopped
  // early): reset them so the savepoint can be released, and so that no
  // cursor stays open under the next request's writes.
  reset_cached_statements();
  if (!savepoint || sqlite3_get_autocommit(db.getHandle()) != 0) return err;
  try {
    if (err) exec(rollback_to_);
    exec(release_);
  } catch (const std::exception& e) {
    // The savepoint machinery itself failed: what the request wrote may
    // still be in the transaction, or its savepoint still open.
    unusable = true;
    err = error{errc::io, "'" + r.name + "': its savepoint could not be " +
                              (err ? "rolled back" : "released") + ": " + sqlite_message(e) +
                              (err ? " (it had failed: " + err->message + ")" : "")};
  }
  return err;
}

bool writer::run_requests(std::deque<std::unique_ptr<detail::request>>& batch, bool savepoints,
                          std::vector<std::optional<error>>& errors, std::optional<error>& lost) {
  for (std::size_t i = 0; i < batch.size(); ++i) {
    bool unusable = false;
    auto changes = sqlite3_total_changes64(db_->getHandle());
    auto err = run_one(*batch[i], savepoints, unusable);
    // SQLite rolled back the whole transaction inside the request (SQLITE_FULL,
    // IOERR, NOMEM, BUSY): nothing of this batch is written, and the requests
    // after it are not run (a SAVEPOINT would open an autocommit transaction
    // that its RELEASE commits).
    if (sqlite3_get_autocommit(db_->getHandle()) != 0) {
      lost = whole_rollback(*batch[i], i, batch.size(), err);
      return true;
    }
    if (unusable) {
      lost = error{errc::io, err->message + "; nothing of this batch of " +
                                 std::to_string(batch.size()) + " requests was written"};
      return true;
    }
    // A failed request that changed no row (a refusal before its first
    // write, or a statement SQLite undid alone) leaves nothing to undo: the
    // batch goes on. One that did: see run_batch.
    if (err && !savepoints && sqlite3_total_changes64(db_->getHandle()) != changes) return false;
    errors[i] = std::move(err);
  }
  return true;
}

void writer::run_batch(std::deque<std::unique_ptr<detail::request>>& batch) {
  auto& db = *db_;
  if (!begin(batch)) return;
  std::vector<std::optional<error>> errors(batch.size());
  std::optional<error> lost;
  // First without savepoints: a SAVEPOINT and its RELEASE per request cost
  // more than most requests (each page a request writes is first copied to
  // the savepoint's journal). When one fails after changing a row, what it
  // wrote is in the transaction: the whole transaction is rolled back, and
  // the batch runs again with each request in its own savepoint, which
  // rolls a failing one back alone. A request may so run twice, the first
  // time undone (writer::op calls it as const: its captures are the same).
  if (!run_requests(batch, false, errors, lost)) {
    bool rolled_back = false;
    try {
      db.exec("ROLLBACK");
      rolled_back = sqlite3_get_autocommit(db.getHandle()) != 0;
    } catch (const std::exception&) {
    }
    {
      std::lock_guard lk(m_);
      stats_.batches_rerun++;
    }
    if (!rolled_back) {
      lost = error{errc::io,
                   "the transaction could not be rolled back after a request of the "
                   "batch failed; nothing of this batch of " +
                       std::to_string(batch.size()) + " requests was written"};
    } else {
      if (!begin(batch)) return;
      run_requests(batch, true, errors, lost);
    }
  }
  std::optional<error> commit_err = std::move(lost);
  if (!commit_err) {
    try {
      reset_cached_statements();  // no statement keeps a cursor open past the batch
      db.exec("COMMIT");
    } catch (const std::exception& e) {
      commit_err =
          error{errc::io, "COMMIT failed: " + sqlite_message(e) + "; nothing of this batch of " +
                              std::to_string(batch.size()) + " requests was written"};
    }
  }
  if (commit_err) {
    try {
      if (sqlite3_get_autocommit(db.getHandle()) == 0) db.exec("ROLLBACK");
    } catch (...) {
    }
  }
  // The pages this batch wrote to the WAL (SQLite's count of the frames its
  // pager appended, read and reset here, once per batch).
  int written = 0, most = 0;
  sqlite3_db_status(db.getHandle(), SQLITE_DBSTATUS_CACHE_WRITE, &written, &most, 1);
  {
    std::lock_guard lk(m_);
    stats_.transactions++;
    stats_.requests += batch.size();
    stats_.frames_written += static_cast<std::uint64_t>(std::max(written, 0));
    if (commit_err) stats_.failed_commits++;
  }
  // A request with a home executor is answered and destroyed there, those
  // of one executor together in one hand-off (answers, above). Answering
  // each from here took the executor's scheduler lock and woke it once per
  // request, and destroying each here freed memory its requester's thread
  // had allocated, which contends for that thread's malloc arena: with 1,024
  // requesters (bench_commit) the two were about a quarter of the writer
  // thread's time.
  std::vector<std::pair<asio::any_io_executor, std::vector<outcome>>> homes;
  for (std::size_t i = 0; i < batch.size(); ++i) {
    outcome o{std::move(batch[i]), commit_err ? commit_err : std::move(errors[i])};
    if (!o.r->home) {
      o.deliver();
      continue;
    }
    auto at = std::find_if(homes.begin(), homes.end(),
                           [&](const auto& h) { return h.first == *o.r->home; });
    if (at == homes.end()) {
      homes.emplace_back(*o.r->home, std::vector<outcome>());
      at = std::prev(homes.end());
    }
    at->second.push_back(std::move(o));
  }
  for (auto& [ex, outcomes] : homes) asio::post(ex, answers(std::move(outcomes)));
  if (t_catch_up_due) {
    t_catch_up_due = false;
    int log = 0, copied = 0;
    // PASSIVE: waits for no reader; what a reader still needs stays in the WAL.
    if (sqlite3_wal_checkpoint_v2(db.getHandle(), nullptr, SQLITE_CHECKPOINT_PASSIVE, &log,
                                  &copied) == SQLITE_OK) {
      std::lock_guard lk(m_);
      stats_.writer_checkpoints++;
      wal_copied_ = 0;  // restarted by the next transaction (unless a reader holds it)
    }
  }
}

}  // namespace tether::persistence
