// The one delivery path (actors/delivery.hpp): every pending receipt of every
// kind reaches its owner's inbox through the same owner check, admit (only
// while pending) and acknowledgement, whoever resends it.
#include <catch2/catch.hpp>

#include "catch_result.hpp"
#include "report_support.hpp"

using namespace tether;
using namespace tether::test;

namespace {

// An owned job of `owner` that ended, with its terminal receipt pending, as
// the job queue's terminal compare-and-set leaves it.
persistence::receipt ended_job(report_fixture& f, const std::string& owner,
                               const std::string& tenant = "default") {
  persistence::owned_job j;
  j.id = protocol::job_id(protocol::mint("job"));
  j.scope.tenant = protocol::tenant_id(tenant);
  j.scope.thread = session_id(owner);
  j.scope.turn = protocol::turn_id("turn_1");
  j.scope.sandbox = protocol::sandbox_id("sb");
  j.scope.generation = 1;
  j.preview = "make test";
  REQUIRE(f.sync(f.host->store().admit_job(j)));
  auto won = f.sync(
      f.host->store().finish(j.id, persistence::owned_state::failed, std::nullopt, "exit 2"));
  REQUIRE(won);
  REQUIRE(*won);
  return std::move(**won);
}

// Sets receipts' creation times on the closed database, each named by its
// id (a notice's) or by its task (a report's terminal receipt). The outbox's
// order is each receipt's creation time, then its id; times set apart
// cannot be tied by a coarse clock.
void set_receipt_times(report_fixture& f,
                       std::initializer_list<std::pair<std::int64_t, std::string>> times) {
  SQLite::Database db(f.dir.file("tether.db"), SQLite::OPEN_READWRITE);
  SQLite::Statement at(db,
                       "UPDATE receipts SET created_at = ? WHERE id = ? OR (task_id = ? AND "
                       "transition != 'started')");
  for (const auto& [t, key] : times) {
    at.bind(1, t);
    at.bind(2, key);
    at.bind(3, key);
    REQUIRE(at.exec() == 1);
    at.reset();
  }
}

actors::delivery_batch notice_for(const persistence::receipt& r) {
  return actors::notice_batch(r, true);  // nobody is woken: the inbox is read as it is
}

persistence::receipt_state state_of(report_fixture& f, const protocol::event_id& id) {
  auto r = f.host->store().receipt_by_id(id);
  REQUIRE(r);
  REQUIRE(*r);
  return (*r)->state;
}

// The one report write_owed_report left owed, and a batch delivering it.
persistence::job_row the_owed_report(report_fixture& f) {
  auto owed = f.host->store().outstanding_jobs();
  REQUIRE(owed);
  REQUIRE(owed->size() == 1);
  return (*owed)[0];
}
actors::delivery_batch report_batch(const persistence::job_row& row, bool recovering = false) {
  actors::delivery_batch b;
  b.owner = *row.parent;
  b.recovering = recovering;
  b.items.push_back({row.nid, std::nullopt, row.child, row.body.value_or("")});
  return b;
}

}  // namespace

TEST_CASE("a notice resent through the delivery path is admitted once and stays owed until read",
          "[delivery]") {
  report_fixture f("delivery_resend");
  REQUIRE(f.sync(f.host->create_session("owner", session_id("s"))));
  auto r = ended_job(f, "s");

  auto first = f.sync(f.host->delivery().deliver(notice_for(r)));
  REQUIRE(first);
  CHECK(*first == 1);
  auto again = f.sync(f.host->delivery().deliver(notice_for(r)));
  REQUIRE(again);
  auto inbox = f.inbox("s");
  REQUIRE(inbox.size() == 1);  // the repeat was dropped by its id
  CHECK(inbox[0].nid.str() == r.id.str());
  CHECK(inbox[0].body == "exit 2");
  CHECK_FALSE(inbox[0].acked);
  // Nobody took it yet: its receipt is still owed.
  CHECK(state_of(f, r.id) == persistence::receipt_state::pending);
}

