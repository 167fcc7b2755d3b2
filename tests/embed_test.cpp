// The embedding API (<tether/tether.hpp>): open, sessions, typed transcripts,
// background reports into the parent's inbox, interrupt, and a shutdown that
// refuses to deadlock on its own executor threads.
#include <atomic>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <catch2/catch.hpp>
#include <chrono>
#include <future>
#include <tether/tether.hpp>

#include "catch_result.hpp"
#include "support.hpp"

namespace {

namespace asio = boost::asio;
using tether::message_kind;
using tether::role;

asio::awaitable<void> echo(tether::turn& t) {
  for (const auto& m : t.inputs()) {
    if (m.kind == message_kind::prompt || m.kind == message_kind::steer) {
      std::string answer = "echo: " + m.text;
      co_await t.say(std::move(answer));
    }
  }
}

// Spawns a helper in the background on a prompt; notes the report when it comes.
asio::awaitable<void> parent(tether::turn& t) {
  for (const auto& m : t.inputs()) {
    if (m.kind == message_kind::prompt) {
      auto child = co_await t.spawn_background("echo", "echo it in the background", m.text);
      if (!child) throw std::runtime_error(child.error().message);
      co_await t.say("started " + child->str());
    } else if (m.kind == message_kind::report) {
      co_await t.say("got the report");
    }
  }
}

tether::options echo_options(const tether::test::scratch_dir& dir) {
  tether::options o;
  o.db_path = dir.file("embed.db");
  o.threads = 2;
  o.add_agent("echo", echo).add_agent("parent", parent);
  return o;
}

std::unique_ptr<tether::embedded> open_host(tether::options o) {
  auto h = tether::embedded::open(std::move(o));
  REQUIRE(h);
  return std::move(*h);
}

}  // namespace

TEST_CASE("embed: every enum value round-trips through to_string and parse") {
  auto round_trip = [](auto first, int count) {
    using E = decltype(first);
    for (int i = 0; i < count; ++i) {
      E v = static_cast<E>(i), back{};
      auto name = tether::to_string(v);
      INFO(name);
      CHECK(name != "unknown");
      CHECK(tether::parse(name, back));
      CHECK(back == v);
    }
    E untouched = first;
    CHECK_FALSE(tether::parse("no-such-name", untouched));
    CHECK(untouched == first);
  };
  round_trip(role::user, 2);
  round_trip(message_kind::prompt, 6);
  round_trip(tether::message_status::completed, 2);
  round_trip(tether::task_kind::subagent, 2);
  round_trip(tether::task_state::admitted, 6);
  round_trip(tether::job_policy::withhold, 2);
  CHECK(tether::to_string(tether::job_policy::report_now) == "report_now");
  CHECK(tether::to_task_state(tether::persistence::job_status::error) ==
        tether::task_state::failed);
}

TEST_CASE("embed: a persisted message with an unknown kind is refused naming its seq and field") {
  tether::persistence::message_row row{7, "user", "telegram", "completed", "hi"};
  auto m = tether::to_message(row);
  REQUIRE_FALSE(m);
  CHECK(m.error().code == tether::errc::corrupt);
  CHECK(m.error().message == "message seq 7 has unknown kind 'telegram'");
}

TEST_CASE("embed: open refuses options without agents and names what it refused") {
  tether::test::scratch_dir dir("embed-open");
  tether::options o;
  o.db_path = dir.file("embed.db");
  auto h = tether::embedded::open(o);
  REQUIRE_FALSE(h);
  CHECK(h.error().code == tether::errc::invalid);
  CHECK_THAT(h.error().message, Catch::Contains("add_agent()"));

  o.add_agent("empty", tether::agent_fn{});
  auto h2 = tether::embedded::open(o);
  REQUIRE_FALSE(h2);
  CHECK_THAT(h2.error().message, Catch::Contains("agent 'empty' is empty"));
}

TEST_CASE("embed: a session for an agent that is not registered is refused") {
  tether::test::scratch_dir dir("embed-unknown");
  auto h = open_host(echo_options(dir));
  auto s = h->block(h->create_session("nobody runs this", "nobody"));
  REQUIRE_FALSE(s);
  CHECK(s.error().code == tether::errc::invalid);
  CHECK_THAT(s.error().message, Catch::Contains("no agent named 'nobody'") &&
                                    Catch::Contains("registered: echo, parent"));
  REQUIRE(h->close());
}

