// Delegated tasks (docs/delegation.md): the settlement-intent protocol, the
// terminal compare-and-set every outcome shares, owner identity in recovery,
// originator checks and limits.
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>

#include "catch_result.hpp"
#include "report_support.hpp"
#include "tether/runtime/artifact.hpp"
#include "tether/runtime/clock.hpp"
#include "tether/runtime/owner_identity.hpp"

using namespace tether;
using namespace tether::test;
using actors::delegate_call;
using actors::delegate_view;
using persistence::delegate_state;
using persistence::delegate_task;
using persistence::settlement_intent;
using protocol::owner_scope;
namespace asio = boost::asio;

namespace {

// What the test's runner does for each task: waits for `release` and answers
// with `output` (or fails with `failure`), or waits until cancelled.
struct runner_control {
  std::shared_ptr<runtime::one_shot<int>> entered = runtime::one_shot<int>::make();
  // -1 when the waiting runner was cancelled (the one_shot honours the slot).
  std::shared_ptr<runtime::one_shot<int>> release = runtime::one_shot<int>::make([] { return -1; });
  std::shared_ptr<runtime::one_shot<int>> interrupted = runtime::one_shot<int>::make();
  bool block_until_cancelled = false;
  std::string output = "the answer";
  std::optional<std::string> failure;
};

struct delegate_fixture {
  explicit delegate_fixture(const std::string& tag,
                            std::function<void(actors::delegate_options&)> limits = {})
      : f(tag), limits(std::move(limits)) {
    f.tune = [this](actors::host_options& o) {
      o.delegation.recovery_every = std::chrono::hours(1);  // recover() is called by the tests
      if (this->limits) this->limits(o.delegation);
      o.run_delegate = [ctl = ctl](delegate_call,
                                   protocol::job_id) -> asio::awaitable<result<std::string>> {
        ctl->entered->set(1);
        try {
          if (ctl->block_until_cancelled) {
            co_await until_cancelled();
          } else if (co_await ctl->release->async_wait(asio::use_awaitable) < 0) {
            ctl->interrupted->set(1);
            co_return error{errc::cancelled, "interrupted"};
          }
        } catch (const boost::system::system_error&) {
          ctl->interrupted->set(1);
          throw;
        }
        if (ctl->failure) co_return error{errc::failed, *ctl->failure};
        co_return ctl->output;
      };
    };
    f.code("origin")->fn = [](agent_context&, drain_input) -> asio::awaitable<void> { co_return; };
    f.code("other")->fn = [](agent_context&, drain_input) -> asio::awaitable<void> { co_return; };
    f.restart();
    REQUIRE(f.sync(f.host->create_session("origin", session_id("origin"))));
    REQUIRE(f.sync(f.host->create_session("other", session_id("other"))));
  }

  owner_scope caller(const std::string& s = "origin") {
    owner_scope c;
    c.tenant = protocol::tenant_id("default");
    c.thread = session_id(s);
    c.turn = protocol::turn_id("turn_1");
    return c;
  }
  delegate_call call(const std::string& prompt = "summarise the logs") {
    delegate_call c;
    c.caller = caller();
    c.agent = "worker";
    c.prompt = prompt;
    c.workspace = f.dir.path() / "workspace";
    return c;
  }
  actors::delegates& d() { return f.host->delegation(); }
  delegate_task row(const protocol::job_id& id) {
    auto r = f.host->store().delegate(id);
    REQUIRE(r);
    REQUIRE(*r);
    return **r;
  }
  std::vector<settlement_intent> intents() {
    auto r = f.host->store().settlement_intents();
    REQUIRE(r);
    return *r;
  }
  int receipts_of(const protocol::job_id& id) {
    auto r = f.host->store().receipts_of(id);
    REQUIRE(r);
    return static_cast<int>(r->size());
  }
  // How many of the originator's transcript messages contain `text`.
  int in_transcript(const std::string& text, const std::string& s = "origin") {
    return f.messages_with(s, text);
  }

