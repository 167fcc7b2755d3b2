// Scheduled work on the one task store (docs/cron.md): the jobs' table, the
// claim compare-and-set with its lease and fencing token, and the runs, each
// a task of kind `cron_run` that ends through the terminal compare-and-set
// every kind shares (task_transitions.hpp). The schedule arithmetic and the
// policy (catch-up, retries, what to do after a run) are the scheduler's
// (actors/cron.hpp): here are only the named writes and reads.
#include <SQLiteCpp/Statement.h>

#include <set>

#include "tether/persistence/task_store.hpp"
#include "tether/persistence/task_transitions.hpp"
#include "tether/protocol/json.hpp"
#include "tether/runtime/clock.hpp"

namespace tether::persistence {

namespace json = boost::json;
using runtime::now_ms;

job_id cron_run_id(const std::string& job, std::int64_t occurrence) {
  return job_id("cron-" + job + "-" + std::to_string(occurrence));
}

namespace {

std::string thread_of(const std::string& job) {
  return "cron:" + job;
}

result<protocol::cron_job_spec> decode_spec(const std::string& name, const std::string& text) {
  auto v = protocol::parse_json(text);
  if (!v) return corrupt_row("cron_jobs", name, "spec: " + v.error().describe());
  auto spec = protocol::cron_job_from_json(*v, "spec");
  if (!spec) return corrupt_row("cron_jobs", name, spec.error().describe());
  if (spec->name != name)
    return corrupt_row("cron_jobs", name, "spec.name: '" + spec->name + "' is not the row's name");
  return std::move(*spec);
}

constexpr const char* k_job_cols =
    "name, source, spec, enabled, next_run, coalesce(claim_owner, ''), coalesce(claim_until, 0), "
    "fence, coalesce(last_status, ''), last_run, created_at, updated_at";

result<cron_job_row> decode_job(SQLite::Statement& q) {
  cron_job_row r;
  auto name = q.getColumn(0).getString();
  auto spec = decode_spec(name, q.getColumn(2).getString());
  if (!spec) return spec.error();
  r.spec = std::move(*spec);
  r.spec.enabled = q.getColumn(3).getInt() != 0;
  r.source = q.getColumn(1).getString();
  if (!q.getColumn(4).isNull()) r.next_run = q.getColumn(4).getInt64();
  r.claim_owner = q.getColumn(5).getString();
  r.claim_until = q.getColumn(6).getInt64();
  r.fence = q.getColumn(7).getInt64();
  r.last_status = q.getColumn(8).getString();
  if (!q.getColumn(9).isNull()) r.last_run = q.getColumn(9).getInt64();
  r.created_at = q.getColumn(10).getInt64();
  r.updated_at = q.getColumn(11).getInt64();
  return r;
}

result<cron_run_row> decode_run(SQLite::Statement& q) {
  cron_run_row r;
  r.id = job_id(q.getColumn(0).getString());
  const auto& key = r.id.str();
  r.state = q.getColumn(1).getString();
  auto payload = protocol::parse_json(q.getColumn(2).getString());
  if (!payload || !payload->is_object())
    return corrupt_row("tasks", key, "payload: not a JSON object");
  const auto& p = payload->as_object();
  if (auto* v = p.if_contains("job"); v && v->is_string()) r.job = std::string(v->as_string());
  if (auto* v = p.if_contains("occurrence"); v && v->is_int64()) r.occurrence = v->as_int64();
  if (auto* v = p.if_contains("attempt"); v && v->is_int64())
    r.attempt = static_cast<int>(v->as_int64());
  if (!q.getColumn(3).isNull()) {
    auto c = protocol::parse_json(q.getColumn(3).getString());
    if (!c || !c->is_object()) return corrupt_row("tasks", key, "completion: not a JSON object");
    const auto& o = c->as_object();
    if (auto* v = o.if_contains("status"); v && v->is_string())
      r.status = std::string(v->as_string());
    if (auto* v = o.if_contains("exit"); v && v->is_int64())
      r.exit = static_cast<int>(v->as_int64());
    if (auto* v = o.if_contains("duration_ms"); v && v->is_int64()) r.duration_ms = v->as_int64();
    if (auto* v = o.if_contains("output"); v && v->is_string())
      r.output = std::string(v->as_string());
    if (auto* v = o.if_contains("error"); v && v->is_string())
      r.error = std::string(v->as_string());
    if (auto* v = o.if_contains("attempts"); v && v->is_int64())
      r.attempt = static_cast<int>(v->as_int64()) - 1;
  }
  r.owner = q.getColumn(4).getString();
  r.created_at = q.getColumn(5).getInt64();
  r.updated_at = q.getColumn(6).getInt64();
  return r;
}

/// Deletes a job's terminal runs beyond the newest `keep`, with their receipts.
void prune_runs(SQLite::Database& db, const std::string& job, std::size_t keep) {
  static constexpr const char* k_old =
      "SELECT id FROM tasks WHERE thread = ? AND kind = 'cron_run' AND state NOT IN "
      "('admitted','running') ORDER BY json_extract(payload, '$.occurrence') DESC, id DESC "
      "LIMIT -1 OFFSET ?";
  static const std::string k_receipts =
      std::string("DELETE FROM receipts WHERE task_id IN (") + k_old + ")";
  static const std::string k_tasks = std::string("DELETE FROM tasks WHERE id IN (") + k_old + ")";
  auto& r = cached_statement(db, k_receipts.c_str());
  r.bind(1, thread_of(job));
  r.bind(2, static_cast<std::int64_t>(keep));
  r.exec();
  auto& t = cached_statement(db, k_tasks.c_str());
  t.bind(1, thread_of(job));
  t.bind(2, static_cast<std::int64_t>(keep));
  t.exec();
}

/// Inserts the run task of `job`'s `occurrence` (admitted) unless it exists.
void insert_run(SQLite::Database& db, const std::string& job, std::int64_t occurrence,
                std::int64_t fence, const std::string& owner, std::int64_t lease_until,
                const protocol::cron_job_spec& spec) {
  auto id = cron_run_id(job, occurrence);
  owner_scope scope;
  scope.tenant = protocol::tenant_id("default");
  scope.thread = session_id(thread_of(job));
  scope.turn = protocol::turn_id(std::to_string(occurrence));
  json::object payload{
      {"job", job},
      {"occurrence", occurrence},
      {"fence", fence},
      {"attempt", 0},
      {"agent", spec.agent},
      {"action", spec.kind == protocol::cron_action_kind::shell ? "shell" : "prompt"}};
  auto& st = cached_statement(
      db,
      "INSERT OR IGNORE INTO tasks (id, kind, state, tenant, thread, turn, scope, payload, owner, "
      "lease_until, created_at, updated_at) VALUES (?, 'cron_run', 'admitted', ?, ?, ?, ?, ?, ?, "
      "?, ?, ?)");
  auto now = now_ms();
  st.bind(1, id.str());
  st.bind(2, scope.tenant.str());
  st.bind(3, scope.thread.str());
  st.bind(4, scope.turn.str());
  st.bind(5, stored_json(protocol::to_json(scope), "the cron run's scope"));
  st.bind(6, stored_json(payload, "the cron run's payload"));
  st.bind(7, owner);
  st.bind(8, lease_until);
  st.bind(9, now);
  st.bind(10, now);
  st.exec();
}

/// The terminal transition of a run, with its completion and a receipt that
/// nobody is owed (a run's record is its row; it reaches no inbox).
bool finish_run(SQLite::Database& db, const job_id& task, const std::string& state,
                const json::object& completion) {
  terminal_write w;
  w.task = task;
  w.kind = "cron_run";
  w.state = state;
  w.transition = transition_of_word(state);
  w.completion = protocol::to_text(completion);  // terminal_transition checks it
  auto st = completion.if_contains("status");
  w.receipt_body = "cron run " + task.str() + ": " +
                   (st && st->is_string() ? std::string(st->as_string()) : state);
  w.receipt_state = "dropped";
  return terminal_transition(db, w).has_value();
}

}  // namespace

// ---- reads ----

result<std::vector<cron_job_row>> task_reader::cron_jobs() {
  return read_all<cron_job_row>(
      readers_, std::string("SELECT ") + k_job_cols + " FROM cron_jobs ORDER BY name",
      "reading cron jobs", {}, decode_job);
}

result<std::optional<cron_job_row>> task_reader::cron_job(const std::string& name) {
  return first_of(read_all<cron_job_row>(
      readers_, std::string("SELECT ") + k_job_cols + " FROM cron_jobs WHERE name = ?",
      "reading cron job " + name, {name}, decode_job));
}

result<std::vector<cron_run_row>> task_reader::cron_runs(const std::string& job) {
  return read_all<cron_run_row>(
      readers_,
      "SELECT id, state, payload, completion, coalesce(owner, ''), created_at, updated_at FROM "
      "tasks WHERE thread = ? AND kind = 'cron_run' ORDER BY json_extract(payload, "
      "'$.occurrence') DESC, id DESC",
      "reading the runs of cron job " + job, {thread_of(job)}, decode_run);
}

result<std::optional<std::int64_t>> task_reader::cron_next_wake() {
  try {
    auto c = readers_.acquire();
    auto& q = c.statement(
        "SELECT min(x) FROM (SELECT min(next_run) AS x FROM cron_jobs WHERE enabled = 1 AND "
        "claim_owner IS NULL UNION ALL SELECT min(claim_until) FROM cron_jobs WHERE enabled = 1 "
        "AND claim_owner IS NOT NULL)");
    std::optional<std::int64_t> out;
    if (q.executeStep() && !q.getColumn(0).isNull()) out = q.getColumn(0).getInt64();
    q.reset();
    return out;
  } catch (const std::exception& e) {
    return read_error("reading the next cron wake", e);
  }
}

// ---- writes ----

namespace {

void upsert_job(SQLite::Database& db, const cron_job_row& row) {
  auto& st = cached_statement(
      db,
      "INSERT INTO cron_jobs (name, source, spec, enabled, next_run, fence, created_at, "
      "updated_at) VALUES (?, ?, ?, ?, ?, 0, ?, ?) ON CONFLICT (name) DO UPDATE SET spec = "
      "excluded.spec, enabled = excluded.enabled, next_run = excluded.next_run, updated_at = "
      "excluded.updated_at");
  auto now = now_ms();
  st.bind(1, row.spec.name);
  st.bind(2, row.source);
  st.bind(3, stored_json(protocol::to_json(row.spec), "cron job '" + row.spec.name + "'"));
  st.bind(4, row.spec.enabled ? 1 : 0);
  if (row.next_run)
    st.bind(5, *row.next_run);
  else
    st.bind(5);
  st.bind(6, now);
  st.bind(7, now);
  st.exec();
}

std::optional<std::string> source_of(SQLite::Database& db, const std::string& name) {
  auto& q = cached_statement(db, "SELECT source FROM cron_jobs WHERE name = ?");
  q.bind(1, name);
  std::optional<std::string> out;
  if (q.executeStep()) out = q.getColumn(0).getString();
  q.reset();
  return out;
}

}  // namespace

awaitable<result<void>> task_store::cron_put(cron_job_row row) {
  auto name = "put cron job " + row.spec.name;
  auto fn = [row = std::move(row)](SQLite::Database& db) -> result<void> {
    auto src = source_of(db, row.spec.name);
    if (src && *src != row.source)
      return error{errc::conflict, "cron job '" + row.spec.name + "' already exists from the " +
                                       *src + " source; it was kept and nothing was written"};
    upsert_job(db, row);
    return {};
  };
  co_return co_await w_.write(std::move(name), 1024, std::move(fn));
}

awaitable<result<bool>> task_store::cron_remove(std::string name) {
  auto what = "remove cron job " + name;
  auto fn = [name = std::move(name)](SQLite::Database& db) -> result<bool> {
    auto& st = cached_statement(db, "DELETE FROM cron_jobs WHERE name = ?");
    st.bind(1, name);
    return st.exec() == 1;
  };
  co_return co_await w_.write(std::move(what), 128, std::move(fn));
}

awaitable<result<bool>> task_store::cron_set_enabled(std::string name, bool enabled,
                                                     std::optional<std::int64_t> next_run) {
  auto what = std::string(enabled ? "enable" : "disable") + " cron job " + name;
  auto fn = [name = std::move(name), enabled, next_run](SQLite::Database& db) -> result<bool> {
    auto& st = cached_statement(
        db,
        "UPDATE cron_jobs SET enabled = ?, next_run = ?, spec = json_set(spec, '$.enabled', "
        "json(?)), updated_at = ? WHERE name = ?");
    st.bind(1, enabled ? 1 : 0);
    if (next_run)
      st.bind(2, *next_run);
    else
      st.bind(2);
    st.bind(3, enabled ? "true" : "false");
    st.bind(4, now_ms());
    st.bind(5, name);
    return st.exec() == 1;
  };
  co_return co_await w_.write(std::move(what), 128, std::move(fn));
}

awaitable<result<task_store::reconciled>> task_store::cron_reconcile(
    std::vector<cron_job_row> rows) {
  std::size_t bytes = 256 * rows.size() + 256;
  auto fn = [rows = std::move(rows)](SQLite::Database& db) -> result<reconciled> {
    reconciled out;
    std::set<std::string> names;
    for (const auto& r : rows) {
      names.insert(r.spec.name);
      auto& q = cached_statement(db, "SELECT source, spec FROM cron_jobs WHERE name = ?");
      q.bind(1, r.spec.name);
      std::optional<std::pair<std::string, std::string>> have;
      if (q.executeStep()) have.emplace(q.getColumn(0).getString(), q.getColumn(1).getString());
      q.reset();
      if (have && have->first != "config")
        throw error_exception(error{
            errc::conflict, "schedule file: job '" + r.spec.name +
                                "' is also a runtime job; the file was not applied and every job "
                                "was kept as it was"});
      auto text = protocol::to_text(protocol::to_json(r.spec));
      if (!have) {
        upsert_job(db, r);
        out.added.push_back(r.spec.name);
      } else if (have->second != text) {
        upsert_job(db, r);
        out.changed.push_back(r.spec.name);
      }
    }
    auto& q = cached_statement(db, "SELECT name FROM cron_jobs WHERE source = 'config'");
    std::vector<std::string> gone;
    while (q.executeStep()) {
      auto n = q.getColumn(0).getString();
      if (!names.count(n)) gone.push_back(std::move(n));
    }
    q.reset();
    for (auto& n : gone) {
      auto& d = cached_statement(db, "DELETE FROM cron_jobs WHERE name = ?");
      d.bind(1, n);
      d.exec();
      out.removed.push_back(std::move(n));
    }
    return out;
  };
  co_return co_await w_.write("reconcile the schedule file", bytes, std::move(fn));
}

awaitable<result<std::vector<cron_claim>>> task_store::cron_claim_due(std::int64_t now,
                                                                      std::string owner,
                                                                      std::int64_t lease_until,
                                                                      int limit) {
  auto fn = [now, owner = std::move(owner), lease_until,
             limit](SQLite::Database& db) -> result<std::vector<cron_claim>> {
    struct due {
      std::string name, spec;
      std::int64_t next_run, fence;
    };
    std::vector<due> found;
    // Unclaimed jobs whose next run is due, then claims whose lease expired:
    // each through its own partial index, so claimed jobs are never walked.
    for (const char* sql :
         {"SELECT name, spec, next_run, fence FROM cron_jobs WHERE enabled = 1 AND claim_owner IS "
          "NULL AND next_run <= ? ORDER BY next_run, name LIMIT ?",
          "SELECT name, spec, next_run, fence FROM cron_jobs WHERE enabled = 1 AND claim_owner IS "
          "NOT NULL AND claim_until <= ? AND next_run IS NOT NULL ORDER BY claim_until, name "
          "LIMIT ?"}) {
      int room = limit - static_cast<int>(found.size());
      if (room <= 0) break;
      auto& q = cached_statement(db, sql);
      q.bind(1, now);
      q.bind(2, room);
      while (q.executeStep())
        found.push_back({q.getColumn(0).getString(), q.getColumn(1).getString(),
                         q.getColumn(2).getInt64(), q.getColumn(3).getInt64()});
      q.reset();
    }
    std::vector<cron_claim> out;
    for (auto& d : found) {
      auto spec = decode_spec(d.name, d.spec);
      if (!spec) return spec.error();  // refused by name; nothing of this pass is claimed
      auto& cas = cached_statement(
          db,
          "UPDATE cron_jobs SET claim_owner = ?, claim_until = ?, fence = fence + 1, updated_at "
          "= ? WHERE name = ? AND fence = ? AND next_run = ?");
      cas.bind(1, owner);
      cas.bind(2, lease_until);
      cas.bind(3, now_ms());
      cas.bind(4, d.name);
      cas.bind(5, d.fence);
      cas.bind(6, d.next_run);
      if (cas.exec() != 1) continue;
      cron_claim c;
      c.spec = std::move(*spec);
      c.occurrence = d.next_run;
      c.fence = d.fence + 1;
      c.task = cron_run_id(d.name, d.next_run);
      auto& q = cached_statement(
          db,
          "SELECT state, coalesce(json_extract(payload, '$.attempt'), 0) FROM tasks WHERE id = "
          "? AND kind = 'cron_run'");
      q.bind(1, c.task.str());
      std::optional<std::pair<std::string, int>> have;
      if (q.executeStep()) have.emplace(q.getColumn(0).getString(), q.getColumn(1).getInt());
      q.reset();
      if (!have) {
        insert_run(db, d.name, d.next_run, c.fence, owner, lease_until, c.spec);
      } else if (have->first == "admitted" || have->first == "running") {
        auto& up = cached_statement(
            db,
            "UPDATE tasks SET payload = json_set(payload, '$.fence', ?), owner = ?, lease_until "
            "= ?, updated_at = ? WHERE id = ?");
        up.bind(1, c.fence);
        up.bind(2, owner);
        up.bind(3, lease_until);
        up.bind(4, now_ms());
        up.bind(5, c.task.str());
        up.exec();
        c.reclaimed = true;
        c.attempt = have->second;
      } else {
        // The occurrence already has a terminal run: it is never run again.
        // The claim is released, and the scheduler moves the job on.
        auto& rel = cached_statement(
            db, "UPDATE cron_jobs SET claim_owner = NULL, claim_until = NULL WHERE name = ?");
        rel.bind(1, d.name);
        rel.exec();
        c.attempt = -1;
      }
      out.push_back(std::move(c));
    }
    return out;
  };
  co_return co_await w_.write("claim due cron jobs", 512, std::move(fn));
}

awaitable<result<std::vector<std::string>>> task_store::cron_renew(
    std::string owner, std::int64_t lease_until,
    std::vector<std::pair<std::string, std::int64_t>> claims) {
  auto fn = [owner = std::move(owner), lease_until,
             claims = std::move(claims)](SQLite::Database& db) -> result<std::vector<std::string>> {
    std::vector<std::string> lost;
    for (const auto& [name, fence] : claims) {
      auto& st = cached_statement(
          db,
          "UPDATE cron_jobs SET claim_until = ? WHERE name = ? AND fence = ? AND claim_owner = ?");
      st.bind(1, lease_until);
      st.bind(2, name);
      st.bind(3, fence);
      st.bind(4, owner);
      if (st.exec() != 1) lost.push_back(name);
    }
    return lost;
  };
  co_return co_await w_.write("renew cron claims", 64, std::move(fn));
}

awaitable<result<bool>> task_store::cron_attempt(std::string job, std::int64_t fence,
                                                 std::string owner, job_id task, int attempt) {
  auto what = "cron attempt " + std::to_string(attempt) + " of " + task.str();
  auto fn = [job = std::move(job), fence, owner = std::move(owner), task = std::move(task),
             attempt](SQLite::Database& db) -> result<bool> {
    auto& st = cached_statement(
        db,
        "UPDATE tasks SET state = 'running', payload = json_set(payload, '$.attempt', ?), "
        "updated_at = ? WHERE id = ? AND kind = 'cron_run' AND state IN ('admitted','running') "
        "AND EXISTS (SELECT 1 FROM cron_jobs WHERE name = ? AND fence = ? AND claim_owner = ?)");
    st.bind(1, attempt);
    st.bind(2, now_ms());
    st.bind(3, task.str());
    st.bind(4, job);
    st.bind(5, fence);
    st.bind(6, owner);
    return st.exec() == 1;
  };
  co_return co_await w_.write(std::move(what), 128, std::move(fn));
}

awaitable<result<bool>> task_store::cron_complete(cron_completion c) {
  auto what = "complete cron run " + c.task.str();
  std::size_t bytes = c.output.size() + c.error.size() + 512;
  auto fn = [c = std::move(c)](SQLite::Database& db) -> result<bool> {
    {
      auto& q = cached_statement(
          db, "SELECT fence, coalesce(claim_owner, '') FROM cron_jobs WHERE name = ?");
      q.bind(1, c.job);
      std::optional<std::pair<std::int64_t, std::string>> have;
      if (q.executeStep()) have.emplace(q.getColumn(0).getInt64(), q.getColumn(1).getString());
      q.reset();
      if (have && (have->first != c.fence || have->second != c.owner))
        return error{errc::conflict, "cron run " + c.task.str() + ": its claim (fencing token " +
                                         std::to_string(c.fence) +
                                         ") is stale (the job's token is " +
                                         std::to_string(have->first) +
                                         "); its completion was refused and nothing was written"};
    }
    json::object completion{{"status", c.status},
                            {"duration_ms", c.duration_ms},
                            {"attempts", c.attempts},
                            {"output", c.output}};
    if (c.exit) completion["exit"] = *c.exit;
    if (!c.error.empty()) completion["error"] = c.error;
    if (!finish_run(db, c.task, c.state, completion)) return false;
    prune_runs(db, c.job, c.keep_runs);
    if (c.after == cron_after::remove) {
      auto& d = cached_statement(db, "DELETE FROM cron_jobs WHERE name = ?");
      d.bind(1, c.job);
      d.exec();
      return true;
    }
    auto& up = cached_statement(
        db,
        "UPDATE cron_jobs SET claim_owner = NULL, claim_until = NULL, last_status = ?, last_run "
        "= (SELECT json_extract(payload, '$.occurrence') FROM tasks WHERE id = ?), next_run = ?, "
        "enabled = CASE WHEN ? THEN 0 ELSE enabled END, spec = CASE WHEN ? THEN json_set(spec, "
        "'$.enabled', json('false')) ELSE spec END, updated_at = ? WHERE name = ?");
    bool disable = c.after == cron_after::disable;
    up.bind(1, c.status);
    up.bind(2, c.task.str());
    if (!disable && c.next_run)
      up.bind(3, *c.next_run);
    else
      up.bind(3);
    up.bind(4, disable ? 1 : 0);
    up.bind(5, disable ? 1 : 0);
    up.bind(6, now_ms());
    up.bind(7, c.job);
    up.exec();
    return true;
  };
  co_return co_await w_.write(std::move(what), bytes, std::move(fn));
}

awaitable<result<bool>> task_store::cron_advance(std::string job, std::int64_t expected,
                                                 std::optional<std::int64_t> next_run, bool disable,
                                                 std::optional<std::string> skipped_why,
                                                 std::size_t keep_runs) {
  auto what = "advance cron job " + job;
  auto fn = [job = std::move(job), expected, next_run, disable, why = std::move(skipped_why),
             keep_runs](SQLite::Database& db) -> result<bool> {
    auto& up = cached_statement(
        db,
        "UPDATE cron_jobs SET next_run = ?, enabled = CASE WHEN ? THEN 0 ELSE enabled END, spec "
        "= CASE WHEN ? THEN json_set(spec, '$.enabled', json('false')) ELSE spec END, "
        "last_status = CASE WHEN ? THEN 'skipped' ELSE last_status END, last_run = CASE WHEN ? "
        "THEN next_run ELSE last_run END, updated_at = ? WHERE name = ? AND next_run = ? AND "
        "claim_owner IS NULL");
    if (next_run && !disable)
      up.bind(1, *next_run);
    else
      up.bind(1);
    up.bind(2, disable ? 1 : 0);
    up.bind(3, disable ? 1 : 0);
    up.bind(4, why ? 1 : 0);
    up.bind(5, why ? 1 : 0);
    up.bind(6, now_ms());
    up.bind(7, job);
    up.bind(8, expected);
    if (up.exec() != 1) return false;
    if (why) {
      auto& q = cached_statement(db, "SELECT spec FROM cron_jobs WHERE name = ?");
      q.bind(1, job);
      std::string spec_text;
      if (q.executeStep()) spec_text = q.getColumn(0).getString();
      q.reset();
      auto spec = decode_spec(job, spec_text);
      if (!spec) return spec.error();
      insert_run(db, job, expected, 0, "", 0, *spec);
      json::object completion{{"status", "skipped"},
                              {"duration_ms", 0},
                              {"attempts", 0},
                              {"output", ""},
                              {"error", *why}};
      finish_run(db, cron_run_id(job, expected), "cancelled", completion);
      prune_runs(db, job, keep_runs);
    }
    return true;
  };
  co_return co_await w_.write(std::move(what), 256, std::move(fn));
}

awaitable<result<int>> task_store::cron_clear_claims(std::vector<std::string> owners) {
  auto fn = [owners = std::move(owners)](SQLite::Database& db) -> result<int> {
    int n = 0;
    for (const auto& o : owners) {
      auto& st = cached_statement(
          db, "UPDATE cron_jobs SET claim_owner = NULL, claim_until = NULL WHERE claim_owner = ?");
      st.bind(1, o);
      n += st.exec();
    }
    return n;
  };
  co_return co_await w_.write("clear stale cron claims", 64, std::move(fn));
}

}  // namespace tether::persistence
