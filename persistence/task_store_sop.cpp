// SOP runs on the one task store (docs/sop.md): a run is a task of kind
// `sop_run` whose payload holds its progression; each step that does work
// is a child task of kind `sop_step`. Every save is a compare-and-set on the
// run's revision (and on its claim, for the claimant's saves); a run ends
// through the terminal compare-and-set every kind shares. The engine
// (actors/sop.hpp) decides what a save says: here are only the named writes
// and reads.
#include <SQLiteCpp/Statement.h>

#include <limits>
#include <map>

#include "tether/persistence/task_store.hpp"
#include "tether/persistence/task_transitions.hpp"
#include "tether/protocol/json.hpp"
#include "tether/runtime/clock.hpp"

namespace tether::persistence {

namespace json = boost::json;
using runtime::now_ms;

std::string sop_run_row::status() const {
  if (state == "admitted" || state == "running") return phase;
  return state;
}

namespace {

std::string thread_of(const std::string& sop) {
  return "sop:" + sop;
}

constexpr const char* k_run_cols =
    "id, state, revision, coalesce(owner, ''), coalesce(lease_until, 0), coalesce(scope, '{}'), "
    "payload, created_at, updated_at";

result<sop_run_row> decode_run(SQLite::Statement& q) {
  sop_run_row r;
  r.id = job_id(q.getColumn(0).getString());
  const auto& key = r.id.str();
  r.state = q.getColumn(1).getString();
  r.revision = q.getColumn(2).getInt64();
  r.owner = q.getColumn(3).getString();
  r.lease_until = q.getColumn(4).getInt64();
  auto sv = protocol::parse_json(q.getColumn(5).getString());
  if (!sv) return corrupt_row("tasks", key, "scope: " + sv.error().describe());
  if (!sv->is_object() || !sv->as_object().empty()) {
    auto scope = protocol::scope_from_json(*sv);
    if (!scope) return corrupt_row("tasks", key, scope.error().describe());
    r.scope = std::move(*scope);
  }
  auto p = protocol::parse_json(q.getColumn(6).getString());
  if (!p || !p->is_object()) return corrupt_row("tasks", key, "payload: not a JSON object");
  r.progress = std::move(p->as_object());
  auto* sop = r.progress.if_contains("sop");
  auto* phase = r.progress.if_contains("phase");
  if (!sop || !sop->is_string()) return corrupt_row("tasks", key, "payload.sop: not a string");
  if (!phase || !phase->is_string())
    return corrupt_row("tasks", key, "payload.phase: not a string");
  r.sop = std::string(sop->as_string());
  r.phase = std::string(phase->as_string());
  r.created_at = q.getColumn(7).getInt64();
  r.updated_at = q.getColumn(8).getInt64();
  return r;
}

void write_event(SQLite::Database& db, const job_id& task, std::int64_t revision,
                 const std::string& kind, const std::string& actor, const std::string& detail) {
  auto& st = cached_statement(
      db,
      "INSERT INTO task_events (task_id, seq, at, revision, kind, actor, detail) VALUES (?, "
      "(SELECT coalesce(max(seq), 0) + 1 FROM task_events WHERE task_id = ?), ?, ?, ?, ?, ?)");
  st.bind(1, task.str());
  st.bind(2, task.str());
  st.bind(3, now_ms());
  st.bind(4, revision);
  st.bind(5, kind);
  st.bind(6, actor);
  st.bind(7, detail);
  st.exec();
}

void write_audit(SQLite::Database& db, const std::string& actor, const std::string& action,
                 const std::string& subject, const std::string& detail) {
  auto& st = cached_statement(
      db, "INSERT INTO audit_log (at, actor, action, subject, detail) VALUES (?, ?, ?, ?, ?)");
  st.bind(1, now_ms());
  st.bind(2, actor);
  st.bind(3, action);
  st.bind(4, subject);
  st.bind(5, detail);
  st.exec();
}

/// Admits a step's child task (running), bound to its run's scope.
void admit_step(SQLite::Database& db, const job_id& run, const job_id& step,
                const std::string& preview) {
  auto& st = cached_statement(
      db,
      "INSERT INTO tasks (id, kind, state, tenant, thread, turn, scope, parent_id, payload, "
      "created_at, updated_at) SELECT ?, 'sop_step', 'running', tenant, thread, turn, scope, id, "
      "?, ?, ? FROM tasks WHERE id = ? AND kind = 'sop_run'");
  auto now = now_ms();
  st.bind(1, step.str());
  st.bind(2, stored_json(json::object{{"run", run.str()}, {"preview", preview}},
                         "the SOP step's preview"));
  st.bind(3, now);
  st.bind(4, now);
  st.bind(5, run.str());
  if (st.exec() != 1)
    throw error_exception(error{errc::conflict, "SOP step task " + step.str() +
                                                    " could not be admitted (it exists, or its "
                                                    "run does not); nothing was written"});
}

}  // namespace

// ---- reads ----

result<std::vector<sop_run_row>> task_reader::sop_runs(bool live_only) {
  std::string sql = std::string("SELECT ") + k_run_cols + " FROM tasks WHERE kind = 'sop_run'" +
                    (live_only ? " AND state IN ('admitted','running')" : "") +
                    " ORDER BY created_at, id";
  return read_all<sop_run_row>(readers_, sql, "reading SOP runs", {}, decode_run);
}

result<std::optional<sop_run_row>> task_reader::sop_run(const job_id& id) {
  return first_of(read_all<sop_run_row>(
      readers_,
      std::string("SELECT ") + k_run_cols + " FROM tasks WHERE id = ? AND kind = 'sop_run'",
      "reading SOP run " + id.str(), {id.str()}, decode_run));
}

result<std::vector<task_event>> task_reader::task_events(const job_id& id) {
  auto decode = [](SQLite::Statement& q) -> result<task_event> {
    task_event e;
    e.task = job_id(q.getColumn(0).getString());
    e.seq = q.getColumn(1).getInt64();
    e.at = q.getColumn(2).getInt64();
    e.revision = q.getColumn(3).getInt64();
    e.kind = q.getColumn(4).getString();
    e.actor = q.getColumn(5).getString();
    e.detail = q.getColumn(6).getString();
    return e;
  };
  return read_all<task_event>(readers_,
                              "SELECT task_id, seq, at, revision, kind, actor, detail FROM "
                              "task_events WHERE task_id = ? ORDER BY seq",
                              "reading the events of task " + id.str(), {id.str()}, decode);
}

result<std::vector<audit_entry>> task_reader::audit_log(const std::string& subject) {
  auto decode = [](SQLite::Statement& q) -> result<audit_entry> {
    audit_entry e;
    e.id = q.getColumn(0).getInt64();
    e.at = q.getColumn(1).getInt64();
    e.actor = q.getColumn(2).getString();
    e.action = q.getColumn(3).getString();
    e.subject = q.getColumn(4).getString();
    e.detail = q.getColumn(5).getString();
    return e;
  };
  if (subject.empty())
    return read_all<audit_entry>(
        readers_, "SELECT id, at, actor, action, subject, detail FROM audit_log ORDER BY id",
        "reading the audit log", {}, decode);
  return read_all<audit_entry>(readers_,
                               "SELECT id, at, actor, action, subject, detail FROM audit_log WHERE "
                               "subject = ? ORDER BY id",
                               "reading the audit log of " + subject, {subject}, decode);
}

result<std::optional<std::int64_t>> task_reader::sop_next_wake(const std::string& owner) {
  try {
    auto c = readers_.acquire();
    // The earliest wait that has not fired (tasks_sop_waits, by deadline),
    // and the earliest lease of another claimant (tasks_sop_claims).
    auto& w = c.statement(
        "SELECT json_extract(payload, '$.wait.deadline') FROM tasks INDEXED BY tasks_sop_waits "
        "WHERE kind = 'sop_run' AND "
        "state IN ('admitted','running') AND json_extract(payload, '$.phase') = "
        "'waiting_approval' AND json_extract(payload, '$.wait.deadline') > 0 AND "
        "json_extract(payload, '$.wait.fired') IS NOT 1 ORDER BY json_extract(payload, "
        "'$.wait.deadline') LIMIT 1");
    std::optional<std::int64_t> out;
    if (w.executeStep() && !w.getColumn(0).isNull()) out = w.getColumn(0).getInt64();
    w.reset();
    auto& l = c.statement(
        "SELECT min(lease_until) FROM tasks INDEXED BY tasks_sop_claims WHERE kind = 'sop_run' "
        "AND state IN "
        "('admitted','running') AND owner IS NOT NULL AND owner != ?");
    l.bind(1, owner);
    if (l.executeStep() && !l.getColumn(0).isNull()) {
      auto lease = l.getColumn(0).getInt64();
      out = out ? std::min(*out, lease) : lease;
    }
    l.reset();
    return out;
  } catch (const std::exception& e) {
    return read_error("reading the next SOP wake", e);
  }
}

result<std::vector<sop_run_row>> task_reader::sop_due_waits(std::int64_t now) {
  return read_all<sop_run_row>(
      readers_,
      std::string("SELECT ") + k_run_cols +
          " FROM tasks INDEXED BY tasks_sop_waits WHERE kind = 'sop_run' AND state IN "
          "('admitted','running') AND json_extract(payload, '$.phase') = 'waiting_approval' AND "
          "json_extract(payload, "
          "'$.wait.deadline') > 0 AND json_extract(payload, '$.wait.deadline') <= CAST(? AS "
          "INTEGER) AND "
          "json_extract(payload, '$.wait.fired') IS NOT 1 ORDER BY json_extract(payload, "
          "'$.wait.deadline'), id",
      "reading the due SOP approval waits", {std::to_string(now)}, decode_run);
}

// ---- writes ----

awaitable<result<void>> task_store::sop_admit(sop_run_row run, std::string actor,
                                              std::string detail) {
  auto what = "admit SOP run " + run.id.str();
  std::size_t bytes = 512 + protocol::to_text(run.progress).size();
  auto fn = [run = std::move(run), actor = std::move(actor),
             detail = std::move(detail)](SQLite::Database& db) -> result<void> {
    auto progress = run.progress;
    progress["sop"] = run.sop;
    progress["phase"] = "pending";
    auto& st = cached_statement(
        db,
        "INSERT OR IGNORE INTO tasks (id, kind, state, tenant, thread, turn, scope, payload, "
        "revision, created_at, updated_at) VALUES (?, 'sop_run', 'admitted', ?, ?, ?, ?, ?, 1, ?, "
        "?)");
    auto now = now_ms();
    st.bind(1, run.id.str());
    st.bind(2, run.scope.tenant.str());
    st.bind(3, thread_of(run.sop));
    st.bind(4, run.id.str());
    st.bind(5, stored_json(protocol::to_json(run.scope), "the SOP run's scope"));
    st.bind(6, stored_json(progress, "the SOP run's progress"));
    st.bind(7, now);
    st.bind(8, now);
    if (st.exec() != 1)
      return error{errc::conflict,
                   "SOP run " + run.id.str() + " already exists; it was kept and nothing written"};
    write_event(db, run.id, 1, "admitted", actor, detail);
    write_audit(db, actor, "sop.start", run.id.str(), detail);
    return {};
  };
  co_return co_await w_.write(std::move(what), bytes, std::move(fn));
}

awaitable<result<std::vector<sop_run_row>>> task_store::sop_claim(std::string owner,
                                                                  std::int64_t now,
                                                                  std::int64_t lease_until,
                                                                  int limit) {
  auto fn = [owner = std::move(owner), now, lease_until,
             limit](SQLite::Database& db) -> result<std::vector<sop_run_row>> {
    std::vector<sop_run_row> out;
    // Candidates, oldest first: live, phase pending or running, unclaimed
    // or with a lapsed lease (tasks_sop_claimable). The walk stops once
    // `limit` are picked; the claims are written after it.
    auto& q = cached_statement(
        db,
        "SELECT id, thread, coalesce(owner, '') FROM tasks INDEXED BY tasks_sop_claimable WHERE "
        "kind = 'sop_run' AND state IN "
        "('admitted','running') AND json_extract(payload, '$.phase') IN ('pending','running') "
        "AND (owner IS NULL OR lease_until <= ?) ORDER BY created_at, id");
    // The cap of a run: its definition's max_concurrent (the snapshot it
    // was started with).
    auto& cap_of = cached_statement(
        db,
        "SELECT coalesce(json_extract(payload, '$.definition.max_concurrent'), 1) FROM tasks "
        "WHERE id = ?");
    // Live claims of an SOP's runs (tasks_sop_claims: only held claims).
    auto& held_by = cached_statement(
        db,
        "SELECT count(*) FROM tasks INDEXED BY tasks_sop_claims WHERE kind = 'sop_run' AND "
        "thread = ? AND state IN "
        "('admitted','running') AND owner IS NOT NULL AND lease_until > ?");
    struct sop_slots {
      std::int64_t held = 0;  // live claims, this transaction's picks included
      std::int64_t full_at = std::numeric_limits<std::int64_t>::max();  // a cap seen reached
    };
    std::map<std::string, sop_slots> slots;
    struct pick {
      std::string id, previous;
    };
    std::vector<pick> picks;
    q.bind(1, now);
    while (static_cast<int>(picks.size()) < limit && q.executeStep()) {
      auto id = q.getColumn(0).getString();
      auto thread = q.getColumn(1).getString();
      auto previous = q.getColumn(2).getString();
      auto [it, fresh] = slots.try_emplace(thread);
      auto& sl = it->second;
      if (fresh) {
        held_by.bind(1, thread);
        held_by.bind(2, now);
        held_by.executeStep();
        sl.held = held_by.getColumn(0).getInt64();
        held_by.reset();
      }
      // A candidate's own claim, if it has one, has lapsed (lease_until <=
      // now): `held` never counts it. Once a run of this SOP found the cap
      // reached, its later runs are passed over without reading their
      // payloads (a later snapshot with a higher cap waits for the next
      // pass: the cap is never exceeded, only met late).
      if (sl.held >= sl.full_at) continue;
      cap_of.bind(1, id);
      cap_of.executeStep();
      auto cap = cap_of.getColumn(0).getInt64();
      cap_of.reset();
      if (sl.held >= cap) {
        sl.full_at = std::min(sl.full_at, cap);
        continue;
      }
      ++sl.held;
      picks.push_back({std::move(id), std::move(previous)});
    }
    q.reset();
    for (const auto& c : picks) {
      auto& up = cached_statement(
          db,
          "UPDATE tasks SET state = 'running', owner = ?, lease_until = ?, revision = revision + "
          "1, payload = json_set(payload, '$.phase', 'running'), updated_at = ? WHERE id = ? "
          "RETURNING revision");
      up.bind(1, owner);
      up.bind(2, lease_until);
      up.bind(3, now_ms());
      up.bind(4, c.id);
      up.executeStep();
      auto rev = up.getColumn(0).getInt64();
      up.reset();
      write_event(db, job_id(c.id), rev, "claimed", owner,
                  c.previous.empty() ? "execution claim taken"
                                     : "execution claim taken over from " + c.previous +
                                           " (its lease lapsed or it is gone)");
      // A constant: the statement cache is keyed by the text's address.
      static const std::string k_run_by_id =
          std::string("SELECT ") + k_run_cols + " FROM tasks WHERE id = ?";
      auto& r = cached_statement(db, k_run_by_id.c_str());
      r.bind(1, c.id);
      r.executeStep();
      auto row = decode_run(r);
      r.reset();
      if (!row) throw error_exception(row.error());
      out.push_back(std::move(*row));
    }
    return out;
  };
  co_return co_await w_.write("claim SOP runs", 256, std::move(fn));
}

awaitable<result<std::int64_t>> task_store::sop_save_run(sop_save s) {
  auto what = "save SOP run " + s.run.str() + " (" + s.event + ")";
  std::size_t bytes = 512 + s.step_completion.size() + s.detail.size();
  auto fn = [s = std::move(s)](SQLite::Database& db) -> result<std::int64_t> {
    // The compare-and-set: read what is there, refuse a divergent save.
    auto& q = cached_statement(
        db,
        "SELECT state, revision, coalesce(owner, '') FROM tasks WHERE id = ? AND kind = "
        "'sop_run'");
    q.bind(1, s.run.str());
    if (!q.executeStep()) {
      q.reset();
      return error{errc::not_found, "SOP run " + s.run.str() + " does not exist"};
    }
    auto state = q.getColumn(0).getString();
    auto rev = q.getColumn(1).getInt64();
    auto owner = q.getColumn(2).getString();
    q.reset();
    if (state != "admitted" && state != "running")
      return error{errc::conflict, "SOP run " + s.run.str() + " is already " + state +
                                       "; the save (" + s.event + ") was refused"};
    if (rev != s.revision)
      return error{errc::conflict, "SOP run " + s.run.str() + " is at revision " +
                                       std::to_string(rev) + ", not " + std::to_string(s.revision) +
                                       ": a divergent save (" + s.event +
                                       ") was refused and nothing was written"};
    if (!s.owner.empty() && owner != s.owner)
      return error{errc::conflict, "SOP run " + s.run.str() + " is not claimed by " + s.owner +
                                       " (claim: " + (owner.empty() ? "none" : owner) +
                                       "); the save (" + s.event + ") was refused"};
    auto next = rev + 1;
    auto& up = cached_statement(
        db,
        "UPDATE tasks SET payload = ?, revision = ?, owner = CASE WHEN ? THEN NULL ELSE owner "
        "END, lease_until = CASE WHEN ? THEN NULL ELSE lease_until END, updated_at = ? WHERE id "
        "= ? AND revision = ?");
    up.bind(1, stored_json(s.progress, "the SOP run's progress"));
    up.bind(2, next);
    up.bind(3, s.release_claim || s.terminal ? 1 : 0);
    up.bind(4, s.release_claim || s.terminal ? 1 : 0);
    up.bind(5, now_ms());
    up.bind(6, s.run.str());
    up.bind(7, rev);
    up.exec();
    if (s.step_admit) admit_step(db, s.run, *s.step_admit, s.step_preview);
    if (s.step_finish) {
      terminal_write w;
      w.task = *s.step_finish;
      w.kind = "sop_step";
      w.state = s.step_state;
      w.transition = transition_of_word(s.step_state);
      w.completion = s.step_completion;
      w.receipt_body = "SOP step " + s.step_finish->str() + ": " + s.step_state;
      w.receipt_state = "dropped";
      (void)terminal_transition(db, w);  // already terminal: the first outcome stays
    }
    if (s.terminal) {
      terminal_write w;
      w.task = s.run;
      w.kind = "sop_run";
      w.state = *s.terminal;
      w.transition = transition_of_word(*s.terminal);
      w.receipt_body = "SOP run " + s.run.str() + ": " + *s.terminal;
      // A run's record is its row and its events; no inbox is owed it.
      w.receipt_state = "dropped";
      if (!terminal_transition(db, w))
        throw error_exception(error{
            errc::conflict, "SOP run " + s.run.str() + " was already terminal; nothing written"});
    }
    write_event(db, s.run, next, s.event, s.actor, s.detail);
    if (s.audit) write_audit(db, s.actor, *s.audit, s.run.str(), s.detail);
    return next;
  };
  co_return co_await w_.write(std::move(what), bytes, std::move(fn));
}

awaitable<result<std::vector<job_id>>> task_store::sop_renew(std::string owner,
                                                             std::int64_t lease_until,
                                                             std::vector<job_id> runs) {
  auto fn = [owner = std::move(owner), lease_until,
             runs = std::move(runs)](SQLite::Database& db) -> result<std::vector<job_id>> {
    std::vector<job_id> lost;
    for (const auto& r : runs) {
      auto& st = cached_statement(
          db,
          "UPDATE tasks SET lease_until = ? WHERE id = ? AND kind = 'sop_run' AND owner = ? AND "
          "state IN ('admitted','running')");
      st.bind(1, lease_until);
      st.bind(2, r.str());
      st.bind(3, owner);
      if (st.exec() != 1) lost.push_back(r);
    }
    return lost;
  };
  co_return co_await w_.write("renew SOP claims", 64, std::move(fn));
}

awaitable<result<int>> task_store::sop_clear_claims(std::vector<std::string> owners) {
  auto fn = [owners = std::move(owners)](SQLite::Database& db) -> result<int> {
    int n = 0;
    for (const auto& o : owners) {
      auto& st = cached_statement(
          db,
          "UPDATE tasks SET owner = NULL, lease_until = NULL WHERE kind = 'sop_run' AND owner = ? "
          "AND state IN ('admitted','running')");
      st.bind(1, o);
      n += st.exec();
    }
    return n;
  };
  co_return co_await w_.write("clear SOP claims", 64, std::move(fn));
}

}  // namespace tether::persistence
