#pragma once
// The <subagent> report a child's busy period sends its parent, in the seed's
// exact format, and the still-running list appended to it.
#include <string>
#include <string_view>
#include <vector>

#include "tether/protocol/ids.hpp"

namespace tether::protocol {

enum class report_state { completed, error, cancelled };
std::string_view to_string(report_state s);
bool parse(std::string_view s, report_state& out);

/// One line of "Background work still running:".
struct running_item {
  std::string kind;    // shell | subagent | image
  std::string detail;  // "sh_1" or "explore, sessionID: ses_abc"
  std::string label;   // the command or description
};

/// What a busy period with no answer reports when a background job waits on it.
inline constexpr std::string_view k_no_text_response =
    "Subagent completed without a text response.";
inline constexpr std::string_view k_cancelled_text = "Subagent cancelled";

/// Escapes &, <, >, " for an attribute value.
std::string escape_attribute(std::string_view v);

/// The body text of a report: answer (or error, or "Subagent cancelled") plus
/// the still-running list when it is not empty.
std::string render_report_body(std::string_view answer, const std::vector<running_item>& running);

/// The whole <subagent ...> element.
std::string render_report(const session_id& child, report_state state, std::string_view description,
                          std::string_view body);

}  // namespace tether::protocol
