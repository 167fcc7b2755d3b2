#include "tether/persistence/schema.hpp"

namespace tether::persistence {

const std::vector<std::string>& migrations() {
  static const std::vector<std::string> steps = {
      // 1: sessions, their transcript, the job outbox and the parent inbox.
      R"sql(
CREATE TABLE sessions (
  id              TEXT PRIMARY KEY,
  parent_id       TEXT,                 -- NULL for top-level sessions and forks
  parent_notify   INTEGER,              -- NULL = default (on); 0 silences the link
  description     TEXT NOT NULL DEFAULT '',
  agent           TEXT NOT NULL DEFAULT 'general',
  status          TEXT NOT NULL DEFAULT 'idle' CHECK (status IN ('idle','busy')),
  time_suspended  INTEGER,              -- the claim: set while a busy period is open
  resume_attempts INTEGER NOT NULL DEFAULT 0,
  idle_outcome    TEXT,
  time_idle       INTEGER,
  seq             INTEGER NOT NULL DEFAULT 0,  -- last durable sequence number
  revert_staged   INTEGER NOT NULL DEFAULT 0,
  input_cursor    INTEGER NOT NULL DEFAULT 0,  -- inputs up to here were settled
  created_at      INTEGER NOT NULL
);
CREATE INDEX sessions_parent ON sessions(parent_id);

CREATE TABLE messages (
  session_id TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
  seq        INTEGER NOT NULL,
  role       TEXT NOT NULL,             -- user | assistant
  kind       TEXT NOT NULL,             -- prompt | steer | report | answer | control
  status     TEXT NOT NULL,             -- completed | error
  payload    TEXT NOT NULL,             -- JSON
  PRIMARY KEY (session_id, seq)
) WITHOUT ROWID;

CREATE TABLE jobs (
  id              TEXT PRIMARY KEY,
  notification_id TEXT NOT NULL UNIQUE,
  kind            TEXT NOT NULL,        -- subagent | shell
  mode            TEXT NOT NULL,        -- background | none
  parent_id       TEXT,                 -- who is owed the report
  child_id        TEXT,                 -- whose busy period it reports
  generation      INTEGER NOT NULL DEFAULT 0,
  status          TEXT NOT NULL,        -- running | completed | error | cancelled
  body            TEXT,                 -- the rendered report once terminal
  payload         TEXT NOT NULL DEFAULT '{}',
  created_at      INTEGER NOT NULL,
  updated_at      INTEGER NOT NULL
);
CREATE INDEX jobs_child ON jobs(child_id);

CREATE TABLE inbox (
  session_id      TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
  notification_id TEXT NOT NULL,
  from_session    TEXT,
  body            TEXT NOT NULL,
  state           TEXT NOT NULL DEFAULT 'pending',  -- pending | acked
  admitted_seq    INTEGER NOT NULL,
  admitted_at     INTEGER NOT NULL,
  PRIMARY KEY (session_id, notification_id)
) WITHOUT ROWID;
-- take_inbox reads only pending rows, in admission order.
CREATE INDEX inbox_pending ON inbox(session_id, admitted_seq, admitted_at, notification_id)
  WHERE state = 'pending';
)sql",
      // 2: owned jobs and their receipts (issue 5). A session gets a tenant, its
      // current turn, whether its turns may launch background jobs, and what a
      // turn does while jobs it owns still run (withhold: its busy period stays
      // open until they end; report_now: it settles and the receipts come later).
      R"sql(
ALTER TABLE sessions ADD COLUMN tenant TEXT NOT NULL DEFAULT 'default';
ALTER TABLE sessions ADD COLUMN turn TEXT;
ALTER TABLE sessions ADD COLUMN job_notify INTEGER NOT NULL DEFAULT 1;
ALTER TABLE sessions ADD COLUMN job_policy TEXT NOT NULL DEFAULT 'withhold'
  CHECK (job_policy IN ('withhold','report_now'));

-- One row per job the queue owns, whatever channel launched it. The owner
-- scope is written before the command is dispatched.
CREATE TABLE owned_jobs (
  id          TEXT PRIMARY KEY,
  tenant      TEXT NOT NULL,
  thread      TEXT NOT NULL,
  turn        TEXT NOT NULL,
  scope       TEXT NOT NULL,            -- JSON owner scope (tenant, thread, turn, sandbox, generation)
  state       TEXT NOT NULL,            -- admitted | running | completed | failed | cancelled | lost
  command     TEXT NOT NULL,            -- JSON: the scrubbed preview and the launch channel
  completion  TEXT,                     -- JSON shell completion once terminal
  created_at  INTEGER NOT NULL,
  updated_at  INTEGER NOT NULL
);
CREATE INDEX owned_jobs_live ON owned_jobs(state) WHERE state IN ('admitted','running');
CREATE INDEX owned_jobs_turn ON owned_jobs(thread, turn);

-- A receipt per job transition, id '<job>/<transition>'. pending: owed to its
-- owner; acked: delivered; read: the owner read it through a status call, so
-- it is not delivered; dropped: refused on reload (other scope, older generation).
CREATE TABLE receipts (
  id          TEXT PRIMARY KEY,
  job_id      TEXT NOT NULL,
  transition  TEXT NOT NULL,
  scope       TEXT NOT NULL,
  body        TEXT NOT NULL,
  state       TEXT NOT NULL,
  created_at  INTEGER NOT NULL,
  updated_at  INTEGER NOT NULL
);
CREATE INDEX receipts_pending ON receipts(created_at, id) WHERE state = 'pending';
CREATE INDEX receipts_job ON receipts(job_id);

-- The sandbox generation this host is bound to, per sandbox.
CREATE TABLE sandboxes (
  id          TEXT PRIMARY KEY,
  generation  INTEGER NOT NULL,
  bound_at    INTEGER NOT NULL
);
)sql",
      // 3: the inbox keeps admission order. Rows admitted together share
      // admitted_seq and admitted_at; admitted_ord (per session, increasing)
      // keeps the order they were admitted in, which is the outbox order.
      R"sql(
ALTER TABLE inbox ADD COLUMN admitted_ord INTEGER NOT NULL DEFAULT 0;
UPDATE inbox SET admitted_ord = o.ord FROM (
  SELECT session_id AS s, notification_id AS n, row_number() OVER (
    PARTITION BY session_id ORDER BY admitted_seq, admitted_at, notification_id) AS ord
  FROM inbox) AS o
WHERE inbox.session_id = o.s AND inbox.notification_id = o.n;
DROP INDEX inbox_pending;
CREATE INDEX inbox_pending ON inbox(session_id, admitted_ord) WHERE state = 'pending';
CREATE INDEX inbox_order ON inbox(session_id, admitted_ord);
)sql",
      // 4: one task store. Every piece of background work is a row of `tasks`,
      // whatever its kind, with one state vocabulary (admitted, running,
      // completed, failed, cancelled, lost, timed_out); receipts name their task.
      // The v3 rows move over unchanged in meaning: a `jobs` row becomes a
      // subagent or local_shell task ('error' is now 'failed'), an `owned_jobs`
      // row a shell task. An unknown word is carried over as it is, so that
      // boot's validation refuses it by name instead of the migration hiding it.
      R"sql(
