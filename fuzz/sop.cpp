// SOP definitions (docs/sop.md): whatever the bytes, parse_sop either fails
// with a named error or yields a definition that checks, survives a round
// trip through JSON (as a value and as text) unchanged, and whose resolved
// transitions all lead to a step of the SOP, "end" or "fail".
//
// Input: the whole input is the text of one SOP file.
#include "tether/protocol/sop.hpp"

#include <cstdint>
#include <cstdlib>
#include <string>

namespace p = tether::protocol;

namespace {

void check_target(const p::sop_definition& d, const std::string& target) {
  if (target != p::sop_end && target != p::sop_fail && !d.index_of(target)) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::string text(reinterpret_cast<const char*>(data), size);
  auto d = p::parse_sop(text);
  if (!d) {
    if (d.error().problem.empty()) std::abort();
    return 0;
  }
  if (p::check(*d)) std::abort();
  auto back = p::sop_from_json(p::to_json(*d));
  if (!back || !(*back == *d)) std::abort();
  auto again = p::parse_sop(p::to_text(p::to_json(*d)));
  if (!again || !(*again == *d)) std::abort();
  for (std::size_t i = 0; i < d->steps.size(); ++i) {
    check_target(*d, d->success_target(i));
    check_target(*d, d->failure_target(i));
    if (d->steps[i].kind == p::sop_step_kind::approval && d->approvers_of(i).empty() &&
        d->approval_timeout_of(i) == 0)
      std::abort();  // an approval that could never end passed check()
  }
  return 0;
}
