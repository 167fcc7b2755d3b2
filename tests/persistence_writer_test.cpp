// The single writer: group commit, per-request savepoints, COMMIT failure,
// database identity, reads beside a busy writer.
#include <SQLiteCpp/Statement.h>
#include <sqlite3.h>
#include <sys/stat.h>

#include <atomic>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <thread>

#include "catch_result.hpp"
#include "support.hpp"
#include "tether/persistence/task_store.hpp"
#include "tether/persistence/writer.hpp"
#include "tether/protocol/ids.hpp"

using namespace tether;
using namespace tether::persistence;
namespace asio = boost::asio;

namespace {

std::unique_ptr<writer> open_writer(const std::string& path,
                                    int checkpoint_frames = db_options{}.checkpoint_frames) {
  db_options opts{path};
  opts.checkpoint_frames = checkpoint_frames;
  auto w = writer::open(opts);
  REQUIRE(w);
  return std::move(*w);
}

void create_table(writer& w) {
  auto st = w.submit("create t", 0, [](SQLite::Database& db) {
    db.exec("CREATE TABLE t (k INTEGER PRIMARY KEY, v TEXT NOT NULL)");
  });
  auto r = test::run(st->async_wait(asio::use_awaitable));
  REQUIRE(r);
}

int count_rows(const std::string& path) {
  SQLite::Database db(path, SQLite::OPEN_READONLY);
  return db.execAndGet("SELECT count(*) FROM t").getInt();
}

}  // namespace

TEST_CASE("500 concurrent writers commit in far fewer transactions, 5 bad ones fail alone") {
  test::scratch_dir dir("group");
  auto w = open_writer(dir.file("t.db"));
  create_table(*w);
  auto before = w->stats().transactions;

  // Outlives the test: the writer's last post may still be signalling it when
  // run() returns (see test::run).
  static asio::io_context io;
  io.restart();
  std::vector<result<void>> results(500, error{errc::failed, "not answered"});
  int answered = 0;
  for (int i = 0; i < 500; ++i) {
    auto one = [](writer& w, int i, std::vector<result<void>>& out,
                  int& answered) -> asio::awaitable<void> {
      bool bad = i % 100 == 7;  // 5 of them violate NOT NULL
      auto r = co_await w.write("insert " + std::to_string(i), 16, [i, bad](SQLite::Database& db) {
        SQLite::Statement st(db, "INSERT INTO t (k, v) VALUES (?, ?)");
        st.bind(1, i);
        if (bad)
          st.bind(2);  // NULL
        else
          st.bind(2, "row");
        st.exec();
      });
      out[i] = r;
      ++answered;
    };
    asio::co_spawn(io, one(*w, i, results, answered), asio::detached);
  }
  io.run();
  CHECK(answered == 500);
  int failed = 0;
  for (int i = 0; i < 500; ++i) {
    if (i % 100 == 7) {
      REQUIRE_FALSE(results[i]);
      CHECK(results[i].error().code == errc::conflict);
      CHECK(results[i].error().message.find("insert " + std::to_string(i)) != std::string::npos);
      ++failed;
    } else {
      CHECK(results[i]);
    }
  }
  CHECK(failed == 5);
  CHECK(count_rows(dir.file("t.db")) == 495);
  // A bad one's INSERT changed no row (SQLite undid the statement): its
  // batch went on without a second run.
  CHECK(w->stats().batches_rerun == 0);
  auto txs = w->stats().transactions - before;
  INFO("transactions for 500 writers: " << txs);
  CHECK(txs < 50);
}

TEST_CASE("a failed COMMIT reaches every requester of the batch and none is told it committed") {
  test::scratch_dir dir("commitfail");
  auto path = dir.file("t.db");
  auto w = open_writer(path);
  create_table(*w);

  // Hold the writer inside a first batch; the rows submitted meanwhile all
  // queue up and form the second batch. Both COMMITs are made to fail.
  std::promise<void> inside, release;
  auto released = release.get_future().share();
  auto blocker = w->submit("blocker", 0, [&inside, released](SQLite::Database& db) {
    db.exec("INSERT INTO t (k, v) VALUES (100, 'blocker')");
    inside.set_value();
    released.wait();
  });
  inside.get_future().wait();
  std::vector<std::shared_ptr<runtime::one_shot<result<void>>>> batch;
  for (int i = 0; i < 10; ++i)
    batch.push_back(w->submit("row " + std::to_string(i), 8, [i](SQLite::Database& db) {
      SQLite::Statement st(db, "INSERT INTO t (k, v) VALUES (?, 'x')");
      st.bind(1, i);
      st.exec();
    }));
  w->inject_commit_failures(2);
  release.set_value();

  auto all = [](auto blocker, auto batch) -> asio::awaitable<std::vector<result<void>>> {
    std::vector<result<void>> out;
    out.push_back(co_await blocker->async_wait(asio::use_awaitable));
    for (auto& b : batch) out.push_back(co_await b->async_wait(asio::use_awaitable));
    co_return out;
  };
  auto results = test::run(all(blocker, batch));
  REQUIRE(results.size() == 11);
  for (auto& r : results) {
    REQUIRE_FALSE(r);
    CHECK(r.error().code == errc::io);
    CHECK(r.error().message.find("COMMIT failed") != std::string::npos);
  }
  CHECK(count_rows(path) == 0);
  CHECK(w->stats().failed_commits == 2);

  // The writer carries on: the next request commits.
  auto after = w->submit("after", 8, [](SQLite::Database& db) {
    db.exec("INSERT INTO t (k, v) VALUES (1, 'after')");
  });
  REQUIRE(test::run(after->async_wait(asio::use_awaitable)));
  CHECK(count_rows(path) == 1);
}

TEST_CASE("a database of another application is refused and left untouched") {
  test::scratch_dir dir("foreign");
  auto path = dir.file("other.db");
  {
    SQLite::Database db(path, SQLite::OPEN_READWRITE | SQLite::OPEN_CREATE);
    db.exec("CREATE TABLE notes (x TEXT)");
    db.exec("INSERT INTO notes VALUES ('mine')");
  }
  auto before = std::filesystem::file_size(path);
  auto mtime = std::filesystem::last_write_time(path);
  auto w = writer::open(db_options{path});
  REQUIRE_FALSE(w);
  CHECK(w.error().code == errc::refused);
  CHECK(w.error().message.find("not a tether database") != std::string::npos);
  CHECK(w.error().message.find("left untouched") != std::string::npos);
  CHECK(std::filesystem::file_size(path) == before);
  CHECK(std::filesystem::last_write_time(path) == mtime);
  CHECK_FALSE(std::filesystem::exists(path + "-wal"));
}

