// The lifecycle table (persistence/lifecycle.hpp) and `tether inspect DB
// --lifecycle` / `--task ID`: every kind and every state word of its enum is
// listed, and one task is answered from its row as stored (the real binary,
// on a database written through the task store).
#include "tether/persistence/lifecycle.hpp"

#include <SQLiteCpp/Database.h>

#include <boost/json.hpp>
#include <catch2/catch.hpp>
#include <fstream>
#include <set>
#include <sstream>

#include "catch_result.hpp"
#include "support.hpp"
#include "tether/persistence/task_store.hpp"
#include "tether/runtime/clock.hpp"
#include "tether/runtime/owner_identity.hpp"

using namespace tether;
using namespace tether::persistence;
namespace json = boost::json;

namespace {

const std::string k_tether = std::string(TETHER_BIN_DIR) + "/tether";

template <class T>
T await(boost::asio::awaitable<T> a) {
  return test::run(std::move(a));
}

// Every word of a state enum, found the way a reader would: to_string() of
// each value until it says "unknown" (independently of lifecycle.cpp).
template <class E, class Word>
std::vector<std::string> words_of(Word word) {
  std::vector<std::string> out;
  for (int i = 0; i < 64; ++i) {
    auto e = static_cast<E>(i);
    if (to_string(e) == "unknown") break;
    out.push_back(word(e));
  }
  return out;
}

std::vector<std::string> delegate_words() {
  return words_of<delegate_state>([](delegate_state s) { return std::string(to_string(s)); });
}
std::vector<std::string> shell_words() {
  return words_of<owned_state>([](owned_state s) { return std::string(to_string(s)); });
}
// The words the cron scheduler and the SOP engine store (actors/cron.cpp,
// actors/sop.cpp), in the table's order: live words, then transitions'.
std::vector<std::string> cron_run_words() {
  return {"admitted", "running", "completed", "failed", "cancelled", "timed_out"};
}
std::vector<std::string> sop_run_words() {
  return {"admitted", "running", "completed", "failed", "cancelled"};
}
std::vector<std::string> sop_step_words() {
  return {"running", "completed", "failed", "cancelled", "lost", "timed_out"};
}
std::vector<std::string> subagent_words() {
  return words_of<job_status>([](job_status s) { return task_state_word(s); });
}

protocol::owner_scope scope_of(const std::string& thread, const std::string& turn) {
  protocol::owner_scope s;
  s.tenant = protocol::tenant_id("default");
  s.thread = session_id(thread);
  s.turn = protocol::turn_id(turn);
  return s;
}

delegate_task delegate_row(const std::string& id, const std::string& owner) {
  delegate_task t;
  t.id = job_id(id);
  t.scope = scope_of("origin", "turn_1");
  t.agent = "worker";
  t.preview = "summarise the logs";
  t.workspace = "/tmp/ws";
  t.depth = 2;
  t.owner = owner;
  t.lease_until = runtime::now_ms() + 3'600'000;
  return t;
}

const std::string k_digest = "sha256:" + std::string(64, 'a');

// A database at rest with a task of each kind this build runs:
//   del_live: a running delegate owned by this (live) test process, with a
//     settlement intent left;
//   del_gone: a delegate of a gone owner, settled lost (its receipt pending);
//   del_bad:  a running delegate whose owner identity does not parse;
//   job_sh:   a running shell launched under ses_owner's turn_7, its
//     preview longer than inspect shows;
//   job_sub:  a running subagent of parent `parent`, child `worker`.
std::string seed(const test::scratch_dir& dir) {
  auto path = dir.file("tether.db");
  auto w = writer::open(db_options{path});
  REQUIRE(w);
  task_store store(**w, path);
  session_row origin;
  origin.id = session_id("origin");
  REQUIRE(await(store.create_session(origin)));
  session_row parent;
  parent.id = session_id("parent");
  REQUIRE(await(store.create_session(parent)));

  auto me = runtime::to_string(runtime::current_process_identity());
  REQUIRE(await(store.admit_delegate(delegate_row("del_live", me))));
  settlement_intent i;
  i.task = job_id("del_live");
  i.owner = me;
  i.state = delegate_state::completed;
  i.artifact = "/tmp/ws/delegates/del_live.json";
  i.digest = k_digest;
  i.bytes = 42;
  auto wrote = await(store.write_intent(i));
  REQUIRE(wrote);
  REQUIRE(*wrote);

  auto gone = test::dead_owner();
  REQUIRE(await(store.admit_delegate(delegate_row("del_gone", gone))));
  auto lost =
      await(store.settle_delegate(job_id("del_gone"), gone, delegate_state::lost,
                                  "recovery: owner gone", "[delegated task del_gone lost]"));
  REQUIRE(lost);
  REQUIRE(*lost);
  REQUIRE(await(store.admit_delegate(delegate_row("del_bad", "v1:not-an-identity"))));

  owned_job sh;
  sh.id = job_id("job_sh");
  sh.scope = scope_of("ses_owner", "turn_7");
  sh.preview = "echo " + std::string(1000, 'x');
  sh.channel = "tool";
  REQUIRE(await(store.admit_job(sh)));
  auto running = await(store.mark_running(job_id("job_sh")));
  REQUIRE(running);
  REQUIRE(*running);

  session_row child;
  child.id = session_id("worker");
  child.parent = session_id("parent");
  child.description = "worker work";
  job_row j;
  j.id = job_id("job_sub");
  j.nid = notification_id("msg_sub");
  j.parent = session_id("parent");
  j.child = session_id("worker");
  j.description = "worker work";
  REQUIRE(await(store.spawn(child, session_id("worker"), "go", j)));
  (*w)->stop();
  return path;
}

bool has(const std::string& text, const std::string& want) {
  return text.find(want) != std::string::npos;
}

// The part of --lifecycle's text about one kind.
std::string section(const std::string& text, const std::string& kind) {
  auto at = text.find("\nkind " + kind + "\n");
  if (at == std::string::npos) return "";
  auto end = text.find("\nkind ", at + 1);
  return text.substr(at, end == std::string::npos ? std::string::npos : end - at);
}

}  // namespace

