// `tether inspect DB [--json]`: what a database holds, read-only.
#include <SQLiteCpp/Database.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <boost/json.hpp>
#include <fstream>
#include <sstream>

#include "catch_result.hpp"
#include "sandbox_support.hpp"
#include "support.hpp"
#include "tether/persistence/task_store.hpp"
#include "tether/protocol/report.hpp"

using namespace tether;
using namespace tether::persistence;
namespace json = boost::json;

namespace {

const std::string k_tether = std::string(TETHER_BIN_DIR) + "/tether";

template <class T>
T await(boost::asio::awaitable<T> a) {
  return test::run(std::move(a));
}

session_row child_row(const std::string& id, const std::string& parent,
                      std::optional<bool> notify = {}) {
  session_row r;
  r.id = session_id(id);
  r.parent = session_id(parent);
  r.notify = notify;
  r.description = id + " work";
  return r;
}

job_row running_job(const std::string& id, const std::string& nid, const std::string& parent,
                    const std::string& child) {
  job_row j;
  j.id = job_id(id);
  j.nid = notification_id(nid);
  j.parent = session_id(parent);
  j.child = session_id(child);
  j.description = child + " work";
  return j;
}

const std::string k_owed_body =
    "<subagent sessionID=\"done\" state=\"completed\" description=\"done work\">\nAll "
    "done.\n</subagent>";
const std::string k_inbox_body =
    "<subagent sessionID=\"worker\" state=\"completed\" description=\"worker "
    "work\">\nEarlier.\n</subagent>";

// A database at rest with one of everything inspect shows: a busy child with
// a claim, a resume and a running job; an idle child whose report is owed; a
// silent child; and a pending report in the parent's inbox.
std::string seed_database(const test::scratch_dir& dir) {
  auto path = dir.file("tether.db");
  auto w = writer::open(db_options{path});
  REQUIRE(w);
  task_store store(**w, path);
  session_row top;
  top.id = session_id("parent");
  top.description = "the parent";
  REQUIRE(await(store.create_session(top)));
  REQUIRE(await(store.spawn(child_row("worker", "parent"), session_id("worker"), "go",
                            running_job("job_w", "msg_w", "parent", "worker"))));
  REQUIRE(await(store.begin_busy(session_id("worker"))));
  REQUIRE(await(store.bump_resume(session_id("worker"))));
  REQUIRE(await(store.spawn(child_row("done", "parent"), session_id("done"), "go",
                            running_job("job_d", "msg_d", "parent", "done"))));
  settle_request req;
  req.child = session_id("done");
  req.background_job = job_id("job_d");
  req.body = k_owed_body;
  auto settled = await(store.settle(req));
  REQUIRE(settled);
  REQUIRE(settled->row_written);
  // A report already delivered: its task stays, terminal, and is owed no more.
  REQUIRE(await(store.spawn(child_row("shipped", "parent"), session_id("shipped"), "go",
                            running_job("job_s", "msg_s", "parent", "shipped"))));
  settle_request shipped;
  shipped.child = session_id("shipped");
  shipped.background_job = job_id("job_s");
  shipped.body = "shipped report";
  REQUIRE(await(store.settle(shipped)));
  std::vector<report_item> delivered{
      {notification_id("msg_s"), session_id("shipped"), "shipped report"}};
  REQUIRE(await(store.admit(session_id("parent"), delivered)));
  REQUIRE(await(store.spawn(child_row("quiet", "parent", false), session_id("quiet"), "hush", {})));
  std::vector<report_item> items{{notification_id("msg_old"), session_id("worker"), k_inbox_body}};
  REQUIRE(await(store.admit(session_id("parent"), items)));
  (*w)->stop();
  return path;
}

const json::object* find_by(const json::array& a, const char* key, const std::string& v) {
  for (auto& e : a)
    if (e.as_object().at(key).as_string() == v) return &e.as_object();
  return nullptr;
}

}  // namespace

