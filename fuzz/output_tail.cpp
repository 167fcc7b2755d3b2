// Bounded output: the notice tail never exceeds its line and byte bounds and
// is valid UTF-8; head_tail retention stays within its limits, counts every
// byte, and reads only what it retained.
//
// Input: bytes 0-3 pick the bounds and chunk size; the rest is the stream.
#include "tether/protocol/output_tail.hpp"

#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

namespace p = tether::protocol;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 4) return 0;
  std::size_t max_lines = data[0] % 50;
  std::size_t max_bytes = data[1] * 8u;
  std::size_t limit = 1 + data[2];
  std::size_t chunk = 1 + data[3] % 97;
  std::string_view stream(reinterpret_cast<const char*>(data) + 4, size - 4);

  auto t = p::make_tail(stream, stream.size() + data[0], max_lines, max_bytes);
  if (t.text.size() > max_bytes || t.lines > max_lines) std::abort();
  if (p::utf8_sanitize(t.text) != t.text) std::abort();

  p::head_tail ht(limit, limit);
  for (std::size_t i = 0; i < stream.size(); i += chunk) ht.append(stream.substr(i, chunk));
  if (ht.total() != stream.size()) std::abort();
  if (ht.head().size() > limit || ht.tail().size() > limit) std::abort();
  if (stream.substr(0, ht.head().size()) != ht.head()) std::abort();
  if (stream.substr(stream.size() - ht.tail().size()) != ht.tail()) std::abort();
  auto sl = ht.read(data[0], data[1]);
  if (sl.data.size() > data[1]) std::abort();
  if (sl.offset + sl.data.size() > ht.total()) std::abort();
  if (stream.substr(sl.offset, sl.data.size()) != sl.data) std::abort();
  auto prefix = p::utf8_prefix(stream, data[2]);
  if (prefix.size() > data[2]) std::abort();
  return 0;
}