  std::shared_ptr<runner_control> ctl = std::make_shared<runner_control>();
  report_fixture f;
  std::function<void(actors::delegate_options&)> limits;
};

// A task as a dead owner left it: registered, running, its lease current.
delegate_task orphan(delegate_fixture& x, const std::string& id, const std::string& owner) {
  delegate_task t;
  t.id = protocol::job_id(id);
  t.scope = x.caller();
  t.agent = "worker";
  t.preview = "p";
  t.workspace = (x.f.dir.path() / "workspace").string();
  t.owner = owner;
  t.lease_until = runtime::now_ms() + 3'600'000;
  REQUIRE(x.f.sync(x.f.host->store().admit_delegate(t)));
  return t;
}

settlement_intent intent_for(const delegate_task& t, const std::string& bytes) {
  settlement_intent i;
  i.task = t.id;
  i.owner = t.owner;
  i.state = delegate_state::completed;
  i.artifact = (std::filesystem::path(t.workspace) / "delegates" / (t.id.str() + ".json")).string();
  i.digest = runtime::sha256_digest(bytes);
  i.bytes = static_cast<std::int64_t>(bytes.size());
  return i;
}

void write_file(const std::string& path, const std::string& bytes) {
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  std::ofstream(path, std::ios::binary) << bytes;
}

// A real process that lives until end() (or the object's end): it blocks
// reading a pipe whose write end only this process holds.
class blocked_child {
 public:
  blocked_child() {
    int fds[2];
    REQUIRE(::pipe(fds) == 0);
    pid_ = ::fork();
    REQUIRE(pid_ >= 0);
    if (pid_ == 0) {
      ::close(fds[1]);
      char c;
      while (::read(fds[0], &c, 1) > 0) {
      }
      ::_exit(0);
    }
    ::close(fds[0]);
    wfd_ = fds[1];
  }
  ~blocked_child() {
    if (wfd_ < 0) return;
    ::close(wfd_);
    int st = 0;
    ::waitpid(pid_, &st, 0);
  }
  /// Its identity as that process would have recorded it (with a nonce).
  std::string identity() const {
    auto who = runtime::identity_of(pid_);
    REQUIRE(who);
    who->nonce = std::string(32, 'a');
    return runtime::to_string(*who);
  }
  /// Lets it exit and reaps it.
  void end() {
    if (wfd_ < 0) return;
    ::close(wfd_);
    wfd_ = -1;
    int st = 0;
    REQUIRE(::waitpid(pid_, &st, 0) == pid_);
  }

 private:
  pid_t pid_ = -1;
  int wfd_ = -1;
};

}  // namespace

TEST_CASE(
    "a background delegate is registered before it runs, and its artifact is published and "
    "promoted once") {
  delegate_fixture x("dlg-life");
  auto id = x.f.sync(x.d().start_task(x.call()));
  REQUIRE(id);
  CHECK(id->str().rfind("dlg_", 0) == 0);
  CHECK(id->str().size() == 4 + 36);  // a UUID
  x.f.sync(x.ctl->entered->async_wait(asio::use_awaitable));
  // Running, owned by this process, with a lease, before any output exists.
  auto t = x.row(*id);
  CHECK(t.state == delegate_state::running);
  CHECK(t.owner == runtime::to_string(runtime::current_process_identity()));
  CHECK(t.lease_until > runtime::now_ms());
  CHECK(t.depth == 1);
  CHECK_FALSE(t.artifact);

  x.ctl->release->set(1);
  auto v = x.f.sync(x.d().wait(x.caller(), *id, std::chrono::milliseconds(120000)));
  REQUIRE(v);
  REQUIRE(v->state == delegate_state::completed);
  REQUIRE(v->output);
  CHECK(*v->output == "the answer");
  // The row holds the reference and digest, the file the exact bytes.
  t = x.row(*id);
  REQUIRE(t.artifact);
  REQUIRE(t.digest);
  auto bytes = runtime::read_artifact(*t.artifact, 1 << 20);
  REQUIRE(bytes);
  CHECK(runtime::sha256_digest(*bytes) == *t.digest);
  CHECK(t.bytes == static_cast<std::int64_t>(bytes->size()));
  CHECK(bytes->find("the answer") != std::string::npos);
  CHECK(x.intents().empty());
  // One terminal receipt, delivered once to the originator.
  x.f.quiet();
  CHECK(x.receipts_of(*id) == 1);
  CHECK(x.in_transcript("[delegated task " + id->str() + " (worker) completed]") == 1);
  CHECK(x.in_transcript("the answer") == 1);
}