TEST_CASE("a database of a newer schema is refused and left untouched") {
  test::scratch_dir dir("newer");
  auto path = dir.file("t.db");
  { open_writer(path); }
  {
    SQLite::Database db(path, SQLite::OPEN_READWRITE);
    db.exec("PRAGMA user_version = " + std::to_string(latest_schema_version() + 1));
  }
  auto mtime = std::filesystem::last_write_time(path);
  auto w = writer::open(db_options{path});
  REQUIRE_FALSE(w);
  CHECK(w.error().code == errc::refused);
  CHECK(w.error().message.find("newer") != std::string::npos);
  CHECK(std::filesystem::last_write_time(path) == mtime);
}

TEST_CASE(
    "a tether database reopens at the latest schema with WAL, FULL sync, foreign keys, "
    "in-memory sub-journals and a bounded WAL file") {
  test::scratch_dir dir("pragmas");
  auto path = dir.file("t.db");
  { open_writer(path); }
  auto w = open_writer(path);
  auto st = w->submit("pragmas", 0, [](SQLite::Database& db) {
    return db.execAndGet("PRAGMA journal_mode").getString() + "/" +
           db.execAndGet("PRAGMA synchronous").getString() + "/" +
           db.execAndGet("PRAGMA foreign_keys").getString() + "/" +
           db.execAndGet("PRAGMA temp_store").getString() + "/" +
           db.execAndGet("PRAGMA cache_size").getString() + "/" +
           db.execAndGet("PRAGMA journal_size_limit").getString();
  });
  auto r = test::run(st->async_wait(asio::use_awaitable));
  REQUIRE(r);
  // temp_store 2 (memory): a savepoint's sub-journal is not a file.
  // journal_size_limit: the WAL file is cut back to 64 MiB when it restarts.
  CHECK(*r == "wal/2/1/2/-32768/67108864");
  SQLite::Database ro(path, SQLite::OPEN_READONLY);
  CHECK(ro.execAndGet("PRAGMA user_version").getInt() == latest_schema_version());
  CHECK(ro.execAndGet("PRAGMA application_id").getInt() == k_application_id);
}

TEST_CASE("reads go through their own connection and do not wait on an open write transaction") {
  test::scratch_dir dir("reads");
  auto path = dir.file("t.db");
  auto w = open_writer(path);
  create_table(*w);
  std::promise<void> inside, release;
  auto released = release.get_future().share();
  auto held = w->submit("held", 0, [&inside, released](SQLite::Database& db) {
    db.exec("INSERT INTO t (k, v) VALUES (1, 'uncommitted')");
    inside.set_value();
    released.wait();
  });
  inside.get_future().wait();  // the writer is now inside BEGIN IMMEDIATE
  reader_pool readers(path);
  {
    auto r = readers.acquire();
    CHECK(r->execAndGet("SELECT count(*) FROM t").getInt() == 0);  // sees the last commit
  }
  release.set_value();
  REQUIRE(test::run(held->async_wait(asio::use_awaitable)));
  auto r = readers.acquire();
  CHECK(r->execAndGet("SELECT count(*) FROM t").getInt() == 1);
}

TEST_CASE("requests after stop are refused with closed, not lost silently") {
  test::scratch_dir dir("stop");
  auto w = open_writer(dir.file("t.db"));
  w->stop();
  auto st = w->submit("late", 0, [](SQLite::Database&) {});
  auto r = test::run(st->async_wait(asio::use_awaitable));
  REQUIRE_FALSE(r);
  CHECK(r.error().code == errc::closed);
}

namespace {

// A SQL function that fails with `code`: inside a write statement SQLite then
// rolls the whole transaction back, as it does for a real I/O error.
void install_fault(SQLite::Database& db, int code) {
  auto fault = [](sqlite3_context* ctx, int, sqlite3_value**) {
    sqlite3_result_error_code(ctx, *static_cast<int*>(sqlite3_user_data(ctx)));
  };
  static int codes[2] = {SQLITE_IOERR, SQLITE_NOMEM};
  int* slot = code == SQLITE_IOERR ? &codes[0] : &codes[1];
  sqlite3_create_function(db.getHandle(), "fault", 0, SQLITE_UTF8, slot, fault, nullptr, nullptr);
}

// Runs `before`, the faulting request and `after` as one batch (a held
// request keeps the writer busy while they queue); returns their results.
std::vector<result<void>> batch_around(writer& w, std::function<void(SQLite::Database&)> faulting) {
  std::promise<void> inside, release;
  auto released = release.get_future().share();
  auto held = w.submit("held", 0, [&inside, released](SQLite::Database&) {
    inside.set_value();
    released.wait();
  });
  inside.get_future().wait();
  std::vector<std::shared_ptr<runtime::one_shot<result<void>>>> batch;
  batch.push_back(w.submit("before", 8, [](SQLite::Database& db) {
    db.exec("INSERT INTO t (k, v) VALUES (1, 'before')");
  }));
  batch.push_back(w.submit("faulting", 8, std::move(faulting)));
  batch.push_back(w.submit("after", 8, [](SQLite::Database& db) {
    db.exec("INSERT INTO t (k, v) VALUES (3, 'after')");
  }));
  release.set_value();
  auto all = [](auto held, auto batch) -> asio::awaitable<std::vector<result<void>>> {
    co_await held->async_wait(asio::use_awaitable);
    std::vector<result<void>> out;
    for (auto& b : batch) out.push_back(co_await b->async_wait(asio::use_awaitable));
    co_return out;
  };
  return test::run(all(held, batch));
}

bool has_row(const std::string& path, int k) {
  SQLite::Database db(path, SQLite::OPEN_READONLY);
  SQLite::Statement q(db, "SELECT count(*) FROM t WHERE k = ?");
  q.bind(1, k);
  q.executeStep();
  return q.getColumn(0).getInt() == 1;
}

void check_whole_batch_failed(const std::string& path, const std::vector<result<void>>& results) {
  REQUIRE(results.size() == 3);
  const char* names[] = {"before", "faulting", "after"};
  for (int i = 0; i < 3; ++i) {
    INFO("request '" << names[i] << "'");
    // Told it failed, and truly not written: neither in the rolled-back
    // transaction nor in an autocommit one of its own.
    REQUIRE_FALSE(results[i]);
    CHECK(results[i].error().message.find("rolled back the whole transaction during 'faulting'") !=
          std::string::npos);
    CHECK(results[i].error().message.find("nothing of this batch of 3 requests was written") !=
          std::string::npos);
  }
  CHECK_FALSE(has_row(path, 1));
  CHECK_FALSE(has_row(path, 3));
}

}  // namespace

