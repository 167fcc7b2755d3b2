// Subagent policy and the shared action budget (docs/policy.md): a child
// inherits its parent's policy and may only narrow it; the policy is checked
// where a call is made and enforced where the action runs; one budget is
// shared down a tree of sessions.
#include "tether/protocol/policy.hpp"

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>

#include "delivery_support.hpp"
#include "tether/runtime/action_budget.hpp"

using namespace tether;
using namespace tether::test;
using protocol::policy_override;
using protocol::session_policy;
namespace asio = boost::asio;

namespace {

session_policy tight() {
  session_policy p;
  p.tools = std::set<std::string>{"shell", "spawn", "search"};
  p.shells = false;
  p.isolated = true;
  p.network = false;
  p.writable = std::vector<std::string>{"/srv/work"};
  p.max_depth = 2;
  p.memory_scopes = std::set<std::string>{"project"};
  return p;
}

std::string field_refused(const session_policy& parent, const policy_override& o) {
  auto r = protocol::narrow(parent, o);
  REQUIRE_FALSE(r);
  return r.error().field;
}

}  // namespace

TEST_CASE("a child's policy override may narrow every field, and a widening one is refused by name",
          "[policy]") {
  auto p = tight();
  policy_override o;
  o.tools = std::set<std::string>{"search"};
  o.max_depth = 1;
  o.writable = std::vector<std::string>{"/srv/work/sub"};
  o.memory_scopes = std::set<std::string>{};
  auto c = protocol::narrow(p, o);
  REQUIRE(c);
  CHECK(c->allows_tool("search"));
  CHECK_FALSE(c->allows_tool("shell"));
  CHECK(c->max_depth == 1);
  CHECK(c->allows_path("/srv/work/sub/x"));
  CHECK_FALSE(c->allows_path("/srv/work/other"));
  CHECK_FALSE(c->allows_memory("project"));
  CHECK_FALSE(c->shells);  // inherited
  CHECK(c->isolated);

  policy_override w;
  w.tools = std::set<std::string>{"search", "delegate"};
  CHECK(field_refused(p, w) == "tools");
  w = {};
  w.tools = std::nullopt;
  CHECK(protocol::narrow(p, w));  // unset: inherited, not widened
  w.shells = true;
  CHECK(field_refused(p, w) == "shells");
  w = {};
  w.isolated = false;
  CHECK(field_refused(p, w) == "isolated");
  w = {};
  w.network = true;
  CHECK(field_refused(p, w) == "network");
  w = {};
  w.writable = std::vector<std::string>{"/srv"};
  CHECK(field_refused(p, w) == "writable");
  w = {};
  w.writable = std::vector<std::string>{"/srv/work/../etc"};
  CHECK(field_refused(p, w) == "writable");
  w = {};
  w.max_depth = 3;
  CHECK(field_refused(p, w) == "max_depth");
  w = {};
  w.memory_scopes = std::set<std::string>{"project", "global"};
  CHECK(field_refused(p, w) == "memory_scopes");

  // From the default (everything allowed), a set field narrows.
  session_policy open;
  policy_override n;
  n.tools = std::set<std::string>{"search"};
  n.network = false;
  auto narrowed = protocol::narrow(open, n);
  REQUIRE(narrowed);
  CHECK(narrowed->isolate_shells());  // no network is only enforced isolated
  CHECK_FALSE(open.isolate_shells());
}

