#pragma once
// The inbox actor: one per session, the only way a report or a notice
// reaches that session.
//
// It admits what the delivery path hands it (actors/delivery.hpp) into the
// session's durable inbox under its inbox id, through the single writer; a
// repeat of an id already admitted is dropped there, so at-least-once
// delivery is seen once. A child's settle that owes this session a report
// comes here too (`settle_admit`): the settle and the admit are one writer
// request, so the report never waits in the outbox. After an admit's commit
// it tells its session what was admitted (after a settle_admit's, the child
// does), and, when the delivery path asks it to, steers the running turn or
// wakes the idle session.
//
// Order: the session learns of an admit (`session_msg::admitted`) before the
// admit's asker is answered. Whatever the asker does next (a job leaving the
// live set, a wake) therefore reaches the session's mailbox after it, and a
// turn that withholds its completion for its jobs sees their receipts before
// it can settle. A settle_admit's asker is answered with the queued write
// and tells the session itself, after the commit and before anything else
// it does.
//
// Threads: pinned to its session's executor. Its state is the session it
// serves (a weak reference, told once by `attach`); it reads no other actor's
// state. Admits do not hold the mailbox while their transaction commits, so
// admits from many children share one group commit.
#include <memory>
#include <variant>
#include <vector>

#include "tether/actors/agent.hpp"
#include "tether/persistence/task_store.hpp"
#include "tether/runtime/actor.hpp"

namespace tether::actors {

class host;
class session;

namespace inbox_msg {
/// The session this inbox serves; the first message of every inbox.
struct attach {
  std::weak_ptr<session> owner;
};
/// Admits `items` under their inbox ids; the reply says, per item, what the
/// admit did (new, a repeat dropped, or a notice no longer pending).
struct admit {
  std::vector<persistence::report_item> items;
  /// Reports: their tasks' terminal receipts are acknowledged in the admit's
  /// own transaction. Notices (job receipts): admitted while pending, and the
  /// owning turn drains them before it settles.
  persistence::admit_receipts how = persistence::admit_receipts::reports;
  runtime::reply_to<std::vector<persistence::admit_outcome>> reply;
};
/// A child's settle folded with the admit of the report it writes (its
/// session's busy period ending): one transaction marks the child idle,
/// writes its report's task row and terminal receipt (acknowledged), and
/// admits the report here. The reply is the queued write itself, sent as
/// soon as it is queued: the asker (the child's session) waits for its
/// commit on its own executor, then tells this session what was admitted
/// (`session_msg::admitted`) before anything else, and wakes it afterwards,
/// as after an admit. One executor hop fewer after the commit than an
/// answer relayed through this actor.
using settle_admit_write =
    std::shared_ptr<runtime::one_shot<result<persistence::settle_admit_result>>>;
struct settle_admit {
  persistence::settle_request settle;
  protocol::notification_id report;  // the report's id (promised, or minted)
  runtime::reply_to<settle_admit_write> reply;
};
/// Steers the running turn (`steer`) or wakes the idle session with a prompt
/// (`input`) to read what was admitted. The host counted it as activity; the
/// session releases the count when it handles the wake.
struct hand_over {
  wake_scope scope = wake_scope::steer;
  /// The wake is dropped if a drain already took what this inbox admitted.
  bool admitted_here = false;
};
}  // namespace inbox_msg

using inbox_message = std::variant<inbox_msg::attach, inbox_msg::admit, inbox_msg::settle_admit,
                                   inbox_msg::hand_over>;

class inbox : public runtime::actor<inbox, inbox_message> {
 public:
  inbox(runtime::executor ex, host& h, protocol::session_id owner);

  awaitable<void> handle(inbox_message& m);

 private:
  /// After the write's commit: `committed(self, value)` tells the session,
  /// then the asker is answered.
  template <class T, class Committed>
  void finish_after_commit(std::shared_ptr<runtime::one_shot<result<T>>> write,
                           runtime::reply_to<T> reply, Committed committed);

  host& host_;
  const protocol::session_id owner_;
  std::weak_ptr<session> session_;
};

}  // namespace tether::actors
