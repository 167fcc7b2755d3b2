#include "tether/persistence/database.hpp"

#include <SQLiteCpp/Exception.h>
#include <SQLiteCpp/Statement.h>
#include <SQLiteCpp/Transaction.h>
#include <fcntl.h>
#include <sqlite3.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iterator>
#include <string>
#include <vector>

#include "tether/persistence/schema.hpp"
#include "tether/protocol/ids.hpp"
#include "tether/runtime/executor_pool.hpp"

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
    return std::string(s->what()) + " (sqlite code " + std::to_string(s->getExtendedErrorCode()) +
           ")";
  return e.what();
}

error corrupt_row(std::string_view table, const std::string& key, const std::string& problem) {
  return error{errc::corrupt, "refusing persisted state: table '" + std::string(table) + "' key '" +
                                  key + "': " + problem + "; the row was left as it is"};
}

error read_error(std::string_view what, const std::exception& e) {
  return error{errc::io, std::string(what) + ": " + sqlite_message(e)};
}

namespace {

// One check: the first row of `table` matching `bad` is refused as
// "<field>: <problem> (found <value>)". `scan`, when set, is a whole query
// (one row if any row of `table` matches `bad`) that the table's scan runs
// instead of testing `bad` on each row: cheaper where `bad` looks up
// another table per row.
struct row_check {
  const char* table;
  const char* key;  // SQL naming the row
  const char* field;
  const char* bad;  // SQL condition
  const char* problem;
  const char* scan = nullptr;
};

#define TETHER_NOT_UINT(c) "(typeof(" c ") != 'integer' OR " c " < 0)"
#define TETHER_NOT_BOOL(c) "(" c " IS NOT 0 AND " c " IS NOT 1)"
// A scope column that disagrees with the JSON scope it was written from.
#define TETHER_SCOPE_DIFFERS(c) \
  "(json_valid(scope) AND " c " IS NOT json_extract(scope, '$." c "'))"

const row_check k_row_checks[] = {
    {"sessions", "id", "id", "id = ''", "empty"},
    {"sessions", "id", "status", "status NOT IN ('idle','busy')", "unknown value"},
    {"sessions", "id", "turn", "status = 'busy' AND turn IS NULL", "missing on a busy session"},
    {"sessions", "id", "turn", "turn = ''", "empty"},
    {"sessions", "id", "time_suspended", "status = 'busy' AND time_suspended IS NULL",
     "missing on a busy session (its claim)"},
    {"sessions", "id", "time_suspended", "status = 'idle' AND time_suspended IS NOT NULL",
     "set on an idle session"},
    {"sessions", "id", "tenant", "typeof(tenant) != 'text' OR tenant = ''", "empty or not text"},
    {"sessions", "id", "seq", TETHER_NOT_UINT("seq"), "not a non-negative integer"},
    {"sessions", "id", "input_cursor", TETHER_NOT_UINT("input_cursor") " OR input_cursor > seq",
     "not an integer in 0..seq"},
    {"sessions", "id", "resume_attempts", TETHER_NOT_UINT("resume_attempts"),
     "not a non-negative integer"},
    {"sessions", "id", "parent_id", "parent_id = '' OR parent_id = id",
     "empty or the session itself"},
    {"sessions", "id", "parent_notify",
     "parent_notify IS NOT NULL AND " TETHER_NOT_BOOL("parent_notify"), "not NULL, 0 or 1"},
    {"sessions", "id", "job_notify", TETHER_NOT_BOOL("job_notify"), "not 0 or 1"},
    {"sessions", "id", "revert_staged", TETHER_NOT_BOOL("revert_staged"), "not 0 or 1"},
    {"sessions", "id", "job_policy", "job_policy NOT IN ('withhold','report_now')",
     "unknown value"},
    {"sessions", "id", "policy", "policy IS NOT NULL AND NOT json_valid(policy)", "not JSON"},
    {"sessions", "id", "depth", TETHER_NOT_UINT("depth"), "not a non-negative integer"},
    {"messages", "session_id || '/' || seq", "seq", TETHER_NOT_UINT("seq"),
     "not an integer in 0..the session's seq"},
    // Past its session's seq: the scan seeks each session's messages past
    // its seq (one probe of the primary key per session) instead of looking
    // up the session of every message.
    {"messages", "session_id || '/' || seq", "seq",
     "seq > (SELECT s.seq FROM sessions s WHERE s.id = session_id)",
     "not an integer in 0..the session's seq",
     "SELECT 1 FROM sessions s WHERE EXISTS (SELECT 1 FROM messages m WHERE m.session_id = s.id "
     "AND m.seq > s.seq) LIMIT 1"},
    {"messages", "session_id || '/' || seq", "role", "role NOT IN ('user','assistant')",
     "unknown value"},
    {"messages", "session_id || '/' || seq", "kind",
     "kind NOT IN ('prompt','steer','report','notice','answer','control')", "unknown value"},
    {"messages", "session_id || '/' || seq", "status", "status NOT IN ('completed','error')",
     "unknown value"},
    {"messages", "session_id || '/' || seq", "payload",
     "CASE WHEN json_valid(payload) THEN json_type(payload, '$.text') IS NOT 'text' ELSE 1 END",
     "not a JSON object with a text"},
    {"tasks", "id", "kind",
     "kind NOT IN ('subagent','local_shell','shell','delegate','goal','cron_run','sop_run',"
     "'sop_step')",
     "unknown value"},
    {"tasks", "id", "state",
     "state NOT IN ('admitted','running','completed','failed','cancelled','lost','timed_out')",
     "unknown value"},
    {"tasks", "id", "notification_id",
     "kind IN ('subagent','local_shell') AND coalesce(notification_id, '') = ''",
     "missing or empty"},
    {"tasks", "id", "generation", TETHER_NOT_UINT("generation"), "not a non-negative integer"},
    {"tasks", "id", "input_tokens", TETHER_NOT_UINT("input_tokens"), "not a non-negative integer"},
    {"tasks", "id", "output_tokens", TETHER_NOT_UINT("output_tokens"),
     "not a non-negative integer"},
    {"tasks", "id", "child_id", "kind = 'local_shell' AND child_id IS NULL",
     "missing on a local shell row"},
    {"tasks", "id", "state", "kind = 'local_shell' AND state IN ('admitted','running')",
     "a local shell still running (this build runs none: schema step 6 settled every one as "
     "lost)"},
    {"tasks", "id", "child_id", "kind = 'subagent' AND state = 'running' AND child_id IS NULL",
     "missing on a running subagent row"},
    {"tasks", "id", "payload",
     "kind IN ('subagent','local_shell') AND CASE WHEN json_valid(payload) THEN "
     "json_type(payload, '$.description') IS NOT 'text' ELSE 1 END",
     "not a JSON object with a description"},
    // A terminal subagent task's report is owed, delivered or dropped as its
    // terminal receipt says: without one, boot could not tell.
    {"tasks", "id", "state",
     "kind = 'subagent' AND state IN ('completed','failed','cancelled') AND NOT EXISTS "
     "(SELECT 1 FROM receipts r WHERE r.task_id = tasks.id AND r.transition != 'started')",
     "terminal with no terminal receipt (the outbox of its report)"},
    {"inbox", "session_id || '/' || notification_id", "state", "state NOT IN ('pending','acked')",
     "unknown value"},
    {"inbox", "session_id || '/' || notification_id", "admitted_seq",
     TETHER_NOT_UINT("admitted_seq"), "not a non-negative integer"},
    {"inbox", "session_id || '/' || notification_id", "admitted_ord",
     TETHER_NOT_UINT("admitted_ord"), "not a non-negative integer"},
    {"tasks", "id", "scope", "kind = 'shell' AND NOT json_valid(scope)", "not JSON"},
    {"tasks", "id", "tenant",
     "kind = 'shell' AND (tenant = '' OR " TETHER_SCOPE_DIFFERS("tenant") ")",
     "empty or not its scope's tenant"},
    {"tasks", "id", "thread", "kind = 'shell' AND " TETHER_SCOPE_DIFFERS("thread"),
     "not its scope's thread"},
    {"tasks", "id", "turn", "kind = 'shell' AND " TETHER_SCOPE_DIFFERS("turn"),
     "not its scope's turn"},
    {"receipts", "id", "state", "state NOT IN ('pending','acked','read','dropped')",
     "unknown value"},
    {"receipts", "id", "transition",
     "transition NOT IN ('started','completed','failed','cancelled','lost','timed_out')",
     "unknown value"},
    {"receipts", "id", "scope", "NOT json_valid(scope)", "not JSON"},
    {"sandboxes", "id", "generation", TETHER_NOT_UINT("generation"), "not a non-negative integer"},
    {"tasks", "id", "scope", "kind = 'delegate' AND NOT json_valid(scope)", "not JSON"},
    {"settlement_intents", "task_id", "state", "state NOT IN ('completed','failed')",
     "unknown value"},
    {"settlement_intents", "task_id", "task_id",
     "NOT EXISTS (SELECT 1 FROM tasks t WHERE t.id = task_id AND t.kind = 'delegate')",
     "not a delegate task"},
    {"tasks", "id", "payload",
     "kind = 'cron_run' AND CASE WHEN json_valid(payload) THEN json_type(payload, '$.job') IS NOT "
     "'text' OR json_type(payload, '$.occurrence') IS NOT 'integer' ELSE 1 END",
     "not a JSON object with a job and an occurrence"},
    {"tasks", "id", "payload",
     "kind = 'sop_run' AND CASE WHEN json_valid(payload) THEN json_type(payload, '$.sop') IS NOT "
     "'text' OR json_type(payload, '$.definition') IS NOT 'object' OR json_extract(payload, "
     "'$.phase') NOT IN ('pending','running','waiting_approval','paused_checkpoint') OR "
     "json_type(payload, '$.step') IS NOT 'integer' ELSE 1 END",
     "not a JSON object with a sop, a definition, a phase and a step"},
    {"tasks", "id", "parent_id", "kind = 'sop_step' AND parent_id IS NULL",
     "missing on an SOP step (its run)"},
    {"tasks", "id", "revision", TETHER_NOT_UINT("revision"), "not a non-negative integer"},
    {"cron_jobs", "name", "spec", "NOT json_valid(spec)", "not JSON"},
    {"cron_jobs", "name", "source", "source NOT IN ('config','runtime')", "unknown value"},
    {"cron_jobs", "name", "enabled", TETHER_NOT_BOOL("enabled"), "not 0 or 1"},
    {"cron_jobs", "name", "fence", TETHER_NOT_UINT("fence"), "not a non-negative integer"},
};

#undef TETHER_NOT_UINT
#undef TETHER_NOT_BOOL
#undef TETHER_SCOPE_DIFFERS

}  // namespace

