// tether run [--tail N] [--isolate] [--allow-network] [--state-dir DIR] [--secret NAME]...
//            -- COMMAND...
//
// One COMMAND argument is a bash script, run as written; several are a
// command and its arguments, each quoted for bash (shell_quote), so no
// argument is interpreted by the shell.
//
// Runs COMMAND as a background job through the local sandbox daemon (started
// on demand), waits for its completion notice, prints the notice exactly as a
// model would read it, and exits with the failing stage's status (or 0;
// 128+N when killed by signal N; 255 when the status is unknown; 125 when
// tether itself failed).
#include <boost/asio/io_context.hpp>
#include <charconv>
#include <cstdio>
#include <filesystem>

#include "command.hpp"
#include "tether/runtime/sync_wait.hpp"
#include "tether/sandbox/client.hpp"
#include "tether/sandbox/daemon_process.hpp"
#include "tether/sandbox/state_dir.hpp"

namespace tether::cli {

namespace {

constexpr int k_tether_failed = 125;

int run_usage(const std::string& problem) {
  std::fprintf(stderr,
               "tether run: %s\nusage: tether run [--tail N] [--isolate] [--allow-network] "
               "[--state-dir DIR] [--secret NAME]... -- COMMAND...\n"
               "  one COMMAND argument is a bash script, run as written ('make | tail');\n"
               "  several are a command and its arguments, each quoted for bash as given\n",
               problem.c_str());
  return 2;
}

// One word for bash, as typed: left bare when it holds nothing bash would
// interpret, else in single quotes.
std::string shell_quote(const std::string& w) {
  bool plain = !w.empty() && w.find_first_not_of(
                                 "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuv"
                                 "wxyz0123456789_-+=/.,:@%^") == std::string::npos;
  if (plain) return w;
  std::string q = "'";
  for (char c : w) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

// One argument is a shell script, run as written (`tether run -- 'make | tail'`);
// several are a command and its arguments, each quoted, so `tether run -- echo
// '$HOME;id'` prints that text and runs nothing else.
std::string command_text(const args& a, std::size_t from) {
  if (a.size() == from + 1) return a[from];
  std::string cmd;
  for (std::size_t i = from; i < a.size(); ++i) cmd += (cmd.empty() ? "" : " ") + shell_quote(a[i]);
  return cmd;
}

boost::asio::awaitable<result<protocol::shell_completion>> run_job(std::string socket,
                                                                   sandbox::wire::exec_req req) {
  auto c = co_await sandbox::client::connect(socket, sandbox::wire::conn_mode::read_write,
                                             "tether run", sandbox::client_options::from_env());
  if (!c) co_return c.error();
  auto started = co_await (*c)->exec(std::move(req));
  if (!started) co_return started.error();
  auto done = co_await (*c)->wait(started->job);
  if (!done && !done.error().answered)
    co_return error{done.error().code, done.error().message + "; job '" + started->job.str() +
                                           "' was started, and the sandbox keeps it and its "
                                           "status by that id"};
  // Read: the daemon need not keep the job's record for anyone any more.
  if (done)
    if (auto e = co_await (*c)->expire(started->job); !e)
      std::fprintf(stderr, "tether run: the sandbox kept the record of job %s (%s)\n",
                   started->job.str().c_str(), e.error().message.c_str());
  co_return done;
}

int run(const args& a) {
  sandbox::wire::exec_req req;
  std::string state_dir;
  std::size_t i = 0;
  for (; i < a.size(); ++i) {
    const std::string& s = a[i];
    if (s == "--") {
      ++i;
      break;
    }
    if (s == "--isolate") {
      req.isolate = true;
    } else if (s == "--allow-network") {
      req.allow_network = true;
    } else if (s == "--tail" || s == "--state-dir" || s == "--secret") {
      if (i + 1 >= a.size()) return run_usage(s + " needs a value");
      const std::string& v = a[++i];
      if (s == "--state-dir") {
        state_dir = v;
      } else if (s == "--secret") {
        req.secret_names.push_back(v);
      } else {
        long long n = 0;
        auto r = std::from_chars(v.data(), v.data() + v.size(), n);
        if (r.ec != std::errc() || r.ptr != v.data() + v.size() || n < 0 || n > 10000)
          return run_usage("--tail wants a line count from 0 to 10000, got '" + v + "'");
        req.tail_lines = n;
      }
    } else if (!s.empty() && s[0] == '-') {
      return run_usage("unknown option '" + s + "'");
    } else {
      break;  // the command starts here
    }
  }
  req.command = command_text(a, i);
  if (req.command.empty()) return run_usage("no command given");
  std::error_code ec;
  req.cwd = std::filesystem::current_path(ec).string();
  if (ec) return run_usage("cannot read the current directory: " + ec.message());
  req.env = sandbox::current_environment();

  if (state_dir.empty()) {
    auto dflt = sandbox::default_state_dir();
    if (!dflt) {
      std::fprintf(stderr, "tether run: %s\n", dflt.error().message.c_str());
      return k_tether_failed;
    }
    state_dir = *dflt;
  }
  sandbox::daemon_options o;
  o.state_dir = state_dir;
  o.binary = (std::filesystem::path(self_dir()) / "tether-sandboxd").string();
  o.idle_exit = std::chrono::minutes(10);
  auto d = sandbox::ensure_daemon(o);
  if (!d) {
    std::fprintf(stderr, "tether run: %s\n", d.error().message.c_str());
    return k_tether_failed;
  }
  boost::asio::io_context io;
  auto done = runtime::run_to_completion(io, run_job(d->socket_path, std::move(req)));
  if (!done) {
    std::fprintf(stderr, "tether run: %s\n", done.error().message.c_str());
    return k_tether_failed;
  }
  std::fputs(protocol::render_notice(*done).c_str(), stdout);
  std::fflush(stdout);
  return protocol::exit_code_for(done->status);
}

registrar run_cmd{{"run",
                   "[--tail N] [--isolate] -- COMMAND...: run COMMAND as a background job in the "
                   "local sandbox and print its completion notice (one argument: a bash script; "
                   "several: a command and its arguments, each quoted)",
                   run}};

}  // namespace

}  // namespace tether::cli
