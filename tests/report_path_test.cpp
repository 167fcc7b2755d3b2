// Report on idle: one report per busy period, in the seed's format.
#include "report_support.hpp"

#include "tether/protocol/report.hpp"

using namespace tether;
using namespace tether::test;

TEST_CASE("a background child reports its answer to the parent once") {
  report_fixture f("bg");
  f.on("parent", 1, {spawn("child", "Audit routes", "check the routes"), say("Started an audit.")});
  f.on("child", 1, {say("All 14 routes answer.")});
  auto p = f.top("parent");
  f.prompt(p, "audit the routes");
  f.settle_all();
  auto inbox = f.inbox("parent");
  REQUIRE(inbox.size() == 1);
  CHECK(inbox[0].body ==
        "<subagent sessionID=\"child\" state=\"completed\" description=\"Audit routes\">\n"
        "All 14 routes answer.\n"
        "</subagent>");
  CHECK(inbox[0].acked);
  auto reports = f.reports_in_transcript("parent");
  REQUIRE(reports.size() == 1);
  CHECK(reports[0].text == inbox[0].body);
  auto jobs = f.host->store().jobs();
  REQUIRE(jobs);
  CHECK(jobs->empty());  // the outbox row completed
}
