// embed: the smallest real host on tether. An echo agent answers a prompt and
// hands it to a background subagent; the subagent's report arrives in the
// parent's inbox and wakes the parent for one more turn. The parent's inbox
// and transcript are printed. Exits 0 only if the report arrived and the
// parent took it.
#include <cstdio>
#include <filesystem>
#include <random>
#include <string>
#include <tether/tether.hpp>

namespace asio = boost::asio;

// The parent: echoes each prompt, starts a helper on it in the background, and
// acknowledges the helper's report when it arrives.
asio::awaitable<void> echo(tether::turn& t) {
  for (const auto& m : t.inputs()) {
    if (m.kind == tether::message_kind::prompt) {
      std::string answer = "echo: " + m.text;
      co_await t.say(std::move(answer));
      auto child = co_await t.spawn_background("helper", "echo it again", m.text);
      if (!child) throw std::runtime_error("cannot start the helper: " + child.error().message);
    } else if (m.kind == tether::message_kind::report) {
      co_await t.say("the helper reported back");
    }
  }
}

// The background subagent: echoes its prompt; its last answer is its report.
asio::awaitable<void> helper(tether::turn& t) {
  for (const auto& m : t.inputs()) {
    if (m.kind != tether::message_kind::prompt) continue;
    std::string answer = "echo from the background: " + m.text;
    co_await t.say(std::move(answer));
  }
}

int run(tether::embedded& host) {
  auto parent = host.block(host.create_session("embed example", "echo"));
  if (!parent) return std::fprintf(stderr, "embed: %s\n", parent.error().message.c_str()), 1;
  auto sent = host.block(host.prompt(*parent, "hello, tether"));
  if (!sent) return std::fprintf(stderr, "embed: %s\n", sent.error().message.c_str()), 1;
  // The parent's first turn settles before the helper reports; quiescence
  // means the report was delivered and the parent's turn on it settled too.
  auto quiet = host.block(host.wait_quiescent());
  if (!quiet) return std::fprintf(stderr, "embed: %s\n", quiet.error().message.c_str()), 1;

  auto inbox = host.inbox(*parent);
  if (!inbox) return std::fprintf(stderr, "embed: %s\n", inbox.error().message.c_str()), 1;
  std::printf("Parent inbox (%s):\n", parent->str().c_str());
  bool arrived = false;
  for (const auto& e : *inbox) {
    std::printf("  [%s] from %s, %s\n", e.id.str().c_str(),
                e.from ? e.from->str().c_str() : "(none)",
                e.acknowledged ? "acknowledged" : "pending");
    std::printf("    %s\n", e.body.c_str());
    arrived |= e.from.has_value() && e.acknowledged;
  }
  auto transcript = host.transcript(*parent);
  if (!transcript)
    return std::fprintf(stderr, "embed: %s\n", transcript.error().message.c_str()), 1;
  std::printf("Parent transcript:\n");
  for (const auto& m : *transcript) {
    std::string_view role = tether::to_string(m.role), kind = tether::to_string(m.kind);
    std::printf("  %lld %.*s/%.*s: %s\n", static_cast<long long>(m.seq),
                static_cast<int>(role.size()), role.data(), static_cast<int>(kind.size()),
                kind.data(), m.text.c_str());
  }
  if (!arrived) std::fprintf(stderr, "embed: the helper's report did not reach the parent\n");
  return arrived ? 0 : 1;
}

int main() {
  auto dir = std::filesystem::temp_directory_path() /
             ("tether-embed-" + std::to_string(std::random_device{}()));
  std::filesystem::create_directories(dir);
  int rc = 1;
  {
    tether::options opts;
    opts.db_path = (dir / "embed.db").string();
    opts.threads = 2;
    opts.add_agent("echo", echo).add_agent("helper", helper);
    auto host = tether::embedded::open(std::move(opts));
    if (!host) {
      std::fprintf(stderr, "embed: cannot open the host: %s\n", host.error().message.c_str());
    } else {
      rc = run(**host);
      // Blocking shutdown, from main's thread (never from inside an agent).
      if (auto closed = (*host)->close(); !closed) {
        std::fprintf(stderr, "embed: %s\n", closed.error().message.c_str());
        rc = 1;
      }
    }
  }
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  return rc;
}
