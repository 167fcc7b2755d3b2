#include "tether/persistence/database.hpp"

#include "tether/persistence/schema.hpp"

#include <SQLiteCpp/Exception.h>
#include <SQLiteCpp/Statement.h>
#include <SQLiteCpp/Transaction.h>
#include <sqlite3.h>

#include <filesystem>

namespace tether::persistence {

namespace {
// Every connection is used by one thread at a time (the writer's, or a
// reader lease), so SQLite's per-connection mutexes and its global memory
// accounting only cost time. The config call is refused harmlessly if the
// embedding program already started SQLite.
const int k_sqlite_config = [] { return sqlite3_config(SQLITE_CONFIG_MEMSTATUS, 0); }();
}  // namespace

std::string sqlite_message(const std::exception& e) {
  if (auto* s = dynamic_cast<const SQLite::Exception*>(&e))
    return std::string(s->what()) + " (sqlite code " + std::to_string(s->getExtendedErrorCode()) + ")";
  return e.what();
}

error corrupt_row(std::string_view table, const std::string& key, const std::string& problem) {
  return error{errc::corrupt, "refusing persisted state: table '" + std::string(table) + "' key '" +
                                  key + "': " + problem + "; the row was left as it is"};
}

error read_error(std::string_view what, const std::exception& e) {
  return error{errc::io, std::string(what) + ": " + sqlite_message(e)};
}

int latest_schema_version() { return static_cast<int>(migrations().size()); }

namespace {

result<void> check_identity(SQLite::Database& db, const std::string& path) {
  auto app = db.execAndGet("PRAGMA application_id").getInt();
  auto ver = db.execAndGet("PRAGMA user_version").getInt();
  auto objects = db.execAndGet("SELECT count(*) FROM sqlite_master").getInt();
  if (app == 0 && ver == 0 && objects == 0) return {};  // brand new
  if (app != k_application_id) {
    char buf[16];
    std::snprintf(buf, sizeof buf, "0x%08x", static_cast<unsigned>(app));
    return error{errc::refused, "refusing to open '" + path +
                                    "': it is not a tether database (application_id " + buf +
                                    ", " + std::to_string(objects) +
                                    " schema objects); the file was left untouched"};
  }
  if (ver > latest_schema_version())
    return error{errc::refused, "refusing to open '" + path + "': its schema version " +
                                    std::to_string(ver) + " is newer than this build's " +
                                    std::to_string(latest_schema_version()) +
                                    "; the file was left untouched"};
  return {};
}

result<void> migrate(SQLite::Database& db) {
  int ver = db.execAndGet("PRAGMA user_version").getInt();
  const auto& steps = migrations();
  if (ver == static_cast<int>(steps.size())) return {};
  SQLite::Transaction tx(db, SQLite::TransactionBehavior::IMMEDIATE);
  for (int v = ver; v < static_cast<int>(steps.size()); ++v) db.exec(steps[v]);
  db.exec("PRAGMA application_id = " + std::to_string(k_application_id));
  db.exec("PRAGMA user_version = " + std::to_string(steps.size()));
  tx.commit();
  return {};
}

}  // namespace

result<std::unique_ptr<SQLite::Database>> open_for_write(const db_options& opts) {
  try {
    auto db = std::make_unique<SQLite::Database>(
        opts.path, SQLite::OPEN_READWRITE | SQLite::OPEN_CREATE | SQLite::OPEN_NOMUTEX);
    db->setBusyTimeout(5000);
    if (auto r = check_identity(*db, opts.path); !r) return r.error();
    db->exec("PRAGMA journal_mode = WAL");
    db->exec(opts.sync == sync_mode::full ? "PRAGMA synchronous = FULL"
                                          : "PRAGMA synchronous = NORMAL");
    db->exec("PRAGMA foreign_keys = ON");
    if (auto r = migrate(*db); !r) return r.error();
    return db;
  } catch (const std::exception& e) {
    return error{errc::io, "cannot open database '" + opts.path + "': " + sqlite_message(e) +
                               "; nothing was changed"};
  }
}

result<int> check_readable(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec))
    return error{errc::not_found, "cannot read '" + path + "': " +
                                      (std::filesystem::exists(path, ec) ? "not a regular file"
                                                                         : "no such file") +
                                      "; nothing was created"};
  try {
    SQLite::Database db(path, SQLite::OPEN_READONLY);
    db.setBusyTimeout(5000);
    if (db.execAndGet("SELECT count(*) FROM sqlite_master").getInt() == 0)
      return error{errc::refused, "refusing to read '" + path +
                                      "': it is empty, not a tether database; the file was left "
                                      "untouched"};
    if (auto r = check_identity(db, path); !r) return r.error();
    int ver = db.execAndGet("PRAGMA user_version").getInt();
    if (ver < latest_schema_version())
      return error{errc::refused, "refusing to read '" + path + "': its schema version " +
                                      std::to_string(ver) + " is older than this build's " +
                                      std::to_string(latest_schema_version()) +
                                      " (a host migrates it when it opens it; a reader never "
                                      "does); the file was left untouched"};
    return ver;
  } catch (const std::exception& e) {
    return error{errc::refused, "refusing to read '" + path + "': it is not a tether database (" +
                                    sqlite_message(e) + "); the file was left untouched"};
  }
}

reader_pool::lease::~lease() {
  if (!c_) return;
  // tryReset: reset() rethrows the error of a step that failed, and a
  // destructor must not throw (an I/O error on a read would terminate).
  for (auto& [sql, st] : c_->cache) st->tryReset();
  std::lock_guard lk(p_->m_);
  p_->free_.push_back(std::move(c_));
}

SQLite::Statement& reader_pool::lease::statement(const std::string& sql) {
  auto it = c_->cache.find(sql);
  if (it == c_->cache.end()) {
    // Prepared before it enters the cache: a prepare that throws leaves no empty slot.
    auto fresh = std::make_unique<SQLite::Statement>(*c_->db, sql);
    return *c_->cache.emplace(sql, std::move(fresh)).first->second;
  }
  it->second->tryReset();  // an earlier failed step is not this read's error
  it->second->clearBindings();
  return *it->second;
}

reader_pool::lease reader_pool::acquire() {
  {
    std::lock_guard lk(m_);
    if (!free_.empty()) {
      auto c = std::move(free_.back());
      free_.pop_back();
      return lease(this, std::move(c));
    }
  }
  auto c = std::make_unique<connection>();
  c->db = std::make_unique<SQLite::Database>(path_, SQLite::OPEN_READONLY | SQLite::OPEN_NOMUTEX);
  c->db->setBusyTimeout(5000);
  return lease(this, std::move(c));
}

}  // namespace tether::persistence
