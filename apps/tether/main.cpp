// tether: the command-line face of the runtime. Each subcommand lives in its
// own file and registers itself; this file only dispatches.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <iostream>

#include "command.hpp"
#include "tether/runtime/crash_point.hpp"
#include "tether/sandbox/daemon_process.hpp"

namespace tether::cli {

static std::vector<command>& table() {
  static std::vector<command> t;
  return t;
}

registrar::registrar(command c) {
  table().push_back(c);
}

const std::vector<command>& commands() {
  return table();
}

std::string self_dir() {
  return sandbox::self_dir();
}

static int usage(std::FILE* out) {
  std::fprintf(out, "usage: tether <command> [args]\n\ncommands:\n");
  auto cmds = commands();
  std::sort(cmds.begin(), cmds.end(),
            [](const command& a, const command& b) { return std::string(a.name) < b.name; });
  for (auto& c : cmds) std::fprintf(out, "  %-14s %s\n", c.name, c.usage);
  return out == stdout ? 0 : 2;
}

static registrar crash_points_cmd{
    {"crash-points", "print every crash point name, one per line", [](const args&) {
       for (auto& n : runtime::crash_point_names()) std::cout << n << '\n';
       return 0;
     }}};

}  // namespace tether::cli

int main(int argc, char** argv) {
  using namespace tether::cli;
  if (argc < 2) return usage(stderr);
  std::string name = argv[1];
  if (name == "-h" || name == "--help" || name == "help") return usage(stdout);
  if (auto r = tether::runtime::check_crash_env(); !r) {
    std::fprintf(stderr, "tether: %s\n", r.error().message.c_str());
    return 2;
  }
  for (auto& c : commands()) {
    if (name == c.name) {
      args a(argv + 2, argv + argc);
      try {
        return c.run(a);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "tether %s: %s\n", c.name, e.what());
        return 1;
      }
    }
  }
  std::fprintf(stderr, "tether: unknown command '%s'\n", name.c_str());
  return usage(stderr);
}