TEST_CASE("a failing delegate is failed with its error, scrubbed, and publishes no artifact") {
  delegate_fixture x("dlg-fail");
  x.ctl->failure = "it broke with token ghp_abcdefghijklmnopqrstuvwxyz0123456789";
  auto id = x.f.sync(x.d().start_task(x.call()));
  REQUIRE(id);
  x.ctl->release->set(1);
  auto v = x.f.sync(x.d().wait(x.caller(), *id, std::chrono::milliseconds(120000)));
  REQUIRE(v);
  CHECK(v->state == delegate_state::failed);
  REQUIRE(v->error);
  CHECK(v->error->find("it broke") != std::string::npos);
  CHECK(v->error->find("ghp_abcdefghij") == std::string::npos);
  CHECK_FALSE(x.row(*id).artifact);
  CHECK_FALSE(
      std::filesystem::exists(x.f.dir.path() / "workspace" / "delegates" / (id->str() + ".json")));
  x.f.quiet();
  CHECK(x.in_transcript("ghp_abcdefghij") == 0);
  CHECK(x.in_transcript("[delegated task " + id->str() + " (worker) failed]") == 1);
}

TEST_CASE(
    "a cancel that wins is kept: the worker is signalled after it, and its later output is never "
    "published") {
  delegate_fixture x("dlg-cancel");
  auto id = x.f.sync(x.d().start_task(x.call()));
  REQUIRE(id);
  x.f.sync(x.ctl->entered->async_wait(asio::use_awaitable));
  auto v = x.f.sync(x.d().cancel(x.caller(), *id));
  REQUIRE(v);
  CHECK(v->state == delegate_state::cancelled);
  // The worker was interrupted by the winner's signal.
  x.f.sync(x.ctl->interrupted->async_wait(asio::use_awaitable));
  auto after = x.f.sync(x.d().wait(x.caller(), *id, std::chrono::milliseconds(120000)));
  REQUIRE(after);
  CHECK(after->state == delegate_state::cancelled);
  CHECK_FALSE(x.row(*id).artifact);
  CHECK(x.intents().empty());
  CHECK_FALSE(
      std::filesystem::exists(x.f.dir.path() / "workspace" / "delegates" / (id->str() + ".json")));
  CHECK(x.receipts_of(*id) == 1);  // the cancel's, and no other
}

TEST_CASE("a cancel after completion loses the compare-and-set and signals nobody") {
  delegate_fixture x("dlg-cancel-late");
  auto id = x.f.sync(x.d().start_task(x.call()));
  REQUIRE(id);
  x.ctl->release->set(1);
  REQUIRE(x.f.sync(x.d().wait(x.caller(), *id, std::chrono::milliseconds(120000)))->state ==
          delegate_state::completed);
  auto v = x.f.sync(x.d().cancel(x.caller(), *id));
  REQUIRE(v);
  CHECK(v->state == delegate_state::completed);
  CHECK_FALSE(x.ctl->interrupted->ready());
  CHECK(x.receipts_of(*id) == 1);
}

