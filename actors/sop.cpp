#include "tether/actors/sop.hpp"

#include <unistd.h>

#include <algorithm>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <filesystem>
#include <random>

#include "tether/actors/command_run.hpp"
#include "tether/protocol/output_tail.hpp"
#include "tether/protocol/scrub.hpp"
#include "tether/runtime/crash_point.hpp"
#include "tether/runtime/owner_identity.hpp"
#include "tether/runtime/retry.hpp"
#include "tether/sandbox/client.hpp"

namespace tether::actors {

namespace asio = boost::asio;
namespace json = boost::json;
using persistence::sop_run_row;
using persistence::sop_save;
using protocol::job_id;
using protocol::sop_definition;
using protocol::sop_step_kind;

namespace {

std::string quote(const std::string& s) {
  return "'" + s + "'";
}

std::int64_t geti(const json::object& o, std::string_view k, std::int64_t d = 0) {
  auto* v = o.if_contains(k);
  return v && v->is_int64() ? v->as_int64() : d;
}

std::string gets(const json::object& o, std::string_view k) {
  auto* v = o.if_contains(k);
  return v && v->is_string() ? std::string(v->as_string()) : std::string();
}

std::string joined(const std::vector<std::string>& v) {
  std::string out;
  for (const auto& s : v) out += (out.empty() ? "" : ", ") + s;
  return out.empty() ? "nobody" : out;
}

std::string random_hex() {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(rng()));
  return buf;
}

/// A definition snapshotted into a run's progress.
result<sop_definition> definition_of(const sop_run_row& r) {
  auto* d = r.progress.if_contains("definition");
  if (!d) return error{errc::corrupt, "SOP run " + r.id.str() + ": its definition is missing"};
  auto def = protocol::sop_from_json(*d, "definition");
  if (!def)
    return error{errc::corrupt, "SOP run " + r.id.str() + ": its definition does not decode (" +
                                    def.error().describe() +
                                    "); the run is failed, nothing of it is run"};
  return std::move(*def);
}

/// Text a model or an operator reads about a step: scrubbed and bounded.
std::string preview_of(const protocol::sop_step& st) {
  protocol::scrubber scrub(protocol::scrub_rules::from_env(sandbox::current_environment()));
  auto text = st.kind == sop_step_kind::shell ? st.command : st.prompt;
  return protocol::bounded_text(scrub.scrub(text), 200);
}

std::string scrubbed(const std::string& text, std::size_t bound = 2000) {
  protocol::scrubber scrub(protocol::scrub_rules::from_env(sandbox::current_environment()));
  return protocol::bounded_text(scrub.scrub(text), bound);
}

}  // namespace

struct sop_engine::drive_ctx {
  sop_run_row row;
  sop_definition def;
  std::string key;
};

sop_engine::sop_engine(runtime::executor ex, persistence::task_store& store, sop_options opts,
                       std::shared_ptr<sandbox_channel> channel, sop_prompt_runner prompts,
                       protocol::session_policy default_policy,
                       std::function<void(const std::string&)> warn)
    : actor(ex, runtime::actor_options{.name = "sop"}),
      store_(&store),
      opts_(std::move(opts)),
      channel_(std::move(channel)),
      prompts_(std::move(prompts)),
      default_policy_(std::move(default_policy)),
      warn_(std::move(warn)),
      clock_(opts_.clock ? opts_.clock : runtime::system_wall_clock()),
      claimant_(opts_.claimant.empty() ? runtime::to_string(runtime::current_process_identity())
                                       : opts_.claimant),
      renew_timer_(std::make_shared<asio::steady_timer>(ex)) {}

sop_engine::~sop_engine() {
  if (own_writer_) own_writer_->stop();
  if (own_store_) own_store_->join_reads();
  if (!memory_path_.empty()) {
    std::error_code ec;
    for (auto suffix : {"", "-wal", "-shm", "-journal"})
      std::filesystem::remove(memory_path_ + suffix, ec);
  }
}

void sop_engine::handle(sop_message& m) {
  std::visit(
      [this](auto& msg) {
        using T = std::decay_t<decltype(msg)>;
        if constexpr (std::is_same_v<T, sop_msg::poke>) {
          asleep_after_.reset();  // a pass is due before anyone is told it is quiet
          ++changes_;
          clock_->interrupt();
        } else if constexpr (std::is_same_v<T, sop_msg::await_quiet>) {
          quiet_waiters_.emplace_back(msg.at, std::move(msg.reply));
          notify_quiet();
        } else if constexpr (std::is_same_v<T, sop_msg::cancel_live>) {
          auto it = live_.find(msg.run.str());
          if (it == live_.end()) {
            msg.reply.send(false);
            return;
          }
          auto& l = it->second;
          if (!l.cancel) {
            l.cancel = true;
            l.cancel_by = msg.who;
            l.cancel_reason = msg.reason;
            // The step in flight is stopped: a shell through the daemon
            // (confirmed), a prompt through its cancellation signal.
            if (!l.attempt.empty() && channel_) {
              auto ch = channel_;
              auto id = job_id(l.attempt);
              auto k = [ch, id]() -> awaitable<void> { (void)co_await ch->kill(id); };
              asio::co_spawn(get_executor(), std::move(k), asio::detached);
            }
            if (l.prompt_signal) l.prompt_signal->emit(asio::cancellation_type::terminal);
          }
          msg.reply.send(true);
        } else if constexpr (std::is_same_v<T, sop_msg::await_run>) {
          auto it = live_.find(msg.run.str());
          if (it == live_.end())
            msg.reply.send();
          else
            it->second.waiters.push_back(std::move(msg.reply));
        }
      },
      m);
}