CREATE TABLE tasks (
  id              TEXT PRIMARY KEY,
  kind            TEXT NOT NULL,        -- subagent | local_shell (history since step 6) | shell (room for delegate, cron_run, sop_run)
  state           TEXT NOT NULL,        -- admitted | running | completed | failed | cancelled | lost | timed_out
  tenant          TEXT,                 -- the owner scope's columns, for kinds launched under a scope (shell)
  thread          TEXT,
  turn            TEXT,
  scope           TEXT,                 -- JSON owner scope (tenant, thread, turn, sandbox, generation)
  parent_id       TEXT,                 -- subagent: the session owed the report
  child_id        TEXT,                 -- subagent: whose busy period it reports; local_shell: its owner
  notification_id TEXT UNIQUE,          -- subagent, local_shell: the inbox id of its report or notice
  mode            TEXT,                 -- subagent, local_shell: background | none
  generation      INTEGER NOT NULL DEFAULT 0,
  body            TEXT,                 -- subagent: the rendered report once terminal, until delivered
  payload         TEXT NOT NULL DEFAULT '{}',  -- JSON: subagent {description}; shell {preview, channel}
  completion      TEXT,                 -- shell: JSON completion once terminal
  created_at      INTEGER NOT NULL,
  updated_at      INTEGER NOT NULL
);
INSERT INTO tasks (id, kind, state, parent_id, child_id, notification_id, mode, generation, body,
                   payload, created_at, updated_at)
  SELECT id, CASE kind WHEN 'shell' THEN 'local_shell' ELSE kind END,
         CASE status WHEN 'error' THEN 'failed' ELSE status END,
         parent_id, child_id, notification_id, mode, generation, body, payload, created_at,
         updated_at
  FROM jobs;
