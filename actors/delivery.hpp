#pragma once
// The one delivery path. Every pending receipt of every kind of task (a
// subagent's report, an owned job's notice) reaches its owner here, live or
// at boot. (A live report owed to a parent that is there has no pending
// receipt: its settle admits it in the same transaction, through the same
// inbox actor, actors/session.cpp `settle_into_parent`. Only a settle that
// could not reach the parent's inbox, or ran as the host shut down, leaves
// one here.)
//
//   1. owner: the owner's session is loaded; gone (or of another tenant than
//      the receipt's scope) means nobody is owed it any more, and the receipt
//      is dropped (if still pending);
//   2. admit: the owner's inbox actor (actors/inbox.hpp) admits it under its
//      inbox id, dropping a repeat (so at-least-once delivery is seen once),
//      and settles receipts in the same transaction. A notice is admitted
//      only while its receipt is still pending (a status read or an earlier
//      hand-over may have settled it), so no separate read comes first and
//      nobody is woken for what was already read;
//   3. acknowledge and wake, by how the owner reads it:
//      - a report is read from the parent's inbox, which is durable and is
//        acknowledged by the drain that takes it: its receipt is acknowledged
//        in the admit's own transaction             [report.admit.after_commit]
//        and the parent is woken to steer it in    [report.wake.after_tell];
//      - a notice can still be read by its owner's status call, which keeps
//        the drain from showing it again: a busy turn takes it steered, and
//        accepted into its queue is acknowledged, in the admit's own
//        transaction                                   [delivery.ack.after_commit];
//        an idle session is woken with a prompt    [delivery.handover.after_admit]
//        and the drain that takes it acknowledges it. During recovery nobody
//        is woken and nothing is acknowledged [recover.handover.after_admit]:
//        boot's phases resume each session.
//
// The steer or the wake goes through the same inbox actor, which tells its
// session.
//
// No state of its own: the calls may run on any executor, and the sessions
// and stores it uses are reached by message (the inbox's admit and hand-over)
// or through the single writer.
#include <boost/asio/awaitable.hpp>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "tether/persistence/task_store.hpp"
#include "tether/runtime/actor.hpp"

namespace tether::actors {

using boost::asio::awaitable;

class host;

/// One pending receipt on its way to its owner's inbox.
struct outbound {
  protocol::notification_id inbox_id;  // what the owner's inbox admits it under
  /// The receipt itself when it is keyed apart from its inbox id (a notice);
  /// a report's receipt is found by its task's notification id.
  std::optional<protocol::event_id> receipt;
  std::optional<protocol::session_id> from;  // a report: the child it is from
  std::string body;
};

struct delivery_batch {
  enum class kind { report, notice };
  kind what = kind::report;
  protocol::session_id owner;
  /// The receipt scope's tenant, checked against the owner's when given.
  std::optional<protocol::tenant_id> tenant;
  std::vector<outbound> items;  // one owner, one kind, in outbox order
  /// Boot's recovery: wakes nobody (boot's phases resume sessions).
  bool recovering = false;
  /// Instrumentation: called after the admit committed, once per batch.
  std::function<void()> handed_over;
};

/// The batch that hands one owned job's pending receipt to its owner (its
/// session and tenant from the receipt's scope), admitted only while pending.
/// `recovering`: boot's sweep, which wakes nobody.
delivery_batch notice_batch(persistence::receipt r, bool recovering);

class delivery {
 public:
  delivery(host& h, persistence::task_store& store) : host_(h), store_(store) {}

  /// How many of the batch were handed over (0 if none was still owed).
  awaitable<result<int>> deliver(delivery_batch b);

 private:
  awaitable<result<int>> drop(delivery_batch& b, const std::string& why);

  host& host_;
  persistence::task_store& store_;
};

}  // namespace tether::actors
