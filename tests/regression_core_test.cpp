// Regressions of the run coordinator and the job queue found by trying main
// adversarially (issue 10): failed writes that must be retried, not dropped;
// interrupts and cancels that must reach what they stop; follow-ups that
// must not cross an ownership line.
#include <atomic>

#include "delivery_support.hpp"

using namespace tether;
using namespace tether::test;
using protocol::transition;

namespace {

// Whether a warning containing every one of `parts` was logged.
bool warned(report_fixture& f, std::initializer_list<std::string> parts) {
  std::lock_guard lk(f.m);
  for (auto& w : f.warnings) {
    bool all = true;
    for (auto& p : parts) all = all && w.find(p) != std::string::npos;
    if (all) return true;
  }
  return false;
}

}  // namespace

TEST_CASE("a terminal write that fails is retried until the receipt commits and reaches its turn",
          "[regression][delivery]") {
  delivery_fixture d("finish-retry");
  // The next COMMIT after the completion arrived is the terminal CAS: it fails.
  d.f.jobs.trace = [&d](const job_id&, std::string_view stage) {
    if (stage == "completion") d.host().store().db_writer().inject_commit_failures(1);
  };
  d.f.restart();
  launcher l;
  l.install(d, "s", job("echo written-after-a-retry"));
  auto s = d.session("s");
  REQUIRE(d.sync(d.host().prompt(s, "build it")));
  REQUIRE(d.sync(d.host().wait_idle(s)));  // the withholding turn got its receipt
  auto j = l.id(d);
  CHECK(d.host().store().db_writer().stats().failed_commits == 1);
  CHECK(d.state_of(j) == owned_state::completed);
  CHECK(d.receipt_state_of(j, transition::completed) == "acked");
  CHECK(d.transcript_count("s", "notice", "written-after-a-retry") == 1);
  CHECK(d.f.observer->settled_of("s") == 1);
  CHECK(warned(d.f, {j.str(), "was not written", "retried"}));
  d.sync(d.host().jobs().wait_idle());  // nothing stays live
}

TEST_CASE("a receipt whose hand-over fails is handed over again while the host runs",
          "[regression][delivery]") {
  delivery_fixture d("deliver-retry");
  // The next COMMIT after the terminal one is the hand-over's admit: it fails.
  d.f.jobs.trace = [&d](const job_id&, std::string_view stage) {
    if (stage == "terminal") d.host().store().db_writer().inject_commit_failures(1);
  };
  d.f.restart();
  launcher l;
  l.install(d, "s", job("echo handed-over-after-a-retry"));
  auto s = d.session("s");
  REQUIRE(d.sync(d.host().prompt(s, "build it")));
  REQUIRE(d.sync(d.host().wait_idle(s)));
  auto j = l.id(d);
  CHECK(d.host().store().db_writer().stats().failed_commits == 1);
  // Steered into the turn that withheld its completion for it, not left for a boot.
  CHECK(d.receipt_state_of(j, transition::completed) == "acked");
  CHECK(d.transcript_count("s", "notice", "handed-over-after-a-retry") == 1);
  CHECK(d.f.observer->started_of("s") == 1);
  CHECK(warned(d.f, {j.str(), "was not handed over", "retried"}));
  d.sync(d.host().jobs().wait_idle());
}
