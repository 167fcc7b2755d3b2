#include "tether/protocol/report.hpp"

namespace tether::protocol {

std::string_view to_string(report_state s) {
  switch (s) {
    case report_state::completed:
      return "completed";
    case report_state::error:
      return "error";
    case report_state::cancelled:
      return "cancelled";
  }
  return "unknown";
}

bool parse(std::string_view s, report_state& out) {
  for (auto v : {report_state::completed, report_state::error, report_state::cancelled})
    if (s == to_string(v)) {
      out = v;
      return true;
    }
  return false;
}

std::string escape_attribute(std::string_view v) {
  std::string out;
  out.reserve(v.size());
  for (char c : v) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string render_report_body(std::string_view answer, const std::vector<running_item>& running) {
  std::string out(answer);
  if (running.empty()) return out;
  out += "\nBackground work still running:";
  for (auto& r : running) {
    out += "\n- ";
    out += r.kind;
    out += " (";
    out += r.detail;
    out += "): ";
    out += r.label;
  }
  return out;
}

std::string render_report(const session_id& child, report_state state, std::string_view description,
                          std::string_view body) {
  std::string out = "<subagent sessionID=\"" + escape_attribute(child.str()) + "\" state=\"" +
                    std::string(to_string(state)) + "\" description=\"" +
                    escape_attribute(description) + "\">\n";
  out += body;
  out += "\n</subagent>";
  return out;
}

}  // namespace tether::protocol