TEST_CASE("inspect --json shows sessions, owed reports, every task and inboxes", "[inspect]") {
  test::scratch_dir dir("inspect-json");
  auto path = seed_database(dir);
  auto r = test::run_captured({k_tether, "inspect", path, "--json"});
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  auto doc = json::parse(r.output).as_object();
  CHECK(doc.at("database").as_string() == path);
  CHECK(doc.at("schema_version").as_int64() == latest_schema_version());

  auto& sessions = doc.at("sessions").as_array();
  REQUIRE(sessions.size() == 5);
  auto* worker = find_by(sessions, "id", "worker");
  REQUIRE(worker);
  CHECK(worker->at("parent").as_string() == "parent");
  CHECK(worker->at("notify").is_null());
  CHECK(worker->at("state").as_string() == "busy");
  CHECK(worker->at("claim").is_int64());
  CHECK(worker->at("resume_attempts").as_int64() == 1);
  CHECK(worker->at("seq").as_int64() == 1);
  auto* quiet = find_by(sessions, "id", "quiet");
  REQUIRE(quiet);
  CHECK(quiet->at("notify").as_bool() == false);
  CHECK(quiet->at("claim").is_null());
  auto* parent = find_by(sessions, "id", "parent");
  REQUIRE(parent);
  CHECK(parent->at("parent").is_null());
  CHECK(parent->at("state").as_string() == "idle");

  // Only msg_d is owed: msg_s's report was delivered (its receipt acknowledged).
  auto& owed = doc.at("owed_reports").as_array();
  REQUIRE(owed.size() == 1);
  CHECK(owed[0].as_object().at("notification_id").as_string() == "msg_d");
  CHECK(owed[0].as_object().at("state").as_string() == "completed");
  CHECK(owed[0].as_object().at("body").as_string() == k_owed_body);

  auto& tasks = doc.at("tasks").as_array();
  REQUIRE(tasks.size() == 3);
  auto* shipped = find_by(tasks, "id", "job_s");
  REQUIRE(shipped);
  CHECK(shipped->at("state").as_string() == "completed");
  auto* running = find_by(tasks, "id", "job_w");
  REQUIRE(running);
  CHECK(running->at("kind").as_string() == "subagent");
  CHECK(running->at("state").as_string() == "running");
  CHECK(running->at("owner").as_string() == "parent");
  CHECK(running->at("child").as_string() == "worker");
  CHECK(running->at("body").is_null());

  auto& inbox = doc.at("inbox").as_object();
  auto& rows = inbox.at("parent").as_array();
  REQUIRE(rows.size() == 2);
  CHECK(rows[0].as_object().at("notification_id").as_string() == "msg_s");
  CHECK(rows[1].as_object().at("notification_id").as_string() == "msg_old");
  CHECK(rows[1].as_object().at("from").as_string() == "worker");
  CHECK(rows[1].as_object().at("state").as_string() == "pending");
  CHECK(rows[1].as_object().at("body").as_string() == k_inbox_body);
  CHECK(inbox.at("worker").as_array().empty());
}

TEST_CASE("inspect does not list a delivered report as owed, only as a terminal task",
          "[inspect]") {
  test::scratch_dir dir("inspect-delivered");
  auto path = seed_database(dir);
  auto r = test::run_captured({k_tether, "inspect", path, "--json"});
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  auto doc = json::parse(r.output).as_object();
  CHECK_FALSE(find_by(doc.at("owed_reports").as_array(), "id", "job_s"));
  auto* task = find_by(doc.at("tasks").as_array(), "id", "job_s");
  REQUIRE(task);
  CHECK(task->at("state").as_string() == "completed");
  auto text = test::run_captured({k_tether, "inspect", path});
  CHECK(text.output.find("msg_s  shipped -> parent") == std::string::npos);
}

TEST_CASE("inspect prints the same as text", "[inspect]") {
  test::scratch_dir dir("inspect-text");
  auto path = seed_database(dir);
  auto r = test::run_captured({k_tether, "inspect", path});
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  for (auto* want : {"sessions (5)", "owed reports (1)", "msg_d  done -> parent  completed",
                     "      | All done.", "tasks (3)", "job_w ", "parent (2, 2 pending)",
                     "msg_old  from worker  pending", "      | Earlier."})
    CHECK(r.output.find(want) != std::string::npos);
}

TEST_CASE("inspect never writes: the database is byte-identical and never migrated", "[inspect]") {
  test::scratch_dir dir("inspect-ro");
  auto path = seed_database(dir);
  auto before = test::file_bytes(path);
  REQUIRE(test::run_captured({k_tether, "inspect", path}).exit_code == 0);
  REQUIRE(test::run_captured({k_tether, "inspect", path, "--json"}).exit_code == 0);
  CHECK(test::file_bytes(path) == before);

  // A tether database of an older schema version is refused, not migrated.
  {
    SQLite::Database db(path, SQLite::OPEN_READWRITE);
    db.exec("PRAGMA user_version = 0");
  }
  before = test::file_bytes(path);
  auto r = test::run_captured({k_tether, "inspect", path});
  INFO(r.output);
  CHECK(r.exit_code == 1);
  CHECK(r.output.find("its schema version 0 is older than this build's") != std::string::npos);
  CHECK(test::file_bytes(path) == before);
}