TEST_CASE("a notice whose result its owner already read is not handed over again", "[delivery]") {
  report_fixture f("delivery_read");
  REQUIRE(f.sync(f.host->create_session("owner", session_id("s"))));
  auto r = ended_job(f, "s");
  REQUIRE(f.sync(f.host->store().mark_read(r.id)));

  auto handed = f.sync(f.host->delivery().deliver(notice_for(r)));
  REQUIRE(handed);
  CHECK(*handed == 0);
  CHECK(f.inbox("s").empty());
  CHECK(state_of(f, r.id) == persistence::receipt_state::read);
}

TEST_CASE(
    "a notice's admit checks its receipt is pending and, steered, acknowledges it in the same "
    "transaction",
    "[delivery]") {
  report_fixture f("delivery_admit_notice");
  REQUIRE(f.sync(f.host->create_session("owner", session_id("s"))));
  auto steered = ended_job(f, "s");
  auto prompted = ended_job(f, "s");
  auto read = ended_job(f, "s");
  REQUIRE(f.sync(f.host->store().mark_read(read.id)));
  auto item = [](const persistence::receipt& r) {
    return persistence::report_item{protocol::notification_id(r.id.str()), std::nullopt, r.body,
                                    r.id};
  };
  using persistence::admit_outcome;
  using persistence::admit_receipts;

  auto a = f.sync(f.host->store().admit(session_id("s"), {item(steered), item(read)},
                                        admit_receipts::notices_acked));
  REQUIRE(a);
  CHECK(*a == std::vector{admit_outcome::added, admit_outcome::not_pending});
  CHECK(state_of(f, steered.id) == persistence::receipt_state::acked);
  CHECK(state_of(f, read.id) == persistence::receipt_state::read);  // not moved back

  auto b = f.sync(f.host->store().admit(session_id("s"), {item(prompted), item(steered)},
                                        admit_receipts::notices));
  REQUIRE(b);
  // The steered one is acknowledged now, so it is not admitted again.
  CHECK(*b == std::vector{admit_outcome::added, admit_outcome::not_pending});
  CHECK(state_of(f, prompted.id) == persistence::receipt_state::pending);  // its drain acks it

  auto inbox = f.inbox("s");
  REQUIRE(inbox.size() == 2);
  CHECK(inbox[0].nid.str() == steered.id.str());
  CHECK(inbox[1].nid.str() == prompted.id.str());
}

TEST_CASE(
    "a notice its owner already read wakes nobody and, its owner gone, is not reported dropped",
    "[delivery]") {
  report_fixture f("delivery_read_live");
  REQUIRE(f.sync(f.host->create_session("owner", session_id("s"))));
  auto r = ended_job(f, "s");
  auto gone = ended_job(f, "nobody");
  for (auto* x : {&r, &gone}) {
    REQUIRE(f.sync(f.host->store().mark_read(x->id)));
    // Live (not boot's recovery): an admitted notice would wake the session.
    auto handed = f.sync(f.host->delivery().deliver(actors::notice_batch(*x, false)));
    REQUIRE(handed);
    CHECK(*handed == 0);
    CHECK(state_of(f, x->id) == persistence::receipt_state::read);
  }
  f.quiet();
  CHECK(f.inbox("s").empty());
  CHECK(f.messages_with("s", "exit 2") == 0);
  std::lock_guard lk(f.m);
  CHECK(f.warnings.empty());
}

TEST_CASE("a notice owed to a session of another tenant, or to no session, is dropped unseen",
          "[delivery]") {
  report_fixture f("delivery_owner");
  REQUIRE(f.sync(f.host->create_session("owner", session_id("s"))));
  auto foreign = ended_job(f, "s", "tenant-evil");
  auto orphan = ended_job(f, "nobody");

  for (auto* r : {&foreign, &orphan}) {
    auto handed = f.sync(f.host->delivery().deliver(notice_for(*r)));
    REQUIRE(handed);
    CHECK(*handed == 0);
    CHECK(state_of(f, r->id) == persistence::receipt_state::dropped);
  }
  CHECK(f.inbox("s").empty());
  bool named = false;
  {
    std::lock_guard lk(f.m);
    for (auto& w : f.warnings) named |= w.find("another tenant") != std::string::npos;
  }
  CHECK(named);
}

