// The payload codecs of persisted rows (messages.payload, jobs.payload): any
// text decodes or yields an error naming the field; what decodes survives a
// round trip through to_json unchanged.
#include "tether/protocol/payloads.hpp"

#include <cstdint>
#include <cstdlib>
#include <string_view>

namespace p = tether::protocol;

template <class T, class F>
void round_trip(std::string_view text, F decode) {
  auto d = p::decode_text<T>(text, decode);
  if (!d) {
    if (d.error().field.empty() && d.error().problem.empty()) std::abort();  // says nothing
    return;
  }
  auto again = p::decode_text<T>(p::to_text(p::to_json(*d)), decode);
  if (!again || !(*again == *d)) std::abort();
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  round_trip<p::message_payload>(
      text, [](const p::json::value& v) { return p::message_payload_from_json(v); });
  round_trip<p::job_payload>(text,
                             [](const p::json::value& v) { return p::job_payload_from_json(v); });
  return 0;
}