const std::vector<std::string>& validated_tables() {
  // Each table once, the ones that grow with a host's history first (a
  // transcript's messages, the tasks and their receipts), so that two
  // connections sharing the list end close together.
  static const std::vector<std::string> tables = [] {
    std::vector<std::string> out{"messages", "tasks", "receipts", "sessions", "inbox"};
    for (const auto& c : k_row_checks)
      if (std::find(out.begin(), out.end(), c.table) == out.end()) out.emplace_back(c.table);
    return out;
  }();
  return tables;
}

result<bool> table_has_bad_row(SQLite::Database& db, const std::string& table) {
  // One scan of the table when every row is well: its checks ORed into one
  // query (a database owing 100,000 reports: ~50 scans of the big tables
  // became one each).
  std::string any_bad;
  std::vector<const char*> scans;  // the checks with a query of their own
  for (const auto& c : k_row_checks) {
    if (table != c.table) continue;
    if (c.scan)
      scans.push_back(c.scan);
    else
      any_bad += (any_bad.empty() ? "(" : " OR (") + std::string(c.bad) + ")";
  }
  try {
    if (!any_bad.empty()) {
      SQLite::Statement q(db, "SELECT 1 FROM " + table + " WHERE " + any_bad + " LIMIT 1");
      if (q.executeStep()) return true;
    }
    for (const char* sql : scans) {
      SQLite::Statement q(db, sql);
      if (q.executeStep()) return true;
    }
    return false;
  } catch (const std::exception& e) {
    return read_error("checking " + table, e);
  }
}

