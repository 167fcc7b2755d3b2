// Delegated tasks on the one task table: registration with the owning
// process, the heartbeat lease, settlement intents and their promotion, and
// the terminal compare-and-set shared with every other kind
// (task_transitions.hpp). docs/delegation.md tells the whole life.
#include <SQLiteCpp/Statement.h>

#include "tether/persistence/task_store.hpp"
#include "tether/persistence/task_transitions.hpp"
#include "tether/protocol/json.hpp"
#include "tether/protocol/payloads.hpp"
#include "tether/runtime/clock.hpp"

namespace tether::persistence {

namespace json = boost::json;
using protocol::transition;
using runtime::now_ms;

result<receipt> receipt_of(const job_id& id, transition t, const terminal_written& won,
                           std::string body) {
  auto scope = protocol::decode_text<owner_scope>(
      won.scope, [](const json::value& v) { return protocol::scope_from_json(v); });
  if (!scope) return corrupt_row("tasks", id.str(), "scope: " + scope.error().describe());
  receipt r;
  r.transition = t;
  r.id = protocol::make_event_id(id, t);
  r.job = id;
  r.scope = std::move(*scope);
  r.body = std::move(body);
  r.created_at = won.created_at;
  return r;
}

std::string_view to_string(delegate_state s) {
  switch (s) {
    case delegate_state::running:
      return "running";
    case delegate_state::completed:
      return "completed";
    case delegate_state::failed:
      return "failed";
    case delegate_state::cancelled:
      return "cancelled";
    case delegate_state::lost:
      return "lost";
    case delegate_state::timed_out:
      return "timed_out";
  }
  return "unknown";
}

bool parse(std::string_view s, delegate_state& out) {
  using S = delegate_state;
  for (auto e : {S::running, S::completed, S::failed, S::cancelled, S::lost, S::timed_out})
    if (s == to_string(e)) {
      out = e;
      return true;
    }
  return false;
}

namespace {

transition transition_of(delegate_state s) {
  switch (s) {
    case delegate_state::completed:
      return transition::completed;
    case delegate_state::failed:
      return transition::failed;
    case delegate_state::cancelled:
      return transition::cancelled;
    case delegate_state::lost:
      return transition::lost;
    case delegate_state::timed_out:
      return transition::timed_out;
    case delegate_state::running:
      break;
  }
  return transition::started;
}

constexpr const char* k_delegate_cols =
    "id, scope, state, payload, completion, coalesce(owner, ''), coalesce(lease_until, 0), "
    "created_at, updated_at";

result<delegate_task> decode_delegate(SQLite::Statement& q) {
  delegate_task t;
  t.id = job_id(q.getColumn(0).getString());
  const auto& key = t.id.str();
  auto scope = protocol::decode_text<owner_scope>(
      q.getColumn(1).getString(),
      [](const json::value& v) { return protocol::scope_from_json(v); });
  if (!scope) return corrupt_row("tasks", key, "scope: " + scope.error().describe());
  t.scope = std::move(*scope);
  auto state = q.getColumn(2).getString();
  if (state == "admitted") state = "running";  // registered is running for a delegate
  if (!parse(state, t.state))
    return corrupt_row("tasks", key, "state: unknown value '" + state + "'");
  auto payload = protocol::parse_json(q.getColumn(3).getString());
  if (!payload) return corrupt_row("tasks", key, "payload: " + payload.error().describe());
  auto f = protocol::fields::of(*payload, "payload");
  if (!f) return corrupt_row("tasks", key, f.error().describe());
  auto agent = f->str("agent");
  auto preview = f->str("preview");
  auto workspace = f->str("workspace");
  auto depth = f->i64("depth");
  for (auto* e : {&agent, &preview, &workspace})
    if (!*e) return corrupt_row("tasks", key, e->error().describe());
  if (!depth) return corrupt_row("tasks", key, depth.error().describe());
  t.agent = std::move(*agent);
  t.preview = std::move(*preview);
  t.workspace = std::move(*workspace);
  t.depth = static_cast<int>(*depth);
  if (!q.getColumn(4).isNull()) {
    auto c = protocol::parse_json(q.getColumn(4).getString());
    if (!c || !c->is_object()) return corrupt_row("tasks", key, "completion: not a JSON object");
    const auto& o = c->as_object();
    auto text = [&o](const char* k) -> std::optional<std::string> {
      auto* v = o.if_contains(k);
      if (!v || !v->is_string()) return std::nullopt;
      return std::string(v->as_string());
    };
    t.artifact = text("artifact");
    t.digest = text("digest");
    t.error = text("error");
    if (auto* b = o.if_contains("bytes"); b && b->is_int64()) t.bytes = b->as_int64();
  }
  t.owner = q.getColumn(5).getString();
  t.lease_until = q.getColumn(6).getInt64();
  t.created_at = q.getColumn(7).getInt64();
  t.updated_at = q.getColumn(8).getInt64();
  return t;
}

result<settlement_intent> decode_intent(SQLite::Statement& q) {
  settlement_intent i;
  i.task = job_id(q.getColumn(0).getString());
  i.owner = q.getColumn(1).getString();
  auto state = q.getColumn(2).getString();
  if (!parse(state, i.state) ||
      (i.state != delegate_state::completed && i.state != delegate_state::failed))
    return corrupt_row("settlement_intents", i.task.str(), "state: unknown value '" + state + "'");
  i.artifact = q.getColumn(3).getString();
  i.digest = q.getColumn(4).getString();
  i.error = q.getColumn(5).getString();
  i.bytes = q.getColumn(6).getInt64();
  i.created_at = q.getColumn(7).getInt64();
  return i;
}

std::string completion_text(const std::string& artifact, const std::string& digest,
                            std::int64_t bytes, const std::string& error) {
  json::object c;
  if (!artifact.empty()) {
    c["artifact"] = artifact;
    c["digest"] = digest;
    c["bytes"] = bytes;
  }
  if (!error.empty()) c["error"] = error;
  return protocol::to_text(c);  // terminal_transition checks it
}

void delete_intent(SQLite::Database& db, const job_id& id) {
  auto& d = cached_statement(db, "DELETE FROM settlement_intents WHERE task_id = ?");
  d.bind(1, id.str());
  d.exec();
}

}  // namespace

// ---- reads ----------------------------------------------------------------------------

result<std::optional<delegate_task>> task_reader::delegate(const job_id& id) {
  return first_of(read_all<delegate_task>(
      readers_,
      std::string("SELECT ") + k_delegate_cols + " FROM tasks WHERE id = ? AND kind = 'delegate'",
      "reading delegated task " + id.str(), {id.str()}, decode_delegate));
}

result<std::vector<delegate_task>> task_reader::delegates() {
  return read_all<delegate_task>(readers_,
                                 std::string("SELECT ") + k_delegate_cols +
                                     " FROM tasks WHERE kind = 'delegate' ORDER BY created_at, id",
                                 "reading delegated tasks", {}, decode_delegate);
}

result<std::vector<settlement_intent>> task_reader::settlement_intents() {
  return read_all<settlement_intent>(
      readers_,
      "SELECT task_id, owner, state, coalesce(artifact, ''), coalesce(digest, ''), "
      "coalesce(error, ''), bytes, created_at FROM settlement_intents ORDER BY created_at, "
      "task_id",
      "reading settlement intents", {}, decode_intent);
}

result<std::string> task_reader::task_kind(const job_id& id) {
  auto one = first_of(read_all<std::string>(
      readers_, "SELECT kind FROM tasks WHERE id = ?", "reading the kind of task " + id.str(),
      {id.str()},
      [](SQLite::Statement& q) -> result<std::string> { return q.getColumn(0).getString(); }));
  if (!one) return one.error();
  return one->value_or("");
}

// ---- writes ---------------------------------------------------------------------------

awaitable<result<void>> task_store::admit_delegate(delegate_task t) {
  auto name = "admit delegated task " + t.id.str();
  std::size_t bytes = t.preview.size() + 512;
  auto fn = [t = std::move(t)](SQLite::Database& db) -> result<void> {
    auto& st = cached_statement(db,
                                "INSERT OR IGNORE INTO tasks (id, kind, tenant, thread, turn, "
                                "scope, state, payload, owner, lease_until, created_at, "
                                "updated_at, goal_id) VALUES (?, 'delegate', ?, ?, ?, ?, "
                                "'running', ?, ?, ?, ?, ?, ?)");
    if (t.goal) require_open_goal(db, *t.goal);
    auto now = now_ms();
    json::object payload{
        {"agent", t.agent}, {"preview", t.preview}, {"workspace", t.workspace}, {"depth", t.depth}};
    st.bind(1, t.id.str());
    st.bind(2, t.scope.tenant.str());
    st.bind(3, t.scope.thread.str());
    st.bind(4, t.scope.turn.str());
    st.bind(5, stored_json(protocol::to_json(t.scope), "the delegate's scope"));
    st.bind(6, stored_json(payload, "the delegate's payload"));
    st.bind(7, t.owner);
    st.bind(8, t.lease_until);
    st.bind(9, now);
    st.bind(10, now);
    if (t.goal)
      st.bind(11, t.goal->str());
    else
      st.bind(11);
    if (st.exec() != 1)
      return error{errc::conflict, "task id '" + t.id.str() +
                                       "' is already registered; the existing task was kept and "
                                       "nothing was started"};
    return {};
  };
  co_return co_await w_.write(std::move(name), bytes, std::move(fn));
}

awaitable<result<bool>> task_store::heartbeat_delegate(job_id id, std::string owner,
                                                       std::int64_t lease_until) {
  auto name = "heartbeat " + id.str();
  auto fn = [id = std::move(id), owner = std::move(owner),
             lease_until](SQLite::Database& db) -> result<bool> {
    auto& st = cached_statement(db,
                                "UPDATE tasks SET lease_until = ? WHERE id = ? AND kind = "
                                "'delegate' AND state = 'running' AND owner = ?");
    st.bind(1, lease_until);
    st.bind(2, id.str());
    st.bind(3, owner);
    return st.exec() == 1;
  };
  co_return co_await w_.write(std::move(name), 64, std::move(fn));
}

awaitable<result<bool>> task_store::write_intent(settlement_intent i) {
  auto name = "settlement intent " + i.task.str();
  std::size_t bytes = i.artifact.size() + i.error.size() + 256;
  auto fn = [i = std::move(i)](SQLite::Database& db) -> result<bool> {
    auto& st = cached_statement(
        db,
        "INSERT INTO settlement_intents (task_id, owner, state, artifact, digest, error, "
        "bytes, created_at) SELECT id, owner, ?, ?, ?, ?, ?, ? FROM tasks WHERE id = ? AND "
        "kind = 'delegate' AND state = 'running' AND owner = ? "
        "ON CONFLICT (task_id) DO UPDATE SET state = excluded.state, artifact = "
        "excluded.artifact, digest = excluded.digest, error = excluded.error, bytes = "
        "excluded.bytes");
    st.bind(1, std::string(to_string(i.state)));
    st.bind(2, i.artifact);
    st.bind(3, i.digest);
    st.bind(4, i.error);
    st.bind(5, i.bytes);
    st.bind(6, now_ms());
    st.bind(7, i.task.str());
    st.bind(8, i.owner);
    return st.exec() == 1;
  };
  co_return co_await w_.write(std::move(name), bytes, std::move(fn));
}

awaitable<result<promotion>> task_store::promote_intent(job_id id, std::string receipt_body) {
  auto name = "promote settlement " + id.str();
  std::size_t bytes = receipt_body.size() + 256;
  auto fn = [id = std::move(id),
             body = std::move(receipt_body)](SQLite::Database& db) -> result<promotion> {
    auto& q = cached_statement(db,
                               "SELECT owner, state, coalesce(artifact, ''), coalesce(digest, ''), "
                               "coalesce(error, ''), bytes FROM settlement_intents WHERE "
                               "task_id = ?");
    q.bind(1, id.str());
    if (!q.executeStep()) {
      q.reset();
      return error{errc::not_found,
                   "task '" + id.str() + "' has no settlement intent; nothing was promoted"};
    }
    settlement_intent i;
    i.owner = q.getColumn(0).getString();
    auto state = q.getColumn(1).getString();
    i.artifact = q.getColumn(2).getString();
    i.digest = q.getColumn(3).getString();
    i.error = q.getColumn(4).getString();
    i.bytes = q.getColumn(5).getInt64();
    q.reset();
    if (!parse(state, i.state))
      return corrupt_row("settlement_intents", id.str(), "state: unknown value '" + state + "'");
    terminal_write tw;
    tw.task = id;
    tw.kind = "delegate";
    tw.state = std::string(to_string(i.state));
    tw.transition = transition_of(i.state);
    tw.completion = completion_text(i.artifact, i.digest, i.bytes, i.error);
    tw.receipt_body = body;
    tw.owner = i.owner;
    auto won = terminal_transition(db, tw);
    delete_intent(db, id);  // promoted, or stale: either way it is done
    promotion out;
    if (won) {
      auto r = receipt_of(id, tw.transition, *won, body);
      if (!r) return r.error();
      out.promoted = true;
      out.terminal = std::move(*r);
      return out;
    }
    auto& k = cached_statement(db, "SELECT state FROM tasks WHERE id = ?");
    k.bind(1, id.str());
    if (k.executeStep()) {
      delegate_state s;
      if (parse(k.getColumn(0).getString(), s)) out.kept = s;
    }
    k.reset();
    return out;
  };
  co_return co_await w_.write(std::move(name), bytes, std::move(fn));
}

awaitable<result<std::optional<receipt>>> task_store::settle_delegate(
    job_id id, std::optional<std::string> owner, delegate_state terminal, std::string error_text,
    std::string receipt_body) {
  if (terminal == delegate_state::running)
    co_return error{errc::invalid, "settle_delegate(" + id.str() + "): 'running' is not terminal"};
  auto name = "delegated task " + std::string(to_string(terminal)) + " " + id.str();
  std::size_t bytes = receipt_body.size() + error_text.size() + 256;
  auto fn = [id = std::move(id), owner = std::move(owner), terminal, err = std::move(error_text),
             body =
                 std::move(receipt_body)](SQLite::Database& db) -> result<std::optional<receipt>> {
    terminal_write tw;
    tw.task = id;
    tw.kind = "delegate";
    tw.state = std::string(to_string(terminal));
    tw.transition = transition_of(terminal);
    tw.completion = completion_text("", "", 0, err);
    tw.receipt_body = body;
    tw.owner = owner;
    auto won = terminal_transition(db, tw);
    if (!won) return std::optional<receipt>{};
    delete_intent(db, id);  // a competing winner: the intent is stale now
    auto r = receipt_of(id, tw.transition, *won, body);
    if (!r) return r.error();
    return std::optional<receipt>(std::move(*r));
  };
  co_return co_await w_.write(std::move(name), bytes, std::move(fn));
}

}  // namespace tether::persistence