TEST_CASE("inspect refuses a file that is not a tether database, leaving it untouched",
          "[inspect]") {
  test::scratch_dir dir("inspect-foreign");
  auto text = dir.file("notes.txt");
  std::ofstream(text) << "just some notes\n";
  auto foreign = dir.file("other.db");
  {
    SQLite::Database db(foreign, SQLite::OPEN_READWRITE | SQLite::OPEN_CREATE);
    db.exec("CREATE TABLE t (x); INSERT INTO t VALUES (1)");
  }
  auto empty = dir.file("empty.db");
  std::ofstream(empty).close();
  struct one {
    std::string path, says;
  };
  for (auto& c : {one{text, "it is not a tether database (file is not a database"},
                  one{foreign, "it is not a tether database (application_id 0x00000000"},
                  one{empty, "it is empty, not a tether database"}}) {
    auto before = test::file_bytes(c.path);
    auto r = test::run_captured({k_tether, "inspect", c.path, "--json"});
    INFO(r.output);
    CHECK(r.exit_code == 1);
    CHECK(r.output.rfind("tether inspect: ", 0) == 0);
    CHECK(r.output.find(c.says) != std::string::npos);
    CHECK(r.output.find("the file was left untouched") != std::string::npos);
    CHECK(test::file_bytes(c.path) == before);
  }
  auto missing = dir.file("missing.db");
  auto r = test::run_captured({k_tether, "inspect", missing});
  CHECK(r.exit_code == 1);
  CHECK(r.output.find("no such file; nothing was created") != std::string::npos);
  CHECK_FALSE(std::filesystem::exists(missing));
}

TEST_CASE("inspect shows owned jobs with their owner scope and every receipt",
          "[inspect][delivery]") {
  test::sandbox_daemon daemon("inspect-owned-sbx");
  test::scratch_dir dir("inspect-owned");
  auto story = (dir.path() / "story").string();
  int st = test::run_process(
      {k_tether, "jobs-story", "--story", story, "--sandbox", daemon.options().state_dir});
  REQUIRE(WIFEXITED(st));
  REQUIRE(WEXITSTATUS(st) == 0);
  auto db = story + "/tether.db";
  auto before = test::file_bytes(db);
  auto out = test::run_captured({k_tether, "inspect", db, "--json"});
  REQUIRE(out.exit_code == 0);
  auto v = json::parse(out.output);
  auto& owned = v.at("tasks").as_array();
  REQUIRE(owned.size() == 3);
  for (auto& j : owned) {
    CHECK(j.at("kind").as_string() == "shell");
    CHECK(j.at("owner").as_string() == "ses_owner");
    CHECK(j.at("scope").at("thread").as_string() == "ses_owner");
    CHECK(j.at("scope").at("generation").as_int64() >= 1);
    CHECK(j.at("channel").as_string() == "tool");
  }
  auto& receipts = v.at("receipts").as_array();
  CHECK(receipts.size() == 6);  // started and one terminal receipt per job
  int pending = 0;
  for (auto& r : receipts) pending += r.at("state").as_string() == "pending";
  CHECK(pending == 0);
  auto text = test::run_captured({k_tether, "inspect", db});
  REQUIRE(text.exit_code == 0);
  CHECK(text.output.find("tasks (3)") != std::string::npos);
  CHECK(text.output.find("receipts (6, 0 pending)") != std::string::npos);
  CHECK(test::file_bytes(db) == before);  // read-only
}

TEST_CASE("a WAL database in a read-only directory is diagnosed as such, not as a foreign file",
          "[inspect]") {
  // A directory other users may read but not write, holding a WAL database
  // with no side files: SQLite cannot create its -shm there.
  std::string tmpl = (std::filesystem::temp_directory_path() / "tether-rodir-XXXXXX").string();
  REQUIRE(::mkdtemp(tmpl.data()));
  std::filesystem::path dir = tmpl;
  auto path = (dir / "tether.db").string();
  {
    auto w = writer::open(db_options{path});
    REQUIRE(w);
  }
  REQUIRE_FALSE(std::filesystem::exists(path + "-shm"));
  ::chmod(path.c_str(), 0644);
  ::chmod(dir.c_str(), 0555);
  auto before = test::file_bytes(path);
  // Root may write anywhere: the read then runs as an unprivileged user.
  int fds[2];
  REQUIRE(::pipe(fds) == 0);
  pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::close(fds[0]);
    if (::geteuid() == 0 && (::setgid(65534) != 0 || ::setuid(65534) != 0)) ::_exit(2);
    auto r = check_readable(path);
    std::string said = r ? std::string("readable") : r.error().message;
    [[maybe_unused]] auto n = ::write(fds[1], said.data(), said.size());
    ::_exit(0);
  }
  ::close(fds[1]);
  std::string said;
  char buf[512];
  ssize_t n;
  while ((n = ::read(fds[0], buf, sizeof buf)) > 0) said.append(buf, static_cast<std::size_t>(n));
  ::close(fds[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  auto after = test::file_bytes(path);
  ::chmod(dir.c_str(), 0755);
  std::filesystem::remove_all(dir);
  INFO(said);
  REQUIRE(WIFEXITED(status));
  REQUIRE(WEXITSTATUS(status) == 0);
  CHECK(said.find("not a tether database") == std::string::npos);
  CHECK(said.find("it is a WAL database") != std::string::npos);
  CHECK(said.find("is not writable by this user") != std::string::npos);
  CHECK(said.find("the file was left untouched") != std::string::npos);
  CHECK(after == before);
}