void sop_engine::notify_quiet() {
  if (!asleep_after_ || !live_.empty()) return;
  for (auto it = quiet_waiters_.begin(); it != quiet_waiters_.end();) {
    if (it->first <= *asleep_after_ || it->first < asleep_until_) {
      it->second.send();
      it = quiet_waiters_.erase(it);
    } else {
      ++it;
    }
  }
}

void sop_engine::poke() {
  sop_msg::poke p;
  (void)tell(std::move(p));
}

void sop_engine::ended(const job_id& run) {
  auto it = live_.find(run.str());
  if (it != live_.end()) {
    auto waiters = std::move(it->second.waiters);
    live_.erase(it);
    for (auto& w : waiters) w.send();
  }
  asleep_after_.reset();
  ++changes_;
  clock_->interrupt();  // a slot is free: the loop looks again
}

awaitable<void> sop_engine::quiet(std::int64_t at) {
  sop_msg::await_quiet q;
  q.at = at;
  (void)co_await ask(std::move(q));
}

awaitable<void> sop_engine::run_ended(job_id run) {
  sop_msg::await_run q;
  q.run = std::move(run);
  (void)co_await ask(std::move(q));
}

const protocol::session_policy& sop_engine::policy_of(const std::string& agent) const {
  auto it = opts_.agent_policies.find(agent);
  return it == opts_.agent_policies.end() ? default_policy_ : it->second;
}

sop_run_view sop_engine::view_of(const sop_run_row& r, bool durable) {
  sop_run_view v;
  v.id = r.id;
  v.sop = r.sop;
  v.state = r.status();
  v.revision = r.revision;
  v.claim = r.owner;
  v.durable = durable;
  v.error = gets(r.progress, "error");
  auto i = geti(r.progress, "step", -1);
  if (auto* d = r.progress.if_contains("definition"); d && d->is_object())
    if (auto* steps = d->as_object().if_contains("steps"); steps && steps->is_array())
      if (i >= 0 && static_cast<std::size_t>(i) < steps->as_array().size())
        if (auto* s = steps->as_array()[i].if_object()) v.step = gets(*s, "name");
  return v;
}

// ---- start and stop ----

awaitable<result<void>> sop_engine::open_store(sop_startup& out) {
  auto open_at = [this](std::string path, bool memory) -> awaitable<result<void>> {
    persistence::db_options dbo;
    dbo.path = path;
    dbo.create = true;
    auto open = [dbo]() -> result<std::shared_ptr<persistence::writer>> {
      auto w = persistence::writer::open(dbo);
      if (!w) return w.error();
      return std::shared_ptr<persistence::writer>(std::move(*w));
    };
    auto w = co_await store_->offload(std::move(open));
    if (!w) co_return w.error();
    own_writer_ = std::move(*w);
    own_store_ = std::make_unique<persistence::task_store>(*own_writer_, path);
    store_ = own_store_.get();
    durable_ = !memory;
    if (memory) memory_path_ = path;
    co_return result<void>{};
  };
  auto memory = [this, &open_at]() -> awaitable<result<void>> {
    std::filesystem::path dir = "/dev/shm";
    std::error_code ec;
    if (!std::filesystem::is_directory(dir, ec) || ::access(dir.c_str(), W_OK) != 0)
      dir = std::filesystem::temp_directory_path();
    auto path =
        (dir / ("tether-sop-" + std::to_string(::getpid()) + "-" + random_hex() + ".db")).string();
    co_return co_await open_at(path, true);
  };
  if (opts_.persistence == sop_persistence::memory) {
    auto r = co_await memory();
    if (!r)
      co_return error{r.error().code,
                      "the in-memory SOP run store could not be opened: " + r.error().message};
    out.warnings.push_back(
        "SOP runs are kept in memory only (sop persistence: memory): they do not survive a "
        "restart");
    co_return result<void>{};
  }
  if (opts_.db.empty()) co_return result<void>{};  // the host's database
  auto r = co_await open_at(opts_.db, false);
  if (r) co_return result<void>{};
  if (opts_.persistence == sop_persistence::durable)
    co_return error{r.error().code, "the SOP run store " + opts_.db + " could not be opened (" +
                                        r.error().message +
                                        "); the SOP engine was not started (set persistence to "
                                        "durable_or_memory to run without a durable store)"};
  auto m = co_await memory();
  if (!m)
    co_return error{m.error().code, "the SOP run store " + opts_.db + " could not be opened (" +
                                        r.error().message + ") nor the in-memory one (" +
                                        m.error().message + ")"};
  out.warnings.push_back("the SOP run store " + opts_.db + " could not be opened (" +
                         r.error().message +
                         "); SOP runs are kept in memory only and do not survive a restart");
  co_return result<void>{};
}

