#include "job_store.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>

#include "slot_pool.hpp"
#include "tether/protocol/ids.hpp"
#include "tether/protocol/json.hpp"
#include "tether/protocol/sandbox_wire.hpp"
#include "tether/runtime/crash_point.hpp"

namespace tether::sandboxd {

namespace json = boost::json;
using protocol::fields;

std::int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

int file_ops::open(const char* path, int flags, mode_t mode) {
  return ::open(path, flags, mode);
}
ssize_t file_ops::write(int fd, const void* data, std::size_t n) {
  return ::write(fd, data, n);
}
int file_ops::fsync(int fd) {
  return ::fsync(fd);
}
int file_ops::close(int fd) {
  return ::close(fd);
}
int file_ops::rename(const char* from, const char* to) {
  return ::rename(from, to);
}

file_ops& system_file_ops() {
  static file_ops ops;
  return ops;
}

namespace {
// Writes `content` to the open `fd` of `tmp`, syncs and closes it, renames tmp
// to p and syncs p's directory. Every step must succeed before the next: a
// rename of a temp whose bytes are not yet durable could leave an empty or
// torn record after a power cut.
result<void> finish_atomic(file_ops& ops, int fd, const fs::path& tmp, const fs::path& p,
                           std::string_view content) {
  auto fail = [&](const std::string& what) {
    int e = errno;
    ops.close(fd);
    return error{errc::io, "cannot " + what + " " + tmp.string() + ": " + std::strerror(e) + "; " +
                               p.string() + " was left as it was"};
  };
  std::size_t off = 0;
  while (off < content.size()) {
    ssize_t n = ops.write(fd, content.data() + off, content.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return fail("write");
    off += static_cast<std::size_t>(n);
  }
  if (ops.fsync(fd) != 0) return fail("sync");
  ops.close(fd);
  if (ops.rename(tmp.c_str(), p.c_str()) != 0)
    return error{errc::io, "cannot rename " + tmp.string() + " to " + p.string() + ": " +
                               std::strerror(errno) + "; " + p.string() + " was left as it was"};
  auto dir = p.parent_path();
  if (auto s = sync_dir(dir.empty() ? fs::path(".") : dir, ops); !s)
    return error{errc::io, s.error().message + "; " + p.string() +
                               " was replaced, but may not survive a power loss"};
  return {};
}
}  // namespace

result<void> sync_dir(const fs::path& dir, file_ops& ops) {
  int fd = ops.open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC, 0);
  if (fd < 0) return error{errc::io, "cannot open " + dir.string() + ": " + std::strerror(errno)};
  if (ops.fsync(fd) != 0) {
    int e = errno;
    ops.close(fd);
    return error{errc::io, "cannot sync " + dir.string() + ": " + std::strerror(e)};
  }
  ops.close(fd);
  return {};
}

std::error_code make_private_dir(const fs::path& dir) {
  if (::mkdir(dir.c_str(), 0700) == 0) return {};
  if (errno != EEXIST) return std::error_code(errno, std::generic_category());
  if (::chmod(dir.c_str(), 0700) != 0) return std::error_code(errno, std::generic_category());
  return {};
}

result<void> write_file_atomic(const fs::path& p, std::string_view content, file_ops& ops) {
  fs::path tmp = p;
  tmp += ".tmp";
  int fd = ops.open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) return error{errc::io, "cannot create " + tmp.string() + ": " + std::strerror(errno)};
  return finish_atomic(ops, fd, tmp, p, content);
}

result<std::string> read_file(const fs::path& p) {
  int fd = ::open(p.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) {
    errc c = errno == ENOENT ? errc::not_found : errc::io;
    return error{c, "cannot open " + p.string() + ": " + std::strerror(errno)};
  }
  std::string out;
  char buf[65536];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      int e = errno;
      ::close(fd);
      return error{errc::io, "cannot read " + p.string() + ": " + std::strerror(e)};
    }
    if (n == 0) break;
    out.append(buf, static_cast<std::size_t>(n));
  }
  ::close(fd);
  return out;
}

result<identity> load_identity(const fs::path& dir, const std::string& wanted_id, bool replace) {
  fs::path file = dir / "sandbox.json";
  auto text = read_file(file);
  identity id;
  if (!text && text.error().code != errc::not_found) return text.error();
  if (text) {
    auto v = protocol::parse_json(*text);
    if (!v)
      return error{errc::corrupt, "refusing to start: " + file.string() + " does not parse (" +
                                      v.error().describe() + "); nothing was changed"};
    auto f = fields::of(*v);
    if (!f)
      return error{errc::corrupt,
                   "refusing to start: " + file.string() + ": " + f.error().describe()};
    auto sid = f->str("sandbox_id");
    auto gen = f->i64("generation");
    if (!sid || !gen || *gen < 1)
      return error{errc::corrupt, "refusing to start: " + file.string() + ": " +
                                      (!sid   ? sid.error().describe()
                                       : !gen ? gen.error().describe()
                                              : std::string("generation must be >= 1")) +
                                      "; nothing was changed"};
    id.sandbox_id = *sid;
    id.generation = static_cast<std::uint64_t>(*gen);
    if (!wanted_id.empty() && wanted_id != id.sandbox_id && !replace)
      return error{errc::refused, "refusing to start: " + dir.string() + " belongs to sandbox '" +
                                      id.sandbox_id + "', not '" + wanted_id +
                                      "' (pass --replace to replace it); nothing was changed"};
    if (!replace) return id;
    if (!wanted_id.empty()) id.sandbox_id = wanted_id;
    id.generation += 1;
  } else {
    id.sandbox_id = wanted_id.empty() ? protocol::mint("sbx") : wanted_id;
    id.generation = 1;
  }
  std::error_code ec;
  if (replace) {
    // The old generation's jobs describe a machine that no longer exists.
    fs::remove_all(dir / "jobs", ec);
    if (ec)
      return error{errc::io, "cannot remove " + (dir / "jobs").string() + ": " + ec.message()};
  }
  json::object o{{"sandbox_id", id.sandbox_id}, {"generation", id.generation}};
  if (auto w = write_file_atomic(file, protocol::to_text(o)); !w) return w.error();
  TETHER_CRASH_POINT("sandboxd.identity_written");
  return id;
}