INSERT INTO tasks (id, kind, state, tenant, thread, turn, scope, payload, completion, created_at,
                   updated_at)
  SELECT id, 'shell', state, tenant, thread, turn, scope, command, completion, created_at,
         updated_at
  FROM owned_jobs;
DROP TABLE jobs;
DROP TABLE owned_jobs;
CREATE INDEX tasks_child ON tasks(child_id);
CREATE INDEX tasks_live ON tasks(state) WHERE state IN ('admitted','running');
CREATE INDEX tasks_turn ON tasks(thread, turn);
ALTER TABLE receipts RENAME COLUMN job_id TO task_id;
)sql",
      // 5: the terminal receipt is a subagent report's only outbox. Until
      // now a terminal subagent row was its own outbox (deleted once its
      // report was delivered), and rows written before subagent receipts
      // existed, or minted at settle (mode none), have no terminal receipt:
      // each terminal subagent row still on disk owes its report, so it gets
      // a pending terminal receipt, bound to its parent's scope when it has no
      // `started` receipt to copy it from. From now on delivered rows stay.
      R"sql(
INSERT OR IGNORE INTO receipts (id, task_id, transition, scope, body, state, created_at, updated_at)
  SELECT t.id || '/' || CASE t.state WHEN 'completed' THEN 'completed'
                                     WHEN 'failed' THEN 'failed' ELSE 'cancelled' END,
         t.id,
         CASE t.state WHEN 'completed' THEN 'completed'
                      WHEN 'failed' THEN 'failed' ELSE 'cancelled' END,
         coalesce((SELECT r.scope FROM receipts r WHERE r.id = t.id || '/started'),
                  json_object('tenant', coalesce(p.tenant, 'default'),
                              'thread', coalesce(t.parent_id, ''),
                              'turn', coalesce(p.turn, ''), 'sandbox', '', 'generation', 0)),
         coalesce(t.body, ''), 'pending', t.updated_at, t.updated_at
  FROM tasks t LEFT JOIN sessions p ON p.id = t.parent_id
  WHERE t.kind = 'subagent' AND t.state IN ('completed', 'failed', 'cancelled')
    AND NOT EXISTS (SELECT 1 FROM receipts r WHERE r.task_id = t.id AND r.transition != 'started');
)sql",
      // 6: no local shells. A host without a configured sandbox now runs its
      // shells as owned jobs of a local daemon; the previous build ran them
      // itself (`local_shell` rows, deleted once their notice was admitted).
      // A row still running here belongs to a process this build cannot
      // follow (it never wrote a result anywhere this build reads), so it
      // becomes `lost` and its owner gets one notice saying so, admitted into
      // its inbox under the shell's id (the id its notice would have had: a
      // repeat is dropped by the inbox's key) in the same transaction, after
      // everything admitted before; boot wakes the owner for it. The notice
      // is fixed text and the minted id only: the command, never scrubbed on
      // disk, is left out. A notice already admitted stays in the inbox and is
      // drained as before; an owner that is gone admits nothing.
      R"sql(