result<void> refuse_first_bad_row(SQLite::Database& db, const std::vector<std::string>& flagged) {
  // The checks one by one, in the list's order, so the row refused is the
  // one checking each in turn over every table would refuse.
  for (const auto& c : k_row_checks) {
    if (std::find(flagged.begin(), flagged.end(), c.table) == flagged.end()) continue;
    std::string sql = std::string("SELECT ") + c.key + ", quote(" + c.field + ") FROM " + c.table +
                      " WHERE " + c.bad + " LIMIT 1";
    try {
      SQLite::Statement q(db, sql);
      if (q.executeStep())
        return corrupt_row(c.table, q.getColumn(0).getString(),
                           std::string(c.field) + ": " + c.problem + " (found " +
                               q.getColumn(1).getString() + ")");
    } catch (const std::exception& e) {
      return read_error(std::string("checking ") + c.table + "." + c.field, e);
    }
  }
  return {};
}

int latest_schema_version() {
  return static_cast<int>(migrations().size());
}

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
                                    "': it is not a tether database (application_id " + buf + ", " +
                                    std::to_string(objects) +
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
  for (int v = ver; v < static_cast<int>(steps.size()); ++v) {
    if (const auto* c = check_before_step(v + 1)) {
      SQLite::Statement q(db, c->sql);
      if (q.executeStep())  // returned before the commit: rolled back whole
        return corrupt_row(c->table, q.getColumn(0).getString(),
                           std::string(c->problem) + " (schema step " + std::to_string(v + 1) +
                               " would refuse it; the file was left at step " +
                               std::to_string(ver) + ")");
    }
    try {
      db.exec(steps[v]);
    } catch (const std::exception& e) {
      return error{errc::io, "schema step " + std::to_string(v + 1) +
                                 " failed: " + sqlite_message(e) +
                                 "; the migration was rolled back and the file left at step " +
                                 std::to_string(ver)};
    }
  }
  db.exec("PRAGMA application_id = " + std::to_string(k_application_id));
  db.exec("PRAGMA user_version = " + std::to_string(steps.size()));
  tx.commit();
  return {};
}