TEST_CASE(
    "an I/O error that rolls back the whole transaction fails its batch without committing a later "
    "request") {
  test::scratch_dir dir("ioerr");
  auto path = dir.file("t.db");
  auto w = open_writer(path);
  create_table(*w);
  auto results = batch_around(*w, [](SQLite::Database& db) {
    install_fault(db, SQLITE_IOERR);
    db.exec("INSERT INTO t (k, v) VALUES (2, fault())");
  });
  check_whole_batch_failed(path, results);
  CHECK(results[2].error().message.find("the 1 after it were not run") != std::string::npos);

  // The writer carries on in a transaction of its own.
  auto next = w->submit(
      "next", 8, [](SQLite::Database& db) { db.exec("INSERT INTO t (k, v) VALUES (4, 'next')"); });
  REQUIRE(test::run(next->async_wait(asio::use_awaitable)));
  CHECK(has_row(path, 4));
}

TEST_CASE(
    "a request that fails after writing leaves nothing, and the rest of its batch commits once") {
  test::scratch_dir dir("partial");
  auto path = dir.file("t.db");
  auto w = open_writer(path);
  create_table(*w);
  auto reruns = w->stats().batches_rerun;
  auto txs = w->stats().transactions;
  // The batch runs without savepoints first: the failure finds 'before' and
  // its own first row in the transaction. Both runs of 'before' insert the
  // same key, so a first run left in place would fail the second.
  auto results = batch_around(*w, [](SQLite::Database& db) {
    db.exec("INSERT INTO t (k, v) VALUES (2, 'partial')");
    throw std::runtime_error("refused after its first row");
  });
  REQUIRE(results.size() == 3);
  CHECK(results[0]);
  REQUIRE_FALSE(results[1]);
  CHECK(results[1].error().code == errc::failed);
  CHECK(results[1].error().message.find("refused after its first row") != std::string::npos);
  CHECK(results[1].error().message.find("rolled back alone") != std::string::npos);
  CHECK(results[2]);
  CHECK(has_row(path, 1));
  CHECK_FALSE(has_row(path, 2));
  CHECK(has_row(path, 3));
  CHECK(count_rows(path) == 2);
  CHECK(w->stats().batches_rerun == reruns + 1);
  // The held request's transaction, then the batch's one.
  CHECK(w->stats().transactions == txs + 2);
  CHECK(w->stats().failed_commits == 0);
}

TEST_CASE("a full database that rolls back the whole transaction fails its batch truthfully") {
  test::scratch_dir dir("full");
  auto path = dir.file("t.db");
  auto w = open_writer(path);
  create_table(*w);
  auto results = batch_around(*w, [](SQLite::Database& db) {
    // The file may not grow: a row bigger than a page needs new pages.
    auto pages = db.execAndGet("PRAGMA page_count").getInt();
    db.exec("PRAGMA max_page_count = " + std::to_string(pages));
    db.exec("INSERT INTO t (k, v) VALUES (2, hex(zeroblob(100000)))");
  });
  check_whole_batch_failed(path, results);
  CHECK(results[1].error().message.find("full") != std::string::npos);
}

namespace {

session_row session_named(const std::string& id, std::optional<std::string> parent = {}) {
  session_row r;
  r.id = session_id(id);
  if (parent) r.parent = session_id(*parent);
  return r;
}

}  // namespace

TEST_CASE("staging a revert on a missing session is an error, not a success") {
  test::scratch_dir dir("revert_missing");
  auto path = dir.file("t.db");
  auto w = open_writer(path);
  task_store store(*w, path);
  auto r = test::run(store.set_revert(session_id("nobody"), true));
  REQUIRE_FALSE(r);
  CHECK(r.error().code == errc::not_found);
  CHECK(r.error().message.find("'nobody' does not exist") != std::string::npos);
  REQUIRE(test::run(store.create_session(session_named("someone"))));
  CHECK(test::run(store.set_revert(session_id("someone"), true)));
}

TEST_CASE("one admit batch enters the inbox in outbox order, not notification id order") {
  test::scratch_dir dir("admit_order");
  auto path = dir.file("t.db");
  auto w = open_writer(path);
  task_store store(*w, path);
  REQUIRE(test::run(store.create_session(session_named("parent"))));
  std::vector<report_item> first{{notification_id("msg_c"), {}, "third by name"},
                                 {notification_id("msg_a"), {}, "first by name"},
                                 {notification_id("msg_b"), {}, "second by name"}};
  std::vector<report_item> second{{notification_id("msg_0"), {}, "before all by name"}};
  REQUIRE(test::run(store.admit(session_id("parent"), first)));
  REQUIRE(test::run(store.admit(session_id("parent"), second)));
  auto inbox = store.inbox(session_id("parent"));
  REQUIRE(inbox);
  std::vector<std::string> order;
  for (auto& r : *inbox) order.push_back(r.nid.str());
  CHECK(order == std::vector<std::string>{"msg_c", "msg_a", "msg_b", "msg_0"});
  auto taken = test::run(store.take_inbox(session_id("parent")));
  REQUIRE(taken);
  std::vector<std::string> bodies;
  for (auto& m : taken->messages) bodies.push_back(m.text);
  CHECK_FALSE(taken->more);
  CHECK(bodies == std::vector<std::string>{"third by name", "first by name", "second by name",
                                           "before all by name"});
}

