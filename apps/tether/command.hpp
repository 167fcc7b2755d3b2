#pragma once
// Subcommands of the `tether` CLI register themselves; main() dispatches.
#include <string>
#include <vector>

namespace tether::cli {

using args = std::vector<std::string>;

struct command {
  const char* name;
  const char* usage;  // one line: arguments and what it does
  int (*run)(const args& a);
};

struct registrar {
  explicit registrar(command c);
};

const std::vector<command>& commands();

/// Path of the running executable's directory (to find tether-sandboxd).
std::string self_dir();

}  // namespace tether::cli
