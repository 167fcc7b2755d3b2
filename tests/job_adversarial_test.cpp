// Adversarial tests for the owned-job queue (seed 000; docs/design.md promises 2, 3
// and 5): strangers asking about a job they do not own, stale and foreign
// receipts on disk, persisted state that does not parse, a daemon replaced or
// gone while the host was down, an owner with no proven generation, and a job
// that finished while the host was down. Every job is a real process in a real
// tether-sandboxd; rows are tampered with through SQLite on a closed database.
#include <algorithm>
#include <atomic>
#include <fstream>
#include <map>

#include "delivery_support.hpp"
#include "jobs_story_support.hpp"
#include "tether/protocol/scope.hpp"

using namespace tether;
using namespace tether::test;
using Catch::Matchers::Contains;
using protocol::owner_scope;
using protocol::transition;

namespace {

// ---- agents ------------------------------------------------------------------------------

// An agent whose drains do nothing: prompting its session opens a turn.
void idle_agent(delivery_fixture& d, const std::string& s) {
  d.f.code(s)->fn = [](agent_context&, drain_input) -> boost::asio::awaitable<void> { co_return; };
}

// Prompts `s`, waits for the turn to settle and returns that turn's scope as
// the runtime supplies it.
owner_scope take_turn(delivery_fixture& d, const session_id& s, const std::string& text) {
  REQUIRE(d.sync(d.host().prompt(s, text)));
  REQUIRE(d.sync(d.host().wait_idle(s)));
  auto scope = d.host().scope_of(s);
  REQUIRE(scope);
  return *scope;
}

// Waits until no job is live, no delivery is in flight and nothing runs.
void settle_all(delivery_fixture& d) {
  d.sync(d.host().jobs().wait_idle());
  d.f.quiet();
}

owner_scope scope_of_job(delivery_fixture& d, const job_id& j) {
  auto r = d.host().store().job(j);
  REQUIRE(r);
  REQUIRE(*r);
  return (*r)->scope;
}

// A session "s" whose turn launched a `sleep 30` job, still running when the
// host shuts down (shutdown keeps the running row); returns the job's id.
job_id running_job_at_shutdown(delivery_fixture& d) {
  launcher l;
  l.install(d, "s", job("sleep 30"));
  auto s = d.session("s");
  REQUIRE(d.sync(d.host().prompt(s, "go")));
  auto j = l.id(d);
  REQUIRE(d.state_of(j) == owned_state::running);
  return j;
}

// ---- the sandbox daemon --------------------------------------------------------------------

// Stops the daemon and starts it again as the next generation of the same sandbox.
void replace_daemon(delivery_fixture& d) {
  d.daemon.stop();
  d.daemon.options().replace = true;
  d.daemon.start();
  d.daemon.options().replace = false;
}

boost::asio::awaitable<wire::hello_rep> hello_of(std::string socket) {
  auto c = co_await connect(socket, wire::conn_mode::read_only);
  auto h = c->hello();
  c->close();
  co_return h;
}

// Every job the daemon knows.
boost::asio::awaitable<std::vector<wire::job_summary>> daemon_jobs(std::string socket) {
  auto c = co_await connect(socket, wire::conn_mode::read_only);
  auto l = co_await c->list();
  REQUIRE(l.has_value());
  c->close();
  co_return l->jobs;
}

// True while the daemon still runs `j` (one it no longer knows, expired by
// its host after the terminal receipt, does not run).
boost::asio::awaitable<bool> daemon_runs(std::string socket, job_id j) {
  auto c = co_await connect(socket, wire::conn_mode::read_only);
  auto p = co_await c->poll(j);
  INFO("poll " << j.str() << ": " << (p ? std::string("ok") : p.error().message));
  if (!p && p.error().code == errc::not_found) co_return false;
  REQUIRE(p.has_value());
  c->close();
  co_return !p->has_value();
}

// Whether anything answers on `socket` (connecting never starts a daemon).
boost::asio::awaitable<bool> daemon_answers(std::string socket) {
  auto c = co_await sandbox::client::connect(socket, wire::conn_mode::read_only, "tether_tests");
  if (c) (*c)->close();
  co_return c.has_value();
}

// Follows `j` in the daemon (read-only, as an observer) until it ends.
boost::asio::awaitable<protocol::shell_completion> daemon_wait(std::string socket, job_id j) {
  auto c = co_await connect(socket, wire::conn_mode::read_only);
  auto done = co_await c->wait(j);
  INFO("wait " << j.str() << ": " << (done ? std::string("ok") : done.error().message));
  REQUIRE(done.has_value());
  c->close();
  co_return *done;
}

// ---- the database, with the host closed -----------------------------------------------------

std::string db_path(delivery_fixture& d) {
  return d.f.dir.file("tether.db");
}

void exec_sql(const std::string& db, const std::string& sql,
              const std::vector<std::string>& binds) {
  SQLite::Database c(db, SQLite::OPEN_READWRITE);
  SQLite::Statement st(c, sql);
  for (std::size_t i = 0; i < binds.size(); ++i) st.bind(static_cast<int>(i + 1), binds[i]);
  INFO(sql);
  REQUIRE(st.exec() == 1);
}

// One column of the row `id` of `table`, as text ("<none>" without such a row).
std::string column_of(const std::string& db, const std::string& table, const std::string& id,
                      const std::string& column) {
  SQLite::Database c(db, SQLite::OPEN_READWRITE);
  SQLite::Statement q(c, "SELECT " + column + " FROM " + table + " WHERE id = ?");
  q.bind(1, id);
  if (!q.executeStep()) return "<none>";
  return q.getColumn(0).getString();
}

// Every row of `table`, each column as its storage type and its bytes: equal
// dumps mean the table was not touched.
std::vector<std::string> dump(const std::string& db, const std::string& table) {
  SQLite::Database c(db, SQLite::OPEN_READWRITE);
  SQLite::Statement q(c, "SELECT * FROM " + table + " ORDER BY id");
  std::vector<std::string> rows;
  while (q.executeStep()) {
    std::string row;
    for (int i = 0; i < q.getColumnCount(); ++i) {
      auto col = q.getColumn(i);
      int type = col.getType();  // before any conversion
      std::string bytes = col.isNull() ? ""
                                       : std::string(static_cast<const char*>(col.getBlob()),
                                                     static_cast<std::size_t>(col.getBytes()));
      row += std::string(q.getColumnName(i)) + "(" + std::to_string(type) + ")=" + bytes + "|";
    }
    rows.push_back(std::move(row));
  }
  return rows;
}

std::map<std::string, std::vector<std::string>> dump_job_tables(const std::string& db) {
  return {{"tasks", dump(db, "tasks")},
          {"receipts", dump(db, "receipts")},
          {"sandboxes", dump(db, "sandboxes")}};
}

int lines_in(const std::string& path) {
  std::ifstream f(path);
  std::string all((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  return static_cast<int>(std::count(all.begin(), all.end(), '\n'));
}

bool warned(delivery_fixture& d, const std::string& a, const std::string& b) {
  std::lock_guard lk(d.f.m);
  for (auto& w : d.f.warnings)
    if (w.find(a) != std::string::npos && w.find(b) != std::string::npos) return true;
  return false;
}

std::string all_warnings(delivery_fixture& d) {
  std::lock_guard lk(d.f.m);
  std::string out;
  for (auto& w : d.f.warnings) out += "  " + w + "\n";
  return out;
}

}  // namespace

// ---- 1. only the owner ---------------------------------------------------------------------

TEST_CASE("a stranger asking about a job it does not own is told 'not found', and the job runs on",
          "[adversarial]") {
  delivery_fixture d("adv-stranger");
  idle_agent(d, "other-tenant");
  idle_agent(d, "other-thread");
  // Setting a tenant reopens the host, so the stranger sessions come first.
  auto tenant_b = d.session("other-tenant", "tenant-b");
  auto other_thread = d.session("other-thread");
  launcher l;
  l.install(d, "owner", job("sleep 30"));
  auto owner = d.session("owner");
  // report_now: the launching turn settles while its job runs, so the same
  // thread can take a second turn.
  REQUIRE(d.sync(d.host().set_job_policy(owner, true, "report_now")));
  auto first_turn = take_turn(d, owner, "build it");
  auto j = l.id(d);
  REQUIRE(d.state_of(j) == owned_state::running);
  auto second_turn = take_turn(d, owner, "anything else?");
  REQUIRE(second_turn.turn != first_turn.turn);

  auto forged = first_turn;  // the owner's thread and turn, under another tenant
  forged.tenant = protocol::tenant_id("tenant-b");
  struct stranger {
    std::string who;
    owner_scope scope;
  };
  std::vector<stranger> strangers = {
      {"a session of another tenant", take_turn(d, tenant_b, "hello")},
      {"another tenant naming the owner's thread and turn", forged},
      {"a later turn of the owner's thread", second_turn},
      {"another thread of the owner's tenant", take_turn(d, other_thread, "hello")},
  };

  // What a job that does not exist gets: the stranger must hear exactly this.
  auto ghost = d.sync(d.host().jobs().status(first_turn, job_id("job_never_launched")));
  REQUIRE_FALSE(ghost);
  REQUIRE(ghost.error().code == errc::not_found);
  REQUIRE(ghost.error().message == "job 'job_never_launched' not found");
  const std::string expected = "job '" + j.str() + "' not found";

  for (auto& s : strangers) {
    INFO("caller: " << s.who << " (tenant " << s.scope.tenant.str() << ", thread "
                    << s.scope.thread.str() << ", turn " << s.scope.turn.str()
                    << "); expected errc::not_found with \"" << expected << "\"");
    auto st = d.sync(d.host().jobs().status(s.scope, j));
    REQUIRE_FALSE(st);
    CHECK(st.error().code == errc::not_found);
    CHECK(st.error().message == expected);
    auto w = d.sync(d.host().jobs().wait(s.scope, j));
    REQUIRE_FALSE(w);
    CHECK(w.error().code == errc::not_found);
    CHECK(w.error().message == expected);
    auto c = d.sync(d.host().jobs().cancel(s.scope, j));
    REQUIRE_FALSE(c);
    CHECK(c.error().code == errc::not_found);
    CHECK(c.error().message == expected);
    auto stopped = d.sync(d.host().jobs().stop_turn(s.scope));
    REQUIRE(stopped);
    CHECK(*stopped == 0);
  }

  // Unaffected: still running in the queue and in the daemon, no cancelled receipt.
  {
    INFO("expected the job untouched by the strangers' calls");
    CHECK(d.state_of(j) == owned_state::running);
    CHECK(d.receipt_state_of(j, transition::cancelled) == "none");
    CHECK(d.receipts(j).size() == 1);  // `started` only
    CHECK(run(daemon_runs(d.daemon.socket(), j)));
    auto mine = d.sync(d.host().jobs().status(first_turn, j));
    REQUIRE(mine);
    CHECK(mine->state == owned_state::running);
  }

  // Its owner cleans it up.
  auto v = d.sync(d.host().jobs().cancel(first_turn, j));
  REQUIRE(v);
  CHECK(v->state == owned_state::cancelled);
  settle_all(d);
  CHECK(d.state_of(j) == owned_state::cancelled);
  CHECK(d.receipt_state_of(j, transition::cancelled) != "none");
  CHECK_FALSE(run(daemon_runs(d.daemon.socket(), j)));
  // Strangers' sessions never heard of it.
  CHECK(d.transcript_count("other-tenant", "notice", j.str()) == 0);
  CHECK(d.transcript_count("other-thread", "notice", j.str()) == 0);
}

// ---- 2. stale and foreign receipts ----------------------------------------------------------

TEST_CASE(
    "pending receipts of an older sandbox generation or of another tenant are dropped at boot, "
    "not delivered",
    "[adversarial]") {
  delivery_fixture d("adv-stale");
  launcher first, second;
  first.install(d, "s1", job("echo first-generation"));
  second.install(d, "s2", job("echo second-generation"));
  auto s1 = d.session("s1");
  auto s2 = d.session("s2");
  REQUIRE(d.sync(d.host().prompt(s1, "build")));
  REQUIRE(d.sync(d.host().wait_idle(s1)));
  auto j1 = first.id(d);
  REQUIRE(d.receipt_state_of(j1, transition::completed) == "acked");

  // The sandbox is replaced while the host is down; the next job binds the new generation.
  d.f.close();
  replace_daemon(d);
  d.f.open();
  REQUIRE(d.sync(d.host().prompt(s2, "build")));
  REQUIRE(d.sync(d.host().wait_idle(s2)));
  auto j2 = second.id(d);
  REQUIRE(d.receipt_state_of(j2, transition::completed) == "acked");
  auto scope1 = scope_of_job(d, j1);
  auto scope2 = scope_of_job(d, j2);
  REQUIRE(scope2.sandbox == scope1.sandbox);
  REQUIRE(scope2.generation == scope1.generation + 1);
  d.f.close();

  auto db = db_path(d);
  REQUIRE(column_of(db, "sandboxes", scope2.sandbox.str(), "generation") ==
          std::to_string(scope2.generation));
  // Its job's own scope, from the generation before the bound one.
  insert_receipt(db, j1, transition::lost, scope_text(scope1), "body-of-an-older-generation");
  // The current job, but another tenant than its owner.
  auto foreign = scope2;
  foreign.tenant = protocol::tenant_id("tenant-evil");
  insert_receipt(db, j2, transition::lost, scope_text(foreign), "body-of-another-tenant");
  // The current job, claiming the older generation.
  auto older = scope2;
  older.generation = scope1.generation;
  insert_receipt(db, j2, transition::failed, scope_text(older),
                 "body-of-the-current-job-older-gen");
  std::vector<protocol::event_id> stale = {protocol::make_event_id(j1, transition::lost),
                                           protocol::make_event_id(j2, transition::lost),
                                           protocol::make_event_id(j2, transition::failed)};

  d.f.open();
  settle_all(d);
  INFO("warnings:\n" << all_warnings(d));
  CHECK(d.f.boot.jobs.dropped == 3);
  CHECK(d.f.boot.jobs.redelivered == 0);
  CHECK(d.f.boot.jobs.warnings.size() == 3);
  for (auto& id : stale) {
    INFO("receipt " << id.str() << ": expected state 'dropped' and a warning naming it");
    auto r = d.host().store().receipt_by_id(id);
    REQUIRE(r);
    REQUIRE(*r);
    CHECK((*r)->state == receipt_state::dropped);
    CHECK(warned(d, id.str(), "dropped"));
  }
  for (auto s : {"s1", "s2"}) {
    INFO("session " << s << ": expected none of the stale bodies in its transcript or inbox");
    for (auto body : {"body-of-an-older-generation", "body-of-another-tenant",
                      "body-of-the-current-job-older-gen"}) {
      CHECK(d.transcript_count(s, "notice", body) == 0);
      for (auto& row : d.f.inbox(s)) CHECK(row.body.find(body) == std::string::npos);
    }
  }
  // The one whose scope is its job's own is refused for its generation alone.
  CHECK(warned(d, stale[0].str(), "older than the bound " + std::to_string(scope2.generation)));
  // The receipts that were delivered before stay as they were.
  CHECK(d.receipt_state_of(j1, transition::completed) == "acked");
  CHECK(d.receipt_state_of(j2, transition::completed) == "acked");
  CHECK(d.transcript_count("s1", "notice", j1.str()) == 1);
  CHECK(d.transcript_count("s2", "notice", j2.str()) == 1);
}

// ---- 3. persisted state that does not parse -------------------------------------------------

TEST_CASE(
    "persisted job state that does not parse refuses the boot and is left byte for byte as it was",
    "[adversarial]") {
  delivery_fixture d("adv-corrupt");
  auto gate = d.fifo("gate");
  launcher l;
  l.install(d, "s", job("cat " + gate));
  auto s = d.session("s");
  REQUIRE(d.sync(d.host().set_job_policy(s, true, "report_now")));
  REQUIRE(d.sync(d.host().prompt(s, "go")));
  REQUIRE(d.sync(d.host().wait_idle(s)));
  auto j = l.id(d);
  REQUIRE(d.state_of(j) == owned_state::running);
  auto scope = scope_of_job(d, j);
  d.f.close();
  auto db = db_path(d);

  std::string tampered, table, key, field, job_state_after = "running";
  SECTION("a shell task's scope cut off mid-JSON") {
    tampered = "tasks.scope cut off mid-JSON";
    exec_sql(db, "UPDATE tasks SET scope = substr(scope, 1, length(scope) / 2) WHERE id = ?",
             {j.str()});
    table = "tasks", key = j.str(), field = "scope";
  }
  SECTION("a shell task's state a word that is no state") {
    tampered = "tasks.state set to 'exploded'";
    exec_sql(db, "UPDATE tasks SET state = 'exploded' WHERE id = ?", {j.str()});
    table = "tasks", key = j.str(), field = "state", job_state_after = "exploded";
  }
  SECTION("a pending receipt whose scope is garbled") {
    tampered = "a pending receipt with a garbled scope";
    auto garbled = scope_text(scope);
    auto at = garbled.find("\"generation\":");
    REQUIRE(at != std::string::npos);
    garbled.replace(at, std::string("\"generation\":").size(), "\"generation\":\"one\",\"x\":");
    insert_receipt(db, j, transition::lost, garbled, "body-of-a-garbled-receipt");
    table = "receipts", key = protocol::make_event_id(j, transition::lost).str(), field = "scope";
  }
  SECTION("a receipt whose state is a word that is no state") {
    tampered = "receipts.state of the started receipt set to 'exploded'";
    auto started = protocol::make_event_id(j, transition::started).str();
    exec_sql(db, "UPDATE receipts SET state = 'exploded' WHERE id = ?", {started});
    table = "receipts", key = started, field = "state";
  }

  INFO("tampered: " << tampered << "; expected the boot to be refused");
  auto before = dump_job_tables(db);
  auto e = d.f.refused_boot();
  INFO("expected errc::corrupt naming table '" << table << "', key '" << key << "' and field '"
                                               << field << "'; got " << to_string(e.code) << ": "
                                               << e.message);
  CHECK(e.code == errc::corrupt);
  CHECK_THAT(e.message, Contains("table '" + table + "'"));
  CHECK_THAT(e.message, Contains("key '" + key + "'"));
  CHECK_THAT(e.message, Contains("': " + field + ":"));
  // Nothing was repaired, dropped or discarded.
  CHECK(dump_job_tables(db) == before);
  CHECK(column_of(db, "tasks", j.str(), "state") == job_state_after);
}

// ---- 4. the sandbox changed while the host was down ------------------------------------------

TEST_CASE(
    "a daemon replaced by a new generation while the host was down refuses the boot and keeps "
    "the owner",
    "[adversarial]") {
  delivery_fixture d("adv-replaced");
  auto j = running_job_at_shutdown(d);
  auto scope = scope_of_job(d, j);
  d.f.close();  // shutdown keeps the running row
  replace_daemon(d);
  auto now = run(hello_of(d.daemon.socket()));
  REQUIRE(now.sandbox == scope.sandbox);
  REQUIRE(now.generation == scope.generation + 1);

  auto e = d.f.refused_boot();
  INFO("got " << to_string(e.code) << ": " << e.message);
  CHECK(e.code == errc::refused);
  CHECK_THAT(e.message, Contains("'" + j.str() + "'"));
  CHECK_THAT(e.message, Contains("generation " + std::to_string(scope.generation) + ","));
  CHECK_THAT(e.message, Contains("generation " + std::to_string(now.generation)));
  CHECK_THAT(e.message, Contains("the outstanding owner was retained"));
  CHECK_THAT(e.message, Contains("no new work was started"));
  auto db = db_path(d);
  CHECK(column_of(db, "tasks", j.str(), "state") == "running");
  CHECK(column_of(db, "sandboxes", scope.sandbox.str(), "generation") ==
        std::to_string(scope.generation));
  // Nothing ran on the new generation.
  CHECK(run(daemon_jobs(d.daemon.socket())).empty());
}

TEST_CASE("a daemon that is gone while the host was down refuses the boot and keeps the owner",
          "[adversarial]") {
  delivery_fixture d("adv-gone");
  auto j = running_job_at_shutdown(d);
  auto scope = scope_of_job(d, j);
  d.f.close();
  d.daemon.stop();  // and not started again

  auto e = d.f.refused_boot();
  INFO("got " << to_string(e.code) << ": " << e.message);
  CHECK(e.code == errc::refused);
  CHECK_THAT(e.message, Contains("'" + j.str() + "'"));
  CHECK_THAT(e.message, Contains("generation " + std::to_string(scope.generation)));
  CHECK_THAT(e.message, Contains("cannot be reached"));
  CHECK_THAT(e.message, Contains("the outstanding owner was retained"));
  CHECK_THAT(e.message, Contains("no new work was started"));
  CHECK(column_of(db_path(d), "tasks", j.str(), "state") == "running");
  // Recovery never provisions: no daemon was started in its place.
  CHECK_FALSE(run(daemon_answers(sandbox::socket_path_for(d.daemon.options().state_dir))));
}

TEST_CASE(
    "recovery against a stopped daemon refuses the boot with a deadline error, and the boot "
    "after it resumes follows the job",
    "[adversarial][deadline]") {
  delivery_fixture d("adv-stopped");
  d.f.jobs.client.deadline = std::chrono::milliseconds(300);
  d.f.jobs.client.heartbeat = std::chrono::milliseconds(100);
  d.f.restart();
  auto j = running_job_at_shutdown(d);
  d.f.close();
  d.daemon.pause();  // the read-only connect lands in the listen backlog; hello waits

  auto e = d.f.refused_boot();
  INFO("got " << to_string(e.code) << ": " << e.message);
  CHECK(e.code == errc::refused);
  CHECK_THAT(e.message, Contains("'" + j.str() + "'"));
  CHECK_THAT(e.message, Contains("did not answer hello within 300 ms"));
  CHECK_THAT(e.message, Contains("the outstanding owner was retained"));
  CHECK(column_of(db_path(d), "tasks", j.str(), "state") == "running");

  d.daemon.resume();
  idle_agent(d, "s");  // the launcher of the first turn is gone
  // The live daemon's boot gets a deadline no loaded machine reaches.
  d.f.jobs.client.deadline = std::chrono::seconds(60);
  d.f.jobs.client.heartbeat = std::chrono::seconds(5);
  d.f.open();
  CHECK(d.f.boot.jobs.reattached == 1);
  CHECK(d.state_of(j) == owned_state::running);
  CHECK(run(daemon_runs(d.daemon.socket(), j)));
}

// ---- 5. no proven generation ----------------------------------------------------------------

TEST_CASE("a saved owner with no proven sandbox generation refuses the boot", "[adversarial]") {
  delivery_fixture d("adv-unproven");
  auto s = d.session("s");
  auto daemon = run(hello_of(d.daemon.socket()));
  d.f.close();
  // Admitted on a named sandbox, but generation 0: dispatch may or may not have happened.
  owner_scope o;
  o.tenant = protocol::tenant_id("default");
  o.thread = s;
  o.turn = protocol::turn_id("turn_unproven");
  o.sandbox = daemon.sandbox;
  o.generation = 0;
  auto db = db_path(d);
  exec_sql(
      db,
      "INSERT INTO tasks (id, kind, tenant, thread, turn, scope, state, payload, created_at, "
      "updated_at) VALUES ('job_unproven', 'shell', 'default', ?, 'turn_unproven', ?, 'admitted', "
      "'{\"preview\":\"make\",\"channel\":\"tool\"}', 1, 1)",
      {s.str(), scope_text(o)});

  auto e = d.f.refused_boot();
  INFO("got " << to_string(e.code) << ": " << e.message);
  CHECK(e.code == errc::refused);
  CHECK_THAT(e.message, Contains("'job_unproven'"));
  CHECK_THAT(e.message, Contains("no proven sandbox generation"));
  CHECK_THAT(e.message, Contains("the outstanding owner was retained"));
  CHECK_THAT(e.message, Contains("no new work was started"));
  CHECK(column_of(db, "tasks", "job_unproven", "state") == "admitted");
  CHECK(run(daemon_jobs(d.daemon.socket())).empty());
}

// ---- 6. finished while the host was down -----------------------------------------------------

TEST_CASE(
    "a job that finished while the host was down yields exactly one terminal receipt, "
    "delivered once",
    "[adversarial]") {
  delivery_fixture d("adv-finished-down");
  auto gate = d.fifo("gate");
  auto side = d.work + "/side-effect";
  launcher l;
  l.install(d, "s", job("cat " + gate + "; echo X >> " + side));
  auto s = d.session("s");
  REQUIRE(d.sync(d.host().prompt(s, "build")));
  auto j = l.id(d);
  REQUIRE(d.state_of(j) == owned_state::running);
  d.f.close();  // the turn was withholding its completion for the job

  d.release(gate);
  auto done = run(daemon_wait(d.daemon.socket(), j));
  REQUIRE(done.status.state == protocol::job_state::exited);
  REQUIRE(done.status.exit_code == 0);

  auto check_once = [&](const std::string& when) {
    INFO(when << ": expected one completed receipt, acknowledged, one notice and one side effect");
    auto rs = d.receipts(j);
    int terminal = 0;
    for (auto& r : rs)
      if (r.transition != transition::started) ++terminal;
    CHECK(terminal == 1);
    CHECK(rs.size() == 2);
    CHECK(d.state_of(j) == owned_state::completed);
    CHECK(d.receipt_state_of(j, transition::completed) == "acked");
    CHECK(d.transcript_count("s", "notice", j.str()) == 1);
    CHECK(lines_in(side) == 1);
  };

  d.f.open();
  CHECK(d.f.boot.jobs.finished_while_down == 1);
  CHECK(d.f.boot.jobs.reattached == 0);
  CHECK(d.f.boot.jobs.lost == 0);
  settle_all(d);
  check_once("after the first restart");

  d.f.restart();
  CHECK(d.f.boot.jobs.finished_while_down == 0);
  CHECK(d.f.boot.jobs.redelivered == 0);
  CHECK(d.f.boot.jobs.dropped == 0);
  settle_all(d);
  check_once("after the second restart");
}

TEST_CASE(
    "a job that ended longer than the old grace before its host came back yields its true "
    "receipt, and the host then expires the daemon's record",
    "[adversarial]") {
  delivery_fixture d("adv-down-long");
  auto gate = d.fifo("gate");
  launcher l;
  l.install(d, "s", job("cat " + gate + "; echo built-while-down"));
  auto s = d.session("s");
  REQUIRE(d.sync(d.host().prompt(s, "build")));
  auto j = l.id(d);
  REQUIRE(d.state_of(j) == owned_state::running);
  d.f.close();

  d.release(gate);
  auto done = run(daemon_wait(d.daemon.socket(), j));
  REQUIRE(done.status.exit_code == 0);
  // The host stays down 23 s: the daemon restarts in between and sees it so.
  d.daemon.stop();
  age_completed_record(d.daemon.options().state_dir, j, 23'000);
  d.daemon.start();

  d.f.open();
  CHECK(d.f.boot.jobs.finished_while_down == 1);
  CHECK(d.f.boot.jobs.lost == 0);
  settle_all(d);
  CHECK(d.state_of(j) == owned_state::completed);
  CHECK(d.receipt_state_of(j, transition::completed) == "acked");
  CHECK(d.transcript_count("s", "notice", "built-while-down") == 1);
  // The receipt is durable, so the daemon was told to drop its record.
  CHECK(run(daemon_jobs(d.daemon.socket())).empty());
}

// ---- 7. transport failures are not lost jobs --------------------------------------------------

namespace {

// Counts the queue's trace stages; `hit` is set once `stage` was traced `n`
// times, or at the first terminal transition (what a job written off too
// early shows), whichever comes first. Only while armed.
struct trace_waiter {
  trace_waiter(std::string s, int count) : stage(std::move(s)), n(count) {}
  std::string stage;
  int n;
  std::atomic<bool> armed{false};
  std::mutex m;
  std::map<std::string, int> seen;
  std::shared_ptr<runtime::one_shot<std::string>> hit = runtime::one_shot<std::string>::make();

  static void install(delivery_fixture& d, std::shared_ptr<trace_waiter> w) {
    d.f.jobs.trace = [w](const job_id&, std::string_view s) {
      if (!w->armed) return;
      int c;
      {
        std::lock_guard lk(w->m);
        c = ++w->seen[std::string(s)];
      }
      if ((s == w->stage && c >= w->n) || s == "terminal") w->hit->set(std::string(s));
    };
  }
  std::string wait(delivery_fixture& d) {
    return d.sync(hit->async_wait(boost::asio::use_awaitable));
  }
};

void short_deadline(delivery_fixture& d) {
  d.f.jobs.client.deadline = std::chrono::milliseconds(300);
  d.f.jobs.client.heartbeat = std::chrono::milliseconds(100);
}

}  // namespace

TEST_CASE(
    "an exec the stopped daemon never answered is sent again once it resumes: the job runs "
    "once and is never written lost",
    "[adversarial][reconnect]") {
  delivery_fixture d("adv-exec-retry");
  auto w = std::make_shared<trace_waiter>("dispatch_retry", 2);
  trace_waiter::install(d, w);
  short_deadline(d);
  d.f.restart();
  // A first job opens the platform route.
  launcher warm;
  warm.install(d, "warm", job("true"));
  auto sw = d.session("warm");
  REQUIRE(d.sync(d.host().prompt(sw, "go")));
  warm.id(d);
  settle_all(d);

  auto side = d.work + "/side-effect";
  launcher l;
  l.install(d, "s", job("echo ran >> " + side));
  auto s = d.session("s");
  w->armed = true;
  d.daemon.pause();  // the exec is written to the socket; nothing answers it
  REQUIRE(d.sync(d.host().prompt(s, "go")));
  auto stage = w->wait(d);
  INFO("expected the unanswered exec to be sent again, not the job settled");
  CHECK(stage == "dispatch_retry");

  d.daemon.resume();
  auto j = l.id(d);
  settle_all(d);
  CHECK(d.state_of(j) == owned_state::completed);
  CHECK(d.receipt_state_of(j, transition::completed) != "none");
  CHECK(d.receipt_state_of(j, transition::lost) == "none");
  CHECK(lines_in(side) == 1);  // sent more than once, run once
  CHECK(warned(d, j.str(), "the exec is sent again"));
}

TEST_CASE(
    "a follow whose daemon went away reconnects with backoff until it is back, and the job is "
    "never written lost",
    "[adversarial][reconnect]") {
  delivery_fixture d("adv-follow-retry");
  auto w = std::make_shared<trace_waiter>("follow_retry", 3);
  trace_waiter::install(d, w);
  d.f.restart();
  auto gate = d.fifo("gate");
  launcher l;
  l.install(d, "s", job("cat " + gate));
  auto s = d.session("s");
  REQUIRE(d.sync(d.host().prompt(s, "go")));
  auto j = l.id(d);
  REQUIRE(d.state_of(j) == owned_state::running);

  w->armed = true;
  d.daemon.crash();  // the connection drops; the job's process lives on
  auto stage = w->wait(d);
  INFO("expected the follow to keep reconnecting while no daemon answers");
  CHECK(stage == "follow_retry");

  d.daemon.start();  // the same sandbox and generation finds the job by its pid
  d.release(gate);
  settle_all(d);
  CHECK(d.state_of(j) == owned_state::completed);
  CHECK(d.receipt_state_of(j, transition::lost) == "none");
  CHECK(warned(d, j.str(), "a failed connection is not a failed job"));
}

TEST_CASE("the daemon's answer that a followed job is gone keeps its 'answered' mark",
          "[adversarial][reconnect]") {
  sandbox_daemon daemon("adv-answered");
  auto r =
      run([](std::string socket) -> boost::asio::awaitable<result<protocol::shell_completion>> {
        auto c = co_await connect(socket);
        co_return co_await c->wait(job_id("job-nobody-knows"));
      }(daemon.socket()));
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().code == errc::not_found);
  CHECK(r.error().answered);
}

// ---- 8. a live reconnect reaches another generation ------------------------------------------

TEST_CASE(
    "a live reconnect to a replaced daemon is refused: the followed job is not attached to the "
    "new generation and stays running for the next boot",
    "[adversarial][reconnect]") {
  launcher l;  // outlives the host: the session keeps calling its agent
  delivery_fixture d("adv-replaced-live");
  l.install(d, "s", job("sleep 30"));
  auto s = d.session("s");
  REQUIRE(d.sync(d.host().prompt(s, "go")));
  auto j = l.id(d);
  REQUIRE(d.state_of(j) == owned_state::running);
  auto scope = scope_of_job(d, j);
  replace_daemon(d);  // the follow's connection drops; the next daemon is generation + 1
  auto now = run(hello_of(d.daemon.socket()));
  REQUIRE(now.generation == scope.generation + 1);
  settle_all(d);  // the follow gave up on the foreign daemon (or, wrongly, settled the job)

  CHECK(d.state_of(j) == owned_state::running);
  CHECK(d.receipt_state_of(j, transition::lost) == "none");
  CHECK(warned(d, j.str(),
               "now answers as sandbox '" + now.sandbox.str() + "' generation " +
                   std::to_string(now.generation) + ", not sandbox '" + scope.sandbox.str() +
                   "' generation " + std::to_string(scope.generation)));
  CHECK(warned(d, j.str(), "was not attached to it"));
  auto sb = d.host().jobs().sandbox();
  REQUIRE(sb);
  CHECK(sb->second == scope.generation);
  CHECK(run(daemon_jobs(d.daemon.socket())).empty());

  d.f.close();
  // The host stays bound to the job's generation: its receipts are not made stale.
  CHECK(column_of(db_path(d), "sandboxes", scope.sandbox.str(), "generation") ==
        std::to_string(scope.generation));
  CHECK(column_of(db_path(d), "tasks", j.str(), "state") == "running");
}
