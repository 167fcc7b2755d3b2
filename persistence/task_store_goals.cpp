// Goals (docs/policy.md): a task of kind `goal` that other tasks join when
// they are admitted; their terminal states and model usage roll up to it.
#include <SQLiteCpp/Database.h>
#include <SQLiteCpp/Statement.h>

#include "tether/persistence/task_store.hpp"
#include "tether/persistence/task_transitions.hpp"
#include "tether/protocol/json.hpp"
#include "tether/protocol/payloads.hpp"
#include "tether/runtime/clock.hpp"

namespace tether::persistence {

namespace json = boost::json;
using runtime::now_ms;

std::string_view to_string(goal_state s) {
  switch (s) {
    case goal_state::running:
      return "running";
    case goal_state::completed:
      return "completed";
    case goal_state::failed:
      return "failed";
    case goal_state::cancelled:
      return "cancelled";
  }
  return "unknown";
}

bool parse(std::string_view s, goal_state& out) {
  for (auto g :
       {goal_state::running, goal_state::completed, goal_state::failed, goal_state::cancelled})
    if (to_string(g) == s) {
      out = g;
      return true;
    }
  return false;
}

void require_open_goal(SQLite::Database& db, const job_id& goal) {
  auto& q = cached_statement(db, "SELECT state FROM tasks WHERE id = ? AND kind = 'goal'");
  q.bind(1, goal.str());
  std::optional<std::string> state;
  if (q.executeStep()) state = q.getColumn(0).getString();
  q.reset();
  if (!state)
    throw error_exception(
        error{errc::not_found, "goal '" + goal.str() + "' not found; nothing was started"});
  if (*state != "running")
    throw error_exception(error{errc::conflict, "goal '" + goal.str() + "' is " + *state +
                                                    ", so no task can join it; nothing was "
                                                    "started"});
}

result<std::optional<goal_record>> task_reader::goal(const job_id& id) {
  auto head = first_of(read_all<goal_record>(
      readers_, "SELECT id, scope, payload, state FROM tasks WHERE id = ? AND kind = 'goal'",
      "reading goal " + id.str(), {id.str()}, [](SQLite::Statement& q) -> result<goal_record> {
        goal_record g;
        g.id = job_id(q.getColumn(0).getString());
        auto scope = protocol::decode_text<owner_scope>(
            q.getColumn(1).getString(),
            [](const json::value& v) { return protocol::scope_from_json(v); });
        if (!scope) return corrupt_row("tasks", g.id.str(), "scope: " + scope.error().describe());
        g.scope = std::move(*scope);
        auto payload = protocol::parse_json(q.getColumn(2).getString());
        if (!payload || !payload->is_object())
          return corrupt_row("tasks", g.id.str(), "payload: not a JSON object");
        const auto& o = payload->as_object();
        auto root = o.if_contains("root");
        if (!root || !root->is_string() || root->as_string().empty())
          return corrupt_row("tasks", g.id.str(), "payload.root: missing");
        g.root = session_id(std::string(root->as_string()));
        if (auto d = o.if_contains("description"); d && d->is_string())
          g.description = std::string(d->as_string());
        g.state = q.getColumn(3).getString();
        return g;
      }));
  if (!head || !*head) return head;
  auto members = read_all<goal_member>(
      readers_,
      "SELECT id, kind, state, input_tokens, output_tokens FROM tasks WHERE goal_id = ? "
      "ORDER BY created_at, id",
      "reading the tasks of goal " + id.str(), {id.str()},
      [](SQLite::Statement& q) -> result<goal_member> {
        goal_member m;
        m.id = job_id(q.getColumn(0).getString());
        m.kind = q.getColumn(1).getString();
        m.state = q.getColumn(2).getString();
        m.input_tokens = q.getColumn(3).getInt64();
        m.output_tokens = q.getColumn(4).getInt64();
        return m;
      });
  if (!members) return members.error();
  auto& g = **head;
  g.members = std::move(*members);
  for (const auto& m : g.members) {
    g.input_tokens += m.input_tokens;
    g.output_tokens += m.output_tokens;
  }
  return head;
}

awaitable<result<void>> task_store::admit_goal(job_id id, owner_scope scope, session_id root,
                                               std::string description) {
  auto name = "admit goal " + id.str();
  std::size_t bytes = description.size() + 512;
  auto fn = [id = std::move(id), scope = std::move(scope), root = std::move(root),
             description = std::move(description)](SQLite::Database& db) -> result<void> {
    auto& st = cached_statement(db,
                                "INSERT OR IGNORE INTO tasks (id, kind, tenant, thread, turn, "
                                "scope, state, payload, created_at, updated_at) VALUES (?, "
                                "'goal', ?, ?, ?, ?, 'running', ?, ?, ?)");
    auto now = now_ms();
    json::object payload{{"description", description}, {"root", root.str()}};
    st.bind(1, id.str());
    st.bind(2, scope.tenant.str());
    st.bind(3, scope.thread.str());
    st.bind(4, scope.turn.str());
    st.bind(5, stored_json(protocol::to_json(scope), "the goal's scope"));
    st.bind(6, stored_json(payload, "the goal's description"));
    st.bind(7, now);
    st.bind(8, now);
    if (st.exec() != 1)
      return error{errc::conflict,
                   "goal id '" + id.str() + "' is already registered; the existing one was kept"};
    return {};
  };
  co_return co_await w_.write(std::move(name), bytes, std::move(fn));
}

awaitable<result<std::optional<receipt>>> task_store::close_goal(job_id id, std::string state,
                                                                 std::string receipt_body) {
  goal_state g;
  if (!parse(state, g) || g == goal_state::running)
    co_return error{errc::invalid, "a goal closes completed, failed or cancelled, not '" + state +
                                       "'; it was left as it was"};
  auto t = g == goal_state::completed ? protocol::transition::completed
           : g == goal_state::failed  ? protocol::transition::failed
                                      : protocol::transition::cancelled;
  auto name = "close goal " + id.str();
  std::size_t bytes = receipt_body.size() + 256;
  auto fn = [id = std::move(id), state = std::move(state), t, body = std::move(receipt_body)](
                SQLite::Database& db) -> result<std::optional<receipt>> {
    terminal_write tw;
    tw.task = id;
    tw.kind = "goal";
    tw.state = state;
    tw.transition = t;
    tw.receipt_body = body;
    auto won = terminal_transition(db, tw);
    if (!won) return std::optional<receipt>{};
    auto r = receipt_of(id, t, *won, body);
    if (!r) return r.error();
    return std::optional<receipt>(std::move(*r));
  };
  co_return co_await w_.write(std::move(name), bytes, std::move(fn));
}

awaitable<result<bool>> task_store::add_usage(job_id task, std::int64_t input_tokens,
                                              std::int64_t output_tokens) {
  if (input_tokens < 0 || output_tokens < 0)
    co_return error{errc::invalid,
                    "usage of task " + task.str() + " must not be negative; nothing was counted"};
  auto name = "usage of " + task.str();
  auto fn = [task = std::move(task), input_tokens,
             output_tokens](SQLite::Database& db) -> result<bool> {
    auto& st = cached_statement(db,
                                "UPDATE tasks SET input_tokens = input_tokens + ?, output_tokens "
                                "= output_tokens + ? WHERE id = ?");
    st.bind(1, input_tokens);
    st.bind(2, output_tokens);
    st.bind(3, task.str());
    return st.exec() == 1;
  };
  co_return co_await w_.write(std::move(name), 128, std::move(fn));
}

}  // namespace tether::persistence