result<void> write_record(const fs::path& job_dir, const job_record& r, file_ops& ops) {
  json::object o{{"job", r.job},
                 {"command", r.command},
                 {"cwd", r.cwd},
                 {"isolate", r.isolate},
                 {"state", r.state},
                 {"pid", r.pid},
                 {"pid_start", r.pid_start},
                 {"started_at_ms", r.started_at_ms},
                 {"tail_lines", r.tail_lines},
                 {"tail_bytes", r.tail_bytes},
                 {"preview_bytes", r.preview_bytes},
                 {"kill_requested", r.kill_requested},
                 {"output_total", r.output_total},
                 {"head_len", r.head_len},
                 {"output_final", r.output_final}};
  json::array stages;
  for (auto& st : r.shape.stages) stages.emplace_back(st);
  o["stages"] = std::move(stages);
  o["negated"] = r.shape.negated;
  if (r.done) o["done"] = protocol::sandbox::to_json(*r.done);
  std::string text = protocol::to_text(o);
  // A temp made ahead by the slot pool, while one is left: no entry to create.
  for (int k = 0; k < slot_pool::k_record_spares; ++k) {
    fs::path spare = job_dir / ("job.json.tmp." + std::to_string(k));
    int fd = ops.open(spare.c_str(), O_WRONLY | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0);
    if (fd >= 0) return finish_atomic(ops, fd, spare, job_dir / "job.json", text);
  }
  return write_file_atomic(job_dir / "job.json", text, ops);
}

std::vector<fs::path> leftover_temps(const fs::path& job_dir) {
  std::vector<fs::path> out;
  std::error_code ec;
  for (auto& e : fs::directory_iterator(job_dir, ec)) {
    auto name = e.path().filename().string();
    bool temp =
        name == "job.json.tmp" || name == "output.tmp" || name.rfind("job.json.tmp.", 0) == 0;
    // The slot pool's spares are made empty; one holding bytes was written to.
    std::error_code sec;
    if (temp && e.is_regular_file(sec) && e.file_size(sec) > 0 && !sec) out.push_back(e.path());
  }
  return out;
}

result<job_record> read_record(const fs::path& job_dir) {
  fs::path file = job_dir / "job.json";
  auto text = read_file(file);
  if (!text) return text.error();
  auto v = protocol::parse_json(*text);
  auto bad = [&](const protocol::decode_error& e) {
    return error{errc::corrupt, file.string() + ": " + e.describe()};
  };
  if (!v) return bad(v.error());
  auto f = fields::of(*v);
  if (!f) return bad(f.error());
  job_record r;
#define TAKE(lhs, expr)              \
  do {                               \
    auto t_ = (expr);                \
    if (!t_) return bad(t_.error()); \
    lhs = *t_;                       \
  } while (0)
  TAKE(r.job, f->str("job"));
  TAKE(r.command, f->str("command"));
  TAKE(r.cwd, f->str("cwd"));
  TAKE(r.isolate, f->boolean("isolate"));
  TAKE(r.state, f->str("state"));
  TAKE(r.pid, f->i64("pid"));
  std::int64_t tmp;
  TAKE(tmp, f->i64("pid_start"));
  r.pid_start = static_cast<std::uint64_t>(tmp);
  TAKE(r.started_at_ms, f->i64("started_at_ms"));
  TAKE(r.tail_lines, f->i64("tail_lines"));
  TAKE(r.tail_bytes, f->i64("tail_bytes"));
  TAKE(r.preview_bytes, f->i64("preview_bytes"));
  TAKE(r.kill_requested, f->boolean("kill_requested"));
  TAKE(tmp, f->i64("output_total"));
  r.output_total = static_cast<std::uint64_t>(tmp);
  TAKE(tmp, f->i64("head_len"));
  r.head_len = static_cast<std::uint64_t>(tmp);
  TAKE(r.output_final, f->boolean("output_final"));
  TAKE(r.shape.negated, f->boolean("negated"));
  const json::array* stages;
  TAKE(stages, f->array("stages"));
  for (std::size_t i = 0; i < stages->size(); ++i) {
    if (!(*stages)[i].is_string())
      return bad({"stages[" + std::to_string(i) + "]", "expected a string"});
    r.shape.stages.emplace_back((*stages)[i].get_string());
  }
#undef TAKE
  if (f->has("done")) {
    auto c = protocol::sandbox::completion_from_json(f->obj().at("done"), "done");
    if (!c) return bad(c.error());
    r.done = std::move(*c);
  }
  if (r.job != job_dir.filename().string())
    return error{errc::corrupt,
                 file.string() + ": job id '" + r.job + "' does not match its directory"};
  return r;
}

}  // namespace tether::sandboxd