// Ids minted by this process sort after every id the store holds, even if
// the wall clock stepped back since they were minted.
void seed_mint_floor(SQLite::Database& db) {
  static const char* const k_ids[][2] = {{"sessions", "id"},
                                         {"sessions", "turn"},
                                         {"tasks", "id"},
                                         {"tasks", "notification_id"},
                                         {"inbox", "notification_id"}};
  // minted_glob() is "*_" then the digits. Its test anchored at the end,
  // the '_' where it must be and then the digits, is what GLOB tests, but a
  // pattern starting with '*' tries every position of every id (100,000
  // sessions and tasks: ~85 ms of a host's open, now ~55).
  auto glob = std::string(protocol::minted_glob());
  auto digits = glob.substr(2);
  auto n = std::count(digits.begin(), digits.end(), '[');
  auto tail = std::to_string(n + 1), at = std::to_string(n);
  std::string sql = "SELECT max(t) FROM (";
  for (std::size_t i = 0; i < std::size(k_ids); ++i) {
    std::string c = k_ids[i][1];
    if (i) sql += " UNION ALL ";
    sql += "SELECT substr(" + c + ", -" + tail + ") AS t FROM " + k_ids[i][0] + " WHERE substr(" +
           c + ", -" + tail + ", 1) = '_' AND substr(" + c + ", -" + at + ") GLOB ?1";
  }
  sql += ")";
  SQLite::Statement q(db, sql);
  q.bind(1, digits);
  if (q.executeStep() && !q.getColumn(0).isNull()) protocol::mint_floor(q.getColumn(0).getString());
}

}  // namespace

