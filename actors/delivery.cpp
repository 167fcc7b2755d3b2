#include "tether/actors/delivery.hpp"

#include <algorithm>

#include "tether/actors/host.hpp"
#include "tether/runtime/crash_point.hpp"

namespace tether::actors {

delivery_batch notice_batch(persistence::receipt r, bool recovering) {
  delivery_batch b;
  b.what = delivery_batch::kind::notice;
  b.owner = r.scope.thread;
  b.tenant = r.scope.tenant;
  b.recovering = recovering;
  b.items.push_back({protocol::notification_id(r.id.str()), r.id, std::nullopt, std::move(r.body)});
  return b;
}

awaitable<result<int>> delivery::drop(delivery_batch& b, const std::string& why) {
  if (b.what == delivery_batch::kind::report) {
    host_.warn(why + "; " + std::to_string(b.items.size()) + " owed report(s) dropped");
    std::vector<protocol::notification_id> nids;
    for (auto& i : b.items) nids.push_back(i.inbox_id);
    auto c = co_await store_.complete(std::move(nids), false);
    if (!c) co_return c.error();
  } else {
    std::vector<protocol::event_id> ids;
    for (auto& i : b.items)
      if (i.receipt) ids.push_back(*i.receipt);
    auto d = co_await store_.drop(std::move(ids));
    if (!d) co_return d.error();
    // Only what was still pending is dropped, and said to be: a receipt read
    // or handed over already was nobody's loss.
    if (*d > 0) host_.warn(why + "; " + std::to_string(*d) + " receipt(s) dropped");
  }
  co_return 0;
}

awaitable<result<int>> delivery::deliver(delivery_batch b) {
  host_.activity(+1);
  struct done_guard {
    host* h;
    ~done_guard() { h->activity(-1); }
  } guard{&host_};
  const bool report = b.what == delivery_batch::kind::report;
  if (b.items.empty()) co_return 0;

  // 1. The owner: gone, or of another tenant, is owed nothing.
  auto s = co_await host_.load(b.owner);
  if (!s && s.error().code != errc::not_found) co_return s.error();
  if (!s) co_return co_await drop(b, "owner session '" + b.owner.str() + "' is gone");
  if (b.tenant && (*s)->tenant() != *b.tenant)
    co_return co_await drop(b, "owner session '" + b.owner.str() + "' belongs to another tenant");
  // A notice for a busy turn is steered in, and accepted into its queue is
  // acknowledged; boot's recovery wakes nobody and acknowledges nothing.
  bool steer = !report && !b.recovering && host_.is_busy(b.owner);

  // 2. Admit under the inbox id (a repeat is dropped there), settling the
  // receipts in the same transaction. A notice is admitted only while its
  // receipt is still pending: a status read or an earlier hand-over may
  // have settled it.
  std::vector<persistence::report_item> items;
  items.reserve(b.items.size());
  for (auto& i : b.items) items.push_back({i.inbox_id, i.from, std::move(i.body), i.receipt});
  using persistence::admit_receipts;
  inbox_msg::admit a{std::move(items),
                     report  ? admit_receipts::reports
                     : steer ? admit_receipts::notices_acked
                             : admit_receipts::notices,
                     {}};
  auto box = (*s)->inbox();
  auto admitted = co_await box->ask(std::move(a));
  if (!admitted && admitted.error().code == errc::not_found)
    co_return co_await drop(b, admitted.error().message);
  if (!admitted) co_return admitted.error();
  using persistence::admit_outcome;
  int handed =
      static_cast<int>(b.items.size()) -
      static_cast<int>(std::count(admitted->begin(), admitted->end(), admit_outcome::not_pending));

  // 3. Wake, by how the owner reads it.
  if (report) {
    // The admit acknowledged the reports' receipts in its own transaction.
    // Only an admit that added a report passes this point: a resend whose
    // reports were all admitted already (repeats dropped) does not.
    if (std::find(admitted->begin(), admitted->end(), admit_outcome::added) != admitted->end())
      TETHER_CRASH_POINT("report.admit.after_commit");
    if (b.handed_over) b.handed_over();
    // Boot's recovery resends without a model turn: its phases wake the
    // parent once every owed receipt is in (seed 002's phase order), so
    // which sessions boot resumes never races a live wake.
    if (b.recovering) co_return handed;
    host_.hand_over(**s, wake_scope::steer, false);
    TETHER_CRASH_POINT("report.wake.after_tell");
    co_return handed;
  }
  // Nothing was still pending: nobody is woken for it.
  if (handed == 0) co_return 0;
  if (b.recovering) {
    TETHER_CRASH_POINT("recover.handover.after_admit");
    co_return handed;
  }
  if (steer) {
    // Steered: accepted into the running session's queue, and acknowledged
    // by the admit's own transaction.
    TETHER_CRASH_POINT("delivery.ack.after_commit");
    if (b.handed_over) b.handed_over();
    host_.hand_over(**s, wake_scope::steer, true);
  } else {
    // Prompted: acknowledged when the session's drain takes it.
    TETHER_CRASH_POINT("delivery.handover.after_admit");
    if (b.handed_over) b.handed_over();
    host_.hand_over(**s, wake_scope::input, true);
  }
  co_return handed;
}

}  // namespace tether::actors