awaitable<result<sop_startup>> sop_engine::start() {
  sop_startup out;
  // 1. The definitions, whole or not at all.
  if (!opts_.dir.empty()) {
    auto dir = opts_.dir;
    auto load = [dir]() -> result<std::vector<sop_definition>> {
      auto d = protocol::load_sop_dir(dir);
      if (!d) return error{errc::invalid, d.error().describe()};
      return std::move(*d);
    };
    auto defs = co_await store_->offload(std::move(load));
    if (!defs)
      co_return error{errc::invalid, "SOP definitions: " + defs.error().message +
                                         "; none was loaded and the SOP engine was not started"};
    defs_ = std::move(*defs);
    for (auto& d : defs_) out.sops.push_back(d.name);
  }
  // 2. The run store.
  auto opened = co_await open_store(out);
  if (!opened) co_return opened.error();
  out.durable = durable_;
  // 3. Claims whose claimant is provably gone (or this claimant's own: no
  // run of it is driven yet) are cleared; the runs are claimed again.
  {
    auto* st = store_;
    auto read = [st] { return st->sop_runs(true); };
    auto have = co_await store_->offload(std::move(read));
    if (!have) co_return have.error();
    std::vector<std::string> gone;
    for (auto& r : *have) {
      if (r.owner.empty()) continue;
      if (std::find(gone.begin(), gone.end(), r.owner) != gone.end()) continue;
      if (r.owner == claimant_) {
        gone.push_back(r.owner);
        continue;
      }
      auto probe = runtime::probe_owner(r.owner);
      if (probe.state == runtime::owner_liveness::gone)
        gone.push_back(r.owner);
      else
        out.warnings.push_back("SOP run " + r.id.str() + ": its claim by " + r.owner +
                               " was kept (" + probe.why +
                               "); it is taken over when its lease "
                               "expires");
    }
    if (!gone.empty()) {
      auto n = co_await store_->sop_clear_claims(std::move(gone));
      if (!n) co_return n.error();
      out.claims_cleared = *n;
    }
  }
  for (auto& w : out.warnings) warn_(w);
  auto held = gate_.enter();
  auto held2 = gate_.enter();
  if (!held || !held2) co_return error{errc::stopped, "the SOP engine is stopping; not started"};
  asio::co_spawn(get_executor(), loop(shared_from_this(), std::move(held)), asio::detached);
  asio::co_spawn(get_executor(), renew_loop(shared_from_this(), std::move(held2)), asio::detached);
  co_return out;
}

awaitable<void> sop_engine::shutdown() {
  stopping_ = true;
  clock_->interrupt();
  auto stop_timer = [](std::shared_ptr<sop_engine> self) -> awaitable<void> {
    self->renew_timer_->cancel();
    co_return;
  };
  co_await asio::co_spawn(get_executor(), stop_timer(shared_from_this()), asio::use_awaitable);
  co_await gate_.close();
  co_await stop();
}

// ---- the API ----

awaitable<result<job_id>> sop_engine::start_run(std::string sop, std::string input,
                                                std::string started_by) {
  auto it = std::find_if(defs_.begin(), defs_.end(),
                         [&](const sop_definition& d) { return d.name == sop; });
  if (it == defs_.end()) {
    std::vector<std::string> names;
    for (auto& d : defs_) names.push_back(d.name);
    co_return error{errc::not_found, "no SOP named " + quote(sop) +
                                         " (loaded: " + (names.empty() ? "none" : joined(names)) +
                                         "); no run was started"};
  }
  if (input.size() > it->max_payload_bytes)
    co_return error{errc::invalid, "the payload is " + std::to_string(input.size()) +
                                       " bytes; SOP " + quote(sop) + " takes at most " +
                                       std::to_string(it->max_payload_bytes) +
                                       " (max_payload_bytes); no run was started"};
  if (stopping_) co_return error{errc::stopped, "the SOP engine is stopping; no run was started"};
  sop_run_row row;
  row.id = job_id("sop-" + sop + "-" + random_hex());
  row.sop = sop;
  row.scope.tenant = protocol::tenant_id("default");
  row.scope.thread = protocol::session_id("sop:" + sop);
  row.scope.turn = protocol::turn_id(row.id.str());
  json::array visits(it->steps.size(), json::value(0));
  row.progress = json::object{{"definition", protocol::to_json(*it)},
                              {"step", 0},
                              {"visits", std::move(visits)},
                              {"input", input},
                              {"started_by", started_by},
                              {"durable", durable_}};
  auto id = row.id;
  auto detail = "run of SOP " + quote(sop) + " started by " + started_by + " (" +
                std::to_string(input.size()) + " bytes of input)";
  auto r = co_await store_->sop_admit(std::move(row), started_by, std::move(detail));
  if (!r) co_return r.error();
  TETHER_CRASH_POINT("sop.admit.after_commit");
  poke();
  co_return id;
}

