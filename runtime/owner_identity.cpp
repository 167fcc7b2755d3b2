#include "tether/runtime/owner_identity.hpp"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <random>
#include <vector>

namespace tether::runtime {

namespace {

constexpr std::string_view k_version = "v1";
constexpr std::size_t k_quote_max = 120;
constexpr std::size_t k_nonce_len = 32;
constexpr const char* k_boot_id_path = "/proc/sys/kernel/random/boot_id";

// At most k_quote_max bytes of `text` in single quotes, bytes outside
// printable ASCII (and the quote and backslash) escaped as \xNN, so an error
// message stays bounded and plain whatever a record holds.
std::string quote(std::string_view text) {
  static constexpr char hex[] = "0123456789abcdef";
  std::string out = "'";
  for (std::size_t i = 0; i < text.size() && i < k_quote_max; ++i) {
    auto c = static_cast<unsigned char>(text[i]);
    if (c < 0x20 || c >= 0x7f || c == '\'' || c == '\\') {
      out += "\\x";
      out += hex[c >> 4];
      out += hex[c & 0xf];
    } else {
      out += static_cast<char>(c);
    }
  }
  out += "'";
  if (text.size() > k_quote_max)
    out +=
        " (first " + std::to_string(k_quote_max) + " of " + std::to_string(text.size()) + " bytes)";
  return out;
}

bool is_lower_hex(char c) {
  return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
}

std::string_view trim(std::string_view s) {
  auto space = [](char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; };
  while (!s.empty() && space(s.front())) s.remove_prefix(1);
  while (!s.empty() && space(s.back())) s.remove_suffix(1);
  return s;
}

// A plain decimal: digits only (no sign, no spaces), the whole text, in range.
template <class T>
std::optional<T> decimal(std::string_view s) {
  if (s.empty() || s.front() < '0' || s.front() > '9') return std::nullopt;
  T v{};
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc{} || end != s.data() + s.size()) return std::nullopt;
  return v;
}

// A small /proc file, whole. The error says which file and why.
result<std::string> read_small_file(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    int e = errno;
    return error{e == ENOENT || e == ESRCH ? errc::not_found : errc::io,
                 "cannot open " + path + ": " + std::strerror(e)};
  }
  std::string out;
  char buf[1024];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      int e = errno;
      ::close(fd);
      return error{e == ESRCH ? errc::not_found : errc::io,
                   "cannot read " + path + ": " + std::strerror(e)};
    }
    if (n == 0) break;
    out.append(buf, static_cast<std::size_t>(n));
    if (out.size() > 64 * 1024) {
      ::close(fd);
      return error{errc::io, "refusing " + path + ": longer than 64 KiB"};
    }
  }
  ::close(fd);
  return out;
}

// The fields after a stat line's last ')': field 3 (the state) is the first.
std::optional<std::vector<std::string_view>> fields_after_comm(std::string_view line) {
  auto close = line.rfind(')');
  if (close == std::string_view::npos) return std::nullopt;
  std::vector<std::string_view> out;
  std::string_view rest = line.substr(close + 1);
  while (!rest.empty()) {
    auto start = rest.find_first_not_of(" \n");
    if (start == std::string_view::npos) break;
    rest.remove_prefix(start);
    auto end = rest.find_first_of(" \n");
    out.push_back(rest.substr(0, end));
    rest.remove_prefix(end == std::string_view::npos ? rest.size() : end);
  }
  return out;
}

struct stat_info {
  std::uint64_t start_s = 0;
  bool zombie = false;
};

long clock_ticks_per_second() {
  static const long tck = [] {
    long t = ::sysconf(_SC_CLK_TCK);
    return t > 0 ? t : 100L;
  }();
  return tck;
}

result<stat_info> read_stat(int pid) {
  auto path = "/proc/" + std::to_string(pid) + "/stat";
  auto text = read_small_file(path);
  if (!text) return text.error();
  auto ticks = start_ticks_from_stat(*text);
  if (!ticks)
    return error{errc::io,
                 path + " does not parse (no start time after the last ')'): " + quote(*text)};
  stat_info s;
  s.start_s = *ticks / static_cast<std::uint64_t>(clock_ticks_per_second());
  auto fields = fields_after_comm(*text);
  s.zombie = fields && !fields->empty() && (*fields)[0] == "Z";
  return s;
}

