#pragma once
// The crash-matrix driver shared by the report-path and delivery matrices: the
// points come from the registry (`tether crash-points`), a traced baseline run
// says how often each is hit, and every hit of every point is then SIGKILLed
// in a child process and restarted.
#include <sys/wait.h>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "catch_result.hpp"
#include "support.hpp"

namespace tether::test {

inline const std::string k_tether_cli = std::string(TETHER_BIN_DIR) + "/tether";

/// Registered crash points that `keep` accepts.
inline std::set<std::string> crash_points(const std::function<bool(const std::string&)>& keep) {
  std::string listing;
  REQUIRE(run_process({k_tether_cli, "crash-points"}, &listing) == 0);
  std::set<std::string> points;
  std::istringstream in(listing);
  std::string l;
  while (std::getline(in, l))
    if (!l.empty() && keep(l)) points.insert(l);
  return points;
}

/// Runs `argv` without a crash (it must exit 0), tracing the points it hits;
/// returns how often each was hit. Every point of `points` must be reached.
inline std::map<std::string, int> traced_hits(const std::vector<std::string>& argv,
                                              const std::filesystem::path& trace,
                                              const std::set<std::string>& points) {
  int st = run_process(argv, nullptr, {"TETHER_CRASH_TRACE=" + trace.string()});
  REQUIRE(WIFEXITED(st));
  REQUIRE(WEXITSTATUS(st) == 0);
  std::map<std::string, int> hits;
  std::ifstream in(trace);
  std::string l;
  while (std::getline(in, l)) hits[l]++;
  for (auto& p : points) {
    INFO("crash point " << p << " is never reached by the matrix scenario");
    CHECK(hits[p] > 0);
  }
  return hits;
}

/// For every hit n of every point p: runs `story(dir)` with
/// TETHER_CRASH_AT=p:n, which must die by SIGKILL (a later hit that did not
/// recur is skipped), then `resume(dir)`, which must exit 0, then
/// `check(p, dir)`. Returns how many crashes it ran.
inline int for_each_crash(
    const std::filesystem::path& root, const std::set<std::string>& points,
    std::map<std::string, int>& hits,
    const std::function<std::vector<std::string>(const std::string&)>& story,
    const std::function<std::vector<std::string>(const std::string&)>& resume,
    const std::function<void(const std::string&, const std::filesystem::path&)>& check) {
  int runs = 0;
  for (auto& p : points) {
    for (int n = 1; n <= hits[p]; ++n) {
      auto dir = root / ("crash-" + p + "-" + std::to_string(n));
      std::string at = p + ":" + std::to_string(n);
      INFO("TETHER_CRASH_AT=" << at);
      int s = run_process(story(dir.string()), nullptr, {"TETHER_CRASH_AT=" + at});
      if (n > 1 && WIFEXITED(s) && WEXITSTATUS(s) == 0) continue;  // that hit did not recur
      REQUIRE(WIFSIGNALED(s));
      REQUIRE(WTERMSIG(s) == SIGKILL);
      std::string out;
      int r = run_process(resume(dir.string()), &out);
      INFO("resume said: " << out);
      REQUIRE(WIFEXITED(r));
      REQUIRE(WEXITSTATUS(r) == 0);
      check(p, dir);
      ++runs;
    }
  }
  CHECK(runs >= static_cast<int>(points.size()));
  return runs;
}

}  // namespace tether::test
