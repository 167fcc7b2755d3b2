// I/O fault injection (issue 16, part 1): the fault VFS fails the Nth read,
// write or sync with SQLITE_IOERR or SQLITE_FULL, for every N a workload
// reaches. After each: nothing acknowledged is missing after a reopen, nothing
// that failed is there, PRAGMA integrity_check is ok, and a restart delivers
// everything owed exactly once. `make test` tries a sample of the fault
// points; TETHER_FAULT_ALL=1 tries every one.
#include <sqlite3.h>

#include <iostream>

#include "fault_support.hpp"

using namespace tether;
namespace fault = tether::test::fault;
namespace fs = std::filesystem;

namespace {

struct fault_kind {
  fault::op kind;
  const char* word;  // TETHER_FAULT's kind
  const char* code;  // ioerr | full
};

const std::vector<fault_kind> k_kinds = {{fault::op::write, "write", "full"},
                                         {fault::op::write, "write", "ioerr"},
                                         {fault::op::sync, "sync", "ioerr"},
                                         {fault::op::read, "read", "ioerr"}};

std::uint64_t ops_of(const fault::counts& c, fault::op k) {
  return k == fault::op::read ? c.reads : k == fault::op::write ? c.writes : c.syncs;
}

// The Ns to try for a kind with `total` ops: all of them, or about `sample`
// spread evenly (always the first and the last).
std::vector<std::uint64_t> fault_points(std::uint64_t total, std::uint64_t sample) {
  std::vector<std::uint64_t> ns;
  std::uint64_t stride = test::fault_all() || total <= sample ? 1 : (total + sample - 1) / sample;
  for (std::uint64_t n = 1; n <= total; n += stride) ns.push_back(n);
  if (!ns.empty() && ns.back() != total) ns.push_back(total);
  return ns;
}

bool has_row(SQLite::Database& db, int k) {
  SQLite::Statement st(db, "SELECT count(*) FROM t WHERE k = ?");
  st.bind(1, k);
  st.executeStep();
  return st.getColumn(0).getInt() == 1;
}

void copy_if_exists(const fs::path& from, const fs::path& to) {
  std::error_code ec;
  if (fs::exists(from)) fs::copy_file(from, to, fs::copy_options::overwrite_existing, ec);
}

}  // namespace

TEST_CASE(
    "an I/O error at any read, write or sync of a commit: what was acknowledged is on disk and "
    "what was reported failed is not, after a clean close and after a crash",
    "[fault]") {
  constexpr int k_requests = 12;
  int tried = 0, resurrected = 0;
  for (auto& fk : k_kinds) {
    for (std::uint64_t n = 1;; ++n) {
      test::scratch_dir dir("fault-writer");
      auto db_path = dir.file("t.db");
      fault::install(fault::plan{});
      auto w = persistence::writer::open(persistence::db_options{db_path});
      REQUIRE(w);
      auto create = (*w)->submit("create t", 0, [](SQLite::Database& db) {
        db.exec("CREATE TABLE t (k INTEGER PRIMARY KEY, v TEXT NOT NULL)");
      });
      REQUIRE(test::run(create->async_wait(boost::asio::use_awaitable)));

      auto spec = std::string(fk.word) + ":" + std::to_string(n) + ":" + fk.code;
      auto p = fault::parse_plan(spec);
      REQUIRE(p);
      fault::install(*p);
      std::vector<bool> acked;
      for (int i = 0; i < k_requests; ++i) {
        auto st = (*w)->submit("insert", 16, [i](SQLite::Database& db) {
          SQLite::Statement s(db, "INSERT INTO t (k, v) VALUES (?, 'x')");
          s.bind(1, i);
          s.exec();
        });
        acked.push_back(test::run(st->async_wait(boost::asio::use_awaitable)).has_value());
      }
      bool fired = fault::current().fired;
      // What a SIGKILL now would leave: the files as they are, writer still open.
      fs::create_directories(dir.path() / "crash");
      for (auto suffix : {"", "-wal"})
        copy_if_exists(db_path + suffix, dir.path() / "crash" / (std::string("t.db") + suffix));
      (*w)->stop();
      w->reset();
      fault::install(fault::plan{});
      if (!fired) break;
      ++tried;
      for (auto image : {db_path, (dir.path() / "crash" / "t.db").string()}) {
        INFO("TETHER_FAULT=" << spec << ", image " << image);
        CHECK(test::integrity(image) == "ok");
        SQLite::Database db(image, SQLite::OPEN_READONLY);
        bool crash = image != db_path;
        for (int i = 0; i < k_requests; ++i) {
          INFO("request " << i << (acked[i] ? " was acknowledged" : " was reported failed"));
          // Known gap (docs/reliability.md): when the WAL's fsync of a COMMIT
          // fails, its frames are already written; if the process dies before
          // another commit overwrites them, recovery brings the transaction
          // back although its requester was told it failed.
          if (crash && !acked[i] && fk.kind == fault::op::sync && has_row(db, i)) {
            ++resurrected;
            continue;
          }
          CHECK(has_row(db, i) == acked[i]);
        }
      }
    }
  }
  std::cout << "writer: fault points tried: " << tried << "; commits reported failed that a crash "
            << "right after brought back: " << resurrected << "\n";
  CHECK(tried > 20);
}