result<std::string> read_boot_id() {
  auto text = read_small_file(k_boot_id_path);
  if (!text) return text.error();
  auto id = trim(*text);
  if (id.empty()) return error{errc::io, std::string(k_boot_id_path) + " is empty"};
  return std::string(id);
}

std::string random_nonce() {
  static constexpr char hex[] = "0123456789abcdef";
  std::random_device rd;
  std::string out;
  out.reserve(k_nonce_len);
  while (out.size() < k_nonce_len) {
    auto v = static_cast<std::uint32_t>(rd());
    for (int i = 28; i >= 0; i -= 4) out += hex[(v >> i) & 0xf];
  }
  return out;
}

process_identity compute_current() {
  process_identity id;
  id.pid = static_cast<int>(::getpid());
  if (auto st = read_stat(id.pid)) id.start_s = st->start_s;
  if (auto b = read_boot_id()) id.boot_id = std::move(*b);
  id.nonce = random_nonce();
  return id;
}

result<process_identity> parse_error(std::string_view text, const std::string& what) {
  return error{errc::invalid, "unparsable owner identity " + quote(text) + ": " + what};
}

owner_probe answer(owner_liveness s, std::string why) {
  return owner_probe{s, std::move(why)};
}

}  // namespace

const process_identity& current_process_identity() {
  // Published once per pid with a compare-and-swap, no lock (so a child forked
  // while another thread computed it cannot deadlock). A superseded identity
  // (the parent's, in a forked child) is never freed: references to it stay valid.
  static std::atomic<const process_identity*> current{nullptr};
  const int pid = static_cast<int>(::getpid());
  const process_identity* p = current.load(std::memory_order_acquire);
  while (!p || p->pid != pid) {
    auto* fresh = new process_identity(compute_current());
    if (current.compare_exchange_strong(p, fresh, std::memory_order_acq_rel,
                                        std::memory_order_acquire))
      return *fresh;
    delete fresh;  // another thread won: `p` is its identity
  }
  return *p;
}

result<process_identity> identity_of(int pid) {
  if (pid <= 0)
    return error{errc::invalid,
                 "no identity for pid " + std::to_string(pid) + ": not a process id (must be > 0)"};
  auto st = read_stat(pid);
  if (!st)
    return error{st.error().code, "no identity for pid " + std::to_string(pid) +
                                      ": its start time is unreadable: " + st.error().message};
  auto boot = read_boot_id();
  if (!boot)
    return error{boot.error().code, "no identity for pid " + std::to_string(pid) +
                                        ": this boot's id is unreadable: " + boot.error().message};
  process_identity id;
  id.pid = pid;
  id.start_s = st->start_s;
  id.boot_id = std::move(*boot);
  return id;
}

std::string to_string(const process_identity& id) {
  return std::string(k_version) + ":" + std::to_string(id.pid) + ":" + std::to_string(id.start_s) +
         ":" + id.boot_id + ":" + id.nonce;
}

result<process_identity> parse_process_identity(std::string_view text) {
  static constexpr std::array<const char*, 5> names = {"version", "pid", "start time", "boot id",
                                                       "nonce"};
  std::vector<std::string_view> parts;
  for (std::string_view rest = text;;) {
    auto colon = rest.find(':');
    parts.push_back(rest.substr(0, colon));
    if (colon == std::string_view::npos) break;
    rest.remove_prefix(colon + 1);
  }
  if (parts[0] != k_version)
    return parse_error(text, std::string("version ") + quote(parts[0]) + " is not '" +
                                 std::string(k_version) + "'");
  if (parts.size() < names.size())
    return parse_error(text, std::string(names[parts.size()]) + " is missing (expected " +
                                 std::string(k_version) + ":<pid>:<start>:<boot id>:<nonce>)");
  if (parts.size() > names.size())
    return parse_error(text, "a field follows the nonce (expected exactly 5 fields, found " +
                                 std::to_string(parts.size()) + ")");
  process_identity id;
  auto pid = decimal<int>(parts[1]);
  if (!pid)
    return parse_error(text, "pid " + quote(parts[1]) + " is not a decimal number in range");
  if (*pid <= 0) return parse_error(text, "pid " + quote(parts[1]) + " is not > 0");
  id.pid = *pid;
  auto start = decimal<std::uint64_t>(parts[2]);
  if (!start)
    return parse_error(text, "start time " + quote(parts[2]) + " is not a decimal number in range");
  id.start_s = *start;
  auto boot = parts[3];
  if (boot.empty()) return parse_error(text, "boot id is empty");
  for (char c : boot)
    if (!is_lower_hex(c) && c != '-')
      return parse_error(text, "boot id " + quote(boot) + " is not lowercase hex and '-'");
  id.boot_id = std::string(boot);
  auto nonce = parts[4];
  bool hex = nonce.size() == k_nonce_len;
  for (char c : nonce) hex = hex && is_lower_hex(c);
  if (!hex)
    return parse_error(text, "nonce " + quote(nonce) + " is not " + std::to_string(k_nonce_len) +
                                 " lowercase hex chars");
  id.nonce = std::string(nonce);
  return id;
}

