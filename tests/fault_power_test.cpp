// Power loss (issue 16, part 2): the fault VFS records every write and sync
// of a run; a power cut is rebuilt by replaying into a fresh directory only
// what a sync made durable, plus seeded random subsets of the writes not yet
// synced (a torn cut). With synchronous=FULL every acknowledged report is
// there; a host booted on the image delivers the rest exactly once.
// `make test` replays a sample of the cuts; TETHER_FAULT_ALL=1 every one.
#include <iostream>
#include <random>

#include "fault_support.hpp"

using namespace tether;
namespace fault = tether::test::fault;
namespace fs = std::filesystem;

TEST_CASE(
    "a power cut at any sync of the report story loses no acknowledged report under "
    "synchronous=FULL, and a host booted on what is left delivers the rest exactly once",
    "[fault][power]") {
  test::scratch_dir root("fault-power");
  auto rec = root.path() / "recorded";
  auto r = test::run_on_fault_vfs(rec, "none", {"demo", "--story", rec.string()}, true);
  INFO(r.output);
  REQUIRE(r.exited());
  REQUIRE(WEXITSTATUS(r.status) == 0);
  auto log = fault::read_log((rec / "io.log").string());
  std::vector<std::size_t> cuts;  // just before and just after each sync
  for (std::size_t i = 0; i < log.size(); ++i)
    if (log[i].type == 'S') {
      cuts.push_back(i);
      cuts.push_back(i + 1);
    }
  REQUIRE(cuts.size() >= 10);
  std::size_t stride = test::fault_all() ? 1 : cuts.size() / 24;
  const unsigned seed = std::random_device{}();
  std::cout << "power cuts: " << log.size() << " recorded writes/syncs, " << cuts.size() / 2
            << " syncs; torn subsets seeded with " << seed << "\n";
  std::mt19937 rng(seed);

  int replayed = 0;
  for (std::size_t c = 0; c < cuts.size(); c += stride) {
    std::size_t cut = cuts[c];
    std::size_t trace_len = cut < log.size() ? log[cut].trace_len : std::string::npos;
    auto acks = test::trace_counts(rec / "trace", trace_len);
    for (int variant = 0; variant < 3; ++variant) {
      auto dir = root.path() / ("cut-" + std::to_string(cut) + "-" + std::to_string(variant));
      fs::create_directories(dir);
      // Variant 0: only what was synced; 1 and 2: a random half of the rest.
      fault::replay(log, cut, dir.string(),
                    [&](std::size_t) { return variant > 0 && (rng() & 1) == 1; });
      INFO("power cut before log entry " << cut << ", variant " << variant << ", seed " << seed);
      auto db = (dir / "tether.db").string();
      ++replayed;
      // A cut before the first sync leaves no file or an empty one (which a
      // restart refuses to adopt): either way nothing was acknowledged.
      if (!fs::exists(db) || fs::file_size(db) == 0) {
        CHECK(acks["report.admit.after_commit"] == 0);
        continue;
      }
      CHECK(test::integrity(db) == "ok");
      auto before = test::read_report_outcome(db);
      CHECK(static_cast<int>(before.bodies.size()) >= acks["report.admit.after_commit"]);
      auto again =
          test::run_on_fault_vfs(dir / "resume", "none", {"demo", "--resume", dir.string()});
      INFO("the restart said: " << again.output);
      REQUIRE(again.exited());
      if (WEXITSTATUS(again.status) != 0 &&
          again.output.find("the file is empty (0 bytes)") != std::string::npos) {
        // The cut left a database file with no page: refused, never adopted
        // as new, and nothing had been acknowledged in it.
        CHECK(acks["report.admit.after_commit"] == 0);
        continue;
      }
      CHECK(WEXITSTATUS(again.status) == 0);
      test::check_delivered_once(test::read_report_outcome(db));
    }
  }
  std::cout << "power cuts replayed: " << replayed << "\n";
  CHECK(replayed >= 24);
}

namespace {

// Commits `n` one-row transactions, each acknowledged, on a recorded writer
// with `mode`; returns how many rows a power cut right after the last
// acknowledgement leaves.
int rows_after_power_cut(persistence::sync_mode mode, int n) {
  test::scratch_dir dir("fault-power-sync");
  auto log_path = dir.file("io.log");
  fault::plan p;
  p.record_path = log_path;
  fault::install(p);
  persistence::db_options o{dir.file("t.db")};
  o.sync = mode;
  auto w = persistence::writer::open(o);
  REQUIRE(w);
  for (int i = 0; i <= n; ++i) {
    auto st = (*w)->submit("row", 8, [i](SQLite::Database& db) {
      if (i == 0)
        db.exec("CREATE TABLE t (k INTEGER PRIMARY KEY)");
      else
        db.exec("INSERT INTO t VALUES (" + std::to_string(i) + ")");
    });
    REQUIRE(test::run(st->async_wait(boost::asio::use_awaitable)));  // acknowledged
  }
  auto log = fault::read_log(log_path);
  fault::install(fault::plan{});  // stop recording before the writer closes
  (*w)->stop();
  auto image = dir.path() / "image";
  fs::create_directories(image);
  fault::replay(log, log.size(), image.string(), [](std::size_t) { return false; });
  auto db = (image / "t.db").string();
  if (!fs::exists(db)) return 0;
  SQLite::Database d(db, SQLite::OPEN_READWRITE);
  if (d.execAndGet("SELECT count(*) FROM sqlite_master WHERE name = 't'").getInt() == 0) return 0;
  return d.execAndGet("SELECT count(*) FROM t").getInt();
}

}  // namespace

TEST_CASE(
    "the documented trade: sync_mode::normal can lose acknowledged commits to a power cut, "
    "sync_mode::full loses none",
    "[fault][power]") {
  constexpr int k_commits = 10;
  int full = rows_after_power_cut(persistence::sync_mode::full, k_commits);
  int normal = rows_after_power_cut(persistence::sync_mode::normal, k_commits);
  std::cout << "power cut after " << k_commits << " acknowledged commits: synchronous=FULL kept "
            << full << ", synchronous=NORMAL kept " << normal << "\n";
  CHECK(full == k_commits);
  CHECK(normal < k_commits);  // WAL+NORMAL syncs only at checkpoints
}