TEST_CASE(
    "a child is created in its parent's tenant, and its spawn returns its row as a read after the "
    "commit finds it") {
  // The spawner makes the child's actor from the returned row instead of
  // reading it back (actors/session.cpp): it must be the stored row, not the
  // one asked for. Here they differ: the child takes its parent's tenant, the
  // store's status and the prompt's seq.
  test::scratch_dir dir("spawned_row");
  auto path = dir.file("t.db");
  auto w = open_writer(path);
  task_store store(*w, path);
  auto parent = session_named("parent");
  parent.tenant = protocol::tenant_id("acme");
  REQUIRE(test::run(store.create_session(parent)));
  auto asked = session_named("child", "parent");
  asked.notify = false;
  asked.depth = 1;
  asked.job_policy = "report_now";
  asked.budget_root = session_id("parent");
  protocol::session_policy narrowed;
  narrowed.max_depth = 2;
  asked.policy = narrowed;
  job_row job;
  job.id = job_id("job_spawned");
  job.nid = notification_id("msg_spawned");
  job.parent = session_id("parent");
  job.child = session_id("child");
  job.status = job_status::running;
  auto spawned = test::run(store.spawn(asked, session_id("child"), "go", job));
  REQUIRE(spawned);
  REQUIRE(spawned->created);
  auto stored = store.session(session_id("child"));
  REQUIRE(stored);
  REQUIRE(*stored);
  const auto& got = *spawned->created;
  const auto& want = **stored;
  CHECK(want.tenant.str() == "acme");  // not the row's "default": the store chose it
  CHECK(want.seq == spawned->seq);
  CHECK(want.seq > 0);
  REQUIRE(want.policy.has_value());
  CHECK(want.policy->max_depth == 2);
  // Every column, as the reads decode it.
  auto text = [](const auto& id) {
    return id ? std::optional<std::string>(id->str()) : std::nullopt;
  };
  auto columns = [&](const session_row& r) {
    return std::make_tuple(r.id.str(), text(r.parent), r.notify, r.description, r.agent, r.busy,
                           r.time_suspended, r.resume_attempts, r.seq, r.revert_staged,
                           r.input_cursor, r.idle_outcome, r.tenant.str(), text(r.turn),
                           r.job_notify, r.job_policy, r.policy, r.depth, text(r.budget_root),
                           text(r.task_id));
  };
  CHECK(columns(got) == columns(want));

  // A follow-up to a child that exists creates nothing and returns no row.
  auto again = test::run(store.spawn(std::nullopt, session_id("child"), "more", std::nullopt));
  REQUIRE(again);
  CHECK_FALSE(again->created);
  CHECK(again->seq == spawned->seq + 1);
}

TEST_CASE("the write connection keeps its 32 MiB page cache after the open's floor scan") {
  // The open scans every id with a small cache (persistence/database.cpp),
  // then gives the connection its own back: each commit's index pages stay
  // cached. Opened twice: on a new file, and on one that holds a task.
  test::scratch_dir dir("cache_size");
  auto path = dir.file("t.db");
  for (int open = 0; open < 2; ++open) {
    INFO("open " << open + 1);
    auto w = open_writer(path);
    auto read = [](SQLite::Database& db) { return db.execAndGet("PRAGMA cache_size").getInt64(); };
    auto size = test::run(w->write("read the page cache's size", 0, read));
    REQUIRE(size);
    CHECK(*size == -32768);
    auto add = [](SQLite::Database& db) {
      db.exec(
          "INSERT OR IGNORE INTO tasks (id, kind, state, payload, created_at, updated_at) "
          "VALUES ('job_cache', 'subagent', 'completed', '{}', 0, 0)");
    };
    REQUIRE(test::run(w->write("add a task", 0, add)));
  }
}

TEST_CASE("an id minted after the wall clock stepped back sorts after every id in the store") {
  // Each column of minted ids the store's open reads, one at a time.
  auto column = GENERATE(as<std::string>{}, "sessions.id", "sessions.turn", "tasks.id",
                         "tasks.notification_id", "inbox.notification_id");
  test::scratch_dir dir("ids_back");
  auto path = dir.file("t.db");
  // An id minted ten minutes "ahead": as if the clock has since stepped back.
  auto us = std::chrono::duration_cast<std::chrono::microseconds>(
                std::chrono::system_clock::now().time_since_epoch() + std::chrono::minutes(10))
                .count();
  char tail[32];
  std::snprintf(tail, sizeof tail, "_%012llx0000", static_cast<unsigned long long>(us));
  // A multi-byte character before the '_' (counted as one) does not matter.
  std::string stored = std::string("s\xc3\xa9s") + tail;
  // Ids that only look minted are not read as a floor: further ahead still,
  // without the '_' right before the digits, or with a digit too many.
  char ahead[32];
  std::snprintf(ahead, sizeof ahead, "%012llx0000",
                static_cast<unsigned long long>(us + 3600LL * 1000000));
  // A multi-byte character among the last 17 keeps an id from looking minted.
  const std::string not_minted[] = {std::string("ses-") + ahead, std::string("ses_x") + ahead,
                                    std::string("ses_0") + ahead,
                                    std::string("ses_") + (ahead + 1) + "\xc3\xa9"};
  {
    auto w = open_writer(path);
    task_store store(*w, path);
    REQUIRE(test::run(store.create_session(session_named("parent"))));
    REQUIRE(test::run(store.create_session(session_named("other"))));
    for (const auto& id : not_minted) REQUIRE(test::run(store.create_session(session_named(id))));
  }
  {
    SQLite::Database db(path, SQLite::OPEN_READWRITE);
    if (column == "sessions.id") {
      db.exec("UPDATE sessions SET id = '" + stored + "' WHERE id = 'parent'");
    } else if (column == "sessions.turn") {
      db.exec("UPDATE sessions SET turn = '" + stored + "' WHERE id = 'parent'");
    } else if (column == "inbox.notification_id") {
      db.exec(
          "INSERT INTO inbox (session_id, notification_id, body, admitted_seq, admitted_at, "
          "admitted_ord) VALUES ('parent', '" +
          stored + "', 'b', 0, 0, 1)");
    } else {
      bool as_id = column == "tasks.id";
      db.exec(
          "INSERT INTO tasks (id, notification_id, kind, mode, parent_id, child_id, state, "
          "payload, created_at, updated_at) VALUES ('" +
          (as_id ? stored : std::string("job_a")) + "', '" +
          (as_id ? std::string("msg_a") : stored) +
          "', 'subagent', 'background', 'parent', 'other', 'running', "
          "'{\"description\":\"d\"}', 0, 0)");
    }
  }
  auto w = open_writer(path);  // a new boot reads what the store holds
  auto a = protocol::mint("ses"), b = protocol::mint("ses");
  INFO(column << ": stored " << stored << ", minted " << a << " then " << b);
  auto digits = [](const std::string& id) { return id.substr(id.rfind('_')); };
  CHECK(digits(a) > digits(stored));
  CHECK(digits(b) > digits(a));
  // The floor is the stored id, not one of those further ahead.
  CHECK(digits(a) < std::string("_") + ahead);
}

