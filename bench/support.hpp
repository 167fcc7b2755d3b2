#pragma once
// Shared by the bench drivers: one JSON figure per line, timing, percentiles,
// sizing a run so that it takes about as long as we want, and CPU time.
#include <fcntl.h>
#include <spawn.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

namespace tether::bench {

using clock = std::chrono::steady_clock;

/// A fresh directory tether-<name>-XXXXXX under the temp directory; exits
/// with a message naming it if it cannot be made.
inline std::string make_temp_dir(std::string_view name) {
  std::string tmpl =
      (std::filesystem::temp_directory_path() / ("tether-" + std::string(name) + "-XXXXXX"))
          .string();
  if (!::mkdtemp(tmpl.data())) {
    std::fprintf(stderr, "%.*s: cannot create a temp dir %s\n", static_cast<int>(name.size()),
                 name.data(), tmpl.c_str());
    std::exit(1);
  }
  return tmpl;
}

inline double seconds_since(clock::time_point t0) {
  return std::chrono::duration<double>(clock::now() - t0).count();
}

/// A figure as JSON: null when not finite, whole from 100 up, else 4
/// significant digits.
inline std::string number(double value) {
  char num[64];
  if (!std::isfinite(value))
    std::snprintf(num, sizeof num, "null");
  else if (std::fabs(value) >= 100)
    std::snprintf(num, sizeof num, "%.0f", value);
  else
    std::snprintf(num, sizeof num, "%.4g", value);
  return num;
}

/// Prints {"bench":...,"figure":...,"value":...,"unit":...} and flushes, so a
/// figure survives a later crash of the same binary.
inline void emit(std::string_view bench, std::string_view figure, double value,
                 std::string_view unit) {
  std::printf("{\"bench\":\"%.*s\",\"figure\":\"%.*s\",\"value\":%s,\"unit\":\"%.*s\"}\n",
              static_cast<int>(bench.size()), bench.data(), static_cast<int>(figure.size()),
              figure.data(), number(value).c_str(), static_cast<int>(unit.size()), unit.data());
  std::fflush(stdout);
}

/// emit() for a figure whose value is a word (a mode, a setting): prints
/// {"bench":...,"figure":...,"value":"<text>","unit":...}.
inline void emit_text(std::string_view bench, std::string_view figure, std::string_view text,
                      std::string_view unit) {
  std::printf("{\"bench\":\"%.*s\",\"figure\":\"%.*s\",\"value\":\"%.*s\",\"unit\":\"%.*s\"}\n",
              static_cast<int>(bench.size()), bench.data(), static_cast<int>(figure.size()),
              figure.data(), static_cast<int>(text.size()), text.data(),
              static_cast<int>(unit.size()), unit.data());
  std::fflush(stdout);
}

/// Runs this program again (/proc/self/exe) with `args` (its --measure
/// mode), in a process of its own, and returns the `count` numbers it
/// printed on its one line of output: a measurement that starts with no heap,
/// page cache or allocator state another measurement left. Exits, naming
/// `bench` and the measurement (args[1]), if it fails or prints otherwise.
inline std::vector<double> measure_apart(std::string_view bench,
                                         const std::vector<std::string>& args, std::size_t count) {
  std::string what = args.size() > 1 ? args[1] : "?";
  auto fail = [&](const std::string& why) {
    std::fprintf(stderr, "%.*s: the %s measurement: %s\n", static_cast<int>(bench.size()),
                 bench.data(), what.c_str(), why.c_str());
    std::exit(1);
  };
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) fail("pipe2 failed");
  posix_spawn_file_actions_t fa;
  ::posix_spawn_file_actions_init(&fa);
  ::posix_spawn_file_actions_adddup2(&fa, fds[1], STDOUT_FILENO);
  std::vector<std::string> all{"/proc/self/exe"};
  all.insert(all.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : all) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  int rc = ::posix_spawn(&pid, "/proc/self/exe", &fa, nullptr, argv.data(), environ);
  ::posix_spawn_file_actions_destroy(&fa);
  ::close(fds[1]);
  if (rc != 0) fail("cannot start it: " + std::string(std::strerror(rc)));
  std::string out;
  char buf[512];
  for (ssize_t n; (n = ::read(fds[0], buf, sizeof buf)) != 0;) {
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail("reading its output failed");
    out.append(buf, static_cast<std::size_t>(n));
  }
  ::close(fds[0]);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    fail("it failed (its error is above); it printed: '" + out + "'");
  std::istringstream in(out);
  std::vector<double> v;
  for (double x; in >> x;) v.push_back(x);
  if (v.size() != count)
    fail("it printed '" + out + "', not " + std::to_string(count) + " numbers");
  return v;
}

/// The p-th percentile (0..100) by nearest rank; reorders `v`.
inline double percentile(std::vector<double>& v, double p) {
  if (v.empty()) return NAN;
  auto rank = static_cast<std::size_t>(std::ceil(p / 100.0 * static_cast<double>(v.size())));
  auto k = std::min(v.size() - 1, rank == 0 ? 0 : rank - 1);
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(k), v.end());
  return v[k];
}

/// Runs `run(n)` (which returns its elapsed seconds) with growing n until one
/// run takes at least 50 ms, then returns the n that should take `seconds`.
template <class Run>
std::uint64_t size_for(Run&& run, double seconds, std::uint64_t n = 1000) {
  for (;;) {
    double t = run(n);
    if (t >= 0.05) return std::max<std::uint64_t>(n, static_cast<std::uint64_t>(n * seconds / t));
    n *= t < 0.005 ? 16 : 4;
  }
}

/// Resident set size of this process in bytes (VmRSS), or -1 if unreadable.
inline long long rss_bytes() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("VmRSS:", 0) == 0) return std::stoll(line.substr(6)) * 1024;
  return -1;
}

/// CPU seconds of this process (every thread), from CLOCK_PROCESS_CPUTIME_ID.
inline double cpu_seconds() {
  timespec ts{};
  ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

/// utime + stime of another process (a daemon), in seconds; NAN if unreadable.
inline double cpu_seconds_of(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string s;
  if (!pid || !std::getline(f, s)) return NAN;
  auto rp = s.rfind(')');
  if (rp == std::string::npos) return NAN;
  std::istringstream in(s.substr(rp + 2));
  std::string field;
  unsigned long long utime = 0, stime = 0;
  // Fields after the command name start at 3 (state); utime is 14, stime 15.
  for (int i = 3; i <= 15 && in >> field; ++i) {
    if (i == 14) utime = std::stoull(field);
    if (i == 15) stime = std::stoull(field);
  }
  return static_cast<double>(utime + stime) / static_cast<double>(::sysconf(_SC_CLK_TCK));
}

}  // namespace tether::bench
