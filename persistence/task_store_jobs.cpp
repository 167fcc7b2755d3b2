#include <SQLiteCpp/Statement.h>

#include <string>
#include <unordered_map>

#include "tether/persistence/task_store.hpp"
#include "tether/persistence/task_transitions.hpp"
#include "tether/protocol/json.hpp"
#include "tether/protocol/payloads.hpp"
#include "tether/protocol/sandbox_wire.hpp"
#include "tether/runtime/clock.hpp"

namespace tether::persistence {

namespace json = boost::json;
using protocol::transition;
using runtime::now_ms;

std::string_view to_string(owned_state s) {
  switch (s) {
    case owned_state::admitted:
      return "admitted";
    case owned_state::running:
      return "running";
    case owned_state::completed:
      return "completed";
    case owned_state::failed:
      return "failed";
    case owned_state::cancelled:
      return "cancelled";
    case owned_state::lost:
      return "lost";
  }
  return "unknown";
}

bool is_terminal(owned_state s) {
  return s != owned_state::admitted && s != owned_state::running;
}

transition transition_of(owned_state terminal) {
  switch (terminal) {
    case owned_state::completed:
      return transition::completed;
    case owned_state::failed:
      return transition::failed;
    case owned_state::cancelled:
      return transition::cancelled;
    case owned_state::lost:
      return transition::lost;
    default:
      return transition::started;
  }
}

std::string_view to_string(receipt_state s) {
  switch (s) {
    case receipt_state::pending:
      return "pending";
    case receipt_state::acked:
      return "acked";
    case receipt_state::read:
      return "read";
    case receipt_state::dropped:
      return "dropped";
  }
  return "unknown";
}

namespace {

template <class E>
bool parse_enum(const std::string& text, E& out, std::initializer_list<E> all) {
  for (auto e : all)
    if (text == to_string(e)) {
      out = e;
      return true;
    }
  return false;
}

// A shell task's columns; its command (preview and channel) is the payload.
constexpr const char* k_job_cols = "id, scope, state, payload, completion, tenant, thread, turn";

result<owned_job> decode_job(SQLite::Statement& q) {
  owned_job j;
  j.id = job_id(q.getColumn(0).getString());
  const auto& key = j.id.str();
  auto scope = protocol::decode_text<owner_scope>(
      q.getColumn(1).getString(),
      [](const json::value& v) { return protocol::scope_from_json(v); });
  if (!scope) return corrupt_row("tasks", key, "scope: " + scope.error().describe());
  j.scope = std::move(*scope);
  // The columns recovery and the turn index read must say what the scope says.
  const std::pair<const char*, const std::string*> columns[] = {{"tenant", &j.scope.tenant.str()},
                                                                {"thread", &j.scope.thread.str()},
                                                                {"turn", &j.scope.turn.str()}};
  for (int i = 0; i < 3; ++i) {
    auto col = q.getColumn(5 + i).getString();
    if (col != *columns[i].second)
      return corrupt_row("tasks", key,
                         std::string(columns[i].first) + ": '" + col + "' is not its scope's '" +
                             *columns[i].second + "'");
  }
  auto state = q.getColumn(2).getString();
  using S = owned_state;
  if (!parse_enum(state, j.state,
                  {S::admitted, S::running, S::completed, S::failed, S::cancelled, S::lost}))
    return corrupt_row("tasks", key, "state: unknown value '" + state + "'");
  auto command = protocol::parse_json(q.getColumn(3).getString());
  if (!command) return corrupt_row("tasks", key, "payload: " + command.error().describe());
  auto f = protocol::fields::of(*command, "payload");
  if (!f) return corrupt_row("tasks", key, f.error().describe());
  auto preview = f->str("preview");
  if (!preview) return corrupt_row("tasks", key, preview.error().describe());
  auto channel = f->str("channel");
  if (!channel) return corrupt_row("tasks", key, channel.error().describe());
  j.preview = std::move(*preview);
  j.channel = std::move(*channel);
  if (!q.getColumn(4).isNull()) {
    auto c = protocol::decode_text<protocol::shell_completion>(
        q.getColumn(4).getString(), [](const json::value& v) {
          return protocol::sandbox::completion_from_json(v, "completion");
        });
    if (!c) return corrupt_row("tasks", key, c.error().describe());
    j.completion = std::move(*c);
  }
  return j;
}

constexpr const char* k_receipt_cols = "id, task_id, transition, scope, body, state, created_at";

result<receipt> decode_receipt_with(SQLite::Statement& q, scope_memo* memo) {
  return decode_receipt_at(q, 0, memo);
}

result<receipt> decode_receipt(SQLite::Statement& q) {
  return decode_receipt_with(q, nullptr);
}

}  // namespace

// The receipts of one owner's turn share a scope, so a read of many
// decodes each text once (memo).
result<receipt> decode_receipt_at(SQLite::Statement& q, int first, scope_memo* memo) {
  receipt r;
  r.id = event_id(q.getColumn(first + 0).getString());
  const auto& key = r.id.str();
  r.job = job_id(q.getColumn(first + 1).getString());
  auto t = q.getColumn(first + 2).getString();
  if (!protocol::parse(t, r.transition))
    return corrupt_row("receipts", key, "transition: unknown value '" + t + "'");
  if (r.id != protocol::make_event_id(r.job, r.transition))
    return corrupt_row("receipts", key,
                       "id: does not match job '" + r.job.str() + "' and transition '" + t + "'");
  auto text = q.getColumn(first + 3).getString();
  auto known = memo ? memo->find(text) : scope_memo::iterator{};
  if (memo && known != memo->end()) {
    r.scope = known->second;
  } else {
    auto scope = protocol::decode_text<owner_scope>(
        text, [](const json::value& v) { return protocol::scope_from_json(v); });
    if (!scope) return corrupt_row("receipts", key, "scope: " + scope.error().describe());
    r.scope = std::move(*scope);
    if (memo) memo->emplace(std::move(text), r.scope);
  }
  r.body = q.getColumn(first + 4).getString();
  auto state = q.getColumn(first + 5).getString();
  using S = receipt_state;
  if (!parse_enum(state, r.state, {S::pending, S::acked, S::read, S::dropped}))
    return corrupt_row("receipts", key, "state: unknown value '" + state + "'");
  r.created_at = q.getColumn(first + 6).getInt64();
  return r;
}

result<std::optional<owned_job>> task_reader::job(const job_id& id) {
  return first_of(read_all<owned_job>(
      readers_, std::string("SELECT ") + k_job_cols + " FROM tasks WHERE id = ? AND kind = 'shell'",
      "reading owned job " + id.str(), {id.str()}, decode_job));
}

result<std::vector<owned_job>> task_reader::all_jobs() {
  return read_all<owned_job>(readers_,
                             std::string("SELECT ") + k_job_cols +
                                 " FROM tasks WHERE kind = 'shell' ORDER BY created_at, id",
                             "reading owned jobs", {}, decode_job);
}

result<std::vector<receipt>> task_reader::all_receipts() {
  return read_all<receipt>(
      readers_, std::string("SELECT ") + k_receipt_cols + " FROM receipts ORDER BY created_at, id",
      "reading receipts", {}, decode_receipt);
}

result<std::vector<owned_job>> task_reader::live_jobs() {
  return read_all<owned_job>(
      readers_,
      std::string("SELECT ") + k_job_cols +
          " FROM tasks WHERE state IN ('admitted','running') AND kind = 'shell' "
          "ORDER BY created_at, id",
      "reading live owned jobs", {}, decode_job);
}

result<std::vector<owned_job>> task_reader::jobs_of_turn(const protocol::session_id& thread,
                                                         const protocol::turn_id& turn) {
  return read_all<owned_job>(readers_,
                             std::string("SELECT ") + k_job_cols +
                                 " FROM tasks WHERE thread = ? AND turn = ? AND kind = 'shell' "
                                 "ORDER BY created_at, id",
                             "reading jobs of turn " + turn.str(), {thread.str(), turn.str()},
                             decode_job);
}

result<std::vector<receipt>> task_reader::pending_receipts() {
  return read_all<receipt>(readers_,
                           std::string("SELECT ") + k_receipt_cols +
                               " FROM receipts WHERE state NOT IN ('acked','read','dropped') "
                               "ORDER BY created_at, id",
                           "reading pending receipts", {}, decode_receipt);
}

result<std::vector<std::pair<receipt, std::string>>> task_reader::pending_receipts_but_subagent() {
  auto decode = [memo = scope_memo{}](
                    SQLite::Statement& q) mutable -> result<std::pair<receipt, std::string>> {
    auto r = decode_receipt_with(q, &memo);
    if (!r) return r.error();
    return std::pair<receipt, std::string>{std::move(*r), q.getColumn(7).getString()};
  };
  // `state = 'pending'` walks receipts_pending, which is in the outbox's
  // order: 100,000 owed reports are neither scanned among the acknowledged
  // ones nor sorted.
  constexpr const char* sql =
      "SELECT r.id, r.task_id, r.transition, r.scope, r.body, r.state, r.created_at, "
      "coalesce(t.kind, '') FROM receipts r LEFT JOIN tasks t ON t.id = r.task_id "
      "WHERE r.state = 'pending' AND t.kind IS NOT 'subagent' ORDER BY r.created_at, r.id";
  return read_all<std::pair<receipt, std::string>>(readers_, sql, "reading pending receipts", {},
                                                   decode);
}

result<std::optional<receipt>> task_reader::receipt_by_id(const event_id& id) {
  return first_of(read_all<receipt>(
      readers_, std::string("SELECT ") + k_receipt_cols + " FROM receipts WHERE id = ?",
      "reading receipt " + id.str(), {id.str()}, decode_receipt));
}

result<std::vector<receipt>> task_reader::receipts_of(const job_id& job) {
  return read_all<receipt>(readers_,
                           std::string("SELECT ") + k_receipt_cols +
                               " FROM receipts WHERE task_id = ? ORDER BY created_at, id",
                           "reading receipts of " + job.str(), {job.str()}, decode_receipt);
}

result<std::optional<std::uint64_t>> task_reader::bound_generation(
    const protocol::sandbox_id& sandbox) {
  auto decode = [](SQLite::Statement& q) -> result<std::uint64_t> {
    auto g = q.getColumn(0).getInt64();
    if (g < 0) return corrupt_row("sandboxes", q.getColumn(1).getString(), "generation: negative");
    return static_cast<std::uint64_t>(g);
  };
  return first_of(
      read_all<std::uint64_t>(readers_, "SELECT generation, id FROM sandboxes WHERE id = ?",
                              "reading sandbox " + sandbox.str(), {sandbox.str()}, decode));
}

awaitable<result<void>> task_store::admit_job(owned_job j) {
  auto name = "admit owned job " + j.id.str();
  auto fn = [j = std::move(j)](SQLite::Database& db) -> result<void> {
    auto& st =
        cached_statement(db,
                         "INSERT OR IGNORE INTO tasks (id, kind, tenant, thread, turn, scope, "
                         "state, payload, created_at, updated_at) "
                         "VALUES (?, 'shell', ?, ?, ?, ?, 'admitted', ?, ?, ?)");
    auto now = now_ms();
    json::object command{{"preview", j.preview}, {"channel", j.channel}};
    st.bind(1, j.id.str());
    st.bind(2, j.scope.tenant.str());
    st.bind(3, j.scope.thread.str());
    st.bind(4, j.scope.turn.str());
    st.bind(5, stored_json(protocol::to_json(j.scope), "the shell job's scope"));
    st.bind(6, stored_json(command, "the shell job's command"));
    st.bind(7, now);
    st.bind(8, now);
    if (st.exec() != 1)
      return error{errc::conflict, "job id '" + j.id.str() +
                                       "' is already owned; the existing job was kept and "
                                       "nothing was started"};
    return {};
  };
  co_return co_await w_.write(std::move(name), 256, std::move(fn));
}

awaitable<result<bool>> task_store::mark_running(job_id id) {
  auto name = "owned job running " + id.str();
  auto fn = [id = std::move(id)](SQLite::Database& db) -> result<bool> {
    auto& st = cached_statement(db,
                                "UPDATE tasks SET state = 'running', updated_at = ? "
                                "WHERE id = ? AND kind = 'shell' AND state = 'admitted' "
                                "RETURNING scope");
    st.bind(1, now_ms());
    st.bind(2, id.str());
    if (!st.executeStep()) return false;
    auto scope = st.getColumn(0).getString();
    st.reset();
    insert_receipt_row(db, id, transition::started, scope, "started", "acked");
    return true;
  };
  co_return co_await w_.write(std::move(name), 128, std::move(fn));
}

awaitable<result<std::optional<receipt>>> task_store::finish(
    job_id id, owned_state terminal, std::optional<protocol::shell_completion> completion,
    std::string body) {
  if (!is_terminal(terminal))
    co_return error{errc::invalid, "finish(" + id.str() + "): '" +
                                       std::string(to_string(terminal)) + "' is not terminal"};
  auto name = "owned job " + std::string(to_string(terminal)) + " " + id.str();
  std::size_t bytes = body.size() + 256;
  auto fn = [id = std::move(id), terminal, completion = std::move(completion),
             body = std::move(body)](SQLite::Database& db) -> result<std::optional<receipt>> {
    terminal_write tw;
    tw.task = id;
    tw.kind = "shell";
    tw.state = std::string(to_string(terminal));
    tw.transition = transition_of(terminal);
    if (completion)
      tw.completion =  // terminal_transition checks it
          protocol::to_text(protocol::sandbox::to_json(*completion));
    tw.receipt_body = body;
    auto won = terminal_transition(db, tw);
    if (!won) return std::optional<receipt>{};  // the first terminal one won already
    auto scope = protocol::decode_text<owner_scope>(
        won->scope, [](const json::value& v) { return protocol::scope_from_json(v); });
    if (!scope) return corrupt_row("tasks", id.str(), "scope: " + scope.error().describe());
    receipt r;
    r.transition = tw.transition;
    r.id = protocol::make_event_id(id, r.transition);
    r.job = id;
    r.scope = std::move(*scope);
    r.body = body;
    r.created_at = won->created_at;
    return std::optional<receipt>(std::move(r));
  };
  co_return co_await w_.write(std::move(name), bytes, std::move(fn));
}

awaitable<result<bool>> task_store::ack(event_id id) {
  auto name = "ack receipt " + id.str();
  auto fn = [id = std::move(id)](SQLite::Database& db) {
    return settle_receipt(db, id, receipt_state::acked);
  };
  co_return co_await w_.write(std::move(name), 64, std::move(fn));
}

awaitable<result<bool>> task_store::mark_read(event_id id) {
  auto name = "receipt read by status " + id.str();
  // From acked too: a steered receipt is acknowledged on acceptance, before
  // the session's drain shows it; a read then keeps it from being shown.
  auto fn = [id = std::move(id)](SQLite::Database& db) -> result<bool> {
    auto& st = cached_statement(db,
                                "UPDATE receipts SET state = 'read', updated_at = ? "
                                "WHERE id = ? AND state IN ('pending','acked')");
    st.bind(1, now_ms());
    st.bind(2, id.str());
    return st.exec() == 1;
  };
  co_return co_await w_.write(std::move(name), 64, std::move(fn));
}

awaitable<result<int>> task_store::drop(std::vector<event_id> ids) {
  auto name = "drop " + std::to_string(ids.size()) + " receipt(s)";
  auto fn = [ids = std::move(ids)](SQLite::Database& db) -> result<int> {
    int n = 0;
    for (auto& id : ids) n += settle_receipt(db, id, receipt_state::dropped) ? 1 : 0;
    return n;
  };
  co_return co_await w_.write(std::move(name), 64, std::move(fn));
}

awaitable<result<void>> task_store::bind_sandbox(protocol::sandbox_id sandbox,
                                                 std::uint64_t generation) {
  auto name = "bind sandbox " + sandbox.str();
  auto fn = [sandbox = std::move(sandbox), generation](SQLite::Database& db) {
    auto& st = cached_statement(db,
                                "INSERT INTO sandboxes (id, generation, bound_at) VALUES (?, ?, ?) "
                                "ON CONFLICT(id) DO UPDATE SET generation = excluded.generation, "
                                "bound_at = excluded.bound_at");
    st.bind(1, sandbox.str());
    st.bind(2, static_cast<std::int64_t>(generation));
    st.bind(3, now_ms());
    st.exec();
  };
  co_return co_await w_.write(std::move(name), 64, std::move(fn));
}

}  // namespace tether::persistence
