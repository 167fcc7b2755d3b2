#include "tether/actors/cron.hpp"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/cancellation_signal.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "tether/actors/command_run.hpp"
#include "tether/protocol/output_tail.hpp"
#include "tether/protocol/scrub.hpp"
#include "tether/runtime/crash_point.hpp"
#include "tether/runtime/owner_identity.hpp"
#include "tether/sandbox/client.hpp"

namespace tether::actors {

namespace asio = boost::asio;
using persistence::cron_claim;
using persistence::cron_completion;
using persistence::cron_job_row;
using protocol::cron_job_spec;

namespace {

std::string quote(const std::string& name) {
  return "'" + name + "'";
}

std::string read_file(const std::string& path, std::string& err) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    err = "cannot read the schedule file " + path;
    return {};
  }
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

cron_scheduler::cron_scheduler(runtime::executor ex, persistence::task_store& store,
                               cron_options opts, std::shared_ptr<sandbox_channel> channel,
                               cron_prompt_runner prompts, protocol::session_policy default_policy,
                               std::function<void(const std::string&)> warn)
    : actor(ex, runtime::actor_options{.name = "cron"}),
      store_(store),
      opts_(std::move(opts)),
      channel_(std::move(channel)),
      prompts_(std::move(prompts)),
      default_policy_(std::move(default_policy)),
      warn_(std::move(warn)),
      clock_(opts_.clock ? opts_.clock : runtime::system_wall_clock()),
      claimant_(opts_.claimant.empty() ? runtime::to_string(runtime::current_process_identity())
                                       : opts_.claimant),
      renew_timer_(std::make_shared<asio::steady_timer>(ex)),
      jitter_(opts_.jitter_seed ? opts_.jitter_seed : std::random_device{}()) {}

void cron_scheduler::handle(cron_message& m) {
  std::visit(
      [this](auto& msg) {
        using T = std::decay_t<decltype(msg)>;
        if constexpr (std::is_same_v<T, cron_msg::poke>) {
          asleep_after_.reset();  // a pass is due before anyone is told it is quiet
          ++changes_;
          clock_->interrupt();
        } else if constexpr (std::is_same_v<T, cron_msg::live_count>) {
          msg.reply.send(static_cast<int>(live_.size()));
        } else if constexpr (std::is_same_v<T, cron_msg::await_idle>) {
          if (live_.empty())
            msg.reply.send();
          else
            idle_waiters_.push_back(std::move(msg.reply));
        } else if constexpr (std::is_same_v<T, cron_msg::await_quiet>) {
          quiet_waiters_.emplace_back(msg.at, std::move(msg.reply));
          notify_quiet();
        }
      },
      m);
}

void cron_scheduler::notify_quiet() {
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

awaitable<void> cron_scheduler::quiet_at(std::int64_t at) {
  cron_msg::await_quiet q;
  q.at = at;
  (void)co_await ask(std::move(q));
}

void cron_scheduler::ended(const std::string& job) {
  live_.erase(job);
  asleep_after_.reset();  // the loop looks again before anyone is told it is quiet
  ++changes_;
  if (live_.empty()) {
    auto waiters = std::move(idle_waiters_);
    idle_waiters_.clear();
    for (auto& w : waiters) w.send();
  }
  clock_->interrupt();  // a slot is free: the loop looks again
}

const protocol::session_policy& cron_scheduler::policy_of(const std::string& agent) const {
  auto it = opts_.agent_policies.find(agent);
  return it == opts_.agent_policies.end() ? default_policy_ : it->second;
}

std::optional<std::int64_t> cron_scheduler::next_run_after(const cron_job_spec& spec,
                                                           std::int64_t occurrence,
                                                           std::int64_t now, bool catch_up) {
  auto next = protocol::next_after(spec.when, occurrence);
  if (!next || !*next) return std::nullopt;
  if (**next > now) return **next;
  // Occurrences passed while this one ran (or while nobody ran): one run of
  // the newest of them, or none.
  if (catch_up) {
    auto latest = protocol::latest_in(spec.when, occurrence, now);
    if (latest && *latest) return **latest;
  }
  auto after = protocol::next_after(spec.when, now);
  if (!after || !*after) return std::nullopt;
  return **after;
}

std::chrono::milliseconds cron_scheduler::backoff(const cron_job_spec& s, int attempt) {
  // Exponential, capped, with "equal jitter": half fixed, half random.
  std::int64_t d = s.backoff_ms;
  for (int i = 0; i < attempt && d < s.backoff_max_ms; ++i) d *= 2;
  d = std::min(d, s.backoff_max_ms);
  if (d <= 1) return std::chrono::milliseconds(d);
  std::uniform_int_distribution<std::int64_t> half(0, d / 2);
  return std::chrono::milliseconds(d - d / 2 + half(jitter_));
}

// ---- the API ----

awaitable<result<cron_job_row>> cron_scheduler::add(cron_job_spec spec) {
  if (auto bad = protocol::check(spec))
    co_return error{errc::invalid, "cron job " + quote(spec.name) + ": " + bad->describe() +
                                       "; nothing was added"};
  cron_job_row row;
  row.source = "runtime";
  auto first = protocol::next_after(spec.when, clock_->now_ms() - 1);
  if (!first)
    co_return error{errc::invalid,
                    "cron job " + quote(spec.name) + ": " + first.error().describe()};
  row.next_run = *first;
  row.spec = std::move(spec);
  if (!row.spec.enabled) row.next_run.reset();
  auto put = co_await store_.cron_put(row);
  if (!put) co_return put.error();
  cron_msg::poke p;
  (void)tell(std::move(p));
  co_return row;
}

awaitable<result<bool>> cron_scheduler::remove(std::string name) {
  auto r = co_await store_.cron_remove(std::move(name));
  cron_msg::poke p;
  (void)tell(std::move(p));
  co_return r;
}

awaitable<result<bool>> cron_scheduler::set_enabled(std::string name, bool enabled) {
  auto read = [this, name] { return store_.cron_job(name); };
  auto have = co_await store_.offload(std::move(read));
  if (!have) co_return have.error();
  if (!*have) co_return false;
  std::optional<std::int64_t> next;
  if (enabled) {
    auto n = protocol::next_after((*have)->spec.when, clock_->now_ms() - 1);
    if (!n) co_return error{errc::invalid, "cron job " + quote(name) + ": " + n.error().describe()};
    next = *n;
  }
  auto r = co_await store_.cron_set_enabled(std::move(name), enabled, next);
  cron_msg::poke p;
  (void)tell(std::move(p));
  co_return r;
}

awaitable<result<std::vector<cron_job_row>>> cron_scheduler::jobs() {
  auto read = [this] { return store_.cron_jobs(); };
  co_return co_await store_.offload(std::move(read));
}

awaitable<result<std::vector<persistence::cron_run_row>>> cron_scheduler::runs(std::string name) {
  auto read = [this, name] { return store_.cron_runs(name); };
  co_return co_await store_.offload(std::move(read));
}

awaitable<void> cron_scheduler::idle() {
  cron_msg::await_idle w;
  (void)co_await ask(std::move(w));
}

awaitable<int> cron_scheduler::live() {
  cron_msg::live_count q;
  auto n = co_await ask(std::move(q));
  co_return n ? *n : 0;
}

// ---- start and stop ----

awaitable<result<cron_startup>> cron_scheduler::start() {
  cron_startup out;
  // 1. The schedule file, whole or not at all.
  if (!opts_.file.empty()) {
    std::string err;
    auto text = read_file(opts_.file, err);
    if (!err.empty()) co_return error{errc::invalid, err + "; the scheduler was not started"};
    auto specs = protocol::parse_cron_file(text);
    if (!specs)
      co_return error{errc::invalid, "schedule file " + opts_.file + ": " +
                                         specs.error().describe() +
                                         "; nothing of it was applied (every job was kept as it "
                                         "was) and the scheduler was not started"};
    auto read = [this] { return store_.cron_jobs(); };
    auto have = co_await store_.offload(std::move(read));
    if (!have) co_return have.error();
    std::vector<cron_job_row> rows;
    auto now = clock_->now_ms();
    for (auto& s : *specs) {
      cron_job_row r;
      r.source = "config";
      r.spec = s;
      // An unchanged job keeps its next run (and so its overdue state).
      const cron_job_row* old = nullptr;
      for (auto& h : *have)
        if (h.spec.name == s.name) old = &h;
      if (old && old->spec == s) {
        r.next_run = old->next_run;
      } else if (s.enabled) {
        auto n = protocol::next_after(s.when, now - 1);
        if (!n)
          co_return error{errc::invalid,
                          "schedule file: job " + quote(s.name) + ": " + n.error().describe()};
        r.next_run = *n;
      }
      rows.push_back(std::move(r));
    }
    auto rec = co_await store_.cron_reconcile(std::move(rows));
    if (!rec) co_return rec.error();
    out.file = std::move(*rec);
  }
  // 2. Claims whose claimant is provably gone are cleared (their run tasks
  // stay, to be taken over by the next claim, at the attempt they recorded).
  {
    auto read = [this] { return store_.cron_jobs(); };
    auto have = co_await store_.offload(std::move(read));
    if (!have) co_return have.error();
    std::vector<std::string> gone;
    for (auto& j : *have) {
      if (j.claim_owner.empty() || j.claim_owner == claimant_) continue;
      auto probe = runtime::probe_owner(j.claim_owner);
      if (probe.state == runtime::owner_liveness::gone) {
        if (std::find(gone.begin(), gone.end(), j.claim_owner) == gone.end())
          gone.push_back(j.claim_owner);
      } else {
        out.warnings.push_back("cron job " + quote(j.spec.name) + ": its claim by " +
                               j.claim_owner + " was kept (" + probe.why +
                               "); it is taken over when its lease expires");
      }
    }
    if (!gone.empty()) {
      auto n = co_await store_.cron_clear_claims(std::move(gone));
      if (!n) co_return n.error();
      out.claims_cleared = *n;
    }
  }
  // 3. Overdue jobs: the catch-up policy.
  auto caught = co_await resolve_overdue(clock_->now_ms(), "at start", &out.warnings);
  if (!caught) co_return caught.error();
  for (auto& w : out.warnings) warn_(w);
  auto held = gate_.enter();
  if (!held) co_return error{errc::stopped, "the scheduler is stopping; it was not started"};
  auto held2 = gate_.enter();
  asio::co_spawn(get_executor(), loop(shared_from_this(), std::move(held)), asio::detached);
  asio::co_spawn(get_executor(), renew_loop(shared_from_this(), std::move(held2)), asio::detached);
  out.caught_up = caught->caught_up;
  out.skipped = caught->skipped;
  co_return out;
}

awaitable<result<cron_scheduler::overdue>> cron_scheduler::resolve_overdue(
    std::int64_t now, const char* why, std::vector<std::string>* warnings) {
  auto read = [this] { return store_.cron_jobs(); };
  auto have = co_await store_.offload(std::move(read));
  if (!have) co_return have.error();
  int caught = 0, skipped = 0;
  for (auto& j : *have) {
    if (!j.spec.enabled || !j.next_run || !j.claim_owner.empty()) continue;
    if (*j.next_run >= now - opts_.overdue_grace.count()) continue;
    auto occ = *j.next_run;
    bool catch_up = catch_up_of(j.spec);
    if (catch_up && caught >= opts_.catch_up_cap) {
      catch_up = false;
      if (warnings)
        warnings->push_back("cron job " + quote(j.spec.name) + ": overdue " + why +
                            ", beyond the catch-up cap of " + std::to_string(opts_.catch_up_cap) +
                            " jobs: skipped");
    }
    result<bool> moved = false;
    if (catch_up) {
      // One run, of the newest missed occurrence.
      ++caught;
      if (j.spec.one_shot()) continue;
      auto latest = protocol::latest_in(j.spec.when, occ - 1, now);
      if (!latest || !*latest || **latest == occ) continue;
      moved = co_await store_.cron_advance(j.spec.name, occ, **latest, false, std::nullopt,
                                           opts_.keep_runs);
    } else if (j.spec.one_shot()) {
      ++skipped;
      std::string reason = std::string("missed (overdue ") + why + ") with catch-up off";
      moved = co_await store_.cron_advance(j.spec.name, occ, std::nullopt, true, reason,
                                           opts_.keep_runs);
    } else {
      ++skipped;
      auto next = protocol::next_after(j.spec.when, now);
      std::optional<std::int64_t> n;
      if (next && *next) n = **next;
      moved =
          co_await store_.cron_advance(j.spec.name, occ, n, false, std::nullopt, opts_.keep_runs);
    }
    if (!moved) co_return moved.error();
  }
  co_return overdue{caught, skipped};
}

awaitable<void> cron_scheduler::shutdown() {
  stopping_ = true;
  clock_->interrupt();
  auto self = shared_from_this();
  auto stop_timer = [](std::shared_ptr<cron_scheduler> self) -> awaitable<void> {
    self->renew_timer_->cancel();
    co_return;
  };
  co_await asio::co_spawn(get_executor(), stop_timer(self), asio::use_awaitable);
  co_await gate_.close();
  co_await stop();
}

// ---- the loop ----

awaitable<void> cron_scheduler::loop(std::shared_ptr<cron_scheduler> self,
                                     runtime::gate::holder held) {
  (void)held;
  while (!self->stopping_) {
    auto seen = self->changes_;
    auto now = self->clock_->now_ms();
    int free = self->opts_.max_runs - static_cast<int>(self->live_.size());
    if (free > 0) {
      auto lease = now + self->opts_.lease.count();
      auto claims = co_await self->store_.cron_claim_due(now, self->claimant_, lease, free);
      if (!claims) {
        self->warn_("cron: claiming due jobs failed: " + claims.error().message +
                    "; tried again at the next wake");
      } else {
        if (!claims->empty()) TETHER_CRASH_POINT("cron.claim.after_commit");
        for (auto& c : *claims) {
          auto run_held = self->gate_.enter();
          if (!run_held) break;
          self->live_[c.spec.name].fence = c.fence;
          asio::co_spawn(self->get_executor(), run(self, std::move(c), std::move(run_held)),
                         asio::detached);
        }
      }
    }
    if (self->stopping_) break;
    auto read = [self] { return self->store_.cron_next_wake(); };
    auto next = co_await self->store_.offload(std::move(read));
    std::int64_t deadline = now + 3600 * 1000;
    if (next && *next) deadline = std::max(now, **next);
    // Something changed during this pass (a job, a run that ended): what it
    // read may be stale, so it looks again instead of sleeping on it.
    if (self->changes_ != seen) continue;
    if (self->clock_->leaps()) {
      // Virtual time moves only when nothing runs: a run's lease cannot
      // lapse under it.
      if (!self->live_.empty()) {
        cron_msg::await_idle w;
        (void)co_await self->ask(std::move(w));
        continue;
      }
      if (!next || !*next) break;  // nothing left to do in virtual time
    } else if (static_cast<int>(self->live_.size()) >= self->opts_.max_runs) {
      deadline = now + 3600 * 1000;  // woken when a run ends
    }
    if (self->opts_.stop_at && deadline > *self->opts_.stop_at) break;
    auto ex = self->get_executor();
    self->asleep_after_ = now;
    self->asleep_until_ = deadline;
    self->notify_quiet();
    auto wake = co_await self->clock_->sleep_until(ex, deadline);
    self->asleep_after_.reset();
    if (wake == runtime::wall_clock::wake::jumped) {
      std::vector<std::string> warnings;
      auto r =
          co_await self->resolve_overdue(self->clock_->now_ms(), "after a clock step", &warnings);
      for (auto& w : warnings) self->warn_(w);
      if (!r) self->warn_("cron: after a clock step: " + r.error().message);
    }
  }
  // The runs this loop started end before finished() resolves.
  while (!self->live_.empty()) {
    cron_msg::await_idle w;
    (void)co_await self->ask(std::move(w));
  }
  self->stopping_ = true;
  self->renew_timer_->cancel();
  self->loop_done_->set(0);
}

awaitable<void> cron_scheduler::finished() {
  co_await loop_done_->async_wait(asio::use_awaitable);
}

awaitable<void> cron_scheduler::renew_loop(std::shared_ptr<cron_scheduler> self,
                                           runtime::gate::holder held) {
  (void)held;
  auto timer = self->renew_timer_;
  while (!self->stopping_) {
    timer->expires_after(self->opts_.renew_every);
    auto [ec] = co_await timer->async_wait(asio::as_tuple(asio::use_awaitable));
    if (self->stopping_ && self->live_.empty()) break;
    if (self->live_.empty()) continue;
    std::vector<std::pair<std::string, std::int64_t>> claims;
    for (auto& [name, r] : self->live_) claims.emplace_back(name, r.fence);
    auto lease = self->clock_->now_ms() + self->opts_.lease.count();
    auto lost = co_await self->store_.cron_renew(self->claimant_, lease, std::move(claims));
    if (!lost)
      self->warn_("cron: renewing leases failed: " + lost.error().message);
    else
      for (auto& n : *lost)
        self->warn_("cron job " + quote(n) +
                    ": its claim was taken over (its lease lapsed); this run's completion will "
                    "be refused by its stale fencing token");
  }
}

// ---- one run ----

awaitable<void> cron_scheduler::run(std::shared_ptr<cron_scheduler> self, cron_claim c,
                                    runtime::gate::holder held) {
  (void)held;
  const auto name = c.spec.name;
  auto started = self->clock_->now_ms();
  cron_completion done;
  done.job = name;
  done.task = c.task;
  done.fence = c.fence;
  done.owner = self->claimant_;
  done.keep_runs = self->opts_.keep_runs;
  if (c.attempt < 0) {
    // Already ran: move the job on without running it again.
    auto now = self->clock_->now_ms();
    auto next = c.spec.one_shot()
                    ? std::optional<std::int64_t>{}
                    : next_run_after(c.spec, c.occurrence, now, self->catch_up_of(c.spec));
    auto r = co_await self->store_.cron_advance(name, c.occurrence, next, c.spec.one_shot(),
                                                std::nullopt, self->opts_.keep_runs);
    if (!r) self->warn_("cron job " + quote(name) + ": " + r.error().message);
    self->ended(name);
    co_return;
  }
  outcome out;
  int attempts = 0;
  bool abandon = false;
  if (c.spec.agent.empty()) {
    self->warn_("cron job " + quote(name) + " has no owning agent: its run at " +
                protocol::format_utc(c.occurrence) + " was skipped");
    out.status = "skipped";
    out.error = "the job has no owning agent";
  } else {
    const auto& policy = self->policy_of(c.spec.agent);
    for (int attempt = c.attempt; attempt <= c.spec.retries; ++attempt) {
      if (self->opts_.on_step) self->opts_.on_step("attempt");
      auto ok = co_await self->store_.cron_attempt(name, c.fence, self->claimant_, c.task, attempt);
      if (!ok || !*ok) {
        self->warn_("cron run " + c.task.str() + ": its claim is stale (" +
                    (ok ? std::string("taken over") : ok.error().message) +
                    "); this claimant stops following it");
        abandon = true;
        break;
      }
      TETHER_CRASH_POINT("cron.attempt.after_commit");
      attempts = attempt + 1;
      auto run_id = c.task.str() + "-a" + std::to_string(attempt);
      if (c.spec.kind == protocol::cron_action_kind::shell)
        out = co_await self->attempt_shell(c, run_id, policy);
      else
        out = co_await self->attempt_prompt(c, run_id, policy);
      if (out.status == "ok" || out.status == "degraded" || out.status == "refused") break;
      if (attempt == c.spec.retries) break;
      if (self->stopping_) {
        // Not retried now: the claim lapses, and the next start takes the
        // run over at this attempt (whose outcome the daemon kept).
        abandon = true;
        break;
      }
      auto timer = std::make_shared<asio::steady_timer>(self->get_executor());
      timer->expires_after(self->backoff(c.spec, attempt));
      co_await timer->async_wait(asio::as_tuple(asio::use_awaitable));
    }
  }
  if (abandon) {
    self->ended(name);
    co_return;
  }
  if (out.status == "refused") out.status = "error";
  auto now = self->clock_->now_ms();
  done.status = out.status;
  done.state = out.status == "ok" || out.status == "degraded" ? "completed"
               : out.status == "skipped"                      ? "cancelled"
               : out.status == "timed_out"                    ? "timed_out"
                                                              : "failed";
  done.exit = out.exit;
  done.output = std::move(out.output);
  done.error = std::move(out.error);
  done.duration_ms = std::max<std::int64_t>(0, now - started);
  done.attempts = std::max(attempts, 1);
  if (c.spec.one_shot()) {
    done.after = (out.status == "ok" && c.spec.delete_after_run) ? persistence::cron_after::remove
                                                                 : persistence::cron_after::disable;
  } else {
    done.after = persistence::cron_after::reschedule;
    done.next_run = next_run_after(c.spec, c.occurrence, now, self->catch_up_of(c.spec));
  }
  co_await self->complete(c, std::move(done));
  if (c.spec.kind == protocol::cron_action_kind::shell && self->channel_)
    for (int a = c.attempt; a < std::max(attempts, c.attempt + 1); ++a) {
      job_id id(c.task.str() + "-a" + std::to_string(a));
      co_await self->channel_->expire_record(id);
    }
  self->ended(name);
}

awaitable<void> cron_scheduler::complete(const cron_claim& c, cron_completion done) {
  for (int attempt = 0;; ++attempt) {
    if (done.after == persistence::cron_after::remove && attempt >= opts_.delete_attempts) {
      warn_("cron job " + quote(c.spec.name) + ": deleting it after its run failed " +
            std::to_string(attempt) + " times; it is disabled instead");
      done.after = persistence::cron_after::disable;
    }
    if (opts_.on_step) opts_.on_step("complete");
    auto copy = done;
    auto r = co_await store_.cron_complete(std::move(copy));
    if (r) {
      TETHER_CRASH_POINT("cron.complete.after_commit");
      co_return;
    }
    if (r.error().code == errc::conflict) {
      warn_(r.error().message);
      co_return;
    }
    if (attempt + 1 >= opts_.complete_attempts) {
      warn_("cron run " + c.task.str() + ": its completion could not be written (" +
            r.error().message + "); the claim is left to lapse and the run is taken over");
      co_return;
    }
    auto timer = std::make_shared<asio::steady_timer>(get_executor());
    timer->expires_after(runtime::retry_delay(attempt));
    co_await timer->async_wait(asio::as_tuple(asio::use_awaitable));
  }
}

awaitable<cron_scheduler::outcome> cron_scheduler::attempt_shell(
    const cron_claim& c, const std::string& run_id, const protocol::session_policy& policy) {
  command_spec spec;
  spec.id = job_id(run_id);
  spec.command = c.spec.command;
  spec.cwd = !c.spec.cwd.empty()  ? c.spec.cwd
             : !opts_.cwd.empty() ? opts_.cwd
                                  : std::filesystem::current_path().string();
  // What the command may want to know of its occurrence.
  spec.env = {{"TETHER_CRON_JOB", c.spec.name},
              {"TETHER_CRON_OCCURRENCE", std::to_string(c.occurrence)},
              {"TETHER_CRON_RUN", run_id}};
  spec.timeout_ms = c.spec.timeout_ms;
  spec.max_output_bytes = c.spec.max_output_bytes;
  auto after_exec = [] { TETHER_CRASH_POINT("cron.dispatch.after_exec"); };
  auto r = co_await run_command(get_executor(), channel_, std::move(spec), policy, c.spec.agent,
                                after_exec);
  co_return outcome{std::move(r.status), r.exit, std::move(r.output), std::move(r.error)};
}

awaitable<cron_scheduler::outcome> cron_scheduler::attempt_prompt(
    const cron_claim& c, const std::string& run_id, const protocol::session_policy& policy) {
  if (!prompts_)
    co_return outcome{"refused", {}, {}, "this host runs no prompt jobs (no prompt runner)"};
  auto sig = std::make_shared<asio::cancellation_signal>();
  auto running = prompts_(c.spec, job_id(run_id), policy);
  auto r = co_await run_prompt(get_executor(), std::move(running), c.spec.timeout_ms,
                               c.spec.max_output_bytes, std::move(sig));
  co_return outcome{std::move(r.status), r.exit, std::move(r.output), std::move(r.error)};
}

}  // namespace tether::actors
