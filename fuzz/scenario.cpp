// Scenario files (`tether scenario FILE`): any text parses to a script or to
// an error whose message starts "FILE:LINE: ", never a crash.
#include "tether/testing/scenario.hpp"

#include <cstdint>
#include <cstdlib>
#include <string>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::string text(reinterpret_cast<const char*>(data), size);
  auto r = tether::testing::scenario::parse(text, "fuzz.scn");
  if (!r && r.error().message.rfind("fuzz.scn:", 0) != 0) std::abort();
  return 0;
}
