#include "tether/persistence/task_transitions.hpp"

#include <SQLiteCpp/Statement.h>

#include "tether/persistence/writer.hpp"
#include "tether/protocol/json.hpp"
#include "tether/protocol/output_tail.hpp"
#include "tether/runtime/clock.hpp"

namespace tether::persistence {

using runtime::now_ms;

void require_utf8(std::string_view text, std::string_view what) {
  auto bad = protocol::first_invalid_utf8(text);
  if (!bad) return;
  static constexpr char hex[] = "0123456789ABCDEF";
  auto b = static_cast<unsigned char>(text[*bad]);
  throw error_exception(error{
      errc::invalid, std::string(what) + " is not valid UTF-8 (byte 0x" + hex[b >> 4] +
                         hex[b & 15] + " at offset " + std::to_string(*bad) + " of " +
                         std::to_string(text.size()) + "); nothing of this request was written"});
}

std::string stored_json(const protocol::json::value& v, std::string_view what) {
  auto text = protocol::to_text(v);
  require_utf8(text, what);
  return text;
}

std::optional<protocol::owner_scope> parent_scope(SQLite::Database& db,
                                                  const protocol::session_id& parent) {
  auto& q = cached_statement(db, "SELECT tenant, coalesce(turn, '') FROM sessions WHERE id = ?");
  q.bind(1, parent.str());
  std::optional<protocol::owner_scope> out;
  if (q.executeStep()) {
    out.emplace();
    out->tenant = protocol::tenant_id(q.getColumn(0).getString());
    out->thread = parent;
    out->turn = protocol::turn_id(q.getColumn(1).getString());
  }
  q.reset();
  return out;
}

std::string receipt_scope(SQLite::Database& db, const protocol::job_id& task,
                          const std::string& row_scope,
                          const std::optional<protocol::session_id>& parent) {
  if (!row_scope.empty()) return row_scope;
  std::string scope;
  auto& q = cached_statement(db, "SELECT scope FROM receipts WHERE id = ?");
  q.bind(1, protocol::make_event_id(task, protocol::transition::started).str());
  if (q.executeStep()) scope = q.getColumn(0).getString();
  q.reset();
  if (!scope.empty()) return scope;
  protocol::owner_scope s;
  s.tenant = protocol::tenant_id("default");
  if (parent) {
    s.thread = *parent;
    if (auto p = parent_scope(db, *parent)) s = std::move(*p);
  }
  return stored_json(protocol::to_json(s), "the receipt's scope");
}

std::int64_t insert_receipt_row(SQLite::Database& db, const protocol::job_id& task,
                                protocol::transition t, const std::string& scope,
                                const std::string& body, std::string_view state) {
  auto& st =
      cached_statement(db,
                       "INSERT OR IGNORE INTO receipts (id, task_id, transition, scope, body, "
                       "state, created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)");
  auto now = now_ms();
  st.bind(1, protocol::make_event_id(task, t).str());
  st.bind(2, task.str());
  st.bind(3, std::string(protocol::to_string(t)));
  st.bind(4, scope);
  st.bind(5, body);
  st.bind(6, std::string(state));
  st.bind(7, now);
  st.bind(8, now);
  st.exec();
  return now;
}

protocol::transition transition_of_word(std::string_view state) {
  using protocol::transition;
  if (state == "completed") return transition::completed;
  if (state == "cancelled") return transition::cancelled;
  if (state == "lost") return transition::lost;
  if (state == "timed_out") return transition::timed_out;
  return transition::failed;
}

std::optional<terminal_written> terminal_transition(SQLite::Database& db, const terminal_write& w) {
  auto& up = w.owner ? cached_statement(db,
                                        "UPDATE tasks SET state = ?, body = coalesce(?, body), "
                                        "completion = coalesce(?, completion), updated_at = ? "
                                        "WHERE id = ? AND kind = ? AND state IN "
                                        "('admitted','running') AND owner = ? "
                                        "RETURNING coalesce(scope, ''), parent_id")
                     : cached_statement(db,
                                        "UPDATE tasks SET state = ?, body = coalesce(?, body), "
                                        "completion = coalesce(?, completion), updated_at = ? "
                                        "WHERE id = ? AND kind = ? AND state IN "
                                        "('admitted','running') "
                                        "RETURNING coalesce(scope, ''), parent_id");
  up.bind(1, w.state);
  if (w.body)
    up.bind(2, *w.body);
  else
    up.bind(2);
  if (w.completion) {
    if (protocol::first_invalid_utf8(*w.completion))
      require_utf8(*w.completion, "the " + std::string(w.kind) + " task's completion");
    up.bind(3, *w.completion);
  } else
    up.bind(3);
  up.bind(4, now_ms());
  up.bind(5, w.task.str());
  up.bind(6, std::string(w.kind));
  if (w.owner) up.bind(7, *w.owner);
  if (!up.executeStep()) {
    up.reset();
    return std::nullopt;  // not live: the first terminal transition won already
  }
  terminal_written out;
  auto row_scope = up.getColumn(0).getString();
  if (!up.getColumn(1).isNull()) out.parent = protocol::session_id(up.getColumn(1).getString());
  up.reset();
  out.scope = receipt_scope(db, w.task, row_scope, out.parent);
  out.created_at =
      insert_receipt_row(db, w.task, w.transition, out.scope, w.receipt_body, w.receipt_state);
  return out;
}

bool settle_receipt(SQLite::Database& db, const protocol::event_id& id, receipt_state to) {
  auto& st = cached_statement(
      db, "UPDATE receipts SET state = ?, updated_at = ? WHERE id = ? AND state = 'pending'");
  st.bind(1, std::string(to_string(to)));
  st.bind(2, now_ms());
  st.bind(3, id.str());
  return st.exec() == 1;
}

}  // namespace tether::persistence
