// Retention of finished work: a terminal task that owes nothing is deleted
// with its receipts once it is older than host_options::task_retention; a
// running task and a task whose report or notice is still owed never are.
#include <atomic>
#include <catch2/catch.hpp>
#include <future>

#include "catch_result.hpp"
#include "report_support.hpp"
#include "tether/persistence/task_store.hpp"
#include "tether/runtime/clock.hpp"

using namespace tether;
using namespace tether::test;
using persistence::job_row;
using persistence::job_status;
using persistence::receipt_state;
using persistence::report_item;
using persistence::session_row;
using persistence::settle_request;
using persistence::task_store;

namespace {

session_row session_named(const std::string& id, std::optional<std::string> parent = {}) {
  session_row r;
  r.id = session_id(id);
  if (parent) r.parent = session_id(*parent);
  return r;
}

job_row running_job(const std::string& id, const std::string& child) {
  job_row j;
  j.id = protocol::job_id(id);
  j.nid = protocol::notification_id(id);
  j.parent = session_id("parent");
  j.child = session_id(child);
  j.description = "work of " + child;
  return j;
}

// A child of "parent" whose background task ended; `delivered`: its report
// was admitted into the parent's inbox (its receipt acknowledged).
template <class Run>
void ended_child(Run& run, task_store& store, const std::string& child, bool delivered) {
  auto job = running_job("msg_" + child, child);
  REQUIRE(run(store.spawn(session_named(child, "parent"), session_id(child), "go", job)));
  REQUIRE(run(store.begin_busy(session_id(child))));
  settle_request req;
  req.child = session_id(child);
  req.background_job = job.id;
  req.body = "report of " + child;
  auto settled = run(store.settle(req));
  REQUIRE(settled);
  REQUIRE(settled->row_written);
  if (delivered) {
    std::vector<report_item> items{{job.nid, session_id(child), req.body}};
    REQUIRE(run(store.admit(session_id("parent"), items)));
  }
}

int receipts_of(task_store& store, const std::string& task) {
  auto r = store.receipts_of(protocol::job_id(task));
  REQUIRE(r);
  return static_cast<int>(r->size());
}

}  // namespace

TEST_CASE("retention deletes finished tasks that owe nothing and keeps running and owed ones",
          "[retention]") {
  report_fixture f("retention_store");
  auto& store = f.host->store();
  auto run = [&f](auto a) { return f.sync(std::move(a)); };
  REQUIRE(run(f.host->create_session("parent", session_id("parent"))));
  ended_child(run, store, "done", true);   // delivered: may go
  ended_child(run, store, "owed", false);  // its report is still owed: stays
  REQUIRE(run(store.spawn(session_named("busy", "parent"), session_id("busy"), "go",
                          running_job("msg_busy", "busy"))));  // running: stays
  REQUIRE(receipts_of(store, "msg_done") == 2);

  // Nothing is older than an hour ago: nothing goes.
  auto none = run(store.expire_tasks(runtime::now_ms() - 3600 * 1000));
  REQUIRE(none);
  CHECK(*none == 0);

  auto n = run(store.expire_tasks(runtime::now_ms() + 1000));
  REQUIRE(n);
  CHECK(*n == 1);
  auto tasks = store.jobs();
  REQUIRE(tasks);
  std::set<std::string> left;
  for (auto& t : *tasks) left.insert(t.id.str());
  CHECK(left == std::set<std::string>{"msg_owed", "msg_busy"});
  CHECK(receipts_of(store, "msg_done") == 0);  // its receipts went with it
  CHECK(receipts_of(store, "msg_owed") == 2);
  // The delivered report itself is the parent's: its inbox and transcript keep it.
  auto inbox = store.inbox(session_id("parent"));
  REQUIRE(inbox);
  REQUIRE(inbox->size() == 1);
  CHECK(inbox->front().body == "report of done");

  auto again = run(store.expire_tasks(runtime::now_ms() + 1000));
  REQUIRE(again);
  CHECK(*again == 0);
}

TEST_CASE("retention takes a long backlog in bounded batches", "[retention]") {
  report_fixture f("retention_batches");
  auto& store = f.host->store();
  auto run = [&f](auto a) { return f.sync(std::move(a)); };
  REQUIRE(run(f.host->create_session("parent", session_id("parent"))));
  for (int i = 0; i < 5; ++i) ended_child(run, store, "c" + std::to_string(i), true);
  auto first = run(store.expire_tasks(runtime::now_ms() + 1000, 2));
  REQUIRE(first);
  CHECK(*first == 2);
  auto rest = run(store.expire_tasks(runtime::now_ms() + 1000, 10));
  REQUIRE(rest);
  CHECK(*rest == 3);
}

TEST_CASE("boot expires finished tasks past the host's retention, and keeps them when it is off",
          "[retention]") {
  report_fixture f("retention_boot");
  auto run = [&f](auto a) { return f.sync(std::move(a)); };
  REQUIRE(run(f.host->create_session("parent", session_id("parent"))));
  ended_child(run, f.host->store(), "done", true);
  CHECK(f.boot.expired == 0);

  f.retention.emplace(std::nullopt);  // off: kept
  f.restart();
  CHECK(f.boot.expired == 0);
  REQUIRE(f.host->store().jobs()->size() == 1);

  f.retention.emplace(std::chrono::milliseconds(0));  // everything finished is past it
  f.restart();
  CHECK(f.boot.expired == 1);
  CHECK(f.host->store().jobs()->empty());
}

TEST_CASE("a running host sweeps finished tasks past its retention without a restart",
          "[retention]") {
  report_fixture f("retention_periodic");
  auto swept = std::make_shared<std::promise<int>>();
  auto once = std::make_shared<std::atomic<bool>>(false);
  f.retention.emplace(std::chrono::milliseconds(0));
  f.tune = [swept, once](actors::host_options& o) {
    o.retention_sweep_every = std::chrono::milliseconds(10);
    o.on_retention_sweep = [swept, once](int n) {
      if (n > 0 && !once->exchange(true)) swept->set_value(n);
    };
  };
  f.restart();
  auto run = [&f](auto a) { return f.sync(std::move(a)); };
  REQUIRE(run(f.host->create_session("parent", session_id("parent"))));
  ended_child(run, f.host->store(), "done", true);
  // The event is the sweep that deleted it; the bound only ends a failing run.
  auto got = swept->get_future();
  REQUIRE(got.wait_for(std::chrono::seconds(30)) == std::future_status::ready);
  CHECK(got.get() == 1);
  auto tasks = f.host->store().jobs();
  REQUIRE(tasks);
  CHECK(tasks->empty());
  auto inbox = f.host->store().inbox(session_id("parent"));
  REQUIRE(inbox);
  CHECK(inbox->size() == 1);  // the delivered report stays the parent's
}