TEST_CASE(
    "an I/O error at any I/O call of the report story: a clean error or a success that holds, "
    "never a story that waits forever, a sound database, and a restart that delivers every owed "
    "report exactly once",
    "[fault][cli]") {
  test::scratch_dir root("fault-story");
  auto base = root.path() / "baseline";
  auto b = test::run_on_fault_vfs(base, "none", {"demo", "--story", base.string()});
  INFO(b.output);
  REQUIRE(b.exited());
  REQUIRE(WEXITSTATUS(b.status) == 0);
  auto baseline = test::read_report_outcome((base / "tether.db").string());
  REQUIRE(baseline.bodies.size() == 2);
  std::cout << "report story I/O calls: reads=" << b.rep.ops.reads << " writes=" << b.rep.ops.writes
            << " syncs=" << b.rep.ops.syncs << "\n";

  int tried = 0, failed_cleanly = 0, absorbed = 0, hung = 0;
  for (auto& fk : k_kinds) {
    auto total = ops_of(b.rep.ops, fk.kind);
    for (auto n : fault_points(total, fk.kind == fault::op::read ? 2 : 4)) {
      auto spec = std::string(fk.word) + ":" + std::to_string(n) + ":" + fk.code;
      auto dir = root.path() / test::spec_dir(spec);
      INFO("TETHER_FAULT=" << spec);
      // The story takes a fraction of a second. The harness's limit (60 s)
      // only keeps a hung story from hanging the suite: no run may need it.
      auto r = test::run_on_fault_vfs(dir, spec, {"demo", "--story", dir.string()});
      INFO("the story said: " << r.output);
      REQUIRE(WIFEXITED(r.status));  // no crash, whatever the fault
      if (!r.rep.fired) continue;    // this run made fewer calls of that kind
      ++tried;
      // A fault that keeps the story's shell from ever starting (a busy
      // period that could not open, a failed spawn) ends the story with
      // what it lacks: it never waits for a shell that is not there. Exit
      // 0 means the story reached its end (both reports in the inbox).
      bool ok = r.exited() && WEXITSTATUS(r.status) == 0;
      r.hung() ? ++hung : ok ? ++absorbed : ++failed_cleanly;
      CHECK_FALSE(r.hung());
      if (r.exited() && !ok) CHECK_FALSE(r.output.empty());  // it said what went wrong

      auto db = (dir / "tether.db").string();
      auto after = test::read_report_outcome(db);
      if (ok) CHECK(after.bodies.size() == 2);
      if (fs::exists(db)) CHECK(test::integrity(db) == "ok");
      // Acknowledged: every report admitted into the parent's inbox (its
      // after-commit point was passed) is on disk.
      auto acks = test::trace_counts(dir / "trace");
      CHECK(static_cast<int>(after.bodies.size()) >= acks["report.admit.after_commit"]);

      auto again =
          test::run_on_fault_vfs(dir / "resume", "none", {"demo", "--resume", dir.string()});
      INFO("the restart said: " << again.output);
      REQUIRE(again.exited());
      CHECK(WEXITSTATUS(again.status) == 0);
      test::check_delivered_once(test::read_report_outcome(db));
    }
  }
  std::cout << "report story: fault points tried: " << tried << " (" << absorbed << " absorbed, "
            << failed_cleanly << " failed with an error, " << hung << " hung)\n";
  CHECK(tried > 10);
}