TEST_CASE("an existing empty database file is refused unless the caller creates a database") {
  test::scratch_dir dir("empty_db");
  auto path = dir.file("t.db");
  { std::ofstream(path, std::ios::binary); }  // truncated to 0 bytes
  auto w = writer::open(db_options{path});
  REQUIRE_FALSE(w);
  CHECK(w.error().code == errc::refused);
  CHECK(w.error().message.find("empty (0 bytes)") != std::string::npos);
  CHECK(std::filesystem::file_size(path) == 0);
  CHECK_FALSE(std::filesystem::exists(path + "-wal"));

  db_options create{path};
  create.create = true;
  auto made = writer::open(create);
  REQUIRE(made);
  (*made)->stop();
  made->reset();
  CHECK(std::filesystem::file_size(path) > 0);
  CHECK(writer::open(db_options{path}));  // a tether database now
}

TEST_CASE("a new database and its side files are 0600 whatever the umask") {
  test::scratch_dir dir("modes");
  auto path = dir.file("t.db");
  auto old = ::umask(0);
  auto w = writer::open(db_options{path});
  ::umask(old);
  REQUIRE(w);
  create_table(**w);
  for (auto& f : {path, path + "-wal", path + "-shm"}) {
    INFO(f);
    REQUIRE(std::filesystem::exists(f));
    auto perms = std::filesystem::status(f).permissions();
    CHECK((perms & std::filesystem::perms::all) ==
          (std::filesystem::perms::owner_read | std::filesystem::perms::owner_write));
  }
}

namespace {
// A busy "parent" (a turn to bind the receipt to) that spawned "child" in the
// background under `nid`, the child's busy period open: a report owed.
job_row busy_background_child(task_store& store, const std::string& nid) {
  REQUIRE(test::run(store.create_session(session_named("parent"))));
  REQUIRE(test::run(store.begin_busy(session_id("parent"))));
  job_row job;
  job.id = job_id(nid);
  job.nid = notification_id(nid);
  job.parent = session_id("parent");
  job.child = session_id("child");
  job.description = "audit";
  REQUIRE(test::run(store.spawn(session_named("child", "parent"), session_id("child"), "go", job)));
  REQUIRE(test::run(store.begin_busy(session_id("child"))));
  return job;
}
}  // namespace

TEST_CASE("deleting a session drops what was owed to it and keeps its tasks as history") {
  test::scratch_dir dir("delete_session");
  auto path = dir.file("t.db");
  auto w = open_writer(path);
  task_store store(*w, path);
  auto job = busy_background_child(store, "msg_owed");
  settle_request req;
  req.child = session_id("child");
  req.background_job = job.id;
  req.body = "the report";
  auto settled = test::run(store.settle(req));
  REQUIRE(settled);
  REQUIRE(settled->row_written);
  REQUIRE(test::run(store.admit(session_id("parent"), {{notification_id("msg_other"), {}, "x"}},
                                persistence::admit_receipts::notices)));
  REQUIRE(test::run(store.append(session_id("parent"), "user", "prompt", "completed", "hi")));

  auto d = test::run(store.delete_session(session_id("parent")));
  REQUIRE(d);
  CHECK(*d == 1);  // the child's report, owed to the parent
  auto gone = store.session(session_id("parent"));
  REQUIRE(gone);
  CHECK_FALSE(gone->has_value());
  auto msgs = store.messages(session_id("parent"));
  REQUIRE(msgs);
  CHECK(msgs->empty());
  auto inbox = store.inbox(session_id("parent"));
  REQUIRE(inbox);
  CHECK(inbox->empty());
  auto r = store.receipt_by_id(protocol::make_event_id(job.id, protocol::transition::completed));
  REQUIRE(r);
  REQUIRE(*r);
  CHECK((*r)->state == receipt_state::dropped);
  auto tasks = store.jobs();
  REQUIRE(tasks);
  REQUIRE(tasks->size() == 1);  // the task stays, terminal, owed to nobody
  CHECK(tasks->front().status == job_status::completed);
  CHECK_FALSE(tasks->front().owed);
  auto child = store.session(session_id("child"));
  REQUIRE(child);
  CHECK(child->has_value());  // children stay sessions of their own

  auto again = test::run(store.delete_session(session_id("parent")));
  REQUIRE_FALSE(again);
  CHECK(again.error().code == errc::not_found);
  CHECK(again.error().message.find("'parent' does not exist") != std::string::npos);
}

namespace {
awaitable<result<settle_admit_result>> settled_and_admitted(
    std::shared_ptr<runtime::one_shot<result<settle_admit_result>>> write) {
  co_return co_await write->async_wait(asio::use_awaitable);
}
}  // namespace

TEST_CASE(
    "a settle folded with its report's admit writes the report into the parent's inbox with its "
    "receipt acknowledged, or dropped when the parent is gone, in one transaction") {
  test::scratch_dir dir("settle-admit");
  auto path = dir.file("t.db");
  auto w = open_writer(path);
  task_store store(*w, path);
  auto job = busy_background_child(store, "msg_folded");
  settle_request req;
  req.child = session_id("child");
  req.background_job = job.id;
  req.body = "the report";
  auto commits = w->stats().transactions;
  auto done = test::run(
      settled_and_admitted(store.settle_admit_submit(session_id("parent"), req, job.nid)));
  REQUIRE(done);
  CHECK(w->stats().transactions == commits + 1);
  CHECK(done->settled.row_written);
  CHECK(done->admitted == admit_outcome::added);
  CHECK_FALSE(done->parent_gone);
  auto child = store.session(session_id("child"));
  REQUIRE(child);
  REQUIRE(*child);
  CHECK_FALSE((*child)->busy);
  auto inbox = store.inbox(session_id("parent"));
  REQUIRE(inbox);
  REQUIRE(inbox->size() == 1);
  CHECK(inbox->front().body == "the report");
  CHECK_FALSE(inbox->front().acked);  // unread until the parent's drain takes it
  auto r = store.receipt_by_id(protocol::make_event_id(job.id, protocol::transition::completed));
  REQUIRE(r);
  REQUIRE(*r);
  CHECK((*r)->state == receipt_state::acked);
  auto owed = store.outstanding_jobs();
  REQUIRE(owed);
  CHECK(owed->empty());  // nothing in the outbox

  // The same settle again finds the task terminal: nothing written, nothing
  // admitted twice.
  auto again = test::run(
      settled_and_admitted(store.settle_admit_submit(session_id("parent"), req, job.nid)));
  REQUIRE(again);
  CHECK_FALSE(again->settled.row_written);
  CHECK_FALSE(again->admitted);
  inbox = store.inbox(session_id("parent"));
  REQUIRE(inbox);
  CHECK(inbox->size() == 1);

  // A none-mode report to a parent that is gone: its receipt is dropped.
  REQUIRE(test::run(store.begin_busy(session_id("child"))));
  settle_request none;
  none.child = session_id("child");
  none.mint_none = notification_id("msg_none");
  none.parent = session_id("gone");
  none.body = "nobody reads this";
  auto dropped = test::run(
      settled_and_admitted(store.settle_admit_submit(session_id("gone"), none, *none.mint_none)));
  REQUIRE(dropped);
  CHECK(dropped->settled.row_written);
  CHECK(dropped->parent_gone);
  CHECK_FALSE(dropped->admitted);
  r = store.receipt_by_id(
      protocol::make_event_id(job_id("msg_none"), protocol::transition::completed));
  REQUIRE(r);
  REQUIRE(*r);
  CHECK((*r)->state == receipt_state::dropped);
  owed = store.outstanding_jobs();
  REQUIRE(owed);
  CHECK(owed->empty());
}