namespace {

// Creates a missing database file 0600 whatever the umask (SQLite gives its
// -wal, -shm and -journal files the database file's mode), and refuses an
// existing empty one unless the caller is creating a database.
// Returns true if it created the file.
result<bool> prepare_file(const db_options& opts) {
  const auto& path = opts.path;
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd >= 0) {
    ::fchmod(fd, 0600);
    ::close(fd);
    return true;
  }
  if (errno != EEXIST)
    return error{errc::io, "cannot create database '" + path + "': " + std::strerror(errno) +
                               "; nothing was created"};
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode) || st.st_size != 0) return false;
  struct stat wal {};
  if (::stat((path + "-wal").c_str(), &wal) == 0 && wal.st_size > 0) return false;  // in its WAL
  if (!opts.create)
    return error{errc::refused, "refusing to open '" + path +
                                    "': the file is empty (0 bytes), so whatever it held is gone; "
                                    "it is not adopted as a new database unless the caller asks "
                                    "to create one; the file was left untouched"};
  ::chmod(path.c_str(), 0600);
  return false;
}

// A database this open created and could not finish creating (a full disk, an
// I/O error) is removed with its side files: nothing was acknowledged in it,
// and an empty file left behind would be refused by every later open.
void remove_unfinished(const std::string& path) {
  for (const char* side : {"-wal", "-shm", "-journal"}) ::unlink((path + side).c_str());
  ::unlink(path.c_str());
}

result<std::unique_ptr<SQLite::Database>> open_new_or_existing(const db_options& opts);

}  // namespace

result<std::unique_ptr<SQLite::Database>> open_for_write(const db_options& opts) {
  auto created = prepare_file(opts);
  if (!created) return created.error();
  auto db = open_new_or_existing(opts);
  if (!db && *created) remove_unfinished(opts.path);
  return db;
}

namespace {

// The write connection's page cache (see open_new_or_existing).
constexpr const char* k_write_cache = "PRAGMA cache_size = -32768";

result<std::unique_ptr<SQLite::Database>> open_new_or_existing(const db_options& opts) {
  try {
    auto db = std::make_unique<SQLite::Database>(
        opts.path, SQLite::OPEN_READWRITE | SQLite::OPEN_CREATE | SQLite::OPEN_NOMUTEX);
    db->setBusyTimeout(5000);
    if (auto r = check_identity(*db, opts.path); !r) return r.error();
    db->exec("PRAGMA journal_mode = WAL");
    db->exec(opts.sync == sync_mode::full ? "PRAGMA synchronous = FULL"
                                          : "PRAGMA synchronous = NORMAL");
    db->exec("PRAGMA foreign_keys = ON");
    // A group commit that a request failing after its writes makes run
    // again runs each request under a savepoint (persistence/writer.hpp), and
    // SQLite keeps the original of every page a savepoint changes in a
    // sub-journal, a temporary file by default: pages written and read back
    // through the kernel that no crash ever needs (a crash rolls the whole
    // transaction back through the WAL). In memory, they cost a copy.
    db->exec("PRAGMA temp_store = MEMORY");
    // Tasks and receipts stay after delivery, so the tables outgrow SQLite's
    // default 2 MiB page cache and each commit re-read its index pages from
    // the kernel. Up to 32 MiB per connection, taken only as the file grows.
    db->exec(k_write_cache);
    // The WAL file keeps the size of its largest transaction (a migration
    // that copies a table, a batch of many requests) until the host closes,
    // unless it is cut back when it restarts: to 64 MiB, far above what the
    // checkpointer lets it reach between restarts (persistence/writer.cpp).
    db->exec("PRAGMA journal_size_limit = 67108864");
    if (auto r = migrate(*db); !r) return r.error();
    // The floor's scan reads every task row once: through a 32 MiB cache, a
    // fresh process paid to allocate and fault in 32 MiB of pages it never
    // read again (100,000 owed reports: ~0.16 s of the open, ~0.035 s with
    // SQLite's default 2 MiB). The cache is taken back to 32 MiB after it.
    db->exec("PRAGMA cache_size = -2048");
    seed_mint_floor(*db);
    db->exec(k_write_cache);
    return db;
  } catch (const std::exception& e) {
    return error{errc::io, "cannot open database '" + opts.path + "': " + sqlite_message(e) +
                               "; nothing was changed"};
  }
}

}  // namespace