INSERT OR IGNORE INTO inbox (session_id, notification_id, from_session, body, admitted_seq,
                             admitted_at, admitted_ord)
  SELECT t.child_id, t.notification_id, NULL,
         '[tether] background job ' || t.id || ' ended with unknown status' || char(10) ||
           'status: exit -1 (unknown: it ran as a local shell under a previous build of tether, ' ||
           'which did not keep its result; it was not run again)' || char(10),
         s.seq, CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER),
         (SELECT coalesce(max(i.admitted_ord), 0) FROM inbox i WHERE i.session_id = t.child_id) +
           row_number() OVER (PARTITION BY t.child_id ORDER BY t.created_at, t.id)
  FROM tasks t JOIN sessions s ON s.id = t.child_id
  WHERE t.kind = 'local_shell' AND t.state IN ('admitted', 'running');
UPDATE tasks SET state = 'lost', updated_at = CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)
  WHERE kind = 'local_shell' AND state IN ('admitted', 'running');
)sql",
      // 7: tasks and receipts stay after delivery now, so every b-tree a
      // settle writes grows with history and costs pages in each commit.
      // Both tables become WITHOUT ROWID (their text key is the only key:
      // one b-tree fewer per row), the index by child keeps only running
      // tasks (every lookup by child asks for that, and children interleave,
      // so a full index took a random leaf per settle), and the index by
      // turn keeps only tasks launched under a scope (subagent tasks have no
      // thread).
      R"sql(
CREATE TABLE tasks_v6 (
  id              TEXT PRIMARY KEY,
  kind            TEXT NOT NULL,
  state           TEXT NOT NULL,
  tenant          TEXT,
  thread          TEXT,
  turn            TEXT,
  scope           TEXT,
  parent_id       TEXT,
  child_id        TEXT,
  notification_id TEXT UNIQUE,
  mode            TEXT,
  generation      INTEGER NOT NULL DEFAULT 0,
  body            TEXT,
  payload         TEXT NOT NULL DEFAULT '{}',
  completion      TEXT,
  created_at      INTEGER NOT NULL,
  updated_at      INTEGER NOT NULL
) WITHOUT ROWID;
INSERT INTO tasks_v6 (id, kind, state, tenant, thread, turn, scope, parent_id, child_id,
                      notification_id, mode, generation, body, payload, completion, created_at,
                      updated_at)
  SELECT id, kind, state, tenant, thread, turn, scope, parent_id, child_id, notification_id, mode,
         generation, body, payload, completion, created_at, updated_at
  FROM tasks;
DROP TABLE tasks;
ALTER TABLE tasks_v6 RENAME TO tasks;
CREATE INDEX tasks_child_running ON tasks(child_id) WHERE state = 'running';
CREATE INDEX tasks_live ON tasks(state) WHERE state IN ('admitted','running');
CREATE INDEX tasks_turn ON tasks(thread, turn) WHERE thread IS NOT NULL;
CREATE TABLE receipts_v6 (
  id          TEXT PRIMARY KEY,
  task_id     TEXT NOT NULL,
  transition  TEXT NOT NULL,
  scope       TEXT NOT NULL,
  body        TEXT NOT NULL,
  state       TEXT NOT NULL,
  created_at  INTEGER NOT NULL,
  updated_at  INTEGER NOT NULL
) WITHOUT ROWID;
INSERT INTO receipts_v6 (id, task_id, transition, scope, body, state, created_at, updated_at)
  SELECT id, task_id, transition, scope, body, state, created_at, updated_at FROM receipts;
DROP TABLE receipts;
ALTER TABLE receipts_v6 RENAME TO receipts;
CREATE INDEX receipts_pending ON receipts(created_at, id) WHERE state = 'pending';
CREATE INDEX receipts_task ON receipts(task_id);
)sql",
      // 8: delegated tasks (docs/delegation.md). A task records the process
      // that owns it (`owner`: pid, its start time, the boot id and a
      // process nonce) and, while running, a heartbeat lease. A settlement
      // intent is written before a terminal artifact is published and
      // deleted by the transaction that promotes it: recovery finds the
      // ones a crash left and finishes or fails them.
      R"sql(
