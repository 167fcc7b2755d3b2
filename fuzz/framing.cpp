// The sandbox wire's framing (sandbox/framing.hpp): whatever bytes arrive and
// however reads cut them, the splitter yields the same lines, none holding a
// newline, blank or longer than the limit, and holds at most one partial line
// of the limit; every line it yields that frame() takes splits back to itself.
#include "tether/sandbox/framing.hpp"

#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

namespace sbx = tether::sandbox;

namespace {

// Input layout: byte 0 the limit (1..64), byte 1 the seed of the read sizes, then the stream.
std::vector<std::string> split(std::string_view stream, std::size_t max, unsigned seed) {
  sbx::line_splitter s(max, "line");
  std::vector<std::string> out;
  std::size_t at = 0;
  while (at < stream.size()) {
    std::size_t n = seed == 0 ? stream.size() - at : 1 + (seed * (at + 7)) % 13;
    if (n > stream.size() - at) n = stream.size() - at;
    s.feed(stream.substr(at, n));
    at += n;
    while (auto l = s.next()) {
      if (!*l) {
        out.push_back("\n<too long>");  // a marker no real line can equal
        continue;
      }
      const std::string& line = **l;
      if (line.find('\n') != std::string::npos || line.size() > max) std::abort();
      if (line.find_first_not_of(" \t") == std::string::npos) std::abort();
      out.push_back(line);
    }
    if (s.buffered() > max + 1) std::abort();  // the limit, and a CR that may end it
  }
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 2) return 0;
  std::size_t max = 1 + data[0] % 64;
  unsigned seed = data[1];
  std::string_view stream(reinterpret_cast<const char*>(data + 2), size - 2);
  auto whole = split(stream, max, 0);
  if (split(stream, max, seed) != whole) std::abort();
  for (auto& line : whole) {
    if (line == "\n<too long>") continue;
    auto f = sbx::frame(line);
    if (!f) {
      if (line.back() == '\r') continue;  // "\r\r\n" leaves one: frame() refuses it
      std::abort();
    }
    sbx::line_splitter again(max, "line");
    again.feed(*f);
    auto back = again.next();
    if (!back || !*back || **back != line) std::abort();
  }
  return 0;
}