TEST_CASE(
    "a foreign caller's result, wait, list and cancel read exactly as a missing task and touch "
    "nothing") {
  delegate_fixture x("dlg-foreign");
  auto id = x.f.sync(x.d().start_task(x.call()));
  REQUIRE(id);
  auto foreign = x.caller("other");
  auto missing = protocol::job_id("dlg_00000000-0000-4000-8000-000000000000");
  auto c1 = x.f.sync(x.d().cancel(foreign, *id));
  auto c2 = x.f.sync(x.d().cancel(foreign, missing));
  REQUIRE_FALSE(c1);
  REQUIRE_FALSE(c2);
  CHECK(c1.error().code == errc::not_found);
  CHECK(c1.error().message == "delegated task '" + id->str() + "' not found");
  CHECK(c2.error().message == "delegated task '" + missing.str() + "' not found");
  auto r = x.f.sync(x.d().result_of(foreign, *id));
  REQUIRE_FALSE(r);
  CHECK(r.error().code == errc::not_found);
  auto w = x.f.sync(x.d().wait(foreign, *id, std::chrono::milliseconds(1)));
  REQUIRE_FALSE(w);
  CHECK(w.error().code == errc::not_found);
  auto l = x.f.sync(x.d().list(foreign));
  REQUIRE(l);
  CHECK(l->empty());
  // Untouched: still running, still the originator's.
  CHECK(x.row(*id).state == delegate_state::running);
  auto mine = x.f.sync(x.d().list(x.caller()));
  REQUIRE(mine);
  REQUIRE(mine->size() == 1);
  CHECK(mine->front().id == *id);
  x.ctl->release->set(1);
  CHECK(x.f.sync(x.d().wait(x.caller(), *id, std::chrono::milliseconds(120000)))->state ==
        delegate_state::completed);
}

TEST_CASE("delegation limits: depth and the number running at once are refused with clear errors") {
  delegate_fixture x("dlg-limits", [](actors::delegate_options& o) { o.max_background = 2; });
  auto deep = x.call();
  deep.depth = 4;
  auto r = x.f.sync(x.d().start_task(deep));
  REQUIRE_FALSE(r);
  CHECK(r.error().code == errc::refused);
  CHECK(r.error().message == "delegation depth 4 exceeds the limit of 3; nothing was started");
  auto a = x.f.sync(x.d().start_task(x.call()));
  auto b = x.f.sync(x.d().start_task(x.call()));
  REQUIRE(a);
  REQUIRE(b);
  auto c = x.f.sync(x.d().start_task(x.call()));
  REQUIRE_FALSE(c);
  CHECK(c.error().message == "2 delegated tasks are running, the limit is 2; nothing was started");
  auto all = x.f.host->store().delegates();
  REQUIRE(all);
  CHECK(all->size() == 2);  // nothing was registered for the refused ones
  x.ctl->release->set(1);
  for (auto& id : {*a, *b})
    CHECK(x.f.sync(x.d().wait(x.caller(), id, std::chrono::milliseconds(120000)))->state ==
          delegate_state::completed);
}

TEST_CASE(
    "a run past its time limit is timed out through the same compare-and-set, and its worker "
    "interrupted") {
  delegate_fixture x("dlg-timeout", [](actors::delegate_options& o) {
    o.run_timeout = std::chrono::milliseconds(1);
  });
  x.ctl->block_until_cancelled = true;  // it can only end by the timeout
  auto id = x.f.sync(x.d().start_task(x.call()));
  REQUIRE(id);
  x.f.sync(x.d().worker_ended(*id));
  // Interrupted, or stopped before it began: never left running.
  CHECK((x.ctl->interrupted->ready() || !x.ctl->entered->ready()));
  auto v = x.f.sync(x.d().wait(x.caller(), *id, std::chrono::milliseconds(120000)));
  REQUIRE(v);
  CHECK(v->state == delegate_state::timed_out);
  CHECK(x.receipts_of(*id) == 1);
}