ALTER TABLE tasks ADD COLUMN owner TEXT;
ALTER TABLE tasks ADD COLUMN lease_until INTEGER;
CREATE TABLE IF NOT EXISTS settlement_intents (
  task_id     TEXT PRIMARY KEY,
  owner       TEXT NOT NULL,
  state       TEXT NOT NULL,
  artifact    TEXT,
  digest      TEXT,
  error       TEXT,
  bytes       INTEGER NOT NULL DEFAULT 0,
  created_at  INTEGER NOT NULL
) WITHOUT ROWID;
)sql",
      // 9: subagent policy and goals (docs/policy.md). A session records its
      // effective policy (JSON; NULL: the host's default, for sessions made
      // before this step), its depth below its top-level session, and the
      // root whose action budget it spends (NULL: its own), and the task
      // its work is counted against (a delegate's session). A task may
      // belong to a goal (a task of kind `goal`) and carries the model usage
      // its agent reported.
      R"sql(
ALTER TABLE sessions ADD COLUMN policy TEXT;
ALTER TABLE sessions ADD COLUMN depth INTEGER NOT NULL DEFAULT 0;
ALTER TABLE sessions ADD COLUMN budget_root TEXT;
ALTER TABLE sessions ADD COLUMN task_id TEXT;
ALTER TABLE tasks ADD COLUMN goal_id TEXT;
ALTER TABLE tasks ADD COLUMN input_tokens INTEGER NOT NULL DEFAULT 0;
ALTER TABLE tasks ADD COLUMN output_tokens INTEGER NOT NULL DEFAULT 0;
CREATE INDEX IF NOT EXISTS tasks_goal ON tasks(goal_id) WHERE goal_id IS NOT NULL;
)sql",
      // 10: scheduled work (docs/cron.md). A job's definition, its next
      // occurrence and the claim on it live in `cron_jobs` (a definition is
      // not background work; its runs are: each due occurrence runs as one
      // task of kind `cron_run`, id `cron-<job>-<occurrence>`, thread
      // `cron:<job>`). A claim records its claimant, its lease and the
      // fencing token it incremented.
      R"sql(
CREATE TABLE IF NOT EXISTS cron_jobs (
  name         TEXT PRIMARY KEY,
  source       TEXT NOT NULL,     -- config | runtime
  spec         TEXT NOT NULL,     -- JSON cron_job_spec (protocol/cron.hpp)
  enabled      INTEGER NOT NULL DEFAULT 1,
  next_run     INTEGER,           -- ms since the epoch; NULL: no occurrence left
  claim_owner  TEXT,              -- the claimant's process identity; NULL: unclaimed
  claim_until  INTEGER,           -- the claim's lease
  fence        INTEGER NOT NULL DEFAULT 0,
  last_status  TEXT,
  last_run     INTEGER,
  created_at   INTEGER NOT NULL,
  updated_at   INTEGER NOT NULL
) WITHOUT ROWID;
-- Two partial indexes, so neither finding due jobs nor the next wake walks
-- the claimed ones: unclaimed jobs by next run, claimed ones by lease.
CREATE INDEX IF NOT EXISTS cron_jobs_due ON cron_jobs(next_run)
  WHERE enabled = 1 AND claim_owner IS NULL;
CREATE INDEX IF NOT EXISTS cron_jobs_leases ON cron_jobs(claim_until)
  WHERE enabled = 1 AND claim_owner IS NOT NULL;
)sql",
      // 11: SOP runs (docs/sop.md). A run is a task of kind `sop_run`
      // (thread `sop:<sop>`), its progression (the definition it was started
      // with, the step, visits, the wait) in its payload, its execution
      // claim in owner/lease_until; each step that does work is a child task
      // of kind `sop_step`. Every save of a task that carries a revision is a
      // compare-and-set on it. A run's events are its history in the run
      // store; the audit log (who approved what, when) is a separate
      // surface, never read to decide a run's state.
      R"sql(