TEST_CASE("a policy round-trips through JSON, and a bad document is refused by its field",
          "[policy]") {
  auto p = tight();
  auto back = protocol::policy_from_json(protocol::to_json(p));
  REQUIRE(back);
  CHECK(*back == p);
  session_policy open;
  auto back2 = protocol::policy_from_json(protocol::to_json(open));
  REQUIRE(back2);
  CHECK(*back2 == open);

  auto refused = [](const std::string& text) {
    auto v = protocol::parse_json(text);
    REQUIRE(v);
    auto r = protocol::policy_from_json(*v);
    REQUIRE_FALSE(r);
    return r.error().field;
  };
  auto full = protocol::to_text(protocol::to_json(open));
  CHECK(refused(R"({"tools":null,"shells":true,"isolated":false,"network":true,"writable":null,)"
                R"("max_depth":3,"memory_scopes":null,"sudo":true})") == "policy.sudo");
  CHECK(refused(R"({"tools":null,"isolated":false,"network":true,"writable":null,)"
                R"("max_depth":3,"memory_scopes":null})") == "policy.shells");
  CHECK(refused(R"({"tools":null,"shells":null,"isolated":false,"network":true,"writable":null,)"
                R"("max_depth":3,"memory_scopes":null})") == "policy.shells");
  CHECK(refused(R"({"tools":[""],"shells":true,"isolated":false,"network":true,"writable":null,)"
                R"("max_depth":3,"memory_scopes":null})") == "policy.tools[0]");
  CHECK(refused(R"({"tools":null,"shells":true,"isolated":false,"network":true,)"
                R"("writable":["rel/dir"],"max_depth":3,"memory_scopes":null})") ==
        "policy.writable");
  CHECK(refused(R"({"tools":null,"shells":true,"isolated":false,"network":true,"writable":null,)"
                R"("max_depth":99,"memory_scopes":null})") == "policy.max_depth");
  CHECK(full.find("\"max_depth\":3") != std::string::npos);
}

TEST_CASE("writable paths compare as normalised absolute paths", "[policy]") {
  session_policy p;
  CHECK(p.allows_path("/anything"));
  p.writable = std::vector<std::string>{"/a/b"};
  CHECK(p.allows_path("/a/b"));
  CHECK(p.allows_path("/a/b/"));
  CHECK(p.allows_path("/a/b/c/../d"));
  CHECK_FALSE(p.allows_path("/a/bc"));
  CHECK_FALSE(p.allows_path("/a/b/../c"));
  CHECK_FALSE(p.allows_path("a/b"));
  CHECK_FALSE(p.allows_path(""));
  p.writable = std::vector<std::string>{"/"};
  CHECK(p.allows_path("/x"));
}

TEST_CASE("an action budget is a sliding window shared by everyone holding it", "[policy]") {
  runtime::action_budgets all(runtime::budget_options{2, std::chrono::seconds(10)});
  auto a = all.of("root");
  auto same = all.of("root");
  auto other = all.of("other");
  auto t0 = runtime::action_budget::clock::time_point{} + std::chrono::hours(1);
  CHECK(a->try_charge(t0));
  CHECK(same->try_charge(t0 + std::chrono::seconds(1)));
  CHECK_FALSE(a->try_charge(t0 + std::chrono::seconds(2)));  // spent: nothing charged
  CHECK(a->used(t0 + std::chrono::seconds(2)) == 2);
  CHECK(other->try_charge(t0 + std::chrono::seconds(2)));  // another tree's
  // The first action leaves the window: one more fits.
  CHECK(a->try_charge(t0 + std::chrono::seconds(10)));
  CHECK_FALSE(a->try_charge(t0 + std::chrono::seconds(10)));

  runtime::action_budget none(runtime::budget_options{0, std::chrono::seconds(1)});
  for (int i = 0; i < 100; ++i) REQUIRE(none.try_charge());
}

TEST_CASE("a spawn that would widen its parent's policy is refused by field, in the transcript",
          "[policy]") {
  report_fixture f("policy-widen");
  auto outcome = runtime::one_shot<result<session_id>>::make();
  f.code("parent")->fn = [outcome](agent_context& ctx, drain_input) -> asio::awaitable<void> {
    actors::spawn_request req;
    req.description = "fetch";
    req.prompt = "go";
    req.child = session_id("child");
    policy_override o;
    o.network = true;
    req.policy = o;
    outcome->set(co_await ctx.spawn_background(std::move(req)));
  };
  session_policy p;
  p.network = false;
  REQUIRE(f.sync(f.host->create_session("parent", session_id("parent"), "general",
                                        protocol::tenant_id("default"), p)));
  REQUIRE(f.sync(f.host->prompt(session_id("parent"), "start")));
  auto r = f.sync(outcome->async_wait(asio::use_awaitable));
  REQUIRE_FALSE(r);
  CHECK(r.error().code == errc::refused);
  CHECK_THAT(r.error().message, Catch::Contains("'network'"));
  f.quiet();
  auto child = f.host->store().session(session_id("child"));
  REQUIRE(child);
  CHECK_FALSE(*child);  // nothing was created
  CHECK(f.messages_with("parent", "refused: the policy field 'network'") == 1);
}