awaitable<result<void>> sop_engine::decide(job_id run, std::string phase, bool success,
                                           std::string actor, std::string event, std::string audit,
                                           std::string detail) {
  for (int tries = 0;; ++tries) {
    auto* st = store_;
    auto read = [st, run] { return st->sop_run(run); };
    auto row = co_await store_->offload(std::move(read));
    if (!row) co_return row.error();
    if (!*row)
      co_return error{errc::not_found, "no SOP run " + run.str() + "; nothing was written"};
    auto& r = **row;
    if (r.status() != phase)
      co_return error{errc::refused, "SOP run " + r.id.str() + " is " + r.status() + ", not " +
                                         phase + "; nothing was written"};
    auto def = definition_of(r);
    if (!def) co_return def.error();
    auto i = static_cast<std::size_t>(geti(r.progress, "step"));
    if (i >= def->steps.size())
      co_return error{errc::corrupt, "SOP run " + r.id.str() + ": its step is out of range"};
    if (phase == "waiting_approval" && audit != "sop.auto_approve") {
      const auto& who = def->approvers_of(i);
      if (std::find(who.begin(), who.end(), actor) == who.end())
        co_return error{errc::refused, actor + " may not approve step " +
                                           quote(def->steps[i].name) + " of SOP run " + r.id.str() +
                                           " (its approvers: " + joined(who) +
                                           "); nothing was written"};
    }
    auto target = success ? def->success_target(i) : def->failure_target(i);
    sop_save s;
    s.run = r.id;
    s.revision = r.revision;
    s.progress = r.progress;
    s.progress.erase("wait");
    s.progress["last"] =
        json::object{{"step", def->steps[i].name}, {"status", event}, {"by", actor}};
    if (target == protocol::sop_end) {
      s.terminal = "completed";
    } else if (target == protocol::sop_fail) {
      s.terminal = "failed";
      s.progress["error"] = "step " + quote(def->steps[i].name) + ": " + event + " by " + actor +
                            (detail.empty() ? "" : " (" + scrubbed(detail, 500) + ")");
    } else {
      s.progress["step"] = static_cast<std::int64_t>(*def->index_of(target));
      s.progress["phase"] = "pending";
    }
    s.event = event;
    s.actor = actor;
    s.detail = "step " + quote(def->steps[i].name) + ": " + event + " by " + actor +
               (detail.empty() ? "" : ": " + scrubbed(detail, 500)) + " → " + target;
    s.audit = audit;
    auto saved = co_await store_->sop_save_run(std::move(s));
    if (saved) {
      poke();
      co_return result<void>{};
    }
    // Another save came first (a timeout, a second approver): read again.
    if (saved.error().code != errc::conflict || tries >= 8) co_return saved.error();
  }
}

awaitable<result<void>> sop_engine::approve(job_id run, std::string approver, std::string note) {
  co_return co_await decide(std::move(run), "waiting_approval", true, std::move(approver),
                            "approved", "sop.approve", std::move(note));
}

awaitable<result<void>> sop_engine::reject(job_id run, std::string approver, std::string reason) {
  co_return co_await decide(std::move(run), "waiting_approval", false, std::move(approver),
                            "rejected", "sop.reject", std::move(reason));
}

awaitable<result<void>> sop_engine::resume(job_id run, std::string who) {
  co_return co_await decide(std::move(run), "paused_checkpoint", true, std::move(who), "resumed",
                            "sop.resume", "");
}

awaitable<result<void>> sop_engine::cancel(job_id run, std::string who, std::string reason) {
  for (int tries = 0;; ++tries) {
    // Driven here: the drive stops its step (confirmed) and makes the CAS.
    sop_msg::cancel_live m;
    m.run = run;
    m.who = who;
    m.reason = reason;
    auto live = co_await ask(std::move(m));
    if (live && *live) {
      co_await run_ended(run);
      auto* st = store_;
      auto read = [st, run] { return st->sop_run(run); };
      auto row = co_await store_->offload(std::move(read));
      if (!row) co_return row.error();
      if (*row && (*row)->state == "cancelled") co_return result<void>{};
      if (*row && (*row)->state != "admitted" && (*row)->state != "running")
        co_return error{errc::refused, "SOP run " + run.str() + " was " + (*row)->state +
                                           " before the cancel took; it was kept"};
      continue;  // the drive ended without the cancel (stopping): do it here
    }
    auto* st = store_;
    auto read = [st, run] { return st->sop_run(run); };
    auto row = co_await store_->offload(std::move(read));
    if (!row) co_return row.error();
    if (!*row)
      co_return error{errc::not_found, "no SOP run " + run.str() + "; nothing was written"};
    auto& r = **row;
    if (r.state != "admitted" && r.state != "running")
      co_return error{errc::refused,
                      "SOP run " + r.id.str() + " is already " + r.state + "; it was kept"};
    sop_save s;
    s.run = r.id;
    s.revision = r.revision;
    s.progress = r.progress;
    // A step in flight in another process: its command is stopped through
    // the daemon (confirmed) before the CAS.
    if (auto* inf = r.progress.if_contains("inflight"); inf && inf->is_object()) {
      auto task = gets(inf->as_object(), "task");
      auto attempt = geti(inf->as_object(), "attempt");
      if (channel_ && !task.empty()) {
        auto opened = co_await channel_->open();
        if (opened) {
          job_id attempt_id(task + "-a" + std::to_string(attempt));
          auto k = co_await channel_->kill(std::move(attempt_id));
          if (!k && k.error().code != errc::not_found)
            co_return error{k.error().code, "SOP run " + r.id.str() +
                                                ": its step's command could not be stopped (" +
                                                k.error().message + "); the run was kept"};
        }
      }
      s.step_finish = job_id(task);
      s.step_state = "cancelled";
      s.step_completion = protocol::to_text(json::object{{"status", "cancelled"}, {"by", who}});
      s.progress.erase("inflight");
    }
    s.progress.erase("wait");
    s.progress["error"] =
        "cancelled by " + who + (reason.empty() ? "" : ": " + scrubbed(reason, 500));
    s.terminal = "cancelled";
    s.event = "cancelled";
    s.actor = who;
    s.detail = "cancelled by " + who + " while " + r.status() +
               (reason.empty() ? "" : ": " + scrubbed(reason, 500));
    s.audit = "sop.cancel";
    auto saved = co_await store_->sop_save_run(std::move(s));
    if (saved) {
      poke();
      co_return result<void>{};
    }
    if (saved.error().code != errc::conflict || tries >= 8) co_return saved.error();
  }
}

