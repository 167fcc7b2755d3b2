// The cron crash matrix: `tether cron run` runs a schedule on a virtual clock
// (a job every second, whose shell command appends its occurrence to a
// side-effect file) in a child process that is SIGKILLed at every hit of
// every `cron.` crash point: after a claim committed, after an attempt was
// recorded, after the command was sent to the sandbox daemon, after a
// completion committed. A restart on the same database (the killed
// claimant is provably gone, so its claim is cleared and the occurrence
// taken over, following the same daemon job) runs the schedule to its end.
// Each due occurrence then ran exactly once: one line in the side-effect
// file and one completed run task, and the job's next run is past the end.
#include <SQLiteCpp/Database.h>
#include <SQLiteCpp/Statement.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "crash_matrix_support.hpp"

using namespace tether;

namespace {

constexpr std::int64_t k_start = 1'800'000'000'000;
constexpr std::int64_t k_until = k_start + 2000;  // occurrences at +0, +1000, +2000

std::vector<std::string> lines_of(const std::filesystem::path& p) {
  std::vector<std::string> out;
  std::istringstream in(test::file_bytes(p.string()));
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

}  // namespace

TEST_CASE("SIGKILL at every cron crash point: after a restart each due occurrence ran exactly once",
          "[crash][cron]") {
  test::scratch_dir root("cron-matrix");
  auto jobs = root.file("jobs.json");
  std::ofstream(jobs) << R"({"jobs": [{"name": "tick", "agent": "ops",
    "schedule": {"every_ms": 1000, "anchor_ms": 1800000000000},
    "command": "echo \"$TETHER_CRON_OCCURRENCE\" >> side.txt", "retries": 0}]})";
  auto points = test::crash_points([](const std::string& p) { return p.rfind("cron.", 0) == 0; });
  REQUIRE(points.size() == 4);
  auto run = [&](const std::string& dir) {
    std::filesystem::create_directories(dir);
    return std::vector<std::string>{test::k_tether_cli,
                                    "cron",
                                    "run",
                                    "--db",
                                    dir + "/tether.db",
                                    "--file",
                                    jobs,
                                    "--virtual",
                                    std::to_string(k_start),
                                    "--until",
                                    std::to_string(k_until)};
  };
  auto expected = std::vector<std::string>{std::to_string(k_start), std::to_string(k_start + 1000),
                                           std::to_string(k_start + 2000)};
  auto check = [&](const std::string& point, const std::filesystem::path& dir) {
    INFO("crashed at " << point);
    CHECK(lines_of(dir / "side.txt") == expected);
    SQLite::Database db((dir / "tether.db").string(), SQLite::OPEN_READONLY);
    SQLite::Statement q(db,
                        "SELECT json_extract(payload, '$.occurrence'), state FROM tasks WHERE "
                        "kind = 'cron_run' ORDER BY 1");
    std::vector<std::string> runs;
    while (q.executeStep())
      runs.push_back(q.getColumn(0).getString() + " " + q.getColumn(1).getString());
    CHECK(runs == std::vector<std::string>{expected[0] + " completed", expected[1] + " completed",
                                           expected[2] + " completed"});
    CHECK(db.execAndGet("SELECT next_run FROM cron_jobs WHERE name = 'tick'").getInt64() ==
          k_start + 3000);
    CHECK(db.execAndGet("SELECT claim_owner IS NULL FROM cron_jobs WHERE name = 'tick'").getInt() ==
          1);
  };
  auto base = root.path() / "baseline";
  auto hits = test::traced_hits(run(base.string()), root.path() / "trace", points);
  check("(none)", base);
  test::for_each_crash(root.path(), points, hits, run, run, check);
}