TEST_CASE("a child inherits its parent's policy narrowed, one level deeper, on the same budget",
          "[policy]") {
  report_fixture f("policy-inherit");
  auto outcome = runtime::one_shot<result<session_id>>::make();
  f.code("parent")->fn = [outcome](agent_context& ctx, drain_input) -> asio::awaitable<void> {
    actors::spawn_request req;
    req.description = "read";
    req.prompt = "go";
    req.child = session_id("child");
    policy_override o;
    o.tools = std::set<std::string>{"search"};
    req.policy = o;
    outcome->set(co_await ctx.spawn_background(std::move(req)));
  };
  auto child_saw = runtime::one_shot<std::pair<int, bool>>::make();
  f.code("child")->fn = [child_saw](agent_context& ctx, drain_input) -> asio::awaitable<void> {
    child_saw->set({ctx.depth(), ctx.policy().allows_tool("spawn")});
    co_return;
  };
  session_policy p;
  p.tools = std::set<std::string>{"search", "spawn"};
  p.network = false;
  REQUIRE(f.sync(f.host->create_session("parent", session_id("parent"), "general",
                                        protocol::tenant_id("default"), p)));
  REQUIRE(f.sync(f.host->prompt(session_id("parent"), "start")));
  REQUIRE(f.sync(outcome->async_wait(asio::use_awaitable)));
  auto saw = f.sync(child_saw->async_wait(asio::use_awaitable));
  CHECK(saw.first == 1);
  CHECK_FALSE(saw.second);
  f.quiet();
  // Durable: the row says the same after a restart.
  f.restart();
  auto row = f.host->store().session(session_id("child"));
  REQUIRE(row);
  REQUIRE(*row);
  REQUIRE((*row)->policy);
  CHECK((*row)->policy->tools == std::set<std::string>{"search"});
  CHECK_FALSE((*row)->policy->network);  // inherited
  CHECK((*row)->depth == 1);
  CHECK((*row)->budget_root == session_id("parent"));
}

TEST_CASE("a spawn or a delegate past the policy's max_depth is refused", "[policy]") {
  report_fixture f("policy-depth");
  auto grandchild = runtime::one_shot<result<session_id>>::make();
  auto delegated = runtime::one_shot<result<protocol::job_id>>::make();
  auto workspace = f.dir.path() / "ws";
  f.code("parent")->fn = [](agent_context& ctx, drain_input in) -> asio::awaitable<void> {
    if (in.inputs.empty() || in.inputs.front().kind != "prompt") co_return;  // the child's report
    actors::spawn_request req;
    req.description = "level 1";
    req.prompt = "go";
    req.child = session_id("child");
    auto r = co_await ctx.spawn_background(std::move(req));
    if (!r) throw std::runtime_error(r.error().message);
  };
  f.code("child")->fn = [grandchild, delegated, workspace](agent_context& ctx,
                                                           drain_input) -> asio::awaitable<void> {
    actors::spawn_request req;
    req.description = "level 2";
    req.prompt = "go";
    req.child = session_id("grandchild");
    grandchild->set(co_await ctx.spawn_background(std::move(req)));
    actors::delegate_request d;
    d.prompt = "work";
    d.workspace = workspace;
    delegated->set(co_await ctx.delegate_background(std::move(d)));
  };
  session_policy p;
  p.max_depth = 1;
  REQUIRE(f.sync(f.host->create_session("parent", session_id("parent"), "general",
                                        protocol::tenant_id("default"), p)));
  REQUIRE(f.sync(f.host->prompt(session_id("parent"), "start")));
  auto g = f.sync(grandchild->async_wait(asio::use_awaitable));
  REQUIRE_FALSE(g);
  CHECK(g.error().code == errc::refused);
  CHECK_THAT(g.error().message, Catch::Contains("max_depth 1"));
  auto d = f.sync(delegated->async_wait(asio::use_awaitable));
  REQUIRE_FALSE(d);
  CHECK_THAT(d.error().message, Catch::Contains("would be at depth 2"));
  f.quiet();
  auto row = f.host->store().session(session_id("grandchild"));
  REQUIRE(row);
  CHECK_FALSE(*row);
  CHECK(f.messages_with("child", "refused: a subagent from session 'child'") == 1);
}

