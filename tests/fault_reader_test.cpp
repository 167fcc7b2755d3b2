// A read connection whose read fails with an I/O error (the fault VFS): the
// error comes back as a value and the lease ends without taking the process
// down.
#include <SQLiteCpp/Database.h>

#include "catch_result.hpp"
#include "fault_vfs.hpp"
#include "support.hpp"
#include "tether/persistence/database.hpp"

using namespace tether;
namespace fault = tether::test::fault;

TEST_CASE("a read that fails with an I/O error ends its lease cleanly instead of terminating",
          "[fault]") {
  test::scratch_dir dir("fault-reader");
  auto path = dir.file("r.db");
  fault::install(fault::plan{});
  {
    SQLite::Database db(path, SQLite::OPEN_READWRITE | SQLite::OPEN_CREATE);
    db.exec("CREATE TABLE t (k INTEGER PRIMARY KEY, v BLOB)");
    db.exec(
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 500) "
        "INSERT INTO t SELECT i, randomblob(1000) FROM n");
  }
  persistence::reader_pool pool(path);
  { pool.acquire()->execAndGet("SELECT count(*) FROM sqlite_master"); }  // opened and warm

  fault::install(*fault::parse_plan("read:1:ioerr:persistent"));
  bool failed = false;
  try {
    auto lease = pool.acquire();
    auto& q = lease.statement("SELECT sum(length(v)) FROM t");
    q.executeStep();
  } catch (const std::exception& e) {
    failed = true;  // the lease above has ended: its statements were reset
  }
  fault::install(fault::plan{});
  CHECK(failed);
  // The pool still serves reads once the disk answers again.
  auto again = pool.acquire();
  CHECK(again.statement("SELECT count(*) FROM t").executeStep());
}

TEST_CASE("a statement whose prepare fails with an I/O error leaves no empty slot in the lease",
          "[fault]") {
  test::scratch_dir dir("fault-reader-prepare");
  auto path = dir.file("r.db");
  fault::install(fault::plan{});
  {
    SQLite::Database db(path, SQLite::OPEN_READWRITE | SQLite::OPEN_CREATE);
    db.exec("CREATE TABLE t (k INTEGER PRIMARY KEY)");
  }
  persistence::reader_pool pool(path);
  bool failed = false;
  {
    auto lease = pool.acquire();  // a fresh connection: the schema is not read yet
    fault::install(*fault::parse_plan("read:1:ioerr:persistent"));
    try {
      lease.statement("SELECT count(*) FROM t");
    } catch (const std::exception&) {
      failed = true;
    }
  }  // the lease ends here: it must not touch a statement that was never prepared
  fault::install(fault::plan{});
  CHECK(failed);
  CHECK(pool.acquire().statement("SELECT count(*) FROM t").executeStep());
}