TEST_CASE("embed: a prompt and a steer appear in the typed transcript with their answers") {
  tether::test::scratch_dir dir("embed-transcript");
  auto h = open_host(echo_options(dir));
  auto s = h->block(h->create_session("echo", "echo"));
  REQUIRE(s);
  REQUIRE(h->block(h->prompt(*s, "hello")));
  REQUIRE(h->block(h->wait_idle(*s)));
  REQUIRE(h->block(h->steer(*s, "and more")));
  REQUIRE(h->block(h->wait_idle(*s)));

  auto t = h->transcript(*s);
  REQUIRE(t);
  REQUIRE(t->size() == 4);
  auto expect = [&](std::size_t i, role r, message_kind k, const std::string& text) {
    INFO("message " << i << ": " << (*t)[i].text);
    CHECK((*t)[i].role == r);
    CHECK((*t)[i].kind == k);
    CHECK((*t)[i].status == tether::message_status::completed);
    CHECK((*t)[i].text == text);
  };
  expect(0, role::user, message_kind::prompt, "hello");
  expect(1, role::assistant, message_kind::answer, "echo: hello");
  expect(2, role::user, message_kind::steer, "and more");
  expect(3, role::assistant, message_kind::answer, "echo: and more");
  CHECK((*t)[0].seq < (*t)[3].seq);
  REQUIRE(h->close());
}

TEST_CASE("embed: a background subagent's report reaches the parent's inbox and wakes it") {
  tether::test::scratch_dir dir("embed-report");
  auto h = open_host(echo_options(dir));
  auto p = h->block(h->create_session("parent", "parent"));
  REQUIRE(p);
  REQUIRE(h->block(h->prompt(*p, "echo this")));
  REQUIRE(h->block(h->wait_quiescent()));

  auto inbox = h->inbox(*p);
  REQUIRE(inbox);
  REQUIRE(inbox->size() == 1);
  const auto& report = inbox->front();
  REQUIRE(report.from);
  CHECK(report.acknowledged);
  CHECK_THAT(report.body, Catch::Contains("echo: echo this"));

  auto t = h->transcript(*p);
  REQUIRE(t);
  REQUIRE(t->size() == 4);
  CHECK((*t)[1].text == "started " + report.from->str());
  CHECK((*t)[2].role == role::user);
  CHECK((*t)[2].kind == message_kind::report);
  CHECK((*t)[2].text == report.body);
  CHECK((*t)[3].text == "got the report");
  // The child's own transcript: its prompt and its answer.
  auto child = h->transcript(*report.from);
  REQUIRE(child);
  REQUIRE(child->size() == 2);
  CHECK((*child)[1].text == "echo: echo this");
  CHECK(h->running(*p).empty());
  REQUIRE(h->close());
}

TEST_CASE("embed: an interrupt cancels the running turn") {
  tether::test::scratch_dir dir("embed-interrupt");
  struct probe {
    std::promise<void> started;
    std::atomic<bool> cancelled{false};
  };
  auto pr = std::make_shared<probe>();
  auto o = echo_options(dir);
  o.add_agent("waiter", [pr](tether::turn&) -> asio::awaitable<void> {
    pr->started.set_value();
    // Ends on the interrupt; the deadline only bounds a failing run.
    asio::steady_timer timer(co_await asio::this_coro::executor, std::chrono::seconds(60));
    try {
      co_await timer.async_wait(asio::use_awaitable);
    } catch (const boost::system::system_error&) {
      pr->cancelled = true;
      throw;
    }
  });
  auto h = open_host(std::move(o));
  auto s = h->block(h->create_session("waits", "waiter"));
  REQUIRE(s);
  REQUIRE(h->block(h->prompt(*s, "wait")));
  REQUIRE(pr->started.get_future().wait_for(std::chrono::seconds(30)) == std::future_status::ready);
  REQUIRE(h->interrupt(*s));
  REQUIRE(h->block(h->wait_idle(*s)));
  CHECK(pr->cancelled);
  auto missing = h->interrupt(tether::session_id("ses_missing"));
  REQUIRE_FALSE(missing);
  CHECK(missing.error().code == tether::errc::not_found);
  REQUIRE(h->close());
}

TEST_CASE(
    "embed: close, shutdown and block inside an agent's turn are refused, naming the misuse") {
  tether::test::scratch_dir dir("embed-misuse");
  struct probe {
    std::atomic<tether::embedded*> host{nullptr};
    std::optional<tether::error> close_err, shutdown_err, block_err;
  };
  auto pr = std::make_shared<probe>();
  auto o = echo_options(dir);
  o.add_agent("closer", [pr](tether::turn& t) -> asio::awaitable<void> {
    auto* h = pr->host.load();
    if (auto r = h->close(); !r) pr->close_err = r.error();
    if (auto r = co_await h->shutdown(); !r) pr->shutdown_err = r.error();
    if (auto r = h->block(h->wait_idle(t.self())); !r) pr->block_err = r.error();
    co_await t.say("still here");
  });
  auto h = open_host(std::move(o));
  pr->host = h.get();
  auto s = h->block(h->create_session("tries to close", "closer"));
  REQUIRE(s);
  REQUIRE(h->block(h->prompt(*s, "close the host")));
  REQUIRE(h->block(h->wait_idle(*s)));

  REQUIRE(pr->close_err);
  CHECK(pr->close_err->code == tether::errc::refused);
  CHECK_THAT(pr->close_err->message,
             Catch::Contains("close() was called on one of the host's own executor threads") &&
                 Catch::Contains("Nothing was done"));
  REQUIRE(pr->shutdown_err);
  CHECK_THAT(pr->shutdown_err->message, Catch::Contains("shutdown() was called on one"));
  REQUIRE(pr->block_err);
  CHECK_THAT(pr->block_err->message, Catch::Contains("block() was called on one"));
  // Nothing was shut down: the turn answered and the host still takes work.
  auto t = h->transcript(*s);
  REQUIRE(t);
  REQUIRE(t->size() == 2);
  CHECK(t->back().text == "still here");
  auto e = h->block(h->create_session("echo", "echo"));
  REQUIRE(e);
  REQUIRE(h->close());
}