TEST_CASE(
    "children spend their parent's action budget, and once spent, actions and spawns are "
    "refused and the refusal is in the transcript",
    "[policy]") {
  report_fixture f("policy-budget");
  f.tune = [](actors::host_options& o) {
    o.action_budget.max_actions = 2;
    o.action_budget.window = std::chrono::hours(1);
  };
  f.restart();
  auto child_acts = std::make_shared<std::vector<bool>>();
  auto parent_after = runtime::one_shot<std::pair<bool, bool>>::make();
  f.code("child")->fn = [child_acts](agent_context& ctx, drain_input) -> asio::awaitable<void> {
    // Two actions of its own: the tree has one left, then none.
    child_acts->push_back(static_cast<bool>(co_await ctx.act("search")));
    child_acts->push_back(static_cast<bool>(co_await ctx.act("search")));
    co_await ctx.say("searched");
  };
  f.code("parent")->fn = [parent_after](agent_context& ctx, drain_input) -> asio::awaitable<void> {
    actors::spawn_request req;  // the tree's first action
    req.description = "search";
    req.prompt = "go";
    req.child = session_id("child");
    auto report = co_await ctx.spawn_foreground(std::move(req));
    if (!report) throw std::runtime_error(report.error().message);
    auto act = co_await ctx.act("search");
    actors::spawn_request again;
    again.description = "search more";
    again.prompt = "go";
    again.child = session_id("child2");
    auto spawned = co_await ctx.spawn_background(std::move(again));
    parent_after->set({static_cast<bool>(act), static_cast<bool>(spawned)});
  };
  REQUIRE(f.sync(f.host->create_session("parent", session_id("parent"))));
  REQUIRE(f.sync(f.host->prompt(session_id("parent"), "start")));
  auto after = f.sync(parent_after->async_wait(asio::use_awaitable));
  CHECK(*child_acts == std::vector<bool>{true, false});
  CHECK_FALSE(after.first);
  CHECK_FALSE(after.second);
  f.quiet();
  CHECK(f.messages_with("child", "refused: the action budget of this session's tree is spent") ==
        1);
  CHECK(f.messages_with("parent", "refused: the action budget of this session's tree is spent") ==
        2);
  auto child2 = f.host->store().session(session_id("child2"));
  REQUIRE(child2);
  CHECK_FALSE(*child2);

  // Another tree has a budget of its own.
  auto other = runtime::one_shot<bool>::make();
  f.code("other")->fn = [other](agent_context& ctx, drain_input) -> asio::awaitable<void> {
    other->set(static_cast<bool>(co_await ctx.act("search")));
  };
  REQUIRE(f.sync(f.host->create_session("other", session_id("other"))));
  REQUIRE(f.sync(f.host->prompt(session_id("other"), "start")));
  CHECK(f.sync(other->async_wait(asio::use_awaitable)));
}

