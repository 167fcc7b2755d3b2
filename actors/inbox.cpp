#include "tether/actors/inbox.hpp"

#include <boost/asio/bind_executor.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/use_awaitable.hpp>

#include "tether/actors/host.hpp"
#include "tether/actors/session.hpp"

namespace tether::actors {

inbox::inbox(runtime::executor ex, host& h, protocol::session_id owner)
    : actor(ex, runtime::actor_options{"inbox " + owner.str()}),
      host_(h),
      owner_(std::move(owner)) {}

template <class T, class Committed>
void inbox::finish_after_commit(std::shared_ptr<runtime::one_shot<result<T>>> write,
                                runtime::reply_to<T> reply, Committed committed) {
  auto finish = [](std::shared_ptr<inbox> self, std::shared_ptr<runtime::one_shot<result<T>>> w,
                   runtime::reply_to<T> r, Committed c) -> awaitable<void> {
    auto v = co_await w->async_wait(asio::use_awaitable);
    // The session first (see the header's Order), then the asker.
    if (v) c(*self, *v);
    r.send(std::move(v));
  };
  auto ex = get_executor();
  auto on_end = [self = shared_from_this()](std::exception_ptr e) {
    // The ask was failed by its reply_to's destructor; say why.
    if (e)
      self->host_.warn("inbox of session " + self->owner_.str() + ": finishing an admit failed: " +
                       runtime::detail::describe(e) + "; its asker was told it failed");
  };
  asio::co_spawn(
      ex, finish(shared_from_this(), std::move(write), std::move(reply), std::move(committed)),
      asio::bind_executor(ex, std::move(on_end)));
}

awaitable<void> inbox::handle(inbox_message& m) {
  if (auto* at = std::get_if<inbox_msg::attach>(&m)) {
    session_ = std::move(at->owner);
  } else if (auto* a = std::get_if<inbox_msg::admit>(&m)) {
    // Queue the write now (the writer keeps arrival order) and answer after
    // its COMMIT without holding the mailbox: admits from many children then
    // share one transaction.
    std::vector<protocol::notification_id> nids;
    nids.reserve(a->items.size());
    for (auto& i : a->items) nids.push_back(i.nid);
    bool receipts = a->how != persistence::admit_receipts::reports;
    auto write = host_.store().admit_submit(owner_, std::move(a->items), a->how);
    auto committed = [nids = std::move(nids), receipts](
                         inbox& self, const std::vector<persistence::admit_outcome>& out) {
      if (auto s = self.session_.lock()) (void)s->tell(session_msg::admitted{receipts});
      if (auto* o = self.host_.observer())
        for (std::size_t i = 0; i < nids.size(); ++i)
          if (out[i] == persistence::admit_outcome::added) o->admitted(self.owner_, nids[i]);
    };
    finish_after_commit(std::move(write), std::move(a->reply), std::move(committed));
  } else if (auto* sa = std::get_if<inbox_msg::settle_admit>(&m)) {
    // Queued in arrival order, as an admit; the asker waits for the commit,
    // tells the session, and fires the observer's hooks, its settled first.
    sa->reply.send(
        host_.store().settle_admit_submit(owner_, std::move(sa->settle), std::move(sa->report)));
  } else if (auto* h = std::get_if<inbox_msg::hand_over>(&m)) {
    auto s = session_.lock();
    session_msg::wake w{h->scope, true, true, h->admitted_here};
    // Gone (deleted, shut down): nobody is woken; the count is released here.
    if (!s || !s->tell(std::move(w))) host_.activity(-1);
  }
  co_return;
}

}  // namespace tether::actors