awaitable<result<std::optional<sop_run_view>>> sop_engine::run(job_id id) {
  auto* st = store_;
  auto read = [st, id] { return st->sop_run(id); };
  auto row = co_await store_->offload(std::move(read));
  if (!row) co_return row.error();
  if (!*row) co_return std::optional<sop_run_view>{};
  co_return std::optional<sop_run_view>(view_of(**row, durable_));
}

awaitable<result<std::vector<sop_run_view>>> sop_engine::runs() {
  auto* st = store_;
  auto read = [st] { return st->sop_runs(false); };
  auto rows = co_await store_->offload(std::move(read));
  if (!rows) co_return rows.error();
  std::vector<sop_run_view> out;
  for (auto& r : *rows) out.push_back(view_of(r, durable_));
  co_return out;
}

awaitable<result<std::vector<persistence::task_event>>> sop_engine::events(job_id id) {
  auto* st = store_;
  auto read = [st, id] { return st->task_events(id); };
  co_return co_await store_->offload(std::move(read));
}

awaitable<result<std::vector<persistence::audit_entry>>> sop_engine::audit(std::string subject) {
  auto* st = store_;
  auto read = [st, subject] { return st->audit_log(subject); };
  co_return co_await store_->offload(std::move(read));
}

// ---- the loop ----

awaitable<void> sop_engine::loop(std::shared_ptr<sop_engine> self, runtime::gate::holder held) {
  (void)held;
  while (!self->stopping_) {
    auto seen = self->changes_;
    auto now = self->clock_->now_ms();
    int free = self->opts_.max_runs - static_cast<int>(self->live_.size());
    if (free > 0) {
      auto lease = now + self->opts_.lease.count();
      auto claims = co_await self->store_->sop_claim(self->claimant_, now, lease, free);
      if (!claims) {
        self->warn_("sop: claiming runs failed: " + claims.error().message +
                    "; tried again at the next wake");
      } else {
        if (!claims->empty()) TETHER_CRASH_POINT("sop.claim.after_commit");
        for (auto& r : *claims) {
          auto run_held = self->gate_.enter();
          if (!run_held) break;
          self->live_[r.id.str()];
          asio::co_spawn(self->get_executor(), drive(self, std::move(r), std::move(run_held)),
                         asio::detached);
        }
      }
    }
    if (self->stopping_) break;
    co_await self->expire_waits(now);
    auto* st = self->store_;
    auto claimant = self->claimant_;
    auto read = [st, claimant] { return st->sop_next_wake(claimant); };
    auto next = co_await self->store_->offload(std::move(read));
    // Something changed during this pass: it looks again instead of sleeping.
    if (self->changes_ != seen) continue;
    std::int64_t deadline = now + 3600 * 1000;
    if (next && *next) deadline = std::max(now, **next);
    auto ex = self->get_executor();
    self->asleep_after_ = now;
    self->asleep_until_ = deadline;
    self->notify_quiet();
    (void)co_await self->clock_->sleep_until(ex, deadline);
    self->asleep_after_.reset();
  }
}

awaitable<void> sop_engine::renew_loop(std::shared_ptr<sop_engine> self,
                                       runtime::gate::holder held) {
  (void)held;
  auto timer = self->renew_timer_;
  while (!self->stopping_) {
    timer->expires_after(self->opts_.renew_every);
    auto [ec] = co_await timer->async_wait(asio::as_tuple(asio::use_awaitable));
    if (self->stopping_) break;
    if (self->live_.empty()) continue;
    std::vector<job_id> runs;
    for (auto& [k, l] : self->live_) runs.emplace_back(k);
    auto lease = self->clock_->now_ms() + self->opts_.lease.count();
    auto lost = co_await self->store_->sop_renew(self->claimant_, lease, std::move(runs));
    if (!lost)
      self->warn_("sop: renewing leases failed: " + lost.error().message);
    else
      for (auto& r : *lost)
        self->warn_("SOP run " + r.str() +
                    ": its claim was lost (its lease lapsed and another claimant took it); this "
                    "engine's next save of it will be refused");
  }
}

