#include "tether/actors/directory.hpp"

#include "tether/protocol/notice.hpp"

namespace tether::actors {

namespace {
constexpr std::size_t k_label_bytes = 200;
}

void session_directory::add(const protocol::session_id& s,
                            std::optional<protocol::session_id> parent, std::string agent,
                            std::string description) {
  std::lock_guard lk(m_);
  auto& e = entries_[s];
  e.parent = parent;
  e.agent = std::move(agent);
  e.description = std::move(description);
  if (parent) entries_[*parent].children.insert(s);
}

void session_directory::add_child(const protocol::session_id& parent,
                                  const protocol::session_id& child) {
  std::lock_guard lk(m_);
  entries_[parent].children.insert(child);
  entries_[child].parent = parent;
}

void session_directory::phase(const protocol::session_id& s, bool busy, bool settling,
                              bool foreground) {
  std::lock_guard lk(m_);
  auto& e = entries_[s];
  e.busy = busy;
  e.settling = settling;
  e.foreground = foreground;
}

bool session_directory::is_busy(const protocol::session_id& s) {
  std::lock_guard lk(m_);
  auto it = entries_.find(s);
  return it != entries_.end() && it->second.busy;
}

void session_directory::remove(const protocol::session_id& s) {
  std::lock_guard lk(m_);
  auto it = entries_.find(s);
  if (it == entries_.end()) return;
  if (it->second.parent)
    if (auto p = entries_.find(*it->second.parent); p != entries_.end())
      p->second.children.erase(s);
  entries_.erase(it);
}

session_directory::under session_directory::running_under(const protocol::session_id& s) {
  under out;
  std::lock_guard lk(m_);
  std::vector<protocol::session_id> stack{s};
  while (!stack.empty()) {
    auto cur = stack.back();
    stack.pop_back();
    if (!out.sessions.insert(cur).second) continue;
    auto it = entries_.find(cur);
    if (it == entries_.end()) continue;
    for (auto& c : it->second.children) {
      auto ci = entries_.find(c);
      // Settling, cancelled or foreground-blocking descendants are not listed.
      if (ci != entries_.end() && ci->second.busy && !ci->second.settling && !ci->second.foreground)
        out.subagents.push_back(
            {"subagent", ci->second.agent + ", sessionID: " + c.str(),
             protocol::make_preview(labels_.scrub(ci->second.description), k_label_bytes).text});
      stack.push_back(c);
    }
  }
  return out;
}

}  // namespace tether::actors