TEST_CASE("a request whose cached statement fails is rolled back alone and the writer goes on",
          "[regression]") {
  // The writer reset the cached statements after each request with
  // Statement::reset(), which throws the error of a step that failed: out of
  // the batch, ending the writer thread (std::terminate).
  test::scratch_dir dir("cached-fails");
  auto w = open_writer(dir.file("t.db"));
  auto make = [](SQLite::Database& db) { db.exec("CREATE TABLE once (k INTEGER PRIMARY KEY)"); };
  REQUIRE(test::run(w->write("make", 8, make)));
  auto insert = [](SQLite::Database& db) {
    cached_statement(db, "INSERT INTO once (k) VALUES (1)").exec();
  };
  REQUIRE(test::run(w->write("first", 8, insert)));
  auto again = test::run(w->write("again", 8, insert));
  REQUIRE_FALSE(again);
  CHECK(again.error().code == errc::conflict);
  auto count = [](SQLite::Database& db) -> result<int> {
    return db.execAndGet("SELECT count(*) FROM once").getInt();
  };
  auto after = test::run(w->write("count", 8, count));
  REQUIRE(after);
  CHECK(*after == 1);
  auto third = test::run(w->write("third", 8, insert));  // the cached statement, reused
  REQUIRE_FALSE(third);
  CHECK(third.error().code == errc::conflict);
}

TEST_CASE("a write that answers false is awaited as false, not as true", "[regression]") {
  // The one-shot that carries a write's answer copied it as a const value
  // and moved it into the handler: boost::system::result<bool>'s converting
  // constructor then took the result's explicit operator bool (has a value:
  // true), so every `false` from the writer (a lost compare-and-set, an ack
  // of an acked receipt, a stale cron claim) arrived as `true`.
  test::scratch_dir dir("false-answer");
  auto w = open_writer(dir.file("t.db"));
  for (bool answer : {false, true}) {
    auto fn = [answer](SQLite::Database&) -> result<bool> { return answer; };
    auto r = test::run(w->write("answer", 8, fn));
    REQUIRE(r);
    CHECK(*r == answer);
  }
  auto st = runtime::one_shot<result<bool>>::make();
  st->set(result<bool>(false));
  auto waited = test::run(st->async_wait(boost::asio::use_awaitable));
  REQUIRE(waited);
  CHECK_FALSE(*waited);
}

namespace {

// Counts its copies: a read's result that is copied on its way to the
// coroutine that awaits it shows here.
struct copy_counted {
  static inline std::atomic<int> copies{0};
  std::vector<std::string> rows;
  copy_counted() = default;
  copy_counted(copy_counted&&) noexcept = default;
  copy_counted& operator=(copy_counted&&) noexcept = default;
  copy_counted(const copy_counted& o) : rows(o.rows) { ++copies; }
  copy_counted& operator=(const copy_counted& o) {
    rows = o.rows;
    ++copies;
    return *this;
  }
};

}  // namespace

TEST_CASE(
    "an offloaded read's or a write's result is moved to the coroutine that awaits it, never "
    "copied") {
  // A read's whole result (boot's outbox pages run to tens of thousands of
  // rows) was copied out of its one_shot on the way to its one reader.
  test::scratch_dir dir("read-moved");
  auto w = open_writer(dir.file("t.db"));
  reader_pool readers(dir.file("t.db"));
  auto read = []() -> result<copy_counted> {
    copy_counted c;
    c.rows.assign(1000, std::string(100, 'x'));
    return c;
  };
  copy_counted::copies = 0;
  auto got = test::run(readers.offload(read));
  REQUIRE(got);
  CHECK(got->rows.size() == 1000);
  CHECK(copy_counted::copies == 0);
  readers.join();

  // A write's answer (a drain's inbox rows, say) likewise.
  auto take = [](SQLite::Database&) -> result<copy_counted> {
    copy_counted c;
    c.rows.assign(1000, std::string(100, 'y'));
    return c;
  };
  copy_counted::copies = 0;
  auto written = test::run(w->write("take", 8, take));
  REQUIRE(written);
  CHECK(written->rows.size() == 1000);
  CHECK(copy_counted::copies == 0);

  // async_take hands over the value itself; async_wait still hands out a
  // copy, so every waiter of a shared one_shot gets the whole value, and a
  // false result<bool> stays false either way.
  auto shared = runtime::one_shot<result<copy_counted>>::make();
  copy_counted v;
  v.rows = {"a", "b"};
  shared->set(std::move(v));
  copy_counted::copies = 0;
  auto first = test::run(shared->async_wait(asio::use_awaitable));
  auto second = test::run(shared->async_wait(asio::use_awaitable));
  REQUIRE(first);
  REQUIRE(second);
  CHECK(first->rows == second->rows);
  CHECK(copy_counted::copies == 2);
  auto taken = runtime::one_shot<result<bool>>::make();
  taken->set(result<bool>(false));
  auto t = test::run(taken->async_take(asio::use_awaitable));
  REQUIRE(t);
  CHECK_FALSE(*t);
}

namespace {

constexpr int k_checkpoint_frames = 40;

// One commit of its own: a row of about 3 KB, so each commit adds at least
// one WAL frame (a new leaf page).
void commit_big_row(writer& w, int k) {
  auto st = w.submit("big row " + std::to_string(k), 3000, [k](SQLite::Database& db) {
    SQLite::Statement ins(db, "INSERT INTO t (k, v) VALUES (?, hex(zeroblob(1500)))");
    ins.bind(1, k);
    ins.exec();
  });
  REQUIRE(test::run(st->async_wait(asio::use_awaitable)));
}

}  // namespace

