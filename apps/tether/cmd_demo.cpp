// Placeholder until the report path lands.
#include "command.hpp"
#include <cstdio>
namespace tether::cli {
static registrar demo_cmd{{"demo", "run the main job", [](const args&) {
  std::puts("demo: not yet");
  return 0;
}}};
}
