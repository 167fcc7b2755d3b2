// No SQLite read runs on an actor's executor (issue 9, item 5): sessions, the
// run coordinator, boot and the job queue await their reads, which run on the
// readers' own threads (reader_pool::offload). persistence::reads_on_executor()
// counts every statement a reader runs on an executor thread; each story here
// must leave it where it was. Without the offloads, each of these paths read
// on its executor hundreds of times across the suite.
#include "delivery_support.hpp"
#include "tether/persistence/database.hpp"

using namespace tether;
using namespace tether::test;
using protocol::transition;

TEST_CASE(
    "a subagent's report, from the spawn through the settle to the parent's drain and a boot that "
    "delivers an owed one, reads nothing on an actor's executor",
    "[actors][reads]") {
  report_fixture f("reads-report");
  auto before = persistence::reads_on_executor();
  f.on("child", 1, {say("All 14 routes answer.")});
  f.parent_spawns("child");
  f.quiet();
  auto inbox = f.inbox("parent");
  REQUIRE(inbox.size() == 1);
  CHECK(inbox[0].body.find("All 14 routes answer.") != std::string::npos);
  CHECK(inbox[0].acked);  // the parent drained it
  // A boot with a report owed: boot's reads, the owed delivery, the wake.
  f.write_owed_report("parent", "child");
  f.restart();
  f.quiet();
  CHECK(f.boot.delivered == 1);
  CHECK(f.inbox("parent").size() == 2);
  CHECK(persistence::reads_on_executor() == before);
}

TEST_CASE(
    "an owned job's launch, status read, completion and steered receipt read nothing on an "
    "actor's executor",
    "[actors][reads][delivery]") {
  delivery_fixture d("reads-job");
  auto before = persistence::reads_on_executor();
  launcher l;
  std::shared_ptr<runtime::one_shot<result<job_view>>> status =
      runtime::one_shot<result<job_view>>::make();
  l.install(d, "s", job("echo hello-from-job"),
            [status](agent_context& ctx, job_id j) -> boost::asio::awaitable<void> {
              auto v = co_await ctx.job_status(j);
              status->set(v);
            });
  auto s = d.session("s");
  REQUIRE(d.sync(d.host().prompt(s, "build it")));
  REQUIRE(d.sync(d.host().wait_idle(s)));
  d.sync(d.host().jobs().wait_idle());
  auto j = l.id(d);
  auto v = d.sync(status->async_wait(boost::asio::use_awaitable));
  REQUIRE(v);
  CHECK(v->id == j);
  CHECK(d.state_of(j) == owned_state::completed);
  CHECK(d.receipts(j).size() == 2);
  CHECK(persistence::reads_on_executor() == before);
}