awaitable<void> sop_engine::expire_waits(std::int64_t now) {
  auto* st = store_;
  auto read = [st, now] { return st->sop_due_waits(now); };
  auto rows = co_await store_->offload(std::move(read));
  if (!rows) {
    warn_("sop: reading approval waits failed: " + rows.error().message);
    co_return;
  }
  for (auto& r : *rows) {
    auto def = definition_of(r);
    if (!def) {
      warn_(def.error().message);
      continue;
    }
    auto i = static_cast<std::size_t>(geti(r.progress, "step"));
    if (i >= def->steps.size()) continue;
    const auto& step = def->steps[i];
    auto action = def->on_timeout_of(i);
    auto waited = std::to_string(def->approval_timeout_of(i)) + " ms";
    if (action == protocol::sop_timeout_action::auto_approve) {
      auto d = co_await decide(
          r.id, "waiting_approval", true, "auto_approve (configured)", "approved",
          "sop.auto_approve",
          "no approval within " + waited + "; the definition sets on_timeout auto_approve");
      if (!d && d.error().code != errc::refused) warn_(d.error().message);
      continue;
    }
    sop_save s;
    s.run = r.id;
    s.revision = r.revision;
    s.progress = r.progress;
    s.actor = "engine";
    if (action == protocol::sop_timeout_action::cancel) {
      s.progress.erase("wait");
      s.progress["error"] = "no approval of step " + quote(step.name) + " within " + waited;
      s.terminal = "cancelled";
      s.event = "approval_timed_out";
      s.detail = "no approval of step " + quote(step.name) + " within " + waited +
                 "; the definition sets on_timeout cancel: the run is cancelled";
      s.audit = "sop.timeout_cancel";
    } else {
      // Fail-closed: tell the owner, record it, keep waiting.
      s.progress["wait"].as_object()["fired"] = true;
      s.progress["wait"].as_object()["escalated"] = true;
      s.event = "escalated";
      s.detail = "no approval of step " + quote(step.name) + " within " + waited +
                 "; escalated to the owner; still waiting for " + joined(def->approvers_of(i));
      s.audit = "sop.escalate";
    }
    auto saved = co_await store_->sop_save_run(std::move(s));
    if (!saved) {
      if (saved.error().code != errc::conflict) warn_(saved.error().message);
      continue;  // approved meanwhile: nothing to do
    }
    if (action == protocol::sop_timeout_action::escalate) {
      warn_("SOP run " + r.id.str() + ": no approval of step " + quote(step.name) + " within " +
            waited + "; escalated (still waiting for " + joined(def->approvers_of(i)) + ")");
      if (opts_.on_escalate) {
        sop_escalation e;
        e.run = r.id;
        e.sop = r.sop;
        e.step = step.name;
        e.approvers = def->approvers_of(i);
        auto* wv = r.progress.if_contains("wait");
        e.waiting_since = wv && wv->is_object() ? geti(wv->as_object(), "since") : 0;
        opts_.on_escalate(e);
      }
    }
  }
}

// ---- one run ----

awaitable<result<void>> sop_engine::save(drive_ctx& c, sop_save s) {
  s.run = c.row.id;
  s.revision = c.row.revision;
  s.owner = claimant_;
  s.progress = c.row.progress;
  for (int attempt = 0;; ++attempt) {
    auto copy = s;
    auto r = co_await store_->sop_save_run(std::move(copy));
    if (r) {
      c.row.revision = *r;
      co_return result<void>{};
    }
    if (r.error().code == errc::conflict || attempt >= 4) co_return r.error();
    auto timer = std::make_shared<asio::steady_timer>(get_executor());
    timer->expires_after(runtime::retry_delay(attempt));
    co_await timer->async_wait(asio::as_tuple(asio::use_awaitable));
  }
}

awaitable<void> sop_engine::drive(std::shared_ptr<sop_engine> self, sop_run_row row,
                                  runtime::gate::holder held) {
  (void)held;
  drive_ctx c;
  c.key = row.id.str();
  c.row = std::move(row);
  auto def = definition_of(c.row);
  if (!def) {
    self->warn_(def.error().message);
    sop_save s;
    c.row.progress["error"] = def.error().message;
    s.terminal = "failed";
    s.event = "failed";
    s.actor = "engine";
    s.detail = def.error().message;
    (void)co_await self->save(c, std::move(s));
    self->ended(c.row.id);
    co_return;
  }
  c.def = std::move(*def);
  for (;;) {
    if (self->stopping_) {
      // Between steps: the claim is released for the next start.
      sop_save s;
      s.release_claim = true;
      s.event = "released";
      s.actor = self->claimant_;
      s.detail = "the engine is stopping; the run is claimed again at the next start";
      auto r = co_await self->save(c, std::move(s));
      if (!r) self->warn_(r.error().message);
      break;
    }
    bool more = false;
    try {
      more = co_await self->work_step(c);
    } catch (const std::exception& e) {
      self->warn_("SOP run " + c.key + ": " + e.what() +
                  "; its claim lapses and the run is taken over");
      more = false;
    }
    if (!more) break;
  }
  self->ended(c.row.id);
}

