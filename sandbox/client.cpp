#include "tether/sandbox/client.hpp"

#include <unistd.h>

#include <algorithm>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/experimental/channel.hpp>
#include <boost/asio/local/stream_protocol.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <cerrno>
#include <cstdlib>
#include <deque>

#include "tether/protocol/scrub.hpp"
#include "tether/sandbox/framing.hpp"
#include "tether/sandbox/state_dir.hpp"

extern char** environ;

namespace tether::sandbox {

namespace asio = boost::asio;
constexpr auto tuple_awaitable = asio::as_tuple(asio::use_awaitable);

std::vector<std::pair<std::string, std::string>> current_environment() {
  std::vector<std::pair<std::string, std::string>> env;
  for (char** e = environ; e && *e; ++e) {
    std::string s = *e;
    auto eq = s.find('=');
    if (eq == std::string::npos || eq == 0) continue;
    env.emplace_back(s.substr(0, eq), s.substr(eq + 1));
  }
  return env;
}

// ---- the connection -----------------------------------------------------------------------

using reply_channel =
    asio::experimental::channel<void(boost::system::error_code, wire::reply_body)>;

struct client::state {
  using clock = std::chrono::steady_clock;
  state(asio::any_io_executor ex, client_options o, std::string path)
      : sock(ex), watchdog(ex), opts(std::move(o)), socket_path(std::move(path)) {}
  asio::local::stream_protocol::socket sock;
  std::map<std::uint64_t, std::shared_ptr<reply_channel>> pending;
  std::uint64_t next_id = 1;
  std::deque<std::string> queue;
  bool writing = false;
  bool closed = false;
  std::string lost;  // why the connection ended
  // The watchdog (see client_options): silence is measured from the last line
  // read, or from the moment a request found the connection idle.
  asio::steady_timer watchdog;
  client_options opts;
  std::string socket_path;
  clock::time_point heard = clock::now();
  bool ready = false;          // hello answered: probes may be sent
  std::uint64_t probe_id = 0;  // the heartbeat probe in flight, if any
  bool timed_out = false;      // the watchdog closed the connection
};

client_options client_options::from_env() {
  client_options o;
  if (const char* v = std::getenv("TETHER_SANDBOX_DEADLINE_MS"); v && *v) {
    long long ms = std::atoll(v);
    if (ms > 0) {
      o.deadline = std::chrono::milliseconds(ms);
      o.heartbeat = std::chrono::milliseconds(std::max(1LL, ms / 4));
    }
  }
  return o;
}

namespace {

using state_ptr = std::shared_ptr<client::state>;

error from_reply(const wire::error_rep& e) {
  errc c = errc::failed;
  if (e.code == "invalid") c = errc::invalid;
  if (e.code == "not_found") c = errc::not_found;
  if (e.code == "refused" || e.code == "unsupported_version") c = errc::refused;
  if (e.code == "io") c = errc::io;
  return error{c, "sandbox daemon: " + e.message, true};
}

error lost(const client::state& s) {
  if (s.timed_out) return error{errc::timeout, s.lost};
  return error{errc::closed, "the connection to the sandbox daemon is closed" +
                                 (s.lost.empty() ? std::string() : " (" + s.lost + ")")};
}

awaitable<void> write_all(state_ptr s) {
  while (!s->queue.empty() && !s->closed) {
    std::string batch;
    while (!s->queue.empty() && batch.size() < (256u << 10)) {
      batch += s->queue.front();
      s->queue.pop_front();
    }
    auto [ec, n] = co_await asio::async_write(s->sock, asio::buffer(batch), tuple_awaitable);
    if (ec) {
      // Only our sending side ends: the reader still reads what the daemon
      // said before it hung up (e.g. why it refused this connection), then
      // reports the end. Closing here raced it ("Operation canceled").
      boost::system::error_code ig;
      s->sock.shutdown(asio::socket_base::shutdown_send, ig);
      break;
    }
  }
  s->writing = false;
}

// Queues one request, framed (framing.hpp), for the writer.
void send_request(const state_ptr& s, const wire::request& r) {
  s->queue.push_back(frame(wire::encode(r)).value());  // JSON text holds no raw newline
  if (!s->writing) {
    s->writing = true;
    asio::co_spawn(s->sock.get_executor(), write_all(s), asio::detached);
  }
}

// The heartbeat probe: an attach of a job id no caller uses. Any daemon that
// reads its socket answers it at once (`not_found`, or that job's status),
// without starting or changing anything; read-only connections may send it.
void send_probe(const state_ptr& s) {
  wire::attach_req a;
  a.job = job_id("tether-heartbeat");
  a.follow = false;
  s->probe_id = s->next_id++;
  wire::request r{s->probe_id, std::move(a)};
  send_request(s, r);
}

std::string millis(std::chrono::milliseconds d) {
  return std::to_string(d.count()) + " ms";
}

// While a request waits, the daemon must be heard from within the deadline;
// it is probed after a heartbeat of silence. Ends when the connection closes.
awaitable<void> watch_silence(state_ptr s) {
  using clock = client::state::clock;
  for (;;) {
    if (s->closed) break;
    if (s->pending.empty()) {
      s->watchdog.expires_at(clock::time_point::max());
    } else {
      auto now = clock::now();
      auto silent = now - s->heard;
      if (silent >= s->opts.deadline) {
        s->timed_out = true;
        s->lost = "the sandbox daemon at " + s->socket_path + " did not answer for " +
                  millis(s->opts.deadline) + (s->ready ? " while a request waited" : " (hello)") +
                  "; it may be stopped or wedged. The connection was closed; the daemon keeps "
                  "its jobs, and a retry once it answers finds them by id";
        boost::system::error_code ig;
        s->sock.close(ig);  // the reader fails every waiting request
        break;
      }
      if (s->ready && s->probe_id == 0 && silent >= s->opts.heartbeat) send_probe(s);
      auto next = s->probe_id != 0 || s->opts.heartbeat >= s->opts.deadline
                      ? s->heard + s->opts.deadline
                      : s->heard + s->opts.heartbeat;
      s->watchdog.expires_at(next);
    }
    co_await s->watchdog.async_wait(tuple_awaitable);  // cancelled: recheck at once
  }
}

// Reads replies until the connection ends and hands each to the request it
// answers. Replies have no line limit (client.hpp says why).
awaitable<void> read_all(state_ptr s) {
  line_splitter lines(k_unbounded_line, "reply line");
  std::vector<char> chunk(64u << 10);
  bool open = true;
  while (open) {
    auto [ec, n] = co_await s->sock.async_read_some(asio::buffer(chunk), tuple_awaitable);
    if (ec) {
      // A reason the daemon gave before hanging up stays the reason.
      if (s->lost.empty()) s->lost = ec == asio::error::eof ? "the daemon closed it" : ec.message();
      break;
    }
    lines.feed(std::string_view(chunk.data(), n));
    for (;;) {
      auto line = lines.next();
      if (!line) break;  // the rest waits for the next read
      if (!*line) {
        s->lost = "the daemon sent " + line->error().message;
        open = false;
        break;
      }
      s->heard = client::state::clock::now();
      auto r = wire::decode_reply(**line);
      if (!r) {
        s->lost = "the daemon sent an undecodable reply: " + r.error().describe();
        open = false;
        break;
      }
      if (s->probe_id != 0 && r->id == s->probe_id) {
        s->probe_id = 0;  // heard: the daemon reads its socket
        if (s->opts.on_heartbeat) s->opts.on_heartbeat();
        continue;
      }
      auto it = s->pending.find(r->id);
      if (it == s->pending.end()) {
        // An error for no request (id 0) says why the daemon is about to hang
        // up, e.g. its connection cap: keep it for the error the caller sees.
        if (auto* e = std::get_if<wire::error_rep>(&r->body);
            e && r->id == 0 && e->code == "refused")
          s->lost = "the daemon closed it: " + e->message;
        continue;  // else an abandoned request
      }
      auto ch = it->second;
      boost::system::error_code ok;
      co_await ch->async_send(ok, std::move(r->body), tuple_awaitable);
    }
  }
  s->closed = true;
  boost::system::error_code ig;
  s->sock.close(ig);
  s->watchdog.cancel();
  for (auto& [id, ch] : s->pending) {
    wire::error_rep e{"closed", "the connection to the sandbox daemon is closed (" + s->lost + ")"};
    if (!ch->try_send(boost::system::error_code{}, wire::reply_body(std::move(e)))) ch->close();
  }
}

// A request in flight: its replies arrive on `ch`; forgets itself when done.
class call {
 public:
  call(state_ptr s, wire::request_body body) : s_(std::move(s)) {
    if (s_->closed) return;
    id_ = s_->next_id++;
    ch_ = std::make_shared<reply_channel>(s_->sock.get_executor(), 64);
    if (s_->pending.empty()) {
      // The daemon owed nothing until now: its silence counts from here.
      s_->heard = client::state::clock::now();
      s_->watchdog.cancel();
    }
    s_->pending[id_] = ch_;
    wire::request r{id_, std::move(body)};
    send_request(s_, r);
  }
  ~call() {
    if (ch_) {
      s_->pending.erase(id_);
      ch_->cancel();  // a reader blocked sending to us must not wait forever
      ch_->close();
    }
  }
  call(const call&) = delete;