TEST_CASE("a report delivered twice reaches its parent's inbox once and its receipt is acked",
          "[delivery]") {
  report_fixture f("delivery_report");
  REQUIRE(f.sync(f.host->create_session("parent", session_id("parent"))));
  f.write_owed_report("parent", "child");
  auto row = the_owed_report(f);
  REQUIRE(row.owed);
  for (int i = 0; i < 2; ++i) {
    auto handed = f.sync(f.host->delivery().deliver(report_batch(row)));
    REQUIRE(handed);
  }
  f.quiet();
  auto inbox = f.inbox("parent");
  REQUIRE(inbox.size() == 1);
  CHECK(inbox[0].nid == row.nid);
  CHECK(inbox[0].body == "owed report");
  auto after = f.host->store().outstanding_jobs();
  REQUIRE(after);
  CHECK(after->empty());  // no longer owed: its terminal receipt was acknowledged
}

TEST_CASE(
    "boot's resend of an owed report wakes nobody: the parent takes it when boot's phases resume "
    "it",
    "[delivery][recovery][regression]") {
  report_fixture f("delivery_boot_report_wakes_nobody");
  auto drains = std::make_shared<std::atomic<int>>(0);
  f.code("parent")->fn = [drains](agent_context& ctx, drain_input) -> boost::asio::awaitable<void> {
    ++*drains;
    co_await ctx.say("read it");
  };
  REQUIRE(f.sync(f.host->create_session("parent", session_id("parent"))));
  f.write_owed_report("parent", "child");
  auto row = the_owed_report(f);

  // Phase 1's resend: admitted, nobody woken, so which sessions phases 2 and
  // 3 resume does not depend on how fast a woken turn drains.
  auto handed = f.sync(f.host->delivery().deliver(report_batch(row, /*recovering=*/true)));
  REQUIRE(handed);
  CHECK(*handed == 1);
  f.quiet();
  CHECK(*drains == 0);
  auto inbox = f.inbox("parent");
  REQUIRE(inbox.size() == 1);
  CHECK_FALSE(inbox[0].acked);

  // A restart's phase 2 finds it pending and wakes the parent, once.
  f.restart();
  f.quiet();
  CHECK(f.boot.resumed_top == 1);
  CHECK(*drains == 1);
  inbox = f.inbox("parent");
  REQUIRE(inbox.size() == 1);
  CHECK(inbox[0].acked);
  CHECK(f.messages_with("parent", "read it") == 1);
}

TEST_CASE("admitting a report acknowledges its terminal receipt in the same transaction",
          "[delivery]") {
  report_fixture f("delivery_admit_acks");
  REQUIRE(f.sync(f.host->create_session("parent", session_id("parent"))));
  f.write_owed_report("parent", "child");
  std::vector<persistence::report_item> items{
      {protocol::notification_id("msg_owed"), session_id("child"), "owed report"}};
  auto admitted = f.sync(f.host->store().admit(session_id("parent"), items));
  REQUIRE(admitted);
  CHECK(*admitted == std::vector{persistence::admit_outcome::added});
  // No second write: the report is in the inbox and no longer owed, so a
  // crash now leaves boot nothing to resend.
  auto owed = f.host->store().outstanding_jobs();
  REQUIRE(owed);
  CHECK(owed->empty());
  REQUIRE(f.inbox("parent").size() == 1);
}

TEST_CASE(
    "a restart that fills a directory of thousands of sessions beside its paged outbox hands every "
    "owed report over once, in order",
    "[delivery][recovery]") {
  // 9,000 more sessions: boot's directory fill yields (every 4,096) while
  // pages of one report are read and delivered beside it.
  report_fixture f("delivery_boot_fill");
  REQUIRE(f.sync(f.host->create_session("parent", session_id("parent"))));
  for (int i = 0; i < 40; ++i)
    f.write_owed_report("parent", "child_" + std::to_string(i), "msg_" + std::to_string(100 + i));
  f.close();
  {
    SQLite::Database db(f.dir.file("tether.db"), SQLite::OPEN_READWRITE);
    db.exec(
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 9000) "
        "INSERT INTO sessions (id, parent_id, description, agent, status, created_at, tenant) "
        "SELECT 'extra_' || i, 'parent', 'd', 'a', 'idle', 0, 'default' FROM n");
    db.exec("UPDATE receipts SET created_at = 1000 + CAST(substr(task_id, 5) AS INTEGER)");
  }
  f.tune = [](actors::host_options& o) { o.boot_outbox_page = 1; };
  f.open();
  f.quiet();
  auto parent = f.inbox("parent");
  REQUIRE(parent.size() == 40);
  for (int i = 0; i < 40; ++i) CHECK(parent[i].nid.str() == "msg_" + std::to_string(100 + i));
  CHECK(f.boot.delivered == 40);
  CHECK(f.host->outstanding(session_id("parent")).empty());  // walks the 9,040 children
  f.restart();
  f.quiet();
  CHECK(f.inbox("parent").size() == 40);
  CHECK(f.boot.delivered == 0);
}