TEST_CASE(
    "the lifecycle table has every kind, every state of each kind's enum, and a meaning "
    "for each",
    "[lifecycle]") {
  std::set<std::string> kinds;
  for (auto& l : lifecycles()) {
    kinds.insert(std::string(l.kind));
    INFO(l.kind);
    REQUIRE(l.fields.size() == checklist_fields().size());
    for (std::size_t i = 0; i < l.fields.size(); ++i)
      CHECK(l.fields[i].field == checklist_fields()[i]);
    for (auto& s : l.states) {
      INFO(s.word);
      CHECK_FALSE(s.meaning.empty());
    }
  }
  CHECK(kinds == std::set<std::string>{"subagent", "shell", "delegate", "local_shell", "goal",
                                       "cron_run", "sop_run", "sop_step"});
  CHECK(state_words("delegate") == delegate_words());
  CHECK(state_words("shell") == shell_words());
  CHECK(state_words("subagent") == subagent_words());
  CHECK(state_words("goal") ==
        std::vector<std::string>{"running", "completed", "failed", "cancelled"});
  CHECK(state_words("cron_run") == cron_run_words());
  CHECK(state_words("sop_run") == sop_run_words());
  CHECK(state_words("sop_step") == sop_step_words());
  CHECK(lifecycle_of("sop_definition") == nullptr);  // not a task: no row pretends it is
}