namespace {

// The header's read and write versions are 2 in WAL mode.
bool is_wal(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  unsigned char h[20] = {};
  auto n = ::pread(fd, h, sizeof h, 0);
  ::close(fd);
  return n == static_cast<ssize_t>(sizeof h) && h[18] == 2 && h[19] == 2;
}

}  // namespace

result<int> check_readable(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec))
    return error{errc::not_found,
                 "cannot read '" + path + "': " +
                     (std::filesystem::exists(path, ec) ? "not a regular file" : "no such file") +
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
    auto* se = dynamic_cast<const SQLite::Exception*>(&e);
    int code = se ? se->getErrorCode() : 0;
    if (code == SQLITE_NOTADB)
      return error{errc::refused, "refusing to read '" + path + "': it is not a tether database (" +
                                      sqlite_message(e) + "); the file was left untouched"};
    if ((code == SQLITE_CANTOPEN || code == SQLITE_READONLY) && is_wal(path)) {
      auto dir = std::filesystem::path(path).parent_path();
      if (dir.empty()) dir = ".";
      bool dir_writable = ::access(dir.c_str(), W_OK) == 0;
      return error{errc::io, "cannot read '" + path +
                                 "': it is a WAL database, and SQLite could not open or create "
                                 "its side files '" +
                                 path + "-shm' and '" + path + "-wal'" +
                                 (dir_writable ? std::string()
                                               : " (the directory '" + dir.string() +
                                                     "' is not writable by this user)") +
                                 ": " + sqlite_message(e) +
                                 "; read it as a user who may write there, or copy the database "
                                 "with its -wal file elsewhere; the file was left untouched"};
    }
    return error{errc::io, "cannot read '" + path + "': " + sqlite_message(e) +
                               "; the file was left untouched"};
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

namespace {

std::atomic<std::uint64_t> g_reads_on_executor{0};

void note_read(const std::string& sql) {
  if (!runtime::on_executor_thread()) return;
  g_reads_on_executor.fetch_add(1, std::memory_order_relaxed);
  static const bool trace = [] {
    const char* v = std::getenv("TETHER_TRACE_EXECUTOR_READS");
    return v && *v && std::string_view(v) != "0";
  }();
  if (trace) std::fprintf(stderr, "tether: SQLite read on an executor thread: %s\n", sql.c_str());
}

}  // namespace

std::uint64_t reads_on_executor() {
  return g_reads_on_executor.load(std::memory_order_relaxed);
}

void reader_pool::join() {
  std::unique_ptr<boost::asio::thread_pool> threads;
  {
    std::lock_guard lk(m_);
    threads = std::move(threads_);
  }
  if (threads) threads->join();
}

boost::asio::thread_pool& reader_pool::read_threads() {
  std::lock_guard lk(m_);
  if (!threads_) threads_ = std::make_unique<boost::asio::thread_pool>(2);
  return *threads_;
}

SQLite::Statement& reader_pool::lease::statement(const std::string& sql) {
  note_read(sql);
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
