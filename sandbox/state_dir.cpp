#include "tether/sandbox/state_dir.hpp"

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>

namespace tether::sandbox {

namespace fs = std::filesystem;

std::string local_state_dir_for(const std::string& db_path) {
  std::string beside = db_path + ".sandbox";
  if (socket_path_for(beside).size() < sizeof(sockaddr_un::sun_path)) return beside;
  // FNV-1a of the absolute path: the same database always finds the same directory.
  std::error_code ec;
  auto abs = fs::absolute(db_path, ec).lexically_normal().string();
  std::uint64_t h = 1469598103934665603ull;
  for (unsigned char c : abs) h = (h ^ c) * 1099511628211ull;
  char name[32];
  std::snprintf(name, sizeof name, "%016llx.sandbox", static_cast<unsigned long long>(h));
  const char* home = std::getenv("HOME");
  const char* runtime = std::getenv("XDG_RUNTIME_DIR");
  if (home && *home) return (fs::path(home) / ".tether" / "local" / name).string();
  if (runtime && *runtime) return (fs::path(runtime) / "tether-local" / name).string();
  return beside;  // its socket path is too long: the launch says so
}

std::string socket_path_for(const std::string& state_dir) {
  return (fs::path(state_dir) / "sock").string();
}

result<std::string> default_state_dir() {
  if (const char* d = std::getenv("TETHER_SANDBOX_DIR"); d && *d) return std::string(d);
  if (const char* h = std::getenv("HOME"); h && *h)
    return (fs::path(h) / ".tether" / "sandbox").string();
  if (const char* r = std::getenv("XDG_RUNTIME_DIR"); r && *r)
    return (fs::path(r) / "tether-sandbox").string();
  // A guessable directory under /tmp could be planted by another local user.
  return error{errc::invalid,
               "no sandbox state directory: set TETHER_SANDBOX_DIR (or HOME, or "
               "XDG_RUNTIME_DIR) to a directory only you can write; nothing was started"};
}

result<void> secure_state_dir(const std::string& dir) {
  if (dir.empty()) return error{errc::invalid, "no sandbox state directory given"};
  fs::path p(dir);
  std::error_code ec;
  if (p.has_parent_path() && !fs::exists(p.parent_path(), ec))
    fs::create_directories(p.parent_path(), ec);
  if (ec) return error{errc::io, "cannot create " + p.parent_path().string() + ": " + ec.message()};
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST)
    return error{errc::io, "cannot create sandbox state directory " + dir + ": " +
                               std::strerror(errno) + "; nothing was started"};
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0)
    return error{errc::refused, "refusing sandbox state directory " + dir + ": " +
                                    (errno == ELOOP || errno == ENOTDIR
                                         ? std::string("it is a symbolic link or not a directory")
                                         : std::string(std::strerror(errno))) +
                                    "; nothing was started"};
  struct stat st {};
  int rc = ::fstat(fd, &st);
  auto done = [&](result<void> r) {
    ::close(fd);
    return r;
  };
  if (rc != 0) return done(error{errc::io, "cannot stat " + dir + ": " + std::strerror(errno)});
  if (st.st_uid != ::geteuid())
    return done(error{errc::refused,
                      "refusing sandbox state directory " + dir + ": it is owned by uid " +
                          std::to_string(st.st_uid) + ", not by uid " +
                          std::to_string(::geteuid()) +
                          " (this process); another user could serve a fake daemon or plant "
                          "links there. Remove it or set TETHER_SANDBOX_DIR to a directory you "
                          "own; nothing was started"});
  if (st.st_mode & (S_IWGRP | S_IWOTH)) {
    char mode[8];
    std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(st.st_mode & 07777));
    return done(error{errc::refused, "refusing sandbox state directory " + dir + ": its mode " +
                                         mode +
                                         " lets group or others write it; chmod 700 it or set "
                                         "TETHER_SANDBOX_DIR elsewhere; nothing was started"});
  }
  if ((st.st_mode & 077) != 0 && ::fchmod(fd, 0700) != 0)
    return done(error{errc::io, "cannot chmod 700 " + dir + ": " + std::strerror(errno)});
  return done({});
}

result<void> check_peer_uid(int fd, const std::string& who) {
  ucred cred{};
  socklen_t len = sizeof cred;
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0)
    return error{errc::io, "cannot read the credentials of " + who + ": " + std::strerror(errno)};
  if (cred.uid != ::geteuid())
    return error{errc::refused, who + " runs as uid " + std::to_string(cred.uid) + " (pid " +
                                    std::to_string(cred.pid) + "), not as uid " +
                                    std::to_string(::geteuid()) +
                                    "; refusing it, nothing was sent"};
  return {};
}

}  // namespace tether::sandbox