TEST_CASE(
    "a restart read a page at a time still hands each owner its notices and reports in the order "
    "they were written, across every page's edge",
    "[delivery][recovery]") {
  report_fixture f("delivery_boot_pages");
  REQUIRE(f.sync(f.host->create_session("parent", session_id("parent"))));
  REQUIRE(f.sync(f.host->create_session("other", session_id("other"))));
  // Two owners' outboxes interleaved: the parent's notice, report, report,
  // notice; the other's notice and report between them.
  auto first = ended_job(f, "parent");
  auto other_notice = ended_job(f, "other");
  f.write_owed_report("parent", "child_a", "msg_a");
  f.write_owed_report("parent", "child_b", "msg_b");
  f.write_owed_report("other", "child_c", "msg_c");
  auto last = ended_job(f, "parent");
  f.close();
  set_receipt_times(f, {{1000, first.id.str()},
                        {1500, other_notice.id.str()},
                        {2000, "msg_a"},
                        {2500, "msg_c"},
                        {3000, "msg_b"},
                        {4000, last.id.str()}});
  // Pages of 1, then 4: every owner's entries are split across pages.
  f.tune = [](actors::host_options& o) { o.boot_outbox_page = 1; };
  f.open();
  f.quiet();
  auto parent = f.inbox("parent");
  REQUIRE(parent.size() == 4);
  CHECK(parent[0].nid.str() == first.id.str());
  CHECK(parent[1].nid.str() == "msg_a");
  CHECK(parent[2].nid.str() == "msg_b");
  CHECK(parent[3].nid.str() == last.id.str());
  auto other = f.inbox("other");
  REQUIRE(other.size() == 2);
  CHECK(other[0].nid.str() == other_notice.id.str());
  CHECK(other[1].nid.str() == "msg_c");
  CHECK(f.boot.jobs.redelivered == 3);
  CHECK(f.boot.delivered == 3);
  // Nothing is owed any more: a second restart hands over nothing.
  f.restart();
  f.quiet();
  CHECK(f.inbox("parent").size() == 4);
  CHECK(f.inbox("other").size() == 2);
  CHECK(f.boot.jobs.redelivered == 0);
  CHECK(f.boot.delivered == 0);
}

TEST_CASE(
    "a restart hands an owner its pending notices and owed reports in the order they were "
    "written, interleaved",
    "[delivery][recovery][regression]") {
  report_fixture f("delivery_boot_order");
  REQUIRE(f.sync(f.host->create_session("parent", session_id("parent"))));
  auto early = ended_job(f, "parent");
  f.write_owed_report("parent", "child");
  auto late = ended_job(f, "parent");
  f.close();
  set_receipt_times(f, {{1000, early.id.str()}, {2000, "msg_owed"}, {3000, late.id.str()}});
  f.open();
  f.quiet();
  auto inbox = f.inbox("parent");
  REQUIRE(inbox.size() == 3);
  CHECK(inbox[0].nid.str() == early.id.str());
  CHECK(inbox[1].nid.str() == "msg_owed");
  CHECK(inbox[2].nid.str() == late.id.str());
  CHECK(f.boot.jobs.redelivered == 2);
  CHECK(f.boot.delivered == 1);
  // A second restart owes nothing and hands over nothing again.
  f.restart();
  f.quiet();
  CHECK(f.inbox("parent").size() == 3);
  CHECK(f.boot.jobs.redelivered == 0);
  CHECK(f.boot.delivered == 0);
}
