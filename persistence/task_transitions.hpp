#pragma once
// Internal to persistence/: the transitions every kind of task shares, run
// inside the caller's write transaction (the writer's connection). The task
// store's named operations (task_store.hpp) are built from these, so a new
// kind (delegate, cron_run, sop_run) reuses them instead of writing its own.
#include <SQLiteCpp/Database.h>

#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "tether/persistence/database.hpp"
#include "tether/persistence/task_store.hpp"
#include "tether/protocol/ids.hpp"
#include "tether/protocol/json.hpp"
#include "tether/protocol/notice.hpp"
#include "tether/protocol/scope.hpp"

namespace tether::persistence {

/// Runs `sql` on a read connection with `binds`, decoding every row; the
/// first row that does not decode is the error (never skipped).
template <class T, class Decode>
inline result<std::vector<T>> read_all(reader_pool& readers, const std::string& sql,
                                       std::string_view what, const std::vector<std::string>& binds,
                                       Decode decode) {
  try {
    auto c = readers.acquire();
    auto& q = c.statement(sql);
    for (std::size_t i = 0; i < binds.size(); ++i) q.bind(static_cast<int>(i + 1), binds[i]);
    std::vector<T> out;
    while (q.executeStep()) {
      auto r = decode(q);
      if (!r) return r.error();
      out.push_back(std::move(*r));
    }
    return out;
  } catch (const std::exception& e) {
    return read_error(what, e);
  }
}

/// The first row, if any.
template <class T>
inline result<std::optional<T>> first_of(result<std::vector<T>> all) {
  if (!all) return all.error();
  if (all->empty()) return std::optional<T>{};
  return std::optional<T>(std::move(all->front()));
}

/// Scopes already decoded in one read, by their JSON text.
using scope_memo = std::unordered_map<std::string, protocol::owner_scope>;
/// A receipt from columns `first`.. (id, task_id, transition, scope, body,
/// state, created_at); every field checked.
result<receipt> decode_receipt_at(SQLite::Statement& q, int first, scope_memo* memo);

struct terminal_written;
/// The receipt a won terminal transition wrote, for the caller to hand over.
result<receipt> receipt_of(const protocol::job_id& id, protocol::transition t,
                           const terminal_written& won, std::string body);

/// Throws error_exception (errc::invalid, rolling back the caller's
/// request) unless `text` is valid UTF-8. Every payload column holds JSON
/// that its readers parse strictly, so a row holding other bytes would be
/// refused by every read after it committed (a session's input, its every
/// later drain). `what` names the text in the error.
void require_utf8(std::string_view text, std::string_view what);
/// The JSON text of `v` for a payload column, refused as require_utf8 says
/// (the JSON around the strings is ASCII: a bad byte is in one of them).
std::string stored_json(const protocol::json::value& v, std::string_view what);

/// Throws error_exception (errc::conflict, rolling back the caller's
/// request) unless `goal` is a running goal: a task joins a goal in the
/// transaction that admits it, or not at all.
void require_open_goal(SQLite::Database& db, const protocol::job_id& goal);

/// One task's terminal transition and its receipt.
struct terminal_write {
  protocol::job_id task;
  std::string_view kind;  // the kind the caller expects the task to be
  std::string state;      // the terminal state word (completed, failed, ...)
  protocol::transition transition = protocol::transition::completed;
  std::optional<std::string> body;             // the task's rendered report (subagent), if any
  std::optional<std::string> completion;       // the completion's JSON (shell), if any
  std::string receipt_body;                    // what the owner reads
  std::string_view receipt_state = "pending";  // "dropped": nobody is owed it (a silenced link)
  /// Set: the transition also requires the task's recorded owner process to
  /// be this one (a delegate's settlement by the process that runs it).
  std::optional<std::string> owner;
};

struct terminal_written {
  std::string scope;  // the receipt's owner scope, as JSON text
  std::optional<protocol::session_id> parent;
  std::int64_t created_at = 0;
};

/// The transition a terminal state word is reached by (an unknown word: failed).
protocol::transition transition_of_word(std::string_view state);

/// The one terminal compare-and-set of every kind of task: admitted|running
/// → the terminal state, and the task's terminal receipt `<task>/<transition>`
/// (the only outbox), in the caller's transaction. nullopt, with nothing
/// written, if the task is not live (the first terminal transition won) or
/// is not of the expected kind. The receipt is bound to the task's own owner
/// scope when it has one (a shell launched under a scope); else to its
/// `started` receipt's scope (a background subagent, bound at spawn); else to
/// its parent's scope now.
std::optional<terminal_written> terminal_transition(SQLite::Database& db, const terminal_write& w);

/// The scope a task's receipt is bound to: `row_scope` (the task's own owner
/// scope, JSON) when not empty; else its `started` receipt's; else its
/// parent's now; else the default tenant's.
std::string receipt_scope(SQLite::Database& db, const protocol::job_id& task,
                          const std::string& row_scope,
                          const std::optional<protocol::session_id>& parent);

/// Inserts a receipt unless its id exists; returns its created_at.
std::int64_t insert_receipt_row(SQLite::Database& db, const protocol::job_id& task,
                                protocol::transition t, const std::string& scope,
                                const std::string& body, std::string_view state);

/// The scope a parent's reports are owed under: its tenant, the parent as the
/// thread, its current turn (no sandbox). nullopt if the parent is gone.
std::optional<protocol::owner_scope> parent_scope(SQLite::Database& db,
                                                  const protocol::session_id& parent);

/// Moves a pending receipt to `to`; true if it was pending.
bool settle_receipt(SQLite::Database& db, const protocol::event_id& id, receipt_state to);

}  // namespace tether::persistence
