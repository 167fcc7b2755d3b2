#include <SQLiteCpp/Statement.h>
#include <SQLiteCpp/Transaction.h>

#include <algorithm>
#include <atomic>
#include <boost/asio/experimental/awaitable_operators.hpp>

#include "tether/persistence/task_store.hpp"
#include "tether/persistence/task_transitions.hpp"
#include "tether/protocol/json.hpp"
#include "tether/protocol/output_tail.hpp"
#include "tether/protocol/payloads.hpp"
#include "tether/protocol/scope.hpp"
#include "tether/runtime/clock.hpp"

namespace tether::persistence {

namespace json = boost::json;
using runtime::now_ms;

std::string_view to_string(job_status s) {
  switch (s) {
    case job_status::running:
      return "running";
    case job_status::completed:
      return "completed";
    case job_status::error:
      return "error";
    case job_status::cancelled:
      return "cancelled";
  }
  return "unknown";
}

std::string task_state_word(job_status s) {
  return s == job_status::error ? "failed" : std::string(to_string(s));
}

namespace {

void bind_opt(SQLite::Statement& st, int i, const std::optional<session_id>& v) {
  if (v)
    st.bind(i, v->str());
  else
    st.bind(i);
}

std::optional<std::string> opt_text(const SQLite::Column& c) {
  if (c.isNull()) return std::nullopt;
  return c.getString();
}

std::string job_payload_text(const job_row& r) {
  return stored_json(protocol::to_json(protocol::job_payload{r.description}),
                     "the job's description");
}

// Appends one message inside the caller's transaction; returns its seq.
// The session's seq, nullopt if it is gone.
std::optional<std::int64_t> session_seq(SQLite::Database& db, const std::string& s) {
  auto& seq = cached_statement(db, "SELECT seq FROM sessions WHERE id = ?");
  seq.bind(1, s);
  if (!seq.executeStep()) return std::nullopt;
  auto at = seq.getColumn(0).getInt64();
  seq.reset();
  return at;
}

// A transcript row at `seq`, which its caller gave the session.
void insert_message(SQLite::Database& db, const std::string& s, std::int64_t seq,
                    const std::string& role, const std::string& kind, const std::string& status,
                    const std::string& text) {
  auto& ins =
      cached_statement(db,
                       "INSERT INTO messages (session_id, seq, role, kind, status, payload) "
                       "VALUES (?, ?, ?, ?, ?, ?)");
  ins.bind(1, s);
  ins.bind(2, seq);
  ins.bind(3, role);
  ins.bind(4, kind);
  ins.bind(5, status);
  if (protocol::first_invalid_utf8(text)) require_utf8(text, "the " + kind + " message's text");
  ins.bind(6, protocol::to_text(protocol::to_json(protocol::message_payload{text})));
  ins.exec();
}

std::int64_t append_in_tx(SQLite::Database& db, const std::string& s, const std::string& role,
                          const std::string& kind, const std::string& status,
                          const std::string& text) {
  // An UPDATE and a read of the row it just wrote, not UPDATE ... RETURNING:
  // SQLite gathers a RETURNING statement's rows in an ephemeral table, which
  // it opens and frees on every run (bench_settle's hottest write).
  auto& up = cached_statement(db, "UPDATE sessions SET seq = seq + 1 WHERE id = ?");
  up.bind(1, s);
  if (up.exec() != 1)
    throw std::runtime_error("session '" + s + "' does not exist; no message appended");
  std::int64_t seq = *session_seq(db, s);  // the row just written
  insert_message(db, s, seq, role, kind, status, text);
  return seq;
}

void insert_subagent_started(SQLite::Database& db, const job_row& r);

protocol::transition transition_of(job_status terminal) {
  return terminal == job_status::completed ? protocol::transition::completed
         : terminal == job_status::error   ? protocol::transition::failed
                                           : protocol::transition::cancelled;
}

void insert_job(SQLite::Database& db, const job_row& r,
                std::string_view receipt_state = "pending") {
  auto& st =
      cached_statement(db,
                       "INSERT INTO tasks (id, notification_id, kind, mode, parent_id, child_id, "
                       "generation, state, body, payload, created_at, updated_at, goal_id) "
                       "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)");
  if (r.goal) require_open_goal(db, *r.goal);
  auto now = now_ms();
  st.bind(1, r.id.str());
  st.bind(2, r.nid.str());
  st.bind(3, r.kind);
  st.bind(4, r.mode);
  bind_opt(st, 5, r.parent);
  bind_opt(st, 6, r.child);
  st.bind(7, r.generation);
  st.bind(8, task_state_word(r.status));
  if (r.body)
    st.bind(9, *r.body);
  else
    st.bind(9);
  st.bind(10, job_payload_text(r));
  st.bind(11, now);
  st.bind(12, now);
  if (r.goal)
    st.bind(13, r.goal->str());
  else
    st.bind(13);
  st.exec();
  insert_subagent_started(db, r);
  // A terminal subagent row is written with its report owed: its terminal
  // receipt, pending, is the outbox (written acknowledged when the same
  // transaction admits the report).
  if (r.kind == "subagent" && r.status != job_status::running)
    insert_receipt_row(db, r.id, transition_of(r.status), receipt_scope(db, r.id, "", r.parent),
                       r.body.value_or(""), receipt_state);
}

// A background subagent task's `started` receipt, written with its running
// row and bound to the parent's tenant, thread and current turn (no
// sandbox); its terminal receipt, with the same scope, is written by the
// settle's terminal transition (task_transitions.hpp) and delivered by the
// report path.
void insert_subagent_started(SQLite::Database& db, const job_row& r) {
  if (r.kind != "subagent" || r.mode != "background" || r.status != job_status::running ||
      !r.parent)
    return;
  auto scope = parent_scope(db, *r.parent);
  if (!scope) return;
  insert_receipt_row(db, r.id, protocol::transition::started,
                     stored_json(protocol::to_json(*scope), "the receipt's scope"), "started",
                     "acked");
}

void insert_session(SQLite::Database& db, const session_row& r) {
  auto& st =
      cached_statement(db,
                       "INSERT INTO sessions (id, parent_id, parent_notify, description, agent, "
                       "status, created_at, tenant, job_notify, job_policy, policy, depth, "
                       "budget_root, task_id) "
                       "VALUES (?, ?, ?, ?, ?, 'idle', ?, "
                       // A child is in its parent's tenant.
                       "coalesce((SELECT tenant FROM sessions WHERE id = ?2), ?), ?, ?, ?, ?, ?, "
                       "?)");
  st.bind(1, r.id.str());
  bind_opt(st, 2, r.parent);
  if (r.notify)
    st.bind(3, *r.notify ? 1 : 0);
  else
    st.bind(3);
  st.bind(4, r.description);
  st.bind(5, r.agent);
  st.bind(6, now_ms());
  st.bind(7, r.tenant.str());
  st.bind(8, r.job_notify ? 1 : 0);
  st.bind(9, r.job_policy);
  if (r.policy)
    st.bind(10, stored_json(protocol::to_json(*r.policy), "the session's policy"));
  else
    st.bind(10);
  st.bind(11, r.depth);
  bind_opt(st, 12, r.budget_root);
  if (r.task_id)
    st.bind(13, r.task_id->str());
  else
    st.bind(13);
  st.exec();
}

// Admits reports into `to`'s inbox inside the caller's transaction, in order;
// for each, false if its id was already there. nullopt if `to` is gone.
// A report's terminal receipt, its outbox: acknowledged once the report is
// in its parent's inbox, or dropped when nobody is owed it any more. The
// task row stays, terminal, with its report.
void settle_report_receipt(SQLite::Database& db, const notification_id& nid, bool delivered,
                           std::int64_t now) {
  auto& rc =
      cached_statement(db,
                       "UPDATE receipts SET state = ?, updated_at = ? WHERE state = 'pending' "
                       "AND transition != 'started' AND task_id IN (SELECT id FROM tasks WHERE "
                       "notification_id = ? AND state != 'running')");
  rc.reset();
  rc.bind(1, delivered ? "acked" : "dropped");
  rc.bind(2, now);
  rc.bind(3, nid.str());
  rc.exec();
}

bool receipt_pending(SQLite::Database& db, const event_id& id) {
  auto& st = cached_statement(db, "SELECT state FROM receipts WHERE id = ?");
  st.bind(1, id.str());
  bool pending = st.executeStep() && st.getColumn(0).getString() == "pending";
  st.reset();
  return pending;
}

// Admits into `to`'s inbox, its seq `at_seq` (read in this transaction).
// `receipts_written`: the reports' receipts were written acknowledged by the
// same transaction, and are not touched again.
std::vector<admit_outcome> admit_rows(SQLite::Database& db, const session_id& to,
                                      std::int64_t at_seq, const std::vector<report_item>& items,
                                      admit_receipts how, bool receipts_written = false) {
  // Admission order, items in the order given (the outbox order), after
  // everything admitted before.
  auto& last =
      cached_statement(db, "SELECT coalesce(max(admitted_ord), 0) FROM inbox WHERE session_id = ?");
  last.bind(1, to.str());
  last.executeStep();
  auto ord = last.getColumn(0).getInt64();
  last.reset();
  auto& st = cached_statement(db,
                              "INSERT OR IGNORE INTO inbox (session_id, notification_id, "
                              "from_session, body, admitted_seq, admitted_at, admitted_ord) "
                              "VALUES (?, ?, ?, ?, ?, ?, ?)");
  std::vector<admit_outcome> out;
  out.reserve(items.size());
  auto now = now_ms();
  for (auto& i : items) {
    if (how != admit_receipts::reports && i.receipt) {
      // A notice is handed over only while its receipt is pending: read by a
      // status call, or handed over already, it is not shown again. Steered,
      // the acknowledgement itself is the check.
      bool pending = how == admit_receipts::notices_acked
                         ? settle_receipt(db, *i.receipt, receipt_state::acked)
                         : receipt_pending(db, *i.receipt);
      if (!pending) {
        out.push_back(admit_outcome::not_pending);
        continue;
      }
    }
    st.reset();
    st.bind(1, to.str());
    st.bind(2, i.nid.str());
    bind_opt(st, 3, i.from);
    st.bind(4, i.body);
    st.bind(5, at_seq);
    st.bind(6, now);
    st.bind(7, ++ord);
    out.push_back(st.exec() == 1 ? admit_outcome::added : admit_outcome::repeat);
    if (how == admit_receipts::reports && !receipts_written)
      settle_report_receipt(db, i.nid, true, now);
  }
  return out;
}

std::optional<std::vector<admit_outcome>> admit_in_tx(SQLite::Database& db, const session_id& to,
                                                      const std::vector<report_item>& items,
                                                      admit_receipts how) {
  auto at_seq = session_seq(db, to.str());
  if (!at_seq) return std::nullopt;
  return admit_rows(db, to, *at_seq, items, how);
}

result<message_row> decode_message(const std::string& session, SQLite::Statement& q) {
  message_row m;
  m.seq = q.getColumn(0).getInt64();
  m.role = q.getColumn(1).getString();
  m.kind = q.getColumn(2).getString();
  m.status = q.getColumn(3).getString();
  std::string key = session + "/" + std::to_string(m.seq);
  if (m.role != "user" && m.role != "assistant")
    return corrupt_row("messages", key, "role: unknown value '" + m.role + "'");
  if (m.status != "completed" && m.status != "error")
    return corrupt_row("messages", key, "status: unknown value '" + m.status + "'");
  auto p = protocol::decode_text<protocol::message_payload>(
      q.getColumn(4).getString(),
      [](const json::value& v) { return protocol::message_payload_from_json(v); });
  if (!p) return corrupt_row("messages", key, p.error().describe());
  m.text = std::move(p->text);
  return m;
}

constexpr const char* k_session_cols =
    "id, parent_id, parent_notify, description, agent, status, time_suspended, resume_attempts, "
    "seq, revert_staged, input_cursor, idle_outcome, tenant, turn, job_notify, job_policy, "
    "policy, depth, budget_root, task_id";
// One session's row by its id: the reads' statement, and the spawn's read of
// the row it wrote (cached_statement keys a statement by its text's address).
const std::string k_session_by_id =
    std::string("SELECT ") + k_session_cols + " FROM sessions WHERE id = ?";

// A session's policy column: NULL (the host's default) or a policy.
result<std::optional<protocol::session_policy>> decode_policy(const SQLite::Column& c,
                                                              const session_id& s) {
  auto text = opt_text(c);
  if (!text) return std::optional<protocol::session_policy>{};
  auto v = protocol::parse_json(*text);
  if (!v) return corrupt_row("sessions", s.str(), "policy: " + v.error().describe());
  auto p = protocol::policy_from_json(*v);
  if (!p) return corrupt_row("sessions", s.str(), p.error().describe());
  return std::optional<protocol::session_policy>(std::move(*p));
}

result<session_row> decode_session(SQLite::Statement& q) {
  session_row r;
  r.id = session_id(q.getColumn(0).getString());
  if (auto p = opt_text(q.getColumn(1))) r.parent = session_id(*p);
  if (!q.getColumn(2).isNull()) r.notify = q.getColumn(2).getInt() != 0;
  r.description = q.getColumn(3).getString();
  r.agent = q.getColumn(4).getString();
  auto status = q.getColumn(5).getString();
  if (status != "idle" && status != "busy")
    return corrupt_row("sessions", r.id.str(), "status: unknown value '" + status + "'");
  r.busy = status == "busy";
  if (!q.getColumn(6).isNull()) r.time_suspended = q.getColumn(6).getInt64();
  r.resume_attempts = q.getColumn(7).getInt();
  r.seq = q.getColumn(8).getInt64();
  r.revert_staged = q.getColumn(9).getInt() != 0;
  r.input_cursor = q.getColumn(10).getInt64();
  r.idle_outcome = opt_text(q.getColumn(11));
  r.tenant = protocol::tenant_id(q.getColumn(12).getString());
  if (auto t = opt_text(q.getColumn(13))) r.turn = protocol::turn_id(*t);
  r.job_notify = q.getColumn(14).getInt() != 0;
  r.job_policy = q.getColumn(15).getString();
  if (r.job_policy != "withhold" && r.job_policy != "report_now")
    return corrupt_row("sessions", r.id.str(), "job_policy: unknown value '" + r.job_policy + "'");
  auto policy = decode_policy(q.getColumn(16), r.id);
  if (!policy) return policy.error();
  r.policy = std::move(*policy);
  r.depth = q.getColumn(17).getInt();
  if (r.depth < 0)
    return corrupt_row("sessions", r.id.str(), "depth: negative (" + std::to_string(r.depth) + ")");
  if (auto b = opt_text(q.getColumn(18))) r.budget_root = session_id(*b);
  if (auto t = opt_text(q.getColumn(19))) r.task_id = job_id(*t);
  if (r.tenant.empty()) return corrupt_row("sessions", r.id.str(), "tenant: empty");
  if (r.seq < 0)
    return corrupt_row("sessions", r.id.str(), "seq: negative (" + std::to_string(r.seq) + ")");
  if (r.busy && !r.turn)
    return corrupt_row("sessions", r.id.str(), "turn: missing on a busy session");
  return r;
}

// A subagent task row from columns `first`.. (TETHER_JOB_COLS and its owed
// flag). Without `description`, its payload is not decoded (boot's
// validation checked that it has one) and the row's description stays empty.
result<job_row> decode_job_at(SQLite::Statement& q, int first, bool description = true) {
  job_row r;
  r.id = job_id(q.getColumn(first + 0).getString());
  r.nid = notification_id(q.getColumn(first + 1).getString());
  r.kind = q.getColumn(first + 2).getString();
  r.mode = q.getColumn(first + 3).getString();
  if (auto p = opt_text(q.getColumn(first + 4))) r.parent = session_id(*p);
  if (auto c = opt_text(q.getColumn(first + 5))) r.child = session_id(*c);
  r.generation = q.getColumn(first + 6).getInt64();
  auto status = q.getColumn(first + 7).getString();
  r.body = opt_text(q.getColumn(first + 8));
  const auto& key = r.id.str();
  if (r.kind != "subagent")
    return corrupt_row("tasks", key, "kind: unknown value '" + r.kind + "'");
  if (r.mode != "background" && r.mode != "none")
    return corrupt_row("tasks", key, "mode: unknown value '" + r.mode + "'");
  bool known = false;
  for (auto s :
       {job_status::running, job_status::completed, job_status::error, job_status::cancelled})
    if (status == task_state_word(s)) {
      r.status = s;
      known = true;
    }
  if (!known) return corrupt_row("tasks", key, "state: unknown value '" + status + "'");
  if (r.status != job_status::running && !r.body)
    return corrupt_row("tasks", key, "body: missing on a terminal row");
  if (description) {
    auto p = protocol::decode_text<protocol::job_payload>(
        q.getColumn(first + 9).getString(),
        [](const json::value& v) { return protocol::job_payload_from_json(v); });
    if (!p) return corrupt_row("tasks", key, p.error().describe());
    r.description = std::move(p->description);
  }
  r.owed = q.getColumn(first + 10).getInt() != 0;
  return r;
}

result<job_row> decode_job(SQLite::Statement& q) {
  return decode_job_at(q, 0);
}

// A task owes its report while its terminal receipt is pending.
#define TETHER_JOB_COLS \
  "id, notification_id, kind, mode, parent_id, child_id, generation, state, body, payload, "
constexpr const char* k_job_cols = TETHER_JOB_COLS
    "state NOT IN ('admitted', 'running') AND EXISTS (SELECT 1 FROM receipts r WHERE "
    "r.task_id = tasks.id AND r.transition != 'started' AND r.state = 'pending')";
// The rows of the pending terminal receipts, in the outbox's order (each
// receipt's creation, then id), read through the receipts' pending index:
// each is owed by construction.
constexpr const char* k_owed_jobs =
    "WITH owed(owed_task, owed_at, owed_id) AS (SELECT task_id, created_at, id FROM receipts "
    "WHERE state = 'pending' AND transition != 'started') "
    "SELECT " TETHER_JOB_COLS
    "1 FROM owed JOIN tasks ON tasks.id = owed.owed_task "
    "WHERE kind = 'subagent' AND state NOT IN ('admitted', 'running') ORDER BY owed_at, owed_id";
constexpr const char* k_running_jobs =
    "SELECT " TETHER_JOB_COLS
    "0 FROM tasks WHERE kind = 'subagent' AND state IN ('admitted', 'running') "
    "ORDER BY created_at, id";
#undef TETHER_JOB_COLS

}  // namespace

task_store::validation task_store::start_validation() {
  // One scan per table, queued biggest first, so that the two read threads
  // end close together (100,000 owed reports: ~0.45 s of scans, ~0.25 s side
  // by side), and reads queued after them fill whichever thread frees first.
  validation v;
  for (const auto& table : validated_tables()) {
    auto scan = [this, t = &table]() -> result<bool> {
      auto db = readers_.acquire();
      return table_has_bad_row(*db, *t);
    };
    v.scans.push_back(readers_.start(std::move(scan)));
  }
  return v;
}

awaitable<result<void>> task_store::finish_validation(validation v) {
  // The checks one by one run only if a scan flagged a table.
  const auto& tables = validated_tables();
  std::vector<std::string> flagged;
  std::optional<error> failed;
  for (std::size_t i = 0; i < v.scans.size(); ++i) {
    auto bad = co_await v.scans[i]->async_take(boost::asio::use_awaitable);
    if (!bad && !failed) failed = bad.error();
    if (bad && *bad) flagged.push_back(tables[i]);
  }
  if (failed) co_return *failed;
  if (flagged.empty()) co_return result<void>{};
  auto refuse = [this, flagged = std::move(flagged)]() -> result<void> {
    auto db = readers_.acquire();
    return refuse_first_bad_row(*db, flagged);
  };
  auto refused = offload(std::move(refuse));
  co_return co_await std::move(refused);
}

awaitable<result<std::vector<session_id>>> task_store::claims_woken_by_inbox() {
  auto fn = [](SQLite::Database& db) {
    // Inbox items reach the transcript as user 'report' or 'notice' messages
    // (take_inbox); a prompt or steer past the cursor is a caller's input
    // (a foreground call its parent retries), so that claim is released.
    SQLite::Statement q(db,
                        "SELECT s.id FROM sessions s WHERE s.time_suspended IS NOT NULL "
                        "AND s.parent_id IS NOT NULL "
                        "AND NOT EXISTS (SELECT 1 FROM tasks j WHERE j.child_id = s.id "
                        "AND j.state = 'running') "
                        "AND EXISTS (SELECT 1 FROM messages m WHERE m.session_id = s.id "
                        "AND m.seq > s.input_cursor AND m.role = 'user' "
                        "AND m.kind IN ('report', 'notice')) "
                        "AND NOT EXISTS (SELECT 1 FROM messages m WHERE m.session_id = s.id "
                        "AND m.seq > s.input_cursor AND m.role = 'user' "
                        "AND m.kind NOT IN ('report', 'notice')) ORDER BY s.id");
    std::vector<session_id> out;
    while (q.executeStep()) out.emplace_back(q.getColumn(0).getString());
    return out;
  };
  co_return co_await w_.write("find claims woken by their inbox", 0, std::move(fn));
}

awaitable<result<void>> task_store::create_session(session_row row) {
  auto name = "create session " + row.id.str();
  auto fn = [row = std::move(row)](SQLite::Database& db) { insert_session(db, row); };
  co_return co_await w_.write(std::move(name), 128, std::move(fn));
}

awaitable<result<std::int64_t>> task_store::append(session_id s, std::string role, std::string kind,
                                                   std::string status, std::string text) {
  auto name = "append " + kind + " to " + s.str();
  std::size_t bytes = text.size() + 64;
  auto fn = [s = std::move(s), role = std::move(role), kind = std::move(kind),
             status = std::move(status), text = std::move(text)](SQLite::Database& db) {
    return append_in_tx(db, s.str(), role, kind, status, text);
  };
  co_return co_await w_.write(std::move(name), bytes, std::move(fn));
}

namespace {
// Opens a busy period on disk: status busy and the claim set, and with
// `append` a transcript message in the same statement's seq. A period that
// resumes a claim (the host died mid-turn) keeps its turn. No RETURNING (see
// append_in_tx): the row is read back.
result<task_store::busy_start> begin_busy_in_tx(SQLite::Database& db, const std::string& s,
                                                bool append) {
  auto& st = cached_statement(db,
                              "UPDATE sessions SET seq = seq + ?, status = 'busy', "
                              "turn = CASE WHEN time_suspended IS NULL OR turn IS NULL "
                              "THEN ? ELSE turn END, "
                              "time_suspended = coalesce(time_suspended, ?) WHERE id = ?");
  auto fresh_turn = protocol::mint("turn");
  st.bind(1, append ? 1 : 0);
  st.bind(2, fresh_turn);
  st.bind(3, now_ms());
  st.bind(4, s);
  if (st.exec() != 1) return error{errc::not_found, "session '" + s + "' does not exist"};
  auto& read = cached_statement(db, "SELECT seq, input_cursor, turn FROM sessions WHERE id = ?");
  read.bind(1, s);
  read.executeStep();
  auto turn = read.getColumn(2).getString();
  bool resumed = turn != fresh_turn;
  task_store::busy_start out{read.getColumn(0).getInt64(), read.getColumn(1).getInt64(),
                             protocol::turn_id(std::move(turn)), resumed};
  read.reset();
  return out;
}
}  // namespace

awaitable<result<task_store::busy_start>> task_store::begin_busy(session_id s) {
  auto name = "begin busy period of " + s.str();
  auto fn = [s = std::move(s)](SQLite::Database& db) {
    return begin_busy_in_tx(db, s.str(), false);
  };
  co_return co_await w_.write(std::move(name), 32, std::move(fn));
}

awaitable<result<task_store::busy_start>> task_store::append_and_begin_busy(session_id s,
                                                                            std::string kind,
                                                                            std::string text) {
  auto name = "append " + kind + " to " + s.str() + " and begin its busy period";
  std::size_t bytes = text.size() + 96;
  auto fn = [s = std::move(s), kind = std::move(kind),
             text = std::move(text)](SQLite::Database& db) -> result<busy_start> {
    auto begun = begin_busy_in_tx(db, s.str(), true);
    if (!begun) return begun;
    // The message takes the seq the claim's statement gave the session.
    insert_message(db, s.str(), begun->seq, "user", kind, "completed", text);
    if (!begun->resumed) {
      // Between the cursor and the input lie the last period's answers;
      // any user message there (another writer's, such as a follow-up's
      // prompt) leaves the drain to read its inputs.
      auto& other = cached_statement(db,
                                     "SELECT EXISTS (SELECT 1 FROM messages WHERE session_id = ? "
                                     "AND seq > ? AND seq < ? AND role = 'user')");
      other.bind(1, s.str());
      other.bind(2, begun->input_cursor);
      other.bind(3, begun->seq);
      other.executeStep();
      bool alone = other.getColumn(0).getInt() == 0;
      other.reset();
      if (alone) begun->input = message_row{begun->seq, "user", kind, "completed", text};
    }
    return begun;
  };
  co_return co_await w_.write(std::move(name), bytes, std::move(fn));
}

awaitable<result<task_store::spawned>> task_store::spawn(std::optional<session_row> create,
                                                         session_id child, std::string prompt,
                                                         std::optional<job_row> job,
                                                         std::optional<bool> notify_update) {
  auto name = "spawn " + child.str();
  std::size_t bytes = prompt.size() + 256;
  auto fn = [create = std::move(create), child = std::move(child), prompt = std::move(prompt),
             job = std::move(job),
             notify_update](SQLite::Database& db) -> result<task_store::spawned> {
    if (create) insert_session(db, *create);
    if (notify_update) {
      auto& st = cached_statement(db, "UPDATE sessions SET parent_notify = ? WHERE id = ?");
      st.bind(1, *notify_update ? 1 : 0);
      st.bind(2, child.str());
      st.exec();
    }
    auto seq = append_in_tx(db, child.str(), "user", "prompt", "completed", prompt);
    if (job) {
      if (job->status == job_status::running) {
        auto& fresh =
            cached_statement(db,
                             "UPDATE sessions SET resume_attempts = 0 WHERE id = ? AND NOT EXISTS "
                             "(SELECT 1 FROM tasks WHERE child_id = ? AND state = 'running')");
        fresh.bind(1, child.str());
        fresh.bind(2, child.str());
        fresh.exec();
      }
      insert_job(db, *job);
    }
    task_store::spawned out;
    out.seq = seq;
    if (create) {
      // The row as this transaction leaves it (the store's defaults, the
      // tenant it inherits, the prompt's seq), read by the statement a read
      // connection would use.
      auto& q = cached_statement(db, k_session_by_id.c_str());
      q.bind(1, child.str());
      if (!q.executeStep())
        throw std::runtime_error("session '" + child.str() + "' is not there after its insert");
      auto row = decode_session(q);
      if (!row) return row.error();
      out.created = std::move(*row);
    }
    return out;
  };
  co_return co_await w_.write(std::move(name), bytes, std::move(fn));
}

namespace {

// The settle's writes (task_store::settle). `receipt_state`: the terminal
// receipt's state, "pending" (the outbox) unless the same transaction admits
// the report ("acked") or finds its parent gone ("dropped").
settle_result settle_in_tx(SQLite::Database& db, const settle_request& req,
                           std::string_view receipt_state) {
  settle_result out;
  auto now = now_ms();
  auto& idle = cached_statement(db,
                                "UPDATE sessions SET status = 'idle', time_suspended = NULL, "
                                "resume_attempts = CASE WHEN ? THEN resume_attempts ELSE 0 END, "
                                "idle_outcome = ?, time_idle = ?, "
                                "input_cursor = max(input_cursor, ?) WHERE id = ?");
  idle.bind(1, req.keep_resume_attempts ? 1 : 0);
  idle.bind(2, std::string(protocol::to_string(req.outcome)));
  idle.bind(3, now);
  idle.bind(4, req.input_cursor);
  idle.bind(5, req.child.str());
  if (idle.exec() != 1)
    throw std::runtime_error("session '" + req.child.str() + "' does not exist");
  job_status terminal = req.outcome == protocol::report_state::completed ? job_status::completed
                        : req.outcome == protocol::report_state::error   ? job_status::error
                                                                         : job_status::cancelled;
  auto receipt_transition = transition_of(terminal);
  if (req.background_job) {
    // The terminal compare-and-set with the report's outbox, its terminal
    // receipt: a settle after the report went out finds the row terminal
    // and writes nothing. A silenced link owes no report, so its receipt is
    // written dropped.
    terminal_write tw;
    tw.task = *req.background_job;
    tw.kind = "subagent";
    tw.state = task_state_word(terminal);
    tw.transition = receipt_transition;
    tw.body = req.body;
    tw.receipt_body = req.body;
    tw.receipt_state = req.drop_background ? "dropped" : receipt_state;
    bool moved = terminal_transition(db, tw).has_value();
    out.row_written = moved && !req.drop_background;
  } else if (req.mint_none) {
    job_row r;
    r.id = job_id(req.mint_none->str());
    r.nid = *req.mint_none;
    r.mode = "none";
    r.parent = req.parent;
    r.child = req.child;
    r.status = terminal;
    r.body = req.body;
    r.description = req.description;
    insert_job(db, r, receipt_state);  // with its terminal receipt
    out.row_written = true;
  }
  return out;
}

}  // namespace

awaitable<result<settle_result>> task_store::settle(settle_request req) {
  auto name = "settle " + req.child.str();
  std::size_t bytes = req.body.size() + 128;
  auto fn = [req = std::move(req)](SQLite::Database& db) {
    return settle_in_tx(db, req, "pending");
  };
  co_return co_await w_.write(std::move(name), bytes, std::move(fn));
}

std::shared_ptr<runtime::one_shot<result<settle_admit_result>>> task_store::settle_admit_submit(
    session_id parent, settle_request req, notification_id nid) {
  auto name = "settle " + req.child.str() + " and admit its report to " + parent.str();
  std::size_t bytes = 2 * req.body.size() + 256;
  std::vector<report_item> items{{std::move(nid), req.child, req.body, std::nullopt}};
  auto fn = [parent = std::move(parent), req = std::move(req),
             items = std::move(items)](SQLite::Database& db) {
    settle_admit_result out;
    auto at_seq = session_seq(db, parent.str());
    out.settled = settle_in_tx(db, req, at_seq ? "acked" : "dropped");
    if (!out.settled.row_written) return out;
    if (!at_seq) {
      out.parent_gone = true;
      return out;
    }
    out.admitted = admit_rows(db, parent, *at_seq, items, admit_receipts::reports, true).front();
    return out;
  };
  return w_.submit(std::move(name), bytes, std::move(fn));
}

std::shared_ptr<runtime::one_shot<result<std::vector<admit_outcome>>>> task_store::admit_submit(
    session_id to, std::vector<report_item> items, admit_receipts how) {
  auto name = "admit " + std::to_string(items.size()) + " report(s) to " + to.str();
  std::size_t bytes = 64;
  for (auto& i : items) bytes += i.body.size() + 96;
  auto fn = [to = std::move(to), items = std::move(items),
             how](SQLite::Database& db) -> result<std::vector<admit_outcome>> {
    auto out = admit_in_tx(db, to, items, how);
    if (!out)
      return error{errc::not_found, "session '" + to.str() + "' does not exist; " +
                                        std::to_string(items.size()) + " report(s) not admitted"};
    return std::move(*out);
  };
  return w_.submit(std::move(name), bytes, std::move(fn));
}

awaitable<result<std::vector<admit_outcome>>> task_store::admit(session_id to,
                                                                std::vector<report_item> items,
                                                                admit_receipts how) {
  auto st = admit_submit(std::move(to), std::move(items), how);
  co_return co_await st->async_take(asio::use_awaitable);
}

awaitable<result<void>> task_store::complete(std::vector<notification_id> nids, bool delivered) {
  auto name = "complete " + std::to_string(nids.size()) + " report(s)";
  std::size_t bytes = 32 * nids.size();
  auto fn = [nids = std::move(nids), delivered](SQLite::Database& db) {
    auto now = now_ms();
    for (auto& n : nids) settle_report_receipt(db, n, delivered, now);
  };
  co_return co_await w_.write(std::move(name), bytes, std::move(fn));
}

namespace detail {
// Named by INDEXED BY: without statistics the planner took the full
// inbox_order index for this query and walked every row the session was ever
// admitted (a primary-key lookup each, to read its state), so a parent's take
// grew with its whole history: 17-22 ms per group commit at 25,000 rows
// (bench_latency). Declared extern so a test can read the query's plan.
extern const char* const k_take_inbox_sql;
const char* const k_take_inbox_sql =
    "SELECT notification_id, body FROM inbox INDEXED BY inbox_pending WHERE session_id = ? AND "
    "state = 'pending' ORDER BY admitted_ord, notification_id LIMIT ?";
}  // namespace detail

awaitable<result<task_store::inbox_take>> task_store::take_inbox(session_id s, std::size_t limit) {
  auto name = "acknowledge inbox of " + s.str();
  limit = std::max<std::size_t>(1, limit);
  auto fn = [s = std::move(s), limit](SQLite::Database& db) {
    std::vector<std::pair<std::string, std::string>> pending;  // nid, body
    inbox_take out;
    {
      // One row past the limit says whether any is left.
      auto& q = cached_statement(db, detail::k_take_inbox_sql);
      q.bind(1, s.str());
      q.bind(2, static_cast<std::int64_t>(limit) + 1);
      while (q.executeStep())
        pending.emplace_back(q.getColumn(0).getString(), q.getColumn(1).getString());
      q.reset();
    }
    if (pending.size() > limit) {
      pending.pop_back();
      out.more = true;
    }
    for (auto& [nid, body] : pending) {
      // A job receipt: acknowledged here (an idle session's receipt is
      // acknowledged once processed), unless its owner already read the
      // result through a status call or it was dropped: then it is not shown.
      auto& rc = cached_statement(db, "SELECT state FROM receipts WHERE id = ?");
      rc.bind(1, nid);
      std::optional<std::string> receipt;
      if (rc.executeStep()) receipt = rc.getColumn(0).getString();
      rc.reset();
      bool show = !receipt || *receipt == "pending" || *receipt == "acked";
      if (receipt && *receipt == "pending") {
        auto& ra = cached_statement(db,
                                    "UPDATE receipts SET state = 'acked', updated_at = ? WHERE id "
                                    "= ? AND state = 'pending'");
        ra.bind(1, now_ms());
        ra.bind(2, nid);
        ra.exec();
      }
      auto& ack = cached_statement(db,
                                   "UPDATE inbox SET state = 'acked' WHERE session_id = ? AND "
                                   "notification_id = ?");
      ack.bind(1, s.str());
      ack.bind(2, nid);
      ack.exec();
      if (!show) continue;
      message_row m{0, "user", receipt ? "notice" : "report", "completed", body};
      m.seq = append_in_tx(db, s.str(), m.role, m.kind, m.status, body);
      out.messages.push_back(std::move(m));
    }
    return out;
  };
  co_return co_await w_.write(std::move(name), 64, std::move(fn));
}

awaitable<result<void>> task_store::set_job_policy(session_id s, bool notify, std::string policy) {
  if (policy != "withhold" && policy != "report_now")
    co_return error{errc::invalid, "job policy '" + policy +
                                       "' is not one of withhold, report_now; the session's "
                                       "policy was kept"};
  auto name = "set job policy of " + s.str();
  auto fn = [s = std::move(s), notify,
             policy = std::move(policy)](SQLite::Database& db) -> result<void> {
    auto& st =
        cached_statement(db, "UPDATE sessions SET job_notify = ?, job_policy = ? WHERE id = ?");
    st.bind(1, notify ? 1 : 0);
    st.bind(2, policy);
    st.bind(3, s.str());
    if (st.exec() != 1) return error{errc::not_found, "session '" + s.str() + "' does not exist"};
    return {};
  };
  co_return co_await w_.write(std::move(name), 64, std::move(fn));
}

awaitable<result<void>> task_store::set_revert(session_id s, bool staged) {
  auto name = std::string(staged ? "stage" : "clear") + " revert on " + s.str();
  auto fn = [s = std::move(s), staged](SQLite::Database& db) -> result<void> {
    auto& st = cached_statement(db, "UPDATE sessions SET revert_staged = ? WHERE id = ?");
    st.bind(1, staged ? 1 : 0);
    st.bind(2, s.str());
    if (st.exec() != 1)
      return error{errc::not_found, "session '" + s.str() + "' does not exist; no revert was " +
                                        (staged ? "staged" : "cleared")};
    return {};
  };
  co_return co_await w_.write(std::move(name), 32, std::move(fn));
}

awaitable<result<int>> task_store::delete_session(session_id s) {
  auto name = "delete session " + s.str();
  auto fn = [s = std::move(s)](SQLite::Database& db) -> result<int> {
    // Its transcript and inbox go with it (ON DELETE CASCADE); its tasks stay
    // as history, and its children stay sessions of their own.
    auto& del = cached_statement(db, "DELETE FROM sessions WHERE id = ?");
    del.bind(1, s.str());
    if (del.exec() != 1)
      return error{errc::not_found,
                   "session '" + s.str() + "' does not exist; nothing was deleted"};
    // What was owed to it is owed to nobody now: the reports of its
    // children's tasks and the notices of tasks launched under its scope.
    auto& drop = cached_statement(
        db,
        "UPDATE receipts SET state = 'dropped', updated_at = ?1 WHERE state = 'pending' AND "
        "EXISTS (SELECT 1 FROM tasks t WHERE t.id = receipts.task_id AND "
        "(t.parent_id = ?2 OR t.thread = ?2))");
    drop.bind(1, now_ms());
    drop.bind(2, s.str());
    int dropped = drop.exec();
    return dropped;
  };
  co_return co_await w_.write(std::move(name), 64, std::move(fn));
}

awaitable<result<int>> task_store::expire_tasks(std::int64_t before_ms, int limit) {
  auto name = "expire tasks before " + std::to_string(before_ms);
  auto fn = [before_ms, limit](SQLite::Database& db) -> result<int> {
    std::vector<std::string> ids;
    auto& q = cached_statement(
        db,
        "SELECT id FROM tasks WHERE state NOT IN ('admitted','running') AND updated_at < ? AND "
        "NOT EXISTS (SELECT 1 FROM receipts r WHERE r.task_id = tasks.id AND "
        "r.state = 'pending') LIMIT ?");
    q.bind(1, before_ms);
    q.bind(2, limit);
    while (q.executeStep()) ids.push_back(q.getColumn(0).getString());
    q.reset();
    auto& rc = cached_statement(db, "DELETE FROM receipts WHERE task_id = ?");
    auto& tk = cached_statement(db, "DELETE FROM tasks WHERE id = ?");
    for (auto& id : ids) {
      rc.bind(1, id);
      rc.exec();
      rc.reset();
      tk.bind(1, id);
      tk.exec();
      tk.reset();
    }
    return static_cast<int>(ids.size());
  };
  co_return co_await w_.write(std::move(name), 64, std::move(fn));
}

awaitable<result<int>> task_store::bump_resume(session_id s) {
  auto name = "count a resume of " + s.str();
  auto fn = [s = std::move(s)](SQLite::Database& db) -> result<int> {
    auto& st =
        cached_statement(db,
                         "UPDATE sessions SET resume_attempts = resume_attempts + 1 WHERE id = ? "
                         "RETURNING resume_attempts");
    st.bind(1, s.str());
    if (!st.executeStep())
      return error{errc::not_found, "session '" + s.str() + "' does not exist"};
    return st.getColumn(0).getInt();
  };
  co_return co_await w_.write(std::move(name), 32, std::move(fn));
}

awaitable<result<void>> task_store::write_job(job_row row) {
  auto name = "write job " + row.id.str();
  auto fn = [row = std::move(row)](SQLite::Database& db) { insert_job(db, row); };
  co_return co_await w_.write(std::move(name), 128, std::move(fn));
}

// --- reads ---

result<std::optional<session_row>> task_reader::session(const session_id& s) {
  try {
    auto db = readers_.acquire();
    auto& q = db.statement(k_session_by_id);
    q.bind(1, s.str());
    if (!q.executeStep()) return std::optional<session_row>{};
    auto r = decode_session(q);
    if (!r) return r.error();
    return std::optional<session_row>(std::move(*r));
  } catch (const std::exception& e) {
    return read_error("reading session " + s.str(), e);
  }
}

result<std::vector<session_row>> task_reader::sessions() {
  return read_all<session_row>(
      readers_, std::string("SELECT ") + k_session_cols + " FROM sessions ORDER BY created_at, id",
      "reading sessions", {}, decode_session);
}

result<std::vector<session_link>> task_reader::session_links() {
  auto decode = [](SQLite::Statement& q) -> result<session_link> {
    session_link r;
    r.id = session_id(q.getColumn(0).getString());
    if (auto p = opt_text(q.getColumn(1))) r.parent = session_id(*p);
    if (!q.getColumn(2).isNull()) r.notify = q.getColumn(2).getInt() != 0;
    r.description = q.getColumn(3).getString();
    r.agent = q.getColumn(4).getString();
    if (auto policy = decode_policy(q.getColumn(5), r.id); !policy) return policy.error();
    return r;
  };
  return read_all<session_link>(
      readers_, "SELECT id, parent_id, parent_notify, description, agent, policy FROM sessions",
      "reading the sessions' links", {}, decode);
}

result<std::vector<session_row>> task_reader::sessions_to_resume() {
  return read_all<session_row>(
      readers_,
      std::string("SELECT ") + k_session_cols +
          " FROM sessions WHERE time_suspended IS NOT NULL "
          // The pending rows' index: a long-lived session's acknowledged
          // history is not walked (the planner picks the primary key).
          "OR EXISTS (SELECT 1 FROM inbox INDEXED BY inbox_pending "
          "WHERE session_id = sessions.id AND state = 'pending') "
          "OR id IN (SELECT child_id FROM tasks WHERE state IN ('admitted', 'running') "
          "AND kind = 'subagent') ORDER BY created_at, id",
      "reading the sessions to resume", {}, decode_session);
}

result<std::vector<history_task>> task_reader::history_tasks() {
  try {
    auto db = readers_.acquire();
    auto& q = db.statement(
        "SELECT id, kind, state, child_id, coalesce(mode, ''), created_at FROM tasks "
        "WHERE kind NOT IN ('subagent', 'shell') ORDER BY created_at, id");
    std::vector<history_task> out;
    while (q.executeStep()) {
      history_task t;
      t.id = q.getColumn(0).getString();
      t.kind = q.getColumn(1).getString();
      t.state = q.getColumn(2).getString();
      if (auto o = opt_text(q.getColumn(3))) t.owner = session_id(*o);
      t.mode = q.getColumn(4).getString();
      t.created_at = q.getColumn(5).getInt64();
      out.push_back(std::move(t));
    }
    return out;
  } catch (const std::exception& e) {
    return read_error("reading history tasks", e);
  }
}

awaitable<result<std::optional<session_row>>> task_reader::load_session(session_id s) {
  auto read = [this, s] { return session(s); };
  co_return co_await offload(std::move(read));
}

namespace {

result<std::vector<job_row>> read_jobs(reader_pool& readers, const char* where) {
  try {
    auto db = readers.acquire();
    auto& q = db.statement(std::string("SELECT ") + k_job_cols + " FROM tasks WHERE " + where +
                           " ORDER BY created_at, id");
    std::vector<job_row> out;
    while (q.executeStep()) {
      auto r = decode_job(q);
      if (!r) return r.error();
      out.push_back(std::move(*r));
    }
    return out;
  } catch (const std::exception& e) {
    return read_error("reading jobs", e);
  }
}

}  // namespace

result<std::vector<job_row>> task_reader::jobs() {
  return read_jobs(readers_, "kind = 'subagent'");
}

result<std::vector<job_row>> task_reader::outstanding_jobs() {
  // Without the delivered history: the rows whose terminal receipt is
  // pending (through receipts_pending, in outbox order), then the running
  // rows (tasks_live), both in one read transaction. One pass over the
  // pending receipts, no sort and no per-row probe of the receipts.
  try {
    auto db = readers_.acquire();
    SQLite::Transaction snapshot(*db);  // read only: rolled back at the end
    std::vector<job_row> out;
    for (const char* sql : {k_owed_jobs, k_running_jobs}) {
      auto& q = db.statement(sql);
      while (q.executeStep()) {
        auto r = decode_job(q);
        if (!r) return r.error();
        out.push_back(std::move(*r));
      }
      q.reset();
    }
    return out;
  } catch (const std::exception& e) {
    return read_error("reading outstanding jobs", e);
  }
}

result<std::vector<job_row>> task_reader::running_jobs() {
  return read_all<job_row>(readers_, k_running_jobs, "reading running jobs", {}, decode_job);
}

result<std::optional<outbox_key>> task_reader::outbox_end() {
  auto decode = [](SQLite::Statement& q) -> result<outbox_key> {
    return outbox_key{q.getColumn(0).getInt64(), q.getColumn(1).getString()};
  };
  return first_of(read_all<outbox_key>(readers_,
                                       "SELECT created_at, id FROM receipts WHERE state = "
                                       "'pending' ORDER BY created_at DESC, id DESC LIMIT 1",
                                       "reading the outbox's end", {}, decode));
}

result<std::vector<outbox_row>> task_reader::outbox_page(const outbox_key& after,
                                                         const outbox_key& end, std::size_t limit) {
  // The receipt's columns, its task's kind, whether it owes the task's
  // report, then the task's row (decode_job_at), its payload left out (a
  // report is delivered without its description). The row-value range
  // walks receipts_pending from `after`, in its order.
  constexpr const char* sql =
      "SELECT r.id, r.task_id, r.transition, r.scope, "
      "CASE WHEN t.kind = 'subagent' THEN '' ELSE r.body END, r.state, r.created_at, "
      "coalesce(t.kind, ''), "
      "t.kind = 'subagent' AND r.transition != 'started' AND t.state NOT IN ('admitted', "
      "'running'), "
      "t.id, t.notification_id, t.kind, t.mode, t.parent_id, t.child_id, t.generation, t.state, "
      "t.body, NULL, 1 "
      "FROM receipts r LEFT JOIN tasks t ON t.id = r.task_id "
      "WHERE r.state = 'pending' AND (r.created_at, r.id) > (?, ?) AND (r.created_at, r.id) <= "
      "(?, ?) ORDER BY r.created_at, r.id LIMIT ?";
  try {
    auto db = readers_.acquire();
    auto& q = db.statement(sql);
    q.bind(1, after.created_at);
    q.bind(2, after.id);
    q.bind(3, end.created_at);
    q.bind(4, end.id);
    q.bind(5, static_cast<std::int64_t>(limit));
    scope_memo memo;
    std::vector<outbox_row> out;
    // A page is read whole: its rows are built in place, never moved to a
    // bigger buffer (boot's pages run to tens of thousands of rows).
    out.reserve(std::min<std::size_t>(limit, 1 << 16));
    while (q.executeStep()) {
      auto r = decode_receipt_at(q, 0, &memo);
      if (!r) return r.error();
      outbox_row row{std::move(*r), q.getColumn(7).getString(), std::nullopt};
      if (q.getColumn(8).getInt() != 0) {
        auto j = decode_job_at(q, 9, /*description=*/false);  // a report needs none
        if (!j) return j.error();
        row.owed = std::move(*j);
      }
      out.push_back(std::move(row));
    }
    return out;
  } catch (const std::exception& e) {
    return read_error("reading pending receipts", e);
  }
}

result<task_reader::input_count> task_reader::user_inputs(const session_id& s, std::int64_t after,
                                                          std::int64_t upto) {
  try {
    auto db = readers_.acquire();
    auto& q = db.statement(
        "SELECT count(*) FILTER (WHERE role = 'user'), coalesce(max(seq), ?2) FROM messages "
        "WHERE session_id = ?1 AND seq > ?2 AND seq <= ?3");
    q.bind(1, s.str());
    q.bind(2, after);
    q.bind(3, upto);
    q.executeStep();
    return input_count{q.getColumn(0).getInt64(), q.getColumn(1).getInt64()};
  } catch (const std::exception& e) {
    return read_error("counting inputs of " + s.str(), e);
  }
}

result<std::vector<message_row>> task_reader::messages(const session_id& s, std::int64_t after) {
  try {
    auto db = readers_.acquire();
    auto& q = db.statement(
        "SELECT seq, role, kind, status, payload FROM messages WHERE session_id = ? "
        "AND seq > ? ORDER BY seq");
    q.bind(1, s.str());
    q.bind(2, after);
    std::vector<message_row> out;
    while (q.executeStep()) {
      auto m = decode_message(s.str(), q);
      if (!m) return m.error();
      out.push_back(std::move(*m));
    }
    return out;
  } catch (const std::exception& e) {
    return read_error("reading messages of " + s.str(), e);
  }
}

result<std::vector<inbox_row>> task_reader::inbox(const session_id& s) {
  try {
    auto db = readers_.acquire();
    auto& q = db.statement(
        "SELECT notification_id, from_session, body, state FROM inbox WHERE "
        "session_id = ? ORDER BY admitted_ord, notification_id");
    q.bind(1, s.str());
    std::vector<inbox_row> out;
    while (q.executeStep()) {
      inbox_row r;
      r.session = s;
      r.nid = notification_id(q.getColumn(0).getString());
      if (auto f = opt_text(q.getColumn(1))) r.from = session_id(*f);
      r.body = q.getColumn(2).getString();
      auto state = q.getColumn(3).getString();
      if (state != "pending" && state != "acked")
        return corrupt_row("inbox", s.str() + "/" + r.nid.str(),
                           "state: unknown value '" + state + "'");
      r.acked = state == "acked";
      out.push_back(std::move(r));
    }
    return out;
  } catch (const std::exception& e) {
    return read_error("reading inbox of " + s.str(), e);
  }
}

result<std::vector<session_id>> task_reader::sessions_with_pending_inbox() {
  try {
    auto db = readers_.acquire();
    auto& q = db.statement("SELECT DISTINCT session_id FROM inbox WHERE state = 'pending'");
    std::vector<session_id> out;
    while (q.executeStep()) out.emplace_back(q.getColumn(0).getString());
    return out;
  } catch (const std::exception& e) {
    return read_error("reading pending inboxes", e);
  }
}

result<std::optional<message_row>> task_reader::last_assistant_after(const session_id& s,
                                                                     std::int64_t after) {
  try {
    auto db = readers_.acquire();
    auto& q = db.statement(
        "SELECT seq, role, kind, status, payload FROM messages WHERE session_id = ? "
        "AND seq > ? AND seq < ? ORDER BY seq DESC LIMIT 20");
    std::int64_t below = INT64_MAX;
    for (;;) {
      q.reset();
      q.bind(1, s.str());
      q.bind(2, after);
      q.bind(3, below);
      int rows = 0;
      while (q.executeStep()) {
        ++rows;
        below = q.getColumn(0).getInt64();
        if (q.getColumn(1).getString() != "assistant" || q.getColumn(3).getString() != "completed")
          continue;
        auto m = decode_message(s.str(), q);
        if (!m) return m.error();
        return std::optional<message_row>(std::move(*m));
      }
      if (rows < 20) return std::optional<message_row>{};
    }
  } catch (const std::exception& e) {
    return read_error("reading the last answer of " + s.str(), e);
  }
}

}  // namespace tether::persistence