awaitable<bool> sop_engine::work_step(drive_ctx& c) {
  auto& p = c.row.progress;
  auto i = geti(p, "step", -1);
  auto finish = [&](std::string state, std::string why) {
    sop_save s;
    c.row.progress["error"] = why;
    s.terminal = std::move(state);
    s.event = *s.terminal;
    s.actor = "engine";
    s.detail = std::move(why);
    return s;
  };
  if (i < 0 || static_cast<std::size_t>(i) >= c.def.steps.size()) {
    auto s = finish("failed", "step index " + std::to_string(i) + " is out of range");
    auto r = co_await save(c, std::move(s));
    if (!r) warn_(r.error().message);
    co_return false;
  }
  const auto& st = c.def.steps[static_cast<std::size_t>(i)];
  auto& live = live_[c.key];
  if (live.cancel) {
    sop_save s;
    c.row.progress["error"] = "cancelled by " + live.cancel_by;
    s.terminal = "cancelled";
    s.event = "cancelled";
    s.actor = live.cancel_by;
    s.detail = "cancelled by " + live.cancel_by + " between steps" +
               (live.cancel_reason.empty() ? "" : ": " + scrubbed(live.cancel_reason, 500));
    s.audit = "sop.cancel";
    auto r = co_await save(c, std::move(s));
    if (!r) warn_(r.error().message);
    co_return false;
  }
  auto now = clock_->now_ms();
  bool resuming = p.contains("inflight");
  auto& visits = p["visits"];
  if (!visits.is_array()) visits = json::array(c.def.steps.size(), json::value(0));
  auto& va = visits.as_array();
  while (va.size() < c.def.steps.size()) va.push_back(0);
  auto& visit_slot = va[static_cast<std::size_t>(i)];
  std::int64_t visit = visit_slot.is_int64() ? visit_slot.as_int64() : 0;
  if (!resuming) {
    auto n = visit;
    if (n >= st.max_visits) {
      auto s = finish("failed", "step " + quote(st.name) + " was entered " + std::to_string(n) +
                                    " times (its max_visits); the run is failed");
      auto r = co_await save(c, std::move(s));
      if (!r) warn_(r.error().message);
      co_return false;
    }
    visit = n + 1;
    visit_slot = visit;
  }
  if (st.kind == sop_step_kind::approval || st.kind == sop_step_kind::checkpoint) {
    bool approval = st.kind == sop_step_kind::approval;
    auto timeout = approval ? c.def.approval_timeout_of(static_cast<std::size_t>(i)) : 0;
    p["phase"] = approval ? "waiting_approval" : "paused_checkpoint";
    p["wait"] = json::object{{"step", i},
                             {"since", now},
                             {"deadline", timeout > 0 ? now + timeout : 0},
                             {"fired", false}};
    sop_save s;
    s.release_claim = true;
    s.actor = "engine";
    if (approval) {
      s.event = "waiting_approval";
      s.detail = "step " + quote(st.name) + " waits for approval by " +
                 joined(c.def.approvers_of(static_cast<std::size_t>(i))) +
                 (timeout > 0 ? " (timeout " + std::to_string(timeout) + " ms, then " +
                                    std::string(protocol::to_string(
                                        c.def.on_timeout_of(static_cast<std::size_t>(i)))) +
                                    ")"
                              : " (no timeout)");
    } else {
      s.event = "paused";
      s.detail = "step " + quote(st.name) + " is a checkpoint: the run waits to be resumed";
    }
    auto r = co_await save(c, std::move(s));
    if (!r) {
      warn_(r.error().message);
      co_return false;
    }
    TETHER_CRASH_POINT("sop.park.after_commit");
    co_return false;
  }
  // A working step: its task, its attempts.
  std::string task;
  std::int64_t attempt = 0;
  bool attach = false;
  if (resuming) {
    const auto& inf = p["inflight"].as_object();
    task = gets(inf, "task");
    attempt = geti(inf, "attempt");
    // Not idempotent: only followed (the daemon may still have it), never
    // started again.
    attach = !st.idempotent;
  } else {
    task = c.key + "-s" + std::to_string(i) + "-v" + std::to_string(visit);
    p["inflight"] = json::object{{"task", task}, {"attempt", 0}};
    sop_save s;
    s.step_admit = job_id(task);
    s.step_preview = preview_of(st);
    s.event = "step_started";
    s.actor = claimant_;
    s.detail = "step " + quote(st.name) + " (" + std::string(protocol::to_string(st.kind)) +
               ") started: " + s.step_preview;
    auto r = co_await save(c, std::move(s));
    if (!r) {
      warn_(r.error().message);
      co_return false;
    }
    TETHER_CRASH_POINT("sop.step.after_admit");
  }
  const auto& policy = policy_of(c.def.agent);
  command_outcome out;
  for (;;) {
    if (live_[c.key].cancel) break;  // cancelled during a retry's pause
    auto attempt_id = task + "-a" + std::to_string(attempt);
    if (st.kind == sop_step_kind::shell) {
      command_spec spec;
      spec.id = job_id(attempt_id);
      spec.command = st.command;
      spec.cwd = !st.cwd.empty()      ? st.cwd
                 : !opts_.cwd.empty() ? opts_.cwd
                                      : std::filesystem::current_path().string();
      spec.env = {{"TETHER_SOP", c.def.name},
                  {"TETHER_SOP_RUN", c.key},
                  {"TETHER_SOP_STEP", st.name},
                  {"TETHER_SOP_INPUT", gets(p, "input")}};
      spec.timeout_ms = st.timeout_ms;
      spec.max_output_bytes = st.max_output_bytes;
      spec.attach_only = attach;
      live_[c.key].attempt = attempt_id;
      auto after_exec = [] { TETHER_CRASH_POINT("sop.dispatch.after_exec"); };
      out = co_await run_command(get_executor(), channel_, std::move(spec), policy, c.def.agent,
                                 after_exec);
      live_[c.key].attempt.clear();
    } else if (attach) {
      out = command_outcome{"lost",
                            {},
                            {},
                            "the prompt was in flight when the process running it died; it is "
                            "not asked again (the step is not idempotent)"};
    } else if (!prompts_) {
      out = command_outcome{"refused", {}, {}, "this host runs no prompt steps (no prompt runner)"};
    } else {
      auto sig = std::make_shared<asio::cancellation_signal>();
      live_[c.key].prompt_signal = sig;
      auto input = gets(p, "input");
      auto text = input.empty() ? st.prompt : st.prompt + "\n\nInput:\n" + input;
      auto running = prompts_(c.def.agent, std::move(text), job_id(attempt_id), policy);
      out = co_await run_prompt(get_executor(), std::move(running), st.timeout_ms,
                                st.max_output_bytes, sig);
      live_[c.key].prompt_signal.reset();
    }
    attach = false;
    if (live_[c.key].cancel) break;
    if (out.status == "ok" || out.status == "degraded" || out.status == "refused" ||
        out.status == "lost")
      break;
    if (attempt >= st.retries) break;
    if (stopping_) {
      // Not retried now: the next start's claimant follows this attempt
      // (its outcome is the daemon's) and retries from there.
      sop_save s;
      s.release_claim = true;
      s.event = "released";
      s.actor = claimant_;
      s.detail = "the engine is stopping during step " + quote(st.name) + "'s retries";
      auto r = co_await save(c, std::move(s));
      if (!r) warn_(r.error().message);
      co_return false;
    }
    auto pause = opts_.backoff * (1LL << std::min<std::int64_t>(attempt, 16));
    auto timer = std::make_shared<asio::steady_timer>(get_executor());
    timer->expires_after(std::min<std::chrono::milliseconds>(pause, opts_.backoff_max));
    co_await timer->async_wait(asio::as_tuple(asio::use_awaitable));
    ++attempt;
    p["inflight"].as_object()["attempt"] = attempt;
    sop_save s;
    s.event = "attempt";
    s.actor = claimant_;
    s.detail = "step " + quote(st.name) + " attempt " + std::to_string(attempt + 1) + " after " +
               out.status + ": " + scrubbed(out.error, 500);
    auto r = co_await save(c, std::move(s));
    if (!r) {
      warn_(r.error().message);
      co_return false;
    }
    TETHER_CRASH_POINT("sop.attempt.after_commit");
  }
  auto& l = live_[c.key];
  bool ok = out.status == "ok" || out.status == "degraded";
  json::object last{{"step", st.name},
                    {"status", l.cancel ? std::string("cancelled") : out.status},
                    {"attempts", attempt + 1},
                    {"output", out.output},
                    {"error", out.error}};
  if (out.exit) last["exit"] = *out.exit;
  p.erase("inflight");
  p["last"] = last;
  sop_save s;
  s.step_finish = job_id(task);
  s.step_completion = protocol::to_text(last);
  s.actor = claimant_;
  if (l.cancel) {
    s.step_state = "cancelled";
    p["error"] = "cancelled by " + l.cancel_by;
    s.terminal = "cancelled";
    s.event = "cancelled";
    s.actor = l.cancel_by;
    s.detail = "cancelled by " + l.cancel_by + " during step " + quote(st.name) +
               " (its command stopped)" +
               (l.cancel_reason.empty() ? "" : ": " + scrubbed(l.cancel_reason, 500));
    s.audit = "sop.cancel";
  } else {
    s.step_state = ok                          ? "completed"
                   : out.status == "timed_out" ? "timed_out"
                   : out.status == "lost"      ? "lost"
                                               : "failed";
    auto target = ok ? c.def.success_target(static_cast<std::size_t>(i))
                     : c.def.failure_target(static_cast<std::size_t>(i));
    auto what = "step " + quote(st.name) + " " + out.status +
                (out.error.empty() ? "" : " (" + scrubbed(out.error, 500) + ")");
    s.detail = what + " → " + target;
    if (target == protocol::sop_end) {
      s.terminal = "completed";
      s.event = "completed";
    } else if (target == protocol::sop_fail) {
      p["error"] = what;
      s.terminal = "failed";
      s.event = "failed";
    } else {
      p["step"] = static_cast<std::int64_t>(*c.def.index_of(target));
      s.event = "step_ended";
    }
  }
  bool terminal = s.terminal.has_value();
  auto r = co_await save(c, std::move(s));
  if (!r) {
    warn_(r.error().message);
    co_return false;
  }
  TETHER_CRASH_POINT("sop.step.after_end");
  co_return !terminal;
}

}  // namespace tether::actors
