// The sandbox daemon's wire messages: any line decodes to a message or to an
// error naming the field, never a crash; a decoded message re-encodes to a
// line that decodes to the same encoding (encode∘decode is idempotent).
#include "tether/protocol/sandbox_wire.hpp"

#include <cstdint>
#include <cstdlib>
#include <string_view>

namespace wire = tether::protocol::sandbox;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::string_view line(reinterpret_cast<const char*>(data), size);
  if (auto r = wire::decode_request(line)) {
    auto once = wire::encode(*r);
    auto again = wire::decode_request(once);
    if (!again || wire::encode(*again) != once) std::abort();
  }
  if (auto r = wire::decode_reply(line)) {
    auto once = wire::encode(*r);
    auto again = wire::decode_reply(once);
    if (!again || wire::encode(*again) != once) std::abort();
  }
  if (auto b = wire::base64_decode(line)) {
    if (wire::base64_decode(wire::base64_encode(*b)).value() != *b) std::abort();
  }
  return 0;
}