TEST_CASE("a tool the policy does not allow is refused at the call, in the transcript",
          "[policy]") {
  report_fixture f("policy-tools");
  auto outcome = runtime::one_shot<std::pair<bool, bool>>::make();
  f.code("s")->fn = [outcome](agent_context& ctx, drain_input) -> asio::awaitable<void> {
    auto search = co_await ctx.act("search");
    auto browse = co_await ctx.act("browse");
    outcome->set({static_cast<bool>(search), static_cast<bool>(browse)});
  };
  session_policy p;
  p.tools = std::set<std::string>{"search"};
  REQUIRE(f.sync(
      f.host->create_session("s", session_id("s"), "general", protocol::tenant_id("default"), p)));
  REQUIRE(f.sync(f.host->prompt(session_id("s"), "start")));
  auto r = f.sync(outcome->async_wait(asio::use_awaitable));
  CHECK(r.first);
  CHECK_FALSE(r.second);
  f.quiet();
  CHECK(f.messages_with("s", "refused: the tool 'browse' is not allowed") == 1);
}

TEST_CASE("a foreground spawn past its timeout interrupts the child and answers timeout",
          "[policy]") {
  report_fixture f("policy-fg-timeout");
  auto outcome = runtime::one_shot<result<std::string>>::make();
  auto child_cancelled = runtime::one_shot<int>::make();
  f.code("child")->fn = [child_cancelled](agent_context&, drain_input) -> asio::awaitable<void> {
    try {
      co_await until_cancelled();
    } catch (const boost::system::system_error&) {
      child_cancelled->set(1);
      throw;
    }
  };
  f.code("parent")->fn = [outcome](agent_context& ctx, drain_input) -> asio::awaitable<void> {
    actors::spawn_request req;
    req.description = "never ends";
    req.prompt = "go";
    req.child = session_id("child");
    req.timeout = std::chrono::milliseconds(20);
    outcome->set(co_await ctx.spawn_foreground(std::move(req)));
  };
  REQUIRE(f.sync(f.host->create_session("parent", session_id("parent"))));
  REQUIRE(f.sync(f.host->prompt(session_id("parent"), "start")));
  auto r = f.sync(outcome->async_wait(asio::use_awaitable));
  REQUIRE_FALSE(r);
  CHECK(r.error().code == errc::timeout);
  CHECK_THAT(r.error().message, Catch::Contains("20 ms limit"));
  CHECK(f.sync(child_cancelled->async_wait(asio::use_awaitable)) == 1);
  f.quiet();
  auto child = f.host->store().session(session_id("child"));
  REQUIRE(child);
  REQUIRE(*child);
  CHECK_FALSE((*child)->busy);
  CHECK((*child)->idle_outcome == std::optional<std::string>("cancelled"));
}

TEST_CASE("a session without shells is refused a shell even when its agent asks", "[policy]") {
  delivery_fixture d("policy-noshell");
  auto outcome = runtime::one_shot<result<protocol::job_id>>::make();
  d.f.code("s")->fn = [outcome](agent_context& ctx, drain_input) -> asio::awaitable<void> {
    actors::launch_request req;
    req.command = "true";
    outcome->set(co_await ctx.launch_job(std::move(req)));
  };
  session_policy p;
  p.shells = false;
  REQUIRE(d.sync(
      d.host().create_session("s", session_id("s"), "general", protocol::tenant_id("default"), p)));
  REQUIRE(d.sync(d.host().prompt(session_id("s"), "start")));
  auto r = d.sync(outcome->async_wait(asio::use_awaitable));
  REQUIRE_FALSE(r);
  CHECK(r.error().code == errc::refused);
  CHECK_THAT(r.error().message, Catch::Contains("'shells'"));
  d.f.quiet();
  CHECK(d.f.messages_with("s", "does not allow shells") == 1);
}

