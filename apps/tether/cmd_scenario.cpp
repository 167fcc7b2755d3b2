// `tether scenario FILE`: runs a scenario file (docs/scenarios.md) against a
// fresh database and prints each expectation with ok/FAIL. Exit status: 0 if
// every expectation held, 1 if one failed, 2 for a malformed file or usage.
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <iostream>

#include "command.hpp"
#include "tether/testing/scenario.hpp"

namespace tether::cli {
namespace {

namespace fs = std::filesystem;
namespace scn = testing::scenario;

constexpr const char* k_usage =
    "usage: tether scenario FILE [--dir DIR] [--timeout SECONDS] [--verbose]\n"
    "  --dir DIR          run in DIR and keep it (inspect it with `tether inspect DIR/tether.db`)\n"
    "  --timeout SECONDS  how long any wait step may take (default 20)\n"
    "  --verbose          print every step as it runs\n";

struct options {
  std::string file, dir;
  bool keep = false, verbose = false;
  int timeout_s = 20;
  // Set in the process a `crash at` step started.
  bool crash_child = false;
  std::size_t crash_step = 0;
};

bool parse_args(const args& a, options& o) {
  std::size_t i = 0;
  if (a.size() >= 4 && a[0] == "--crash-segment") {
    o.crash_child = true;
    o.crash_step = std::stoul(a[1]);
    o.dir = a[2];
    i = 3;
  }
  for (; i < a.size(); ++i) {
    if (a[i] == "--dir" && i + 1 < a.size()) {
      o.dir = a[++i];
      o.keep = true;
    } else if (a[i] == "--timeout" && i + 1 < a.size()) {
      char* end = nullptr;
      long t = std::strtol(a[++i].c_str(), &end, 10);
      if (*end != '\0' || t < 1 || t > 3600) {
        std::cerr << "tether scenario: --timeout '" << a[i]
                  << "' is not a whole number of seconds (1..3600)\n";
        return false;
      }
      o.timeout_s = static_cast<int>(t);
    } else if (a[i] == "--verbose" || a[i] == "-v") {
      o.verbose = true;
    } else if (!a[i].empty() && a[i][0] != '-' && o.file.empty()) {
      o.file = a[i];
    } else {
      std::cerr << "tether scenario: unexpected argument '" << a[i] << "'\n";
      return false;
    }
  }
  return !o.file.empty();
}

// Runs the steps after a `crash at` step in a fresh `tether` process armed
// with TETHER_CRASH_AT; returns its wait status.
int start_crash_segment(const options& o, std::size_t step, const std::string& point) {
  std::cout.flush();
  pid_t pid = ::fork();
  if (pid == 0) {
    ::setenv("TETHER_CRASH_AT", point.c_str(), 1);
    // The running binary itself, whatever it is called.
    std::error_code ec;
    std::string self = fs::read_symlink("/proc/self/exe", ec).string();
    if (ec) self = self_dir() + "/tether";
    std::string step_s = std::to_string(step), timeout_s = std::to_string(o.timeout_s);
    ::execl(self.c_str(), self.c_str(), "scenario", "--crash-segment", step_s.c_str(),
            o.dir.c_str(), o.file.c_str(), "--timeout", timeout_s.c_str(),
            o.verbose ? "--verbose" : nullptr, nullptr);
    ::_exit(127);
  }
  if (pid < 0) return W_EXITCODE(127, 0);
  int status = 0;
  ::waitpid(pid, &status, 0);
  return status;
}

int scenario(const args& a) {
  options o;
  if (!parse_args(a, o)) {
    std::cerr << k_usage;
    return 2;
  }
  auto s = scn::parse_file(o.file);
  if (!s) {
    std::cerr << "tether scenario: " << s.error().message << "\n";
    return 2;
  }
  scn::run_options ro;
  ro.verbose = o.verbose;
  ro.wait_timeout = std::chrono::seconds(o.timeout_s);

  if (o.crash_child) {
    ro.dir = o.dir;
    int rc = scn::run_crash_segment(*s, ro, o.crash_step);
    std::cout.flush();
    std::_Exit(rc);  // a host left behind by a timeout must not be destroyed
  }

  if (o.keep) {
    if (fs::exists(fs::path(o.dir) / "tether.db")) {
      std::cerr << "tether scenario: " << o.dir
                << "/tether.db exists; a scenario starts from a fresh database\n";
      return 2;
    }
  } else {
    char tmpl[] = "/tmp/tether-scenario-XXXXXX";
    if (!::mkdtemp(tmpl)) {
      std::perror("tether scenario: mkdtemp");
      return 1;
    }
    o.dir = tmpl;
  }
  ro.dir = o.dir;
  ro.crash_segment = [&o](std::size_t step, const std::string& point) {
    return start_crash_segment(o, step, point);
  };
  auto res = scn::run(*s, ro);
  if (o.keep) std::cout << "database kept: " << (fs::path(o.dir) / "tether.db").string() << "\n";
  std::cout.flush();
  if (res.stuck) std::_Exit(1);  // a wedged host cannot be shut down
  if (!o.keep) {
    std::error_code ec;
    fs::remove_all(o.dir, ec);
  }
  return res.failed ? 1 : 0;
}

registrar scenario_cmd{
    {"scenario", "FILE: run a scenario file (docs/scenarios.md); exit 0 if every expectation held",
     scenario}};

}  // namespace
}  // namespace tether::cli