TEST_CASE("embed: shutdown is idempotent and the host refuses work after it") {
  tether::test::scratch_dir dir("embed-shutdown");
  auto h = open_host(echo_options(dir));
  auto s = h->block(h->create_session("echo", "echo"));
  REQUIRE(s);
  REQUIRE(tether::test::run(h->shutdown()));
  REQUIRE(tether::test::run(h->shutdown()));
  REQUIRE(h->close());

  auto p = tether::test::run(h->prompt(*s, "anyone there?"));
  REQUIRE_FALSE(p);
  CHECK(p.error().code == tether::errc::stopped);
  CHECK(p.error().message == "prompt refused: the host is shut down");
  auto q = tether::test::run(h->wait_quiescent());
  REQUIRE_FALSE(q);
  CHECK(q.error().code == tether::errc::stopped);
  auto b = h->block(h->wait_idle(*s));
  REQUIRE_FALSE(b);
  CHECK(b.error().code == tether::errc::stopped);
}

TEST_CASE("embed: a session that was mid-turn at shutdown resumes at the next open") {
  tether::test::scratch_dir dir("embed-resume");
  auto pr = std::make_shared<std::promise<void>>();
  auto o = echo_options(dir);
  o.add_agent("slow", [pr](tether::turn&) -> asio::awaitable<void> {
    pr->set_value();
    // Ends on the shutdown; the deadline only bounds a failing run.
    asio::steady_timer timer(co_await asio::this_coro::executor, std::chrono::seconds(60));
    co_await timer.async_wait(asio::use_awaitable);
  });
  tether::session_id s("ses_x");
  {
    auto h = open_host(o);
    auto created = h->block(h->create_session("slow", "slow"));
    REQUIRE(created);
    s = *created;
    REQUIRE(h->block(h->prompt(s, "take your time")));
    REQUIRE(pr->get_future().wait_for(std::chrono::seconds(30)) == std::future_status::ready);
    REQUIRE(h->close());
  }
  // The claim stayed on disk: the next open resumes the session, now answered by echo.
  auto o2 = echo_options(dir);
  o2.add_agent("slow", echo);
  auto h = open_host(std::move(o2));
  CHECK(h->boot_report().resumed_top == 1);
  REQUIRE(h->block(h->wait_quiescent()));
  auto t = h->transcript(s);
  REQUIRE(t);
  REQUIRE(t->size() == 2);
  CHECK(t->back().text == "echo: take your time");
  REQUIRE(h->close());
}

TEST_CASE("embed: a turn's delegate runs the named agent and its notice reaches the caller once") {
  tether::test::scratch_dir dir("embed-delegate");
  auto noticed = std::make_shared<std::promise<std::string>>();
  auto ws = dir.path() / "ws";
  auto boss = [noticed, ws](tether::turn& t) -> asio::awaitable<void> {
    for (const auto& m : t.inputs()) {
      if (m.kind == message_kind::prompt) {
        auto id = co_await t.delegate("echo", m.text, ws);
        if (!id) throw std::runtime_error(id.error().message);
        co_await t.say("delegated " + id->str());
      } else if (m.kind == message_kind::notice) {
        co_await t.say("got the notice");
        noticed->set_value(m.text);
      }
    }
  };
  auto o = echo_options(dir);
  o.add_agent("boss", boss);
  auto h = open_host(std::move(o));
  auto p = h->block(h->create_session("boss", "boss"));
  REQUIRE(p);
  REQUIRE(h->block(h->prompt(*p, "summarise")));
  auto notice = noticed->get_future().get();
  CHECK_THAT(notice, Catch::Contains("echo: summarise"));
  REQUIRE(h->block(h->wait_quiescent()));
  auto t = h->transcript(*p);
  REQUIRE(t);
  int notices = 0;
  for (const auto& m : *t)
    if (m.kind == message_kind::notice) ++notices;
  CHECK(notices == 1);
  // The artifact is where the call said, and the row holds only its reference.
  REQUIRE((*t)[1].text.rfind("delegated dlg_", 0) == 0);
  auto id = (*t)[1].text.substr(std::string("delegated ").size());
  CHECK(std::filesystem::exists(ws / "delegates" / (id + ".json")));
  REQUIRE(h->close());
}