  /// The next reply; a daemon `error` reply becomes an error value.
  awaitable<result<wire::reply_body>> next() {
    if (!ch_) co_return lost(*s_);
    auto [ec, body] = co_await ch_->async_receive(tuple_awaitable);
    if (ec) co_return lost(*s_);
    if (auto* e = std::get_if<wire::error_rep>(&body)) {
      if (e->code == "closed") co_return lost(*s_);
      co_return from_reply(*e);
    }
    co_return body;
  }

 private:
  state_ptr s_;
  std::uint64_t id_ = 0;
  std::shared_ptr<reply_channel> ch_;
};

template <class T>
result<T> expect(result<wire::reply_body> r, const char* what) {
  if (!r) return r.error();
  if (auto* v = std::get_if<T>(&*r)) return std::move(*v);
  return error{errc::invalid,
               std::string("sandbox daemon answered ") + what + " with an unexpected reply type"};
}

}  // namespace

awaitable<result<std::unique_ptr<client>>> client::connect(std::string socket_path,
                                                           wire::conn_mode mode,
                                                           std::string client_name,
                                                           client_options opts) {
  auto ex = co_await asio::this_coro::executor;
  auto s = std::make_shared<state>(ex, opts, socket_path);
  asio::local::stream_protocol::endpoint ep(socket_path);
  auto [ec] = co_await s->sock.async_connect(ep, tuple_awaitable);
  if (ec)
    co_return error{ec == asio::error::connection_refused || ec == asio::error::not_found ||
                            ec.value() == ENOENT
                        ? errc::not_found
                        : errc::io,
                    "no sandbox daemon answers at " + socket_path + " (" + ec.message() +
                        "); connecting never starts one"};
  // A daemon run by another user would receive our whole environment.
  if (auto peer = check_peer_uid(s->sock.native_handle(), "the sandbox daemon at " + socket_path);
      !peer)
    co_return peer.error();
  asio::co_spawn(ex, read_all(s), asio::detached);
  asio::co_spawn(ex, watch_silence(s), asio::detached);
  std::unique_ptr<client> c(new client(s));
  wire::hello_req h;
  h.mode = mode;
  h.client = std::move(client_name);
  call q(s, std::move(h));
  auto rep = expect<wire::hello_rep>(co_await q.next(), "hello");
  if (!rep) {
    if (rep.error().code == errc::timeout)
      co_return error{errc::timeout, "the sandbox daemon at " + socket_path +
                                         " accepted the connection but did not answer hello "
                                         "within " +
                                         millis(opts.deadline) +
                                         "; it may be stopped or wedged. Nothing was sent to "
                                         "it; retry once it answers"};
    co_return rep.error();
  }
  s->ready = true;
  if (rep->version != wire::k_version)
    co_return error{errc::refused, "the sandbox daemon speaks protocol version " +
                                       std::to_string(rep->version) + "; this client speaks " +
                                       std::to_string(wire::k_version)};
  c->hello_ = std::move(*rep);
  co_return c;
}

client::~client() {
  close();
}

void client::close() {
  if (!s_) return;
  boost::system::error_code ig;
  s_->sock.close(ig);
  s_->watchdog.cancel();  // the reader ends the watchdog with the connection
}

awaitable<result<wire::started_rep>> client::exec(wire::exec_req r) {
  // Remember a scrubbed preview for the -1 path (the daemon scrubs the same way).
  protocol::scrubber sc(protocol::scrub_rules::from_env(r.env, r.secret_names));
  std::string preview = sc.scrub(r.command);
  auto lines = r.tail_lines, bytes = r.tail_bytes, pbytes = r.preview_bytes;
  call q(s_, std::move(r));
  auto rep = expect<wire::started_rep>(co_await q.next(), "exec");
  if (rep) {
    auto& sn = seen_[rep->job.str()];
    sn.preview = protocol::make_preview(preview, static_cast<std::size_t>(pbytes)).text;
    sn.tail_lines = lines;
    sn.tail_bytes = bytes;
  }
  co_return rep;
}

void client::keep(const job_id& job, const wire::output_rep& o) {
  auto& sn = seen_[job.str()];
  if (o.offset + o.data.size() <= sn.next_offset) return;  // already have it
  std::string_view d(o.data);
  if (o.offset < sn.next_offset) d.remove_prefix(sn.next_offset - o.offset);
  if (o.offset > sn.next_offset)
    sn.out.append("[... " + std::to_string(o.offset - sn.next_offset) +
                  " bytes the sandbox no longer retained ...]\n");
  sn.out.append(d);
  sn.next_offset = o.offset + o.data.size();
}

const protocol::head_tail* client::retained(const job_id& job) const {
  auto it = seen_.find(job.str());
  return it == seen_.end() ? nullptr : &it->second.out;
}

awaitable<result<client::attach_result>> client::attach_impl(job_id job, std::uint64_t offset,
                                                             bool follow) {
  wire::attach_req a;
  a.job = job;
  a.offset = offset;
  a.follow = follow;
  call q(s_, std::move(a));
  attach_result res;
  res.offset = offset;
  res.next_offset = offset;
  bool first = true;
  for (;;) {
    auto r = co_await q.next();
    if (!r) co_return r.error();
    if (auto* o = std::get_if<wire::output_rep>(&*r)) {
      keep(job, *o);
      if (first) res.offset = o->offset, res.skipped = o->skipped;
      first = false;
      // A follow lasts the job's whole life: its output is kept only in the
      // bounded retained() head and tail, never accumulated here.
      if (!follow) {
        res.data += o->data;
        largest_buffer_ = std::max(largest_buffer_, res.data.size());
      }
      res.next_offset = o->offset + o->data.size();
      continue;
    }
    if (auto* st = std::get_if<wire::status_rep>(&*r)) {
      res.output_bytes = st->output_bytes;
      res.done = std::move(st->done);
      co_return res;
    }
    co_return error{errc::invalid, "sandbox daemon answered attach with an unexpected reply type"};
  }
}

awaitable<result<client::attach_result>> client::attach(job_id job, std::uint64_t offset) {
  return attach_impl(std::move(job), offset, false);
}

result<protocol::shell_completion> client::cleaned_up(const job_id& job, const error& e) {
  auto it = seen_.find(job.str());
  if (e.code != errc::not_found) return e;
  if (it == seen_.end() || it->second.out.total() == 0)
    return error{errc::not_found,
                 "job '" + job.str() +
                     "': the sandbox has no status for it and this client "
                     "captured no output; nothing is known about how it ended (" +
                     e.message + ")",
                 e.answered};  // the daemon's own answer stays one
  auto& sn = it->second;
  protocol::shell_completion c;
  c.job = job.str();
  c.status.state = protocol::job_state::unknown;
  c.status.exit_code = -1;
  c.status.reason =
      "the sandbox cleaned this job up before its status was read; the output shown was retained "
      "by the client";
  c.preview.text = sn.preview.empty() ? "(not known to this client)" : sn.preview;
  auto bytes = static_cast<std::size_t>(sn.tail_bytes);
  auto t = protocol::make_tail(sn.out.last(bytes + 8), sn.out.total(),
                               static_cast<std::size_t>(sn.tail_lines), bytes);
  c.tail = std::move(t.text);
  c.tail_omitted_bytes = t.omitted_bytes;
  c.tail_lines = t.lines;
  c.output_bytes = sn.out.total();
  return c;
}

awaitable<result<protocol::shell_completion>> client::wait(job_id job) {
  std::uint64_t from = seen_[job.str()].next_offset;
  auto r = co_await attach_impl(job, from, true);
  if (!r) co_return cleaned_up(job, r.error());
  if (!r->done)
    co_return error{errc::invalid, "sandbox daemon ended a followed attach of '" + job.str() +
                                       "' without a completion"};
  co_return std::move(*r->done);
}

awaitable<result<bool>> client::wait_for_output(job_id job, std::string text) {
  auto& sn = seen_[job.str()];
  auto has = [&] {
    auto all = sn.out.read(0, static_cast<std::size_t>(sn.out.total()));
    return all.data.find(text) != std::string::npos;
  };
  if (has()) co_return true;
  wire::attach_req a;
  a.job = job;
  a.offset = sn.next_offset;
  a.follow = true;
  call q(s_, std::move(a));
  for (;;) {
    auto r = co_await q.next();
    if (!r) co_return r.error();
    if (auto* o = std::get_if<wire::output_rep>(&*r)) {
      keep(job, *o);
      if (has()) co_return true;  // the rest of the stream goes to an abandoned request
      continue;
    }
    co_return false;
  }
}

awaitable<result<std::optional<protocol::shell_completion>>> client::poll(job_id job) {
  std::uint64_t from = seen_[job.str()].next_offset;
  auto r = co_await attach_impl(job, from, false);
  if (!r) {
    auto c = cleaned_up(job, r.error());
    if (!c) co_return c.error();
    co_return std::optional<protocol::shell_completion>(std::move(*c));
  }
  co_return std::move(r->done);
}

awaitable<result<protocol::shell_completion>> client::kill(
    job_id job, std::optional<std::chrono::milliseconds> wait) {
  wire::kill_req k;
  k.job = std::move(job);
  if (wait) k.wait_ms = wait->count();
  call q(s_, std::move(k));
  auto rep = expect<wire::killed_rep>(co_await q.next(), "kill");
  if (!rep) co_return rep.error();
  co_return std::move(rep->done);
}

awaitable<result<wire::jobs_rep>> client::list(std::optional<std::uint64_t> after_revision) {
  wire::list_req l;
  l.after_revision = after_revision;
  call q(s_, std::move(l));
  co_return expect<wire::jobs_rep>(co_await q.next(), "list");
}

awaitable<result<std::vector<job_id>>> client::expire(std::optional<job_id> job) {
  wire::expire_req e;
  e.job = std::move(job);
  call q(s_, std::move(e));
  auto rep = expect<wire::expired_rep>(co_await q.next(), "expire");
  if (!rep) co_return rep.error();
  co_return std::move(rep->jobs);
}

}  // namespace tether::sandbox
