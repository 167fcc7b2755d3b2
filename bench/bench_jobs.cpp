// bench_jobs: short background commands through a real tether-sandboxd
// (exec, follow, completion notice) against raw posix_spawn + waitpid of the
// same `bash -c` commands in the same run, interleaved job by job.
//
// Figures: jobs/s and launch-to-notice latency p50/p99 for both, the p50
// overhead per job and the ratio. Goal: overhead <= 2 ms per job at p50.
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <boost/asio/io_context.hpp>
#include <cstdlib>
#include <filesystem>

#include "support.hpp"
#include "tether/runtime/sync_wait.hpp"
#include "tether/sandbox/client.hpp"
#include "tether/sandbox/daemon_process.hpp"

extern char** environ;

using namespace tether;
namespace wire = protocol::sandbox;
using boost::asio::awaitable;

namespace {

constexpr const char* k_bench = "bench_jobs";

const std::vector<std::string> k_commands = {
    "echo hello",
    "true",
    "printf 'a\\nb\\n' | wc -l",
    "ls / > /dev/null; echo listed",
};

// Raw baseline: bash -c COMMAND with stdout+stderr to a pipe, read to EOF, waitpid.
double raw_job(const std::string& cmd) {
  auto t0 = bench::clock::now();
  int p[2];
  if (::pipe2(p, O_CLOEXEC) != 0) std::abort();
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, p[1], 1);
  posix_spawn_file_actions_adddup2(&fa, p[1], 2);
  std::string c = cmd;
  char* argv[] = {const_cast<char*>("/bin/bash"), const_cast<char*>("-c"), c.data(), nullptr};
  pid_t pid;
  if (::posix_spawn(&pid, "/bin/bash", &fa, nullptr, argv, environ) != 0) std::abort();
  posix_spawn_file_actions_destroy(&fa);
  ::close(p[1]);
  char buf[4096];
  while (::read(p[0], buf, sizeof buf) > 0) {
  }
  ::close(p[0]);
  int st;
  ::waitpid(pid, &st, 0);
  return bench::seconds_since(t0);
}

struct samples {
  std::vector<double> daemon_s, raw_s;
  double daemon_total = 0, raw_total = 0;
  double concurrent_jobs_per_s = 0;
};

awaitable<void> drive(std::string socket, std::string cwd, int jobs, samples& out) {
  auto c = co_await sandbox::client::connect(socket, wire::conn_mode::read_write, "bench_jobs");
  if (!c) {
    std::fprintf(stderr, "bench_jobs: %s\n", c.error().message.c_str());
    std::exit(1);
  }
  auto& client = **c;
  // The same environment the raw baseline's bash gets (without HOME, bash
  // looks the user up through NSS on every start).
  auto env = sandbox::current_environment();
  auto one = [&](const std::string& cmd) -> awaitable<double> {
    auto t0 = bench::clock::now();
    wire::exec_req r;
    r.command = cmd;
    r.cwd = cwd;
    r.env = env;
    auto s = co_await client.exec(std::move(r));
    if (!s) throw std::runtime_error(s.error().message);
    auto done = co_await client.wait(s->job);
    if (!done) throw std::runtime_error(done.error().message);
    auto notice = protocol::render_notice(*done);
    if (notice.empty() || done->status.exit_code != 0)
      throw std::runtime_error("job failed: " + notice);
    co_return bench::seconds_since(t0);
  };
  for (int i = 0; i < 50; ++i) {  // warm-up, both paths
    auto w = one(k_commands[i % k_commands.size()]);
    co_await std::move(w);
    raw_job(k_commands[i % k_commands.size()]);
  }
  for (int i = 0; i < jobs; ++i) {
    const auto& cmd = k_commands[i % k_commands.size()];
    auto job = one(cmd);
    double d = co_await std::move(job);
    out.daemon_s.push_back(d);
    out.daemon_total += d;
    double r = raw_job(cmd);
    out.raw_s.push_back(r);
    out.raw_total += r;
  }
  // Throughput with 8 jobs in flight on one connection.
  auto t0 = bench::clock::now();
  const int batch = 8;
  int launched = 0;
  while (launched < jobs) {
    std::vector<protocol::job_id> ids;
    for (int k = 0; k < batch && launched < jobs; ++k, ++launched) {
      wire::exec_req r;
      r.command = k_commands[launched % k_commands.size()];
      r.cwd = cwd;
      r.env = env;
      auto s = co_await client.exec(std::move(r));
      if (!s) throw std::runtime_error(s.error().message);
      ids.push_back(s->job);
    }
    for (auto& id : ids) {
      auto done = co_await client.wait(id);
      if (!done) throw std::runtime_error(done.error().message);
    }
  }
  out.concurrent_jobs_per_s = jobs / bench::seconds_since(t0);
}

}  // namespace

int main(int argc, char** argv) {
  int jobs = argc > 1 ? std::atoi(argv[1]) : 1000;
  char tmpl[] = "/tmp/tether-bench-jobs-XXXXXX";
  if (!::mkdtemp(tmpl)) return 1;
  std::string dir = tmpl;
  sandbox::daemon_options o;
  o.state_dir = dir + "/state";
  o.binary = std::string(TETHER_BIN_DIR) + "/tether-sandboxd";
  o.detach = false;
  o.grace = std::chrono::seconds(5);
  auto d = sandbox::ensure_daemon(o);
  if (!d) {
    std::fprintf(stderr, "bench_jobs: %s\n", d.error().message.c_str());
    return 1;
  }
  samples s;
  int rc = 0;
  try {
    boost::asio::io_context io;
    runtime::run_to_completion(io, drive(d->socket_path, dir, jobs, s));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_jobs: %s\n", e.what());
    rc = 1;
  }
  (void)sandbox::stop_daemon(*d);
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  if (rc) return rc;

  double dp50 = bench::percentile(s.daemon_s, 50) * 1e3,
         dp99 = bench::percentile(s.daemon_s, 99) * 1e3;
  double rp50 = bench::percentile(s.raw_s, 50) * 1e3, rp99 = bench::percentile(s.raw_s, 99) * 1e3;
  bench::emit(k_bench, "jobs", jobs, "jobs");
  bench::emit(k_bench, "daemon_jobs_per_s", jobs / s.daemon_total, "jobs/s");
  bench::emit(k_bench, "daemon_launch_to_notice_p50", dp50, "ms");
  bench::emit(k_bench, "daemon_launch_to_notice_p99", dp99, "ms");
  bench::emit(k_bench, "daemon_launch_to_notice_max", bench::percentile(s.daemon_s, 100) * 1e3,
              "ms");
  bench::emit(k_bench, "raw_spawn_jobs_per_s", jobs / s.raw_total, "jobs/s");
  bench::emit(k_bench, "raw_spawn_waitpid_p50", rp50, "ms");
  bench::emit(k_bench, "raw_spawn_waitpid_p99", rp99, "ms");
  bench::emit(k_bench, "raw_spawn_waitpid_max", bench::percentile(s.raw_s, 100) * 1e3, "ms");
  bench::emit(k_bench, "overhead_per_job_p50", dp50 - rp50, "ms");
  bench::emit(k_bench, "latency_ratio_p50", dp50 / rp50, "x");
  bench::emit(k_bench, "daemon_jobs_per_s_8_in_flight", s.concurrent_jobs_per_s, "jobs/s");
  return 0;
}
