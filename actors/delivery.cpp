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
  b.recheck = true;
  b.recovering = recovering;
  b.items.push_back({protocol::notification_id(r.id.str()), r.id, std::nullopt, std::move(r.body)});
  return b;
}

awaitable<result<int>> delivery::drop(delivery_batch& b, const std::string& why) {
  host_.warn(why);
  if (b.what == delivery_batch::kind::report) {
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

  // 1. Recheck: only what is still pending is handed over.
  if (b.recheck && !report) {
    std::vector<protocol::event_id> ids;
    for (auto& i : b.items)
      if (i.receipt) ids.push_back(*i.receipt);
    auto read = [this, ids = std::move(ids)]() -> result<std::vector<bool>> {
      std::vector<bool> pending;
      for (auto& id : ids) {
        auto r = store_.receipt_by_id(id);
        if (!r) return r.error();
        pending.push_back(*r && (*r)->state == persistence::receipt_state::pending);
      }
      return pending;
    };
    auto pending = co_await store_.offload(std::move(read));
    if (!pending) co_return pending.error();
    std::vector<outbound> still;
    for (std::size_t i = 0; i < b.items.size(); ++i)
      if ((*pending)[i]) still.push_back(std::move(b.items[i]));
    b.items = std::move(still);
  }
  if (b.items.empty()) co_return 0;

  // 2. The owner: gone, or of another tenant, is owed nothing.
  auto s = co_await host_.load(b.owner);
  if (!s && s.error().code != errc::not_found) co_return s.error();
  auto count = std::to_string(b.items.size());
  if (!s)
    co_return co_await drop(b, "owner session '" + b.owner.str() + "' is gone; " + count +
                                   (report ? " owed report(s)" : " receipt(s)") + " dropped");
  if (b.tenant && (*s)->tenant() != *b.tenant)
    co_return co_await drop(b, "owner session '" + b.owner.str() + "' belongs to another tenant; " +
                                   count + " receipt(s) dropped");
  bool was_busy = !report && host_.is_busy(b.owner);

  // 3. Admit under the inbox id (a repeat is dropped there).
  std::vector<persistence::report_item> items;
  items.reserve(b.items.size());
  for (auto& i : b.items) items.push_back({i.inbox_id, i.from, std::move(i.body)});
  inbox_msg::admit a{std::move(items), !report, {}};
  auto box = (*s)->inbox();
  auto admitted = co_await box->ask(std::move(a));
  if (!admitted && admitted.error().code == errc::not_found)
    co_return co_await drop(b, admitted.error().message);
  if (!admitted) co_return admitted.error();
  int handed = static_cast<int>(b.items.size());

  // 4. Acknowledge, by how the owner reads it.
  if (report) {
    // The admit acknowledged the reports' receipts in its own transaction.
    // Only an admit that added a report passes this point: a resend whose
    // reports were all admitted already (repeats dropped) does not.
    if (std::find(admitted->begin(), admitted->end(), true) != admitted->end())
      TETHER_CRASH_POINT("report.admit.after_commit");
    if (b.handed_over) b.handed_over();
    host_.hand_over(**s, wake_scope::steer, false);
    TETHER_CRASH_POINT("report.wake.after_tell");
    co_return handed;
  }
  if (b.recovering) {
    TETHER_CRASH_POINT("recover.handover.after_admit");
    co_return handed;
  }
  TETHER_CRASH_POINT("delivery.handover.after_admit");
  if (b.handed_over) b.handed_over();
  if (was_busy) {
    // Steered: accepted into the running session's queue is acknowledged.
    for (auto& i : b.items) {
      if (!i.receipt) continue;
      auto acked = co_await store_.ack(*i.receipt);
      if (!acked) co_return acked.error();
    }
    TETHER_CRASH_POINT("delivery.ack.after_commit");
    host_.hand_over(**s, wake_scope::steer, true);
  } else {
    // Prompted: acknowledged when the session's drain takes it.
    host_.hand_over(**s, wake_scope::input, true);
  }
  co_return handed;
}

}  // namespace tether::actors