TEST_CASE("a shell runs under its session's policy: isolated, only its work directory writable",
          "[policy]") {
  delivery_fixture d("policy-isolated");
  auto outside = d.f.dir.file("outside.txt");
  auto inside = d.work + "/inside.txt";
  auto done = runtime::one_shot<result<actors::job_view>>::make();
  auto refused = runtime::one_shot<result<protocol::job_id>>::make();
  d.f.code("s")->fn = [done, refused, outside, inside, work = d.work, dir = d.f.dir.path()](
                          agent_context& ctx, drain_input) -> asio::awaitable<void> {
    actors::launch_request req;
    // The agent asks for no isolation and the network: the policy wins.
    req.isolate = false;
    req.allow_network = true;
    req.command = "echo in > " + inside + "; echo out > " + outside;
    req.cwd = work;
    auto id = co_await ctx.launch_job(std::move(req));
    if (!id) {
      done->set(id.error());
      co_return;
    }
    done->set(co_await ctx.wait_job(*id));
    actors::launch_request elsewhere;
    elsewhere.command = "true";
    elsewhere.cwd = dir.string();
    refused->set(co_await ctx.launch_job(std::move(elsewhere)));
  };
  session_policy p;
  p.writable = std::vector<std::string>{d.work};
  REQUIRE(d.sync(
      d.host().create_session("s", session_id("s"), "general", protocol::tenant_id("default"), p)));
  REQUIRE(d.sync(d.host().prompt(session_id("s"), "start")));
  auto r = d.sync(done->async_wait(asio::use_awaitable));
  REQUIRE(r);
  REQUIRE(r->completion);
  // The command's last write failed on the read-only root; the first one,
  // in the work directory, landed.
  CHECK(std::filesystem::exists(inside));
  CHECK_FALSE(std::filesystem::exists(outside));
  auto e = d.sync(refused->async_wait(asio::use_awaitable));
  REQUIRE_FALSE(e);
  CHECK(e.error().code == errc::refused);
  CHECK_THAT(e.error().message, Catch::Contains("outside the session's writable paths"));
}

TEST_CASE("a goal rolls up its members' terminal states and reported usage, and closes once",
          "[goal]") {
  report_fixture f("goal-rollup");
  auto goal = std::make_shared<std::optional<protocol::job_id>>();
  auto started = runtime::one_shot<std::pair<result<session_id>, result<protocol::job_id>>>::make();
  auto ws = f.dir.path() / "ws";
  f.code("parent")->fn = [goal, started, ws](agent_context& ctx,
                                             drain_input in) -> asio::awaitable<void> {
    if (in.inputs.empty() || in.inputs.front().kind != "prompt") co_return;
    actors::spawn_request req;
    req.description = "part one";
    req.prompt = "go";
    req.child = session_id("child");
    req.goal = *goal;
    auto child = co_await ctx.spawn_background(std::move(req));
    actors::delegate_request d;
    d.agent = "worker";
    d.prompt = "part two";
    d.workspace = ws;
    d.goal = *goal;
    auto task = co_await ctx.delegate_background(std::move(d));
    // A top-level session works for no task: its usage has nowhere to go.
    auto own = co_await ctx.report_usage(1, 1);
    if (own || own.error().code != errc::not_found) throw std::runtime_error("usage counted");
    started->set({std::move(child), std::move(task)});
  };
  f.code("child")->fn = [](agent_context& ctx, drain_input) -> asio::awaitable<void> {
    auto u = co_await ctx.report_usage(10, 5);
    if (!u) throw std::runtime_error(u.error().message);
    co_await ctx.say("part one done");
  };
  f.code("agent:worker")->fn = [](agent_context& ctx, drain_input) -> asio::awaitable<void> {
    auto u = co_await ctx.report_usage(7, 3);
    if (!u) throw std::runtime_error(u.error().message);
    co_await ctx.say("part two done");
  };
  REQUIRE(f.sync(f.host->create_session("parent", session_id("parent"))));
  auto g = f.sync(f.host->create_goal(session_id("parent"), "ship the release"));
  REQUIRE(g);
  *goal = *g;
  REQUIRE(f.sync(f.host->prompt(session_id("parent"), "start")));
  auto s = f.sync(started->async_wait(asio::use_awaitable));
  REQUIRE(s.first);
  REQUIRE(s.second);
  protocol::owner_scope parent;
  parent.tenant = protocol::tenant_id("default");
  parent.thread = session_id("parent");
  auto done = f.sync(f.host->delegation().wait(parent, *s.second));
  REQUIRE(done);
  CHECK(done->state == persistence::delegate_state::completed);
  f.quiet();

  auto view = f.sync(f.host->goal(session_id("parent"), *g));
  REQUIRE(view);
  CHECK(view->state == "running");
  REQUIRE(view->members.size() == 2);
  std::map<std::string, std::string> states;
  for (auto& m : view->members) states[m.kind] = m.state;
  CHECK(states ==
        std::map<std::string, std::string>{{"delegate", "completed"}, {"subagent", "completed"}});
  CHECK(view->input_tokens == 17);
  CHECK(view->output_tokens == 8);
  // A child of the tree sees it too.
  CHECK(f.sync(f.host->goal(session_id("child"), *g)));

  auto closed = f.sync(f.host->close_goal(session_id("parent"), *g, "completed"));
  REQUIRE(closed);
  CHECK(closed->state == "completed");
  f.quiet();
  CHECK(f.messages_with("parent", "[goal " + g->str() + " completed] ship the release") == 1);
  CHECK(f.messages_with("parent", "usage 17 input, 8 output tokens") == 1);
  auto again = f.sync(f.host->close_goal(session_id("parent"), *g, "failed"));
  REQUIRE_FALSE(again);
  CHECK(again.error().code == errc::conflict);
  CHECK_THAT(again.error().message, Catch::Contains("already completed"));
  // The close survives a restart, with its notice delivered once.
  f.restart();
  auto after = f.sync(f.host->goal(session_id("parent"), *g));
  REQUIRE(after);
  CHECK(after->state == "completed");
  CHECK(f.messages_with("parent", "[goal " + g->str() + " completed]") == 1);
}