TEST_CASE("a synchronous delegate past its wait is cancelled, and the caller is told so") {
  delegate_fixture x("dlg-sync");
  x.ctl->block_until_cancelled = true;
  auto v = x.f.sync(x.d().run(x.call(), std::chrono::milliseconds(1)));
  REQUIRE(v);
  CHECK(v->state == delegate_state::cancelled);
  REQUIRE(v->error);
  CHECK(v->error->find("ran past 1 ms") != std::string::npos);
  x.f.sync(x.d().worker_ended(v->id));
  CHECK((x.ctl->interrupted->ready() || !x.ctl->entered->ready()));
}

TEST_CASE("recovery promotes a valid intent of a provably gone owner, once") {
  delegate_fixture x("dlg-rec-promote");
  auto t = orphan(x, "dlg_a", dead_owner());
  auto bytes = actors::delegates::envelope(t.id, "worker", "recovered output");
  auto in = intent_for(t, bytes);
  REQUIRE(x.f.sync(x.f.host->store().write_intent(in)));
  REQUIRE(runtime::publish_artifact(std::filesystem::path(in.artifact).parent_path(),
                                    t.id.str() + ".json", bytes));
  auto rep = x.f.sync(x.d().recover());
  REQUIRE(rep);
  CHECK(rep->promoted == 1);
  CHECK(rep->failed == 0);
  auto row = x.row(t.id);
  CHECK(row.state == delegate_state::completed);
  CHECK(row.digest == in.digest);
  CHECK(x.intents().empty());
  auto again = x.f.sync(x.d().recover());
  REQUIRE(again);
  CHECK(again->promoted == 0);
  x.f.quiet();
  CHECK(x.receipts_of(t.id) == 1);
  CHECK(x.in_transcript("recovered output") == 1);
}

TEST_CASE("recovery never completes a task whose artifact is missing, corrupt or another task's") {
  delegate_fixture x("dlg-rec-fail");
  // Missing: the intent is on disk, the bytes never were.
  auto missing = orphan(x, "dlg_missing", dead_owner());
  auto mb = actors::delegates::envelope(missing.id, "worker", "never written");
  REQUIRE(x.f.sync(x.f.host->store().write_intent(intent_for(missing, mb))));
  // Corrupt: other bytes than the digest's.
  auto corrupt = orphan(x, "dlg_corrupt", dead_owner());
  auto cb = actors::delegates::envelope(corrupt.id, "worker", "the real output");
  auto ci = intent_for(corrupt, cb);
  REQUIRE(x.f.sync(x.f.host->store().write_intent(ci)));
  write_file(ci.artifact, actors::delegates::envelope(corrupt.id, "worker", "tampered"));
  // Another task's: digest-matched bytes that name another task.
  auto borrowed = orphan(x, "dlg_borrowed", dead_owner());
  auto other = actors::delegates::envelope(protocol::job_id("dlg_other"), "worker", "theirs");
  auto bi = intent_for(borrowed, other);
  REQUIRE(x.f.sync(x.f.host->store().write_intent(bi)));
  write_file(bi.artifact, other);

  auto rep = x.f.sync(x.d().recover());
  REQUIRE(rep);
  CHECK(rep->promoted == 0);
  CHECK(rep->failed == 3);
  auto m = x.row(missing.id);
  CHECK(m.state == delegate_state::failed);
  REQUIRE(m.error);
  CHECK(m.error->find("recovery:") != std::string::npos);
  auto c = x.row(corrupt.id);
  CHECK(c.state == delegate_state::failed);
  REQUIRE(c.error);
  CHECK(c.error->find("does not match its digest") != std::string::npos);
  auto b = x.row(borrowed.id);
  CHECK(b.state == delegate_state::failed);
  REQUIRE(b.error);
  CHECK(b.error->find("is the output of task 'dlg_other'") != std::string::npos);
  CHECK(x.intents().empty());
}