TEST_CASE("inspect --lifecycle lists every kind with every state word of its enum", "[lifecycle]") {
  test::scratch_dir dir("lifecycle-table");
  auto path = seed(dir);
  auto r = test::run_captured({k_tether, "inspect", path, "--lifecycle"});
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  struct kind_words {
    std::string kind;
    std::vector<std::string> words;
  };
  for (auto& k : {kind_words{"delegate", delegate_words()}, kind_words{"shell", shell_words()},
                  kind_words{"subagent", subagent_words()},
                  kind_words{"local_shell", {"completed", "failed", "cancelled", "lost"}},
                  kind_words{"goal", {"running", "completed", "failed", "cancelled"}},
                  kind_words{"cron_run", cron_run_words()}, kind_words{"sop_run", sop_run_words()},
                  kind_words{"sop_step", sop_step_words()}}) {
    auto text = section(r.output, k.kind);
    INFO(k.kind);
    REQUIRE_FALSE(text.empty());
    for (auto& w : k.words) {
      INFO(w);
      CHECK(has(text, "\n    " + w + " "));
    }
    for (auto* line : {"owner:", "store:", "durability:", "cancel:", "in flight:", "waits:",
                       "recovery:", "delivery:", "fields:"})
      CHECK(has(text, line));
  }
  CHECK(has(section(r.output, "delegate"), "durability:  durably supervised"));
  CHECK(has(section(r.output, "subagent"), "durability:  restart-resumable"));
  CHECK(has(section(r.output, "subagent"), "recovery:    can duplicate a side effect"));
  CHECK(has(section(r.output, "shell"), "recovery:    cannot duplicate a side effect"));

  auto j = test::run_captured({k_tether, "inspect", path, "--lifecycle", "--json"});
  REQUIRE(j.exit_code == 0);
  auto doc = json::parse(j.output).as_object();
  auto& kinds = doc.at("lifecycles").as_array();
  REQUIRE(kinds.size() == 8);
  for (auto& k : kinds) {
    if (k.at("kind").as_string() != "delegate") continue;
    std::vector<std::string> words;
    for (auto& s : k.at("states").as_array()) words.emplace_back(s.at("word").as_string());
    CHECK(words == delegate_words());
    CHECK(k.at("fields").at("owner").at("source").as_string() == "row");
  }
}

TEST_CASE("inspect --task answers a running delegate: state, originator, owner alive, intent",
          "[lifecycle]") {
  test::scratch_dir dir("lifecycle-delegate");
  auto path = seed(dir);
  auto before = test::file_bytes(path);
  auto r = test::run_captured({k_tether, "inspect", path, "--task", "del_live"});
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  for (auto* want :
       {"task del_live in ", "kind:        delegate",
        "state:       running (live:", "lifecycle of delegate", "parent_id = absent (NULL)",
        "thread = origin", "turn = turn_1", "tenant = default", "payload.agent = worker",
        "payload.depth = 2", "depth = absent (no such column)", "input_tokens = 0",
        "goal_id = absent (NULL)", "owner process: alive",
        "settlement intent (written, not yet promoted)\n  task_id = del_live", "receipts (0, "})
    CHECK(has(r.output, want));
  CHECK(has(r.output, "digest = " + k_digest));
  CHECK(test::file_bytes(path) == before);  // read-only

  auto j = test::run_captured({k_tether, "inspect", path, "--task", "del_live", "--json"});
  REQUIRE(j.exit_code == 0);
  auto doc = json::parse(j.output).as_object();
  CHECK(doc.at("state").as_string() == "running");
  CHECK(doc.at("state_known").as_bool());
  CHECK(doc.at("owner_process").at("liveness").as_string() == "alive");
  CHECK(doc.at("fields").at("originator").at("values").at("thread").as_string() == "origin");
  CHECK(doc.at("fields").at("usage").at("values").at("input_tokens").as_string() == "0");
  CHECK(doc.at("fields").at("goal").at("values").at("goal_id").is_null());
  CHECK(doc.at("settlement_intent").at("digest").as_string() == k_digest);
  CHECK(doc.at("artifact").at("artifact").is_null());  // not promoted: the row has none yet
}

