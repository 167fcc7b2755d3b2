#include "support.hpp"

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <random>

namespace tether::test {

scratch_dir::scratch_dir(const std::string& tag) {
  const char* base = std::getenv("TETHER_TEST_TMP");
  std::filesystem::path root = base ? base : std::filesystem::temp_directory_path() / "tether-test";
  std::filesystem::create_directories(root);
  std::random_device rd;
  p_ = root / (tag + "-" + std::to_string(::getpid()) + "-" + std::to_string(rd()));
  std::filesystem::create_directories(p_);
}

scratch_dir::~scratch_dir() {
  std::error_code ec;
  std::filesystem::remove_all(p_, ec);
}

int run_process(const std::vector<std::string>& argv, std::string* out,
                const std::vector<std::string>& extra_env) {
  int fds[2];
  if (::pipe(fds) != 0) return -1;
  pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(fds[1], 1);
    if (!out) ::dup2(fds[1], 2);
    ::close(fds[0]);
    ::close(fds[1]);
    for (auto& e : extra_env) ::putenv(const_cast<char*>(e.c_str()));
    std::vector<char*> a;
    for (auto& s : argv) a.push_back(const_cast<char*>(s.c_str()));
    a.push_back(nullptr);
    ::execv(a[0], a.data());
    ::_exit(127);
  }
  ::close(fds[1]);
  std::string buf;
  char chunk[4096];
  ssize_t n;
  while ((n = ::read(fds[0], chunk, sizeof chunk)) > 0) buf.append(chunk, n);
  ::close(fds[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  if (out) *out = std::move(buf);
  return status;
}

captured run_captured(const std::vector<std::string>& argv) {
  std::string cmd = "exec";
  for (auto& a : argv) {
    std::string q;
    for (char c : a) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
    cmd += " '" + q + "'";
  }
  cmd += " 2>&1";
  captured r;
  int status = run_process({"/bin/sh", "-c", cmd}, &r.output);
  if (WIFEXITED(status)) r.exit_code = WEXITSTATUS(status);
  return r;
}

}  // namespace tether::test
