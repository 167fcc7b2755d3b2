#pragma once
// Shared test helpers: scratch directories and running awaitables.
#include <boost/asio/io_context.hpp>
#include <chrono>
#include <filesystem>
#include <string>
#include <vector>

#include "tether/runtime/sync_wait.hpp"

namespace tether::test {

/// A fresh, empty directory for this test, removed when the object dies.
class scratch_dir {
 public:
  explicit scratch_dir(const std::string& tag);
  ~scratch_dir();
  const std::filesystem::path& path() const { return p_; }
  std::string file(const std::string& name) const { return (p_ / name).string(); }

 private:
  std::filesystem::path p_;
};

/// The whole file at `path` ("" if it cannot be read).
std::string file_bytes(const std::string& path);

/// An owner identity (runtime::to_string) whose process is provably gone:
/// this process's, under another boot's id.
std::string dead_owner();

/// Drives `a` to completion on this thread's private io_context. It lives as
/// long as the thread: a completion posted by another thread (the writer's)
/// may still be inside the post, signalling the io_context, when run()
/// returns, so the io_context must not be destroyed then (TSan: a race on its
/// condition variable).
template <class T>
T run(boost::asio::awaitable<T> a) {
  thread_local boost::asio::io_context io;
  return runtime::run_to_completion(io, std::move(a));
}

/// Runs a program to completion; returns its raw wait status.
int run_process(const std::vector<std::string>& argv, std::string* out = nullptr,
                const std::vector<std::string>& extra_env = {});

/// What run_bounded() saw.
struct bounded_run {
  int status = 0;          // the raw wait status
  bool timed_out = false;  // still running at the limit: SIGKILLed here
  std::string output;      // its stdout and stderr, interleaved as written
};
/// Runs a program for at most `limit`: one still running then is SIGKILLed
/// (by its pid) and reaped, and `timed_out` says so, so a hung child fails a
/// test instead of hanging it.
bounded_run run_bounded(const std::vector<std::string>& argv, std::chrono::milliseconds limit,
                        const std::vector<std::string>& extra_env = {});

/// What run_captured() saw: the exit code (-1 if the program did not exit
/// normally) and its stdout and stderr, interleaved as written.
struct captured {
  int exit_code = -1;
  std::string output;
};
captured run_captured(const std::vector<std::string>& argv);

}  // namespace tether::test