TEST_CASE("inspect --task tells a gone owner from an unparsable one, with the terminal receipt",
          "[lifecycle]") {
  test::scratch_dir dir("lifecycle-owners");
  auto path = seed(dir);
  auto gone = test::run_captured({k_tether, "inspect", path, "--task", "del_gone", "--json"});
  INFO(gone.output);
  REQUIRE(gone.exit_code == 0);
  auto g = json::parse(gone.output).as_object();
  CHECK(g.at("state").as_string() == "lost");
  CHECK(g.at("terminal").as_bool());
  CHECK(g.at("owner_process").at("liveness").as_string() == "gone");
  CHECK(g.at("settlement_intent").is_null());
  CHECK(g.at("artifact").at("error").as_string() == "recovery: owner gone");
  REQUIRE(g.at("receipts").as_array().size() == 1);
  CHECK(g.at("receipts").as_array()[0].at("id").as_string() == "del_gone/lost");
  CHECK(g.at("receipts").as_array()[0].at("state").as_string() == "pending");

  auto bad = test::run_captured({k_tether, "inspect", path, "--task", "del_bad"});
  INFO(bad.output);
  REQUIRE(bad.exit_code == 0);
  CHECK(has(bad.output, "owner process: unparsable ("));
  CHECK(has(bad.output, "settlement intent: absent"));
}

TEST_CASE("inspect --task answers a shell and a subagent from their rows", "[lifecycle]") {
  test::scratch_dir dir("lifecycle-kinds");
  auto path = seed(dir);
  auto sh = test::run_captured({k_tether, "inspect", path, "--task", "job_sh"});
  INFO(sh.output);
  REQUIRE(sh.exit_code == 0);
  for (auto* want : {"kind:        shell", "state:       running (live:", "thread = ses_owner",
                     "turn = turn_7", "owner = absent (NULL)", "owner process: absent",
                     "lease_until = absent (NULL)", "job_sh/started", "...[truncated, "})
    CHECK(has(sh.output, want));
  CHECK_FALSE(has(sh.output, "artifact (once terminal"));  // a delegate's section only
  CHECK_FALSE(has(sh.output, std::string(300, 'x')));      // bounded

  auto sub = test::run_captured({k_tether, "inspect", path, "--task", "job_sub"});
  INFO(sub.output);
  REQUIRE(sub.exit_code == 0);
  for (auto* want : {"kind:        subagent", "state:       running (live:", "parent_id = parent",
                     "child_id = worker", "the child session's agent = general",
                     "the parent session's tenant = default", "durability:  restart-resumable"})
    CHECK(has(sub.output, want));
}

TEST_CASE("inspect --task shows a column a later schema adds, and absent ones as absent",
          "[lifecycle]") {
  test::scratch_dir dir("lifecycle-columns");
  auto path = seed(dir);
  {
    SQLite::Database db(path, SQLite::OPEN_READWRITE);
    db.exec("ALTER TABLE tasks ADD COLUMN principal TEXT");
    db.exec("UPDATE tasks SET principal = 'alice' WHERE id = 'del_live'");
  }
  auto r = test::run_captured({k_tether, "inspect", path, "--task", "del_live"});
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK(has(r.output, "principal = alice"));
  CHECK(has(r.output, "depth = absent (no such column)"));
  auto other = test::run_captured({k_tether, "inspect", path, "--task", "job_sh"});
  CHECK(has(other.output, "principal = absent\n"));  // the column exists, the row has NULL
}

TEST_CASE("inspect --task of an unknown id names it and exits non-zero", "[lifecycle]") {
  test::scratch_dir dir("lifecycle-missing");
  auto path = seed(dir);
  auto before = test::file_bytes(path);
  for (auto json_flag : {false, true}) {
    std::vector<std::string> argv{k_tether, "inspect", path, "--task", "no_such_task"};
    if (json_flag) argv.push_back("--json");
    auto r = test::run_captured(argv);
    INFO(r.output);
    CHECK(r.exit_code == 1);
    CHECK(has(r.output, "tether inspect: no task 'no_such_task' in " + path));
  }
  auto usage = test::run_captured({k_tether, "inspect", path, "--task"});
  CHECK(usage.exit_code == 2);
  auto both = test::run_captured({k_tether, "inspect", path, "--task", "job_sh", "--lifecycle"});
  CHECK(both.exit_code == 2);
  CHECK(test::file_bytes(path) == before);
}