TEST_CASE("a closed goal or another tree's goal cannot be joined, and nothing is started",
          "[goal]") {
  report_fixture f("goal-closed");
  auto goal = std::make_shared<std::optional<protocol::job_id>>();
  auto outcome = runtime::one_shot<result<session_id>>::make();
  f.code("other")->fn = [goal, outcome](agent_context& ctx,
                                        drain_input in) -> asio::awaitable<void> {
    if (in.inputs.empty() || in.inputs.front().kind != "prompt") co_return;
    actors::spawn_request req;
    req.description = "sneak in";
    req.prompt = "go";
    req.child = session_id(in.inputs.front().text);
    req.goal = *goal;
    outcome->set(co_await ctx.spawn_background(std::move(req)));
  };
  REQUIRE(f.sync(f.host->create_session("owner", session_id("owner"))));
  REQUIRE(f.sync(f.host->create_session("other", session_id("other"))));
  auto g = f.sync(f.host->create_goal(session_id("owner"), "mine"));
  REQUIRE(g);
  *goal = *g;
  REQUIRE(f.sync(f.host->prompt(session_id("other"), "c1")));
  auto r = f.sync(outcome->async_wait(asio::use_awaitable));
  REQUIRE_FALSE(r);
  CHECK(r.error().code == errc::not_found);  // another tree's goal reads as missing
  auto foreign = f.sync(f.host->goal(session_id("other"), *g));
  REQUIRE_FALSE(foreign);
  CHECK(foreign.error().code == errc::not_found);
  auto foreign_close = f.sync(f.host->close_goal(session_id("other"), *g, "cancelled"));
  REQUIRE_FALSE(foreign_close);
  CHECK(foreign_close.error().code == errc::not_found);
  f.quiet();
  CHECK_FALSE(*f.host->store().session(session_id("c1")));

  // A closed goal refuses new members in the admitting transaction itself.
  REQUIRE(f.sync(f.host->close_goal(session_id("owner"), *g, "cancelled")));
  persistence::job_row jr;
  jr.id = protocol::job_id("job_late");
  jr.nid = protocol::notification_id("msg_late");
  jr.parent = session_id("owner");
  jr.child = session_id("late");
  jr.goal = *g;
  persistence::session_row late;
  late.id = session_id("late");
  late.parent = session_id("owner");
  auto written = f.sync(f.host->store().spawn(late, session_id("late"), "go", jr, std::nullopt));
  REQUIRE_FALSE(written);
  CHECK(written.error().code == errc::conflict);
  CHECK_THAT(written.error().message, Catch::Contains("is cancelled, so no task can join it"));
  CHECK_FALSE(*f.host->store().session(session_id("late")));
}
