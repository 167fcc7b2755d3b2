// The scrubber, whole and streamed (in chunks the input chooses): whatever
// surrounds them, a registered secret value and a known-format credential on
// a line of its own never survive.
//
// Input: byte 0 picks the known-format secret, where it goes and whether
// digits are glued before it ("91xoxb-…"); byte 1 the chunk size; the rest
// is the text.
#include "tether/protocol/scrub.hpp"

#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

namespace p = tether::protocol;

namespace {
constexpr std::string_view k_value = "zq7-Value-of-a-Secret-91x";  // TOKEN=... in the env
constexpr std::string_view k_known[] = {
    "AKIAIOSFODNN7EXAMPLE",                                     // AWS access key id
    "ghp_0123456789abcdefghijABCDEFGHIJ012345",                 // GitHub token
    "xoxb-123456789012-123456789012-abcdefghijABCDEFGHIJklmn",  // Slack bot token
    "hf_abcdefghijklmnopqrstuvwxyz0123456",                     // short prefix
    "-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASC\n-----END PRIVATE KEY-----",
};
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 2) return 0;
  static const p::scrubber s(p::scrub_rules::from_env({{"API_TOKEN", std::string(k_value)}}));
  std::string body(reinterpret_cast<const char*>(data) + 2, size - 2);
  auto known = k_known[data[0] % std::size(k_known)];
  std::size_t at = body.empty() ? 0 : (data[0] * 131u) % (body.size() + 1);
  bool pem = known.rfind("-----BEGIN", 0) == 0;
  std::string glue = (data[0] & 0x80) && !pem ? "91" : "";
  std::string planted = "\n" + glue + std::string(known) + "\n";
  std::string text = body.substr(0, at) + planted + body.substr(at);

  // The registered value is redacted wherever it appears; the planted
  // credential, alone on its line or glued after digits, is redacted
  // whatever the input around it.
  auto check = [&](const std::string& out) {
    if (out.find(k_value) != std::string::npos) std::abort();
    // A PEM block: its header line followed by the key must not survive.
    std::string secret = pem ? std::string(known.substr(0, 60)) : planted;
    if (out.find(secret) != std::string::npos) std::abort();
  };
  check(s.scrub(text));

  std::size_t chunk = 1 + data[1] % 64;
  p::stream_scrubber st(s);
  std::string out;
  for (std::size_t i = 0; i < text.size(); i += chunk) out += st.feed(text.substr(i, chunk));
  out += st.finish();
  check(out);
  return 0;
}
