#include "tether/runtime/artifact.hpp"

#include <fcntl.h>
#include <openssl/evp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <random>

namespace tether::runtime {

namespace {

std::string errno_text(int e) {
  return std::strerror(e);
}

// Closes the descriptor when it goes.
struct fd_guard {
  int fd = -1;
  ~fd_guard() {
    if (fd >= 0) ::close(fd);
  }
};

std::string random_suffix() {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(rng()));
  return buf;
}

result<void> write_all(int fd, std::string_view bytes, const std::string& path) {
  while (!bytes.empty()) {
    auto n = ::write(fd, bytes.data(), bytes.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return error{errc::io, "writing " + path + ": " + errno_text(errno)};
    }
    bytes.remove_prefix(static_cast<std::size_t>(n));
  }
  return {};
}

result<void> fsync_path(const std::string& path, int flags) {
  fd_guard g{::open(path.c_str(), flags | O_CLOEXEC)};
  if (g.fd < 0) return error{errc::io, "opening " + path + " to sync it: " + errno_text(errno)};
  if (::fsync(g.fd) != 0) return error{errc::io, "syncing " + path + ": " + errno_text(errno)};
  return {};
}

}  // namespace

std::string sha256_digest(std::string_view bytes) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (EVP_Digest(bytes.data(), bytes.size(), md, &len, EVP_sha256(), nullptr) != 1)
    throw std::runtime_error("EVP_Digest(sha256) failed");
  static constexpr char hex[] = "0123456789abcdef";
  std::string out = "sha256:";
  for (unsigned i = 0; i < len; ++i) {
    out.push_back(hex[md[i] >> 4]);
    out.push_back(hex[md[i] & 15]);
  }
  return out;
}

result<std::string> publish_artifact(const std::filesystem::path& dir, const std::string& name,
                                     std::string_view bytes) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return error{errc::io, "creating " + dir.string() + ": " + ec.message()};
  auto final_path = (dir / name).string();
  auto tmp = (dir / ("." + name + ".tmp-" + random_suffix())).string();
  {
    fd_guard g{::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644)};
    if (g.fd < 0) return error{errc::io, "creating " + tmp + ": " + errno_text(errno)};
    auto w = write_all(g.fd, bytes, tmp);
    if (w && ::fsync(g.fd) != 0) w = error{errc::io, "syncing " + tmp + ": " + errno_text(errno)};
    if (!w) {
      ::unlink(tmp.c_str());
      return w.error();
    }
  }
  if (::rename(tmp.c_str(), final_path.c_str()) != 0) {
    auto e = errno;
    ::unlink(tmp.c_str());
    return error{errc::io, "renaming " + tmp + " to " + final_path + ": " + errno_text(e)};
  }
  auto d = fsync_path(dir.string(), O_RDONLY | O_DIRECTORY);
  if (!d) return d.error();
  return final_path;
}

result<std::string> read_artifact(const std::string& path, std::size_t max_bytes) {
  fd_guard g{::open(path.c_str(), O_RDONLY | O_CLOEXEC)};
  if (g.fd < 0) {
    auto e = errno;
    return error{e == ENOENT ? errc::not_found : errc::io,
                 "reading " + path + ": " + errno_text(e)};
  }
  struct stat st {};
  if (::fstat(g.fd, &st) != 0) return error{errc::io, "reading " + path + ": " + errno_text(errno)};
  if (static_cast<std::size_t>(st.st_size) > max_bytes)
    return error{errc::invalid, path + " is " + std::to_string(st.st_size) +
                                    " bytes, more than the " + std::to_string(max_bytes) +
                                    " an artifact may have; it was not read"};
  std::string out;
  char buf[65536];
  for (;;) {
    auto n = ::read(g.fd, buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      return error{errc::io, "reading " + path + ": " + errno_text(errno)};
    }
    if (n == 0) break;
    out.append(buf, static_cast<std::size_t>(n));
    if (out.size() > max_bytes)
      return error{errc::invalid, path + " grew past " + std::to_string(max_bytes) + " bytes"};
  }
  return out;
}

}  // namespace tether::runtime