ALTER TABLE tasks ADD COLUMN revision INTEGER NOT NULL DEFAULT 0;
CREATE TABLE IF NOT EXISTS task_events (
  task_id   TEXT NOT NULL,
  seq       INTEGER NOT NULL,
  at        INTEGER NOT NULL,
  revision  INTEGER NOT NULL,
  kind      TEXT NOT NULL,
  actor     TEXT NOT NULL,
  detail    TEXT NOT NULL,
  PRIMARY KEY (task_id, seq)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS audit_log (
  id       INTEGER PRIMARY KEY,
  at       INTEGER NOT NULL,
  actor    TEXT NOT NULL,
  action   TEXT NOT NULL,
  subject  TEXT NOT NULL,
  detail   TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS tasks_sop_live ON tasks(thread, created_at)
  WHERE kind = 'sop_run' AND state IN ('admitted','running');
)sql",
      // 12: the SOP engine's reads walk only the rows they are about
      // (bench_sop found each loop pass reading every live run: quadratic in
      // a backlog). Claimable runs (phase pending or running) by age, so a
      // claim stops at its limit; live claims by SOP and lease, so the cap
      // counts only held claims; approval waits by deadline, so the timeout
      // sweep and the next wake read only the waits. A run's phase and wait
      // live in its payload, hence the expressions; a query uses an index
      // only with the same terms (persistence/task_store_sop.cpp).
      R"sql(
CREATE INDEX IF NOT EXISTS tasks_sop_claimable ON tasks(created_at, id)
  WHERE kind = 'sop_run' AND state IN ('admitted','running')
    AND json_extract(payload, '$.phase') IN ('pending','running');
CREATE INDEX IF NOT EXISTS tasks_sop_claims ON tasks(thread, lease_until)
  WHERE kind = 'sop_run' AND state IN ('admitted','running') AND owner IS NOT NULL;
CREATE INDEX IF NOT EXISTS tasks_sop_waits ON tasks(json_extract(payload, '$.wait.deadline'))
  WHERE kind = 'sop_run' AND state IN ('admitted','running')
    AND json_extract(payload, '$.phase') = 'waiting_approval';
)sql",
      // 13: a task's receipts by task and transition. Boot's check that a
      // terminal subagent task has its terminal receipt (its validation, once
      // per task) reads the index alone instead of each receipt's row; the
      // reads by task (receipts_of) use it as they used receipts(task_id).
      R"sql(
DROP INDEX IF EXISTS receipts_task;
CREATE INDEX receipts_task ON receipts(task_id, transition);
)sql",
      // 14: the transcript becomes a rowid table (its key, (session_id, seq),
      // stays, as an index). WITHOUT ROWID kept each row inside its session's
      // range of the key: sessions that run at once append to as many places
      // in the table, and each append rewrote a leaf of whole rows (and split
      // it every few rows; interior pages of such a table hold whole rows
      // too). A rowid table appends every row to its last page, and the key's
      // index takes the random leaf, with entries of a few dozen bytes. In
      // bench_latency's open loop (1,000 children, its WAL read page by
      // page) a report's commits wrote 11.7 pages, 7.2 of them the
      // transcript's; now 6.3 and 2.5. SQLite's own advice: WITHOUT ROWID
      // suits rows of at most about 1/20 of a page, and a model's messages
      // are larger.
      R"sql(
CREATE TABLE messages_v14 (
  session_id TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
  seq        INTEGER NOT NULL,
  role       TEXT NOT NULL,
  kind       TEXT NOT NULL,
  status     TEXT NOT NULL,
  payload    TEXT NOT NULL,
  PRIMARY KEY (session_id, seq)
);
INSERT INTO messages_v14 (session_id, seq, role, kind, status, payload)
  SELECT session_id, seq, role, kind, status, payload FROM messages ORDER BY session_id, seq;
DROP TABLE messages;
ALTER TABLE messages_v14 RENAME TO messages;
)sql",
  };
  return steps;
}

const step_check* check_before_step(int step) {
  // Step 14 copies every message under the foreign key its new table
  // declares: a message whose session is gone would fail the copy.
  static const step_check messages_have_sessions{
      "messages",
      "SELECT m.session_id || '/' || m.seq FROM messages m "
      "WHERE NOT EXISTS (SELECT 1 FROM sessions s WHERE s.id = m.session_id) LIMIT 1",
      "session_id: no such session"};
  return step == 14 ? &messages_have_sessions : nullptr;
}

}  // namespace tether::persistence