TEST_CASE(
    "a commit past the checkpoint size does not copy the WAL back itself: the checkpointer does, "
    "beside it") {
  test::scratch_dir dir("checkpointer");
  auto path = dir.file("t.db");
  auto w = open_writer(path, k_checkpoint_frames);
  create_table(*w);
  w->hold_checkpoints(true);
  auto db_size = std::filesystem::file_size(path);

  // Commits up to the checkpoint size and beyond it (but not twice it), with
  // the checkpointer held.
  int k = 0;
  while (w->stats().wal_frames < k_checkpoint_frames + 5) commit_big_row(*w, k++);
  CHECK(w->stats().wal_frames < 2 * k_checkpoint_frames);
  // Nothing was copied into the database file: no commit checkpointed.
  CHECK(w->stats().checkpoints == 0);
  CHECK(w->stats().writer_checkpoints == 0);
  CHECK(std::filesystem::file_size(path) == db_size);

  // Released, the checkpointer copies the WAL into the file.
  w->hold_checkpoints(false);
  REQUIRE(w->wait_checkpoints(1, std::chrono::seconds(30)));
  CHECK(std::filesystem::file_size(path) >= db_size + static_cast<std::uintmax_t>(k) * 3000);
  CHECK(count_rows(path) == k);
}

TEST_CASE("the writer counts the WAL frames its commits wrote, across restarts of the WAL") {
  test::scratch_dir dir("walframes");
  auto path = dir.file("t.db");
  auto w = open_writer(path, k_checkpoint_frames);
  create_table(*w);
  w->hold_checkpoints(true);  // the writer's own catch-ups restart the WAL
  int restarts = 0;
  for (int k = 0; k < 10 * k_checkpoint_frames; ++k) {
    auto before = w->stats();
    commit_big_row(*w, k);
    auto after = w->stats();
    if (after.wal_frames < before.wal_frames) ++restarts;
    // A row of a page of its own: one new leaf, and at most its parent
    // interior pages and the header page besides.
    auto wrote = after.frames_written - before.frames_written;
    INFO("commit " << k << ": WAL frames " << before.wal_frames << " -> " << after.wal_frames);
    CHECK(wrote >= 1);
    CHECK(wrote <= 5);
    if (after.wal_frames >= before.wal_frames)
      CHECK(wrote == static_cast<std::uint64_t>(after.wal_frames - before.wal_frames));
    else
      CHECK(wrote == static_cast<std::uint64_t>(after.wal_frames));
  }
  CHECK(restarts >= 5);
}

TEST_CASE(
    "a commit with a request queued behind it leaves the WAL's last frames to a later commit, and "
    "the "
    "first with none queued copies them") {
  test::scratch_dir dir("catchuppause");
  auto path = dir.file("t.db");
  // The writer copies the rest itself when under an eighth is left: 20
  // frames here.
  constexpr int size = 160;
  auto w = open_writer(path, size);
  create_table(*w);
  // Up to the checkpoint size with the checkpointer held, a reader's
  // snapshot taken a few frames before it: the checkpointer's one pass then
  // copies the frames up to the snapshot and leaves those after it (fewer
  // than the writer copies itself). Held again, it runs no other pass.
  w->hold_checkpoints(true);
  int k = 0;
  while (w->stats().wal_frames < size - 6) commit_big_row(*w, k++);
  SQLite::Database reader(path, SQLite::OPEN_READONLY);
  reader.exec("BEGIN");
  REQUIRE(reader.execAndGet("SELECT count(*) FROM t").getInt() == k);
  while (w->stats().wal_frames < size) commit_big_row(*w, k++);
  w->hold_checkpoints(false);
  REQUIRE(w->wait_checkpoints(1, std::chrono::seconds(30)));
  w->hold_checkpoints(true);
  reader.exec("COMMIT");
  REQUIRE(w->stats().writer_checkpoints == 0);

  // Two small rows, the second queued while the first's batch runs (a leaf
  // and its parent each at most: the frames left stay under 20).
  auto small_row = [](int key, std::promise<void>* inside, std::shared_future<void> released) {
    return [key, inside, released](SQLite::Database& db) {
      SQLite::Statement ins(db, "INSERT INTO t (k, v) VALUES (?, 'x')");
      ins.bind(1, key);
      ins.exec();
      inside->set_value();
      released.wait();
    };
  };
  std::promise<void> in_a, go_a, in_b, go_b;
  auto a = w->submit("a", 8, small_row(100000, &in_a, go_a.get_future().share()));
  in_a.get_future().wait();
  auto b = w->submit("b", 8, small_row(100001, &in_b, go_b.get_future().share()));
  go_a.set_value();
  in_b.get_future().wait();                   // a committed, b's batch runs
  CHECK(w->stats().writer_checkpoints == 0);  // b was queued behind a's commit
  REQUIRE(test::run(a->async_wait(asio::use_awaitable)));
  go_b.set_value();
  REQUIRE(test::run(b->async_wait(asio::use_awaitable)));
  // Nothing was queued behind b's commit: the writer copied the rest once
  // b's batch was answered, before it took the next, whose transaction then
  // found the WAL wholly copied and restarted it.
  auto before = w->stats().wal_frames;
  commit_big_row(*w, k++);
  CHECK(w->stats().writer_checkpoints == 1);
  CHECK(w->stats().wal_frames < before);
  CHECK(count_rows(path) == k + 2);
}

TEST_CASE(
    "a write is answered, and its request destroyed, on the awaiting coroutine's thread, not on "
    "the writer's") {
  test::scratch_dir dir("home");
  auto w = open_writer(dir.file("t.db"));
  create_table(*w);
  std::atomic<std::thread::id> ran_on{}, destroyed_on{};
  auto write = [&]() -> asio::awaitable<result<void>> {
    // The deleter runs when the request, which holds the only copy, goes.
    std::shared_ptr<void> witness(nullptr,
                                  [&](void*) { destroyed_on = std::this_thread::get_id(); });
    auto fn = [&ran_on, witness](SQLite::Database& db) {
      db.exec("INSERT INTO t (k, v) VALUES (1, 'x')");
      ran_on = std::this_thread::get_id();
    };
    witness.reset();
    co_return co_await w->write("witnessed", 8, std::move(fn));
  };
  REQUIRE(test::run(write()));
  CHECK(ran_on.load() != std::this_thread::get_id());  // the writer thread ran it
  CHECK(destroyed_on.load() == std::this_thread::get_id());
}