TEST_CASE("recovery keeps a competing terminal winner and removes the stale intent") {
  delegate_fixture x("dlg-rec-stale");
  auto t = orphan(x, "dlg_won", dead_owner());
  auto bytes = actors::delegates::envelope(t.id, "worker", "late output");
  auto in = intent_for(t, bytes);
  REQUIRE(x.f.sync(x.f.host->store().write_intent(in)));
  write_file(in.artifact, bytes);
  {
    // A cancel that won while the intent was on disk.
    SQLite::Database db(x.f.dir.file("tether.db"), SQLite::OPEN_READWRITE);
    db.exec("UPDATE tasks SET state = 'cancelled' WHERE id = 'dlg_won'");
  }
  auto rep = x.f.sync(x.d().recover());
  REQUIRE(rep);
  CHECK(rep->promoted == 0);
  CHECK(rep->stale == 1);
  CHECK(x.row(t.id).state == delegate_state::cancelled);
  CHECK(x.intents().empty());
}

TEST_CASE(
    "recovery reclaims prior-boot orphans as lost and keeps an unparsable owner, saying why") {
  delegate_fixture x("dlg-rec-lost");
  auto gone = orphan(x, "dlg_gone", dead_owner());
  auto garbled = orphan(x, "dlg_garbled", "v1:not-an-identity");
  auto rep = x.f.sync(x.d().recover());
  REQUIRE(rep);
  CHECK(rep->lost == 1);
  CHECK(x.row(gone.id).state == delegate_state::lost);
  CHECK(x.row(garbled.id).state == delegate_state::running);
  REQUIRE(rep->kept.size() == 1);
  CHECK(rep->kept[0].find("dlg_garbled") != std::string::npos);
  CHECK(rep->kept[0].find("uncertain") != std::string::npos);
}

TEST_CASE("a live foreign owner keeps its task, which is reclaimed once that process exits") {
  delegate_fixture x("dlg-rec-foreign");
  blocked_child child;
  auto t = orphan(x, "dlg_foreign", child.identity());
  auto rep = x.f.sync(x.d().recover());
  REQUIRE(rep);
  CHECK(rep->lost == 0);
  CHECK(x.row(t.id).state == delegate_state::running);
  child.end();  // it exits and is reaped
  rep = x.f.sync(x.d().recover());
  REQUIRE(rep);
  CHECK(rep->lost == 1);
  CHECK(x.row(t.id).state == delegate_state::lost);
}

TEST_CASE("a running task of a live owner whose lease expired is timed out") {
  delegate_fixture x("dlg-rec-lease");
  blocked_child child;
  auto t = orphan(x, "dlg_stuck", child.identity());
  {
    SQLite::Database db(x.f.dir.file("tether.db"), SQLite::OPEN_READWRITE);
    db.exec("UPDATE tasks SET lease_until = 1 WHERE id = 'dlg_stuck'");
  }
  auto rep = x.f.sync(x.d().recover());
  child.end();
  REQUIRE(rep);
  CHECK(rep->timed_out == 1);
  CHECK(x.row(t.id).state == delegate_state::timed_out);
}

TEST_CASE("boot recovers a dead owner's settlement and delivers its notice once") {
  delegate_fixture x("dlg-boot");
  auto t = orphan(x, "dlg_boot", dead_owner());
  auto bytes = actors::delegates::envelope(t.id, "worker", "found at boot");
  auto in = intent_for(t, bytes);
  REQUIRE(x.f.sync(x.f.host->store().write_intent(in)));
  write_file(in.artifact, bytes);
  x.f.restart();
  CHECK(x.f.boot.delegation.promoted == 1);
  x.f.quiet();
  CHECK(x.row(t.id).state == delegate_state::completed);
  CHECK(x.in_transcript("found at boot") == 1);
  x.f.restart();
  CHECK(x.f.boot.delegation.promoted == 0);
  x.f.quiet();
  CHECK(x.in_transcript("found at boot") == 1);
}