std::string_view to_string(owner_liveness s) {
  switch (s) {
    case owner_liveness::alive:
      return "alive";
    case owner_liveness::gone:
      return "gone";
    case owner_liveness::uncertain:
      return "uncertain";
  }
  return "unknown";
}

owner_probe probe_owner(std::string_view recorded) {
  auto id = parse_process_identity(recorded);
  if (!id) return answer(owner_liveness::uncertain, id.error().message);
  return probe_owner(*id);
}

owner_probe probe_owner(const process_identity& r) {
  using enum owner_liveness;
  const auto pid = std::to_string(r.pid);
  if (r.pid <= 0) return answer(uncertain, "recorded pid " + pid + " is not a process id");
  if (r.boot_id.empty()) return answer(uncertain, "recorded boot id is empty");
  const auto& self = current_process_identity();
  if (self.boot_id.empty())
    return answer(uncertain, "this boot's id is unreadable (" + std::string(k_boot_id_path) +
                                 "), so pid " + pid + "'s boot cannot be compared");
  if (r.boot_id != self.boot_id)
    return answer(gone, "another boot: the owner ran under boot " + quote(r.boot_id) +
                            ", this is boot " + self.boot_id);
  if (r.pid == self.pid && r.start_s == self.start_s) return answer(alive, "this very process");

  // EPERM: the pid exists but belongs to another user. That may be the owner
  // (alive) or a reuse of its pid, which the start time tells apart when
  // /proc lets us read it; when it does not, the pid's existence is the answer.
  bool not_ours = false;
  if (::kill(r.pid, 0) != 0) {
    int e = errno;
    if (e == ESRCH) return answer(gone, "no such process: pid " + pid);
    if (e != EPERM)
      return answer(uncertain, "kill(" + pid + ", 0) failed: " + std::string(std::strerror(e)));
    not_ours = true;
  }
  auto st = read_stat(r.pid);
  if (!st) {
    if (::kill(r.pid, 0) != 0 && errno == ESRCH)
      return answer(gone, "no such process: pid " + pid + " exited while probed");
    if (not_ours)
      return answer(alive, "pid " + pid + " exists, not ours to signal, and its start time is " +
                               "unreadable: " + st.error().message);
    return answer(uncertain,
                  "pid " + pid + " exists but its start time is unreadable: " + st.error().message);
  }
  if (st->start_s != r.start_s)
    return answer(gone, "pid reused: pid " + pid + " started at " + std::to_string(st->start_s) +
                            " s, the owner at " + std::to_string(r.start_s) + " s");
  std::string why =
      "pid " + pid + " started at " + std::to_string(st->start_s) + " s, as the owner did";
  if (not_ours) why += "; it exists, not ours to signal";
  if (st->zombie) why += "; it has exited but is not yet reaped (alive until reaped)";
  return answer(alive, std::move(why));
}

std::optional<std::uint64_t> start_ticks_from_stat(std::string_view stat_line) {
  // Field 22 is the 20th after the command name (the state, field 3, is the 1st).
  auto fields = fields_after_comm(stat_line);
  if (!fields || fields->size() < 20) return std::nullopt;
  return decimal<std::uint64_t>((*fields)[19]);
}

}  // namespace tether::runtime