TEST_CASE(
    "a write whose executor was stopped before its answer ran is answered as that executor goes, "
    "so the waiting coroutine is freed") {
  test::scratch_dir dir("stoppedhome");
  auto w = open_writer(dir.file("t.db"));
  create_table(*w);
  std::atomic<bool> frame_freed{false};
  std::promise<void> inside, release;
  auto released = release.get_future().share();
  auto io = std::make_unique<asio::io_context>();
  {
    // The coroutine's frame holds the only copy of the witness.
    std::shared_ptr<void> witness(nullptr, [&](void*) { frame_freed = true; });
    std::function<void(SQLite::Database&)> fn = [&inside, released](SQLite::Database& db) {
      db.exec("INSERT INTO t (k, v) VALUES (1, 'held')");
      inside.set_value();
      released.wait();
    };
    auto body = [](writer* w, std::shared_ptr<void> witness,
                   std::function<void(SQLite::Database&)> fn) -> asio::awaitable<void> {
      (void)co_await w->write("held", 8, std::move(fn));
      witness.reset();
    };
    asio::co_spawn(*io, body(w.get(), std::move(witness), std::move(fn)), asio::detached);
  }
  io->poll();  // the coroutine submits its write and waits
  inside.get_future().wait();
  io->stop();  // nothing runs on it any more
  release.set_value();
  // A request behind the held one, answered on the writer thread: the held
  // one's batch committed first and handed its answer to the stopped queue.
  auto after = w->submit("after", 8, [](SQLite::Database& db) {
    db.exec("INSERT INTO t (k, v) VALUES (2, 'after')");
  });
  REQUIRE(test::run(after->async_wait(asio::use_awaitable)));
  CHECK_FALSE(frame_freed);
  io.reset();  // its queue goes: the answer, then the coroutine it resumed
  CHECK(frame_freed);
}

TEST_CASE("under commits with no pause the WAL stays bounded: the writer copies the rest itself") {
  test::scratch_dir dir("walbound");
  auto path = dir.file("t.db");
  auto w = open_writer(path, k_checkpoint_frames);
  create_table(*w);
  // The checkpointer never runs, as if it never caught up: the writer's own
  // catch-up at twice the checkpoint size is what bounds the WAL.
  w->hold_checkpoints(true);
  int most = 0;
  for (int k = 0; k < 20 * k_checkpoint_frames; ++k) {
    commit_big_row(*w, k);
    most = std::max(most, w->stats().wal_frames);
  }
  INFO("most frames in the WAL after a commit: " << most);
  CHECK(most < 2 * k_checkpoint_frames + 8);  // one commit past the bound at most
  // The WAL file restarted from its beginning instead of growing: 800
  // commits of a new page each would have made it over 3 MB.
  auto wal = std::filesystem::file_size(path + "-wal");
  INFO("WAL file: " << wal << " bytes");
  CHECK(wal < static_cast<std::uintmax_t>(2 * k_checkpoint_frames + 8) * (4096 + 24) + 32);
  CHECK(count_rows(path) == 20 * k_checkpoint_frames);
}

namespace tether::persistence::detail {
extern const char* const k_take_inbox_sql;  // persistence/task_store_reports.cpp
}

TEST_CASE(
    "a session's inbox take reads its pending rows through the pending index, not its history",
    "[regression]") {
  test::scratch_dir dir("takeplan");
  auto path = dir.file("t.db");
  auto w = open_writer(path);  // the schema, migrated
  // Without statistics the planner took the full inbox_order index and walked
  // every row the session was ever admitted; the take must read only the
  // pending ones.
  SQLite::Database db(path, SQLite::OPEN_READONLY);
  SQLite::Statement plan(
      db, std::string("EXPLAIN QUERY PLAN ") + persistence::detail::k_take_inbox_sql);
  std::string detail;
  while (plan.executeStep()) detail += plan.getColumn(3).getString() + "\n";
  INFO(detail);
  CHECK(detail.find("USING INDEX inbox_pending") != std::string::npos);
  CHECK(detail.find("inbox_order") == std::string::npos);
}

TEST_CASE("an input to an idle session is appended and opens its busy period in one write") {
  test::scratch_dir dir("append_and_begin");
  auto path = dir.file("t.db");
  auto w = open_writer(path);
  task_store store(*w, path);
  REQUIRE(test::run(store.create_session(session_named("solo"))));
  REQUIRE(test::run(store.append(session_id("solo"), "user", "prompt", "completed", "first")));
  auto requests = w->stats().requests;

  auto begun = test::run(store.append_and_begin_busy(session_id("solo"), "prompt", "second"));
  REQUIRE(begun);
  CHECK(w->stats().requests == requests + 1);
  CHECK(begun->seq == 2);  // the input's seq: the period starts after it was written
  CHECK(begun->input_cursor == 0);
  CHECK_FALSE(begun->resumed);
  auto row = store.session(session_id("solo"));
  REQUIRE(row);
  REQUIRE(row->has_value());
  CHECK((*row)->busy);
  CHECK((*row)->time_suspended.has_value());  // the claim
  CHECK((*row)->seq == 2);
  REQUIRE((*row)->turn.has_value());
  CHECK(*(*row)->turn == begun->turn);
  auto msgs = store.messages(session_id("solo"));
  REQUIRE(msgs);
  REQUIRE(msgs->size() == 2);
  CHECK(msgs->back().seq == 2);
  CHECK(msgs->back().role == "user");
  CHECK(msgs->back().kind == "prompt");
  CHECK(msgs->back().text == "second");

  // A claim a crashed host left: the period resumes it and keeps its turn.
  auto again = test::run(store.append_and_begin_busy(session_id("solo"), "steer", "third"));
  REQUIRE(again);
  CHECK(again->resumed);
  CHECK(again->turn == begun->turn);
  CHECK(again->seq == 3);

  // No such session: nothing is written, and the error names it.
  auto none = test::run(store.append_and_begin_busy(session_id("nobody"), "prompt", "lost"));
  REQUIRE_FALSE(none);
  CHECK(none.error().code == errc::not_found);
  CHECK(none.error().message.find("nobody") != std::string::npos);
  auto nothing = store.messages(session_id("nobody"));
  REQUIRE(nothing);
  CHECK(nothing->empty());
}
