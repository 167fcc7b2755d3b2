#include "fault_vfs.hpp"

#include <sqlite3.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <set>
#include <sstream>

namespace tether::test::fault {
namespace {

struct state {
  sqlite3_vfs* real = nullptr;
  sqlite3_vfs vfs{};
  plan p;
  std::atomic<std::uint64_t> reads{0}, writes{0}, syncs{0};
  std::atomic<bool> fired{false};
  std::mutex log_m;
  std::FILE* log = nullptr;
  std::string trace_path;
};
// Never destroyed: write_counts reads it from an atexit handler, which may
// run after the static destructors of this library.
state& g = *new state;

struct file {
  sqlite3_file base;
  sqlite3_file* real;
  const char* name;  // SQLite keeps the name alive while the file is open
  bool tracked;      // main db, WAL or rollback journal
};

sqlite3_file* real_of(sqlite3_file* f) {
  return reinterpret_cast<file*>(f)->real;
}

const char* base_name(const char* path) {
  const char* s = std::strrchr(path, '/');
  return s ? s + 1 : path;
}

std::uint64_t trace_len() {
  if (g.trace_path.empty()) return 0;
  struct stat st;
  return ::stat(g.trace_path.c_str(), &st) == 0 ? static_cast<std::uint64_t>(st.st_size) : 0;
}

void put_u64(std::string& out, std::uint64_t v) {
  out.append(reinterpret_cast<char*>(&v), 8);
}

void log_op(char type, const char* name, std::int64_t offset, const void* data, int n) {
  if (!g.log) return;
  std::string rec(1, type);
  std::string nm = base_name(name);
  put_u64(rec, nm.size());
  rec += nm;
  put_u64(rec, static_cast<std::uint64_t>(offset));
  put_u64(rec, static_cast<std::uint64_t>(n));
  if (n > 0) rec.append(static_cast<const char*>(data), n);
  put_u64(rec, trace_len());
  std::lock_guard lk(g.log_m);
  std::fwrite(rec.data(), 1, rec.size(), g.log);
  std::fflush(g.log);
}

void append_report(const std::string& line) {
  if (g.p.report_path.empty()) return;
  std::FILE* f = std::fopen(g.p.report_path.c_str(), "a");
  if (!f) return;
  std::fputs((line + "\n").c_str(), f);
  std::fclose(f);
}

const char* op_name(op k) {
  return k == op::read ? "read" : k == op::write ? "write" : "sync";
}

// Counts an op of kind `k`; true if it must fail.
bool should_fail(op k, std::atomic<std::uint64_t>& counter) {
  std::uint64_t n = ++counter;
  if (!g.p.kind || *g.p.kind != k || g.p.nth == 0) return false;
  if (n == g.p.nth) {
    g.fired = true;
    append_report(std::string("fired ") + op_name(k) + " " + std::to_string(n));
    return true;
  }
  return g.p.persistent && n > g.p.nth;
}

int x_close(sqlite3_file* f) {
  auto* r = real_of(f);
  int rc = r->pMethods ? r->pMethods->xClose(r) : SQLITE_OK;
  return rc;
}
int x_read(sqlite3_file* f, void* buf, int n, sqlite3_int64 off) {
  auto* w = reinterpret_cast<file*>(f);
  if (w->tracked && should_fail(op::read, g.reads)) return g.p.code;
  return w->real->pMethods->xRead(w->real, buf, n, off);
}
int x_write(sqlite3_file* f, const void* buf, int n, sqlite3_int64 off) {
  auto* w = reinterpret_cast<file*>(f);
  if (w->tracked) {
    if (should_fail(op::write, g.writes)) return g.p.code;
    log_op('W', w->name, off, buf, n);
  }
  return w->real->pMethods->xWrite(w->real, buf, n, off);
}
int x_truncate(sqlite3_file* f, sqlite3_int64 size) {
  auto* w = reinterpret_cast<file*>(f);
  if (w->tracked) log_op('T', w->name, size, nullptr, 0);
  return w->real->pMethods->xTruncate(w->real, size);
}
int x_sync(sqlite3_file* f, int flags) {
  auto* w = reinterpret_cast<file*>(f);
  if (w->tracked) {
    if (should_fail(op::sync, g.syncs)) return g.p.code;
    int rc = w->real->pMethods->xSync(w->real, flags);
    if (rc == SQLITE_OK) log_op('S', w->name, 0, nullptr, 0);
    return rc;
  }
  return w->real->pMethods->xSync(w->real, flags);
}
int x_file_size(sqlite3_file* f, sqlite3_int64* s) {
  return real_of(f)->pMethods->xFileSize(real_of(f), s);
}
int x_lock(sqlite3_file* f, int l) {
  return real_of(f)->pMethods->xLock(real_of(f), l);
}
int x_unlock(sqlite3_file* f, int l) {
  return real_of(f)->pMethods->xUnlock(real_of(f), l);
}
int x_check_reserved(sqlite3_file* f, int* out) {
  return real_of(f)->pMethods->xCheckReservedLock(real_of(f), out);
}
int x_file_control(sqlite3_file* f, int op, void* arg) {
  return real_of(f)->pMethods->xFileControl(real_of(f), op, arg);
}
int x_sector_size(sqlite3_file* f) {
  return real_of(f)->pMethods->xSectorSize(real_of(f));
}
int x_device_chars(sqlite3_file* f) {
  return real_of(f)->pMethods->xDeviceCharacteristics(real_of(f));
}
int x_shm_map(sqlite3_file* f, int pg, int sz, int extend, void volatile** pp) {
  return real_of(f)->pMethods->xShmMap(real_of(f), pg, sz, extend, pp);
}
int x_shm_lock(sqlite3_file* f, int off, int n, int flags) {
  return real_of(f)->pMethods->xShmLock(real_of(f), off, n, flags);
}
void x_shm_barrier(sqlite3_file* f) {
  real_of(f)->pMethods->xShmBarrier(real_of(f));
}
int x_shm_unmap(sqlite3_file* f, int del) {
  return real_of(f)->pMethods->xShmUnmap(real_of(f), del);
}
int x_fetch(sqlite3_file* f, sqlite3_int64 off, int n, void** pp) {
  return real_of(f)->pMethods->xFetch(real_of(f), off, n, pp);
}
int x_unfetch(sqlite3_file* f, sqlite3_int64 off, void* p) {
  return real_of(f)->pMethods->xUnfetch(real_of(f), off, p);
}

const sqlite3_io_methods k_methods = {3,
                                      x_close,
                                      x_read,
                                      x_write,
                                      x_truncate,
                                      x_sync,
                                      x_file_size,
                                      x_lock,
                                      x_unlock,
                                      x_check_reserved,
                                      x_file_control,
                                      x_sector_size,
                                      x_device_chars,
                                      x_shm_map,
                                      x_shm_lock,
                                      x_shm_barrier,
                                      x_shm_unmap,
                                      x_fetch,
                                      x_unfetch};

int x_open(sqlite3_vfs*, sqlite3_filename name, sqlite3_file* f, int flags, int* out_flags) {
  auto* w = reinterpret_cast<file*>(f);
  w->real = reinterpret_cast<sqlite3_file*>(w + 1);
  w->name = name;
  w->tracked = name && (flags & (SQLITE_OPEN_MAIN_DB | SQLITE_OPEN_WAL | SQLITE_OPEN_MAIN_JOURNAL));
  int rc = g.real->xOpen(g.real, name, w->real, flags, out_flags);
  // SQLite calls xClose only when pMethods is set, even if xOpen failed.
  w->base.pMethods = w->real->pMethods ? &k_methods : nullptr;
  return rc;
}
int x_delete(sqlite3_vfs*, const char* name, int sync_dir) {
  log_op('D', name, 0, nullptr, 0);
  return g.real->xDelete(g.real, name, sync_dir);
}
int x_access(sqlite3_vfs*, const char* name, int flags, int* out) {
  return g.real->xAccess(g.real, name, flags, out);
}
int x_full_pathname(sqlite3_vfs*, const char* name, int n, char* out) {
  return g.real->xFullPathname(g.real, name, n, out);
}
void* x_dl_open(sqlite3_vfs*, const char* p) {
  return g.real->xDlOpen(g.real, p);
}
void x_dl_error(sqlite3_vfs*, int n, char* m) {
  g.real->xDlError(g.real, n, m);
}
void (*x_dl_sym(sqlite3_vfs*, void* h, const char* s))(void) {
  return g.real->xDlSym(g.real, h, s);
}
void x_dl_close(sqlite3_vfs*, void* h) {
  g.real->xDlClose(g.real, h);
}
int x_randomness(sqlite3_vfs*, int n, char* out) {
  return g.real->xRandomness(g.real, n, out);
}
int x_sleep(sqlite3_vfs*, int us) {
  return g.real->xSleep(g.real, us);
}
int x_current_time(sqlite3_vfs*, double* t) {
  return g.real->xCurrentTime(g.real, t);
}
int x_last_error(sqlite3_vfs*, int n, char* m) {
  return g.real->xGetLastError(g.real, n, m);
}
int x_current_time64(sqlite3_vfs*, sqlite3_int64* t) {
  return g.real->xCurrentTimeInt64(g.real, t);
}

[[maybe_unused]] void write_counts() {
  append_report("ops reads=" + std::to_string(g.reads.load()) + " writes=" +
                std::to_string(g.writes.load()) + " syncs=" + std::to_string(g.syncs.load()));
}

}  // namespace

std::optional<plan> parse_plan(const std::string& spec) {
  plan p;
  if (spec == "none") return p;
  std::vector<std::string> parts;
  std::stringstream in(spec);
  for (std::string s; std::getline(in, s, ':');) parts.push_back(s);
  if (parts.size() < 3 || parts.size() > 4) return std::nullopt;
  if (parts[0] == "read")
    p.kind = op::read;
  else if (parts[0] == "write")
    p.kind = op::write;
  else if (parts[0] == "sync")
    p.kind = op::sync;
  else
    return std::nullopt;
  p.nth = std::strtoull(parts[1].c_str(), nullptr, 10);
  if (p.nth == 0) return std::nullopt;
  if (parts[2] == "full")
    p.code = SQLITE_FULL;
  else if (parts[2] == "ioerr")
    p.code = *p.kind == op::read    ? SQLITE_IOERR_READ
             : *p.kind == op::write ? SQLITE_IOERR_WRITE
                                    : SQLITE_IOERR_FSYNC;
  else
    return std::nullopt;
  if (parts.size() == 4) {
    if (parts[3] != "persistent") return std::nullopt;
    p.persistent = true;
  }
  return p;
}

void install(const plan& p) {
  if (!g.real) {
    g.real = sqlite3_vfs_find(nullptr);
    g.vfs = *g.real;
    g.vfs.zName = "tether_fault";
    g.vfs.szOsFile = static_cast<int>(sizeof(file)) + g.real->szOsFile;
    g.vfs.pNext = nullptr;
    g.vfs.pAppData = nullptr;
    g.vfs.xOpen = x_open;
    g.vfs.xDelete = x_delete;
    g.vfs.xAccess = x_access;
    g.vfs.xFullPathname = x_full_pathname;
    g.vfs.xDlOpen = x_dl_open;
    g.vfs.xDlError = x_dl_error;
    g.vfs.xDlSym = x_dl_sym;
    g.vfs.xDlClose = x_dl_close;
    g.vfs.xRandomness = x_randomness;
    g.vfs.xSleep = x_sleep;
    g.vfs.xCurrentTime = x_current_time;
    g.vfs.xGetLastError = x_last_error;
    g.vfs.xCurrentTimeInt64 = x_current_time64;
    // System-call overrides (version 3) stay with the real VFS.
    g.vfs.iVersion = 2;
    sqlite3_vfs_register(&g.vfs, 1);
  }
  g.p = p;
  g.reads = g.writes = g.syncs = 0;
  g.fired = false;
  {
    std::lock_guard lk(g.log_m);
    if (g.log) std::fclose(g.log);
    g.log = p.record_path.empty() ? nullptr : std::fopen(p.record_path.c_str(), "ab");
  }
  const char* t = std::getenv("TETHER_CRASH_TRACE");
  g.trace_path = t ? t : "";
}

counts current() {
  return counts{g.reads.load(), g.writes.load(), g.syncs.load(), g.fired.load()};
}

std::vector<record> read_log(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<record> out;
  std::size_t i = 0;
  auto u64 = [&](std::uint64_t& v) {
    if (i + 8 > all.size()) return false;
    std::memcpy(&v, all.data() + i, 8);
    i += 8;
    return true;
  };
  while (i < all.size()) {
    record r;
    r.type = all[i++];
    std::uint64_t n = 0, off = 0, len = 0;
    if (!u64(n) || i + n > all.size()) break;
    r.file = all.substr(i, n);
    i += n;
    if (!u64(off) || !u64(len) || i + len > all.size()) break;
    r.offset = static_cast<std::int64_t>(off);
    r.data = all.substr(i, len);
    i += len;
    if (!u64(r.trace_len)) break;
    out.push_back(std::move(r));
  }
  return out;
}

void replay(const std::vector<record>& log, std::size_t cut, const std::string& dir,
            const std::function<bool(std::size_t)>& keep_unsynced) {
  // A write is durable if a sync of its file follows it before the cut.
  std::vector<bool> durable(cut, false);
  std::set<std::string> synced_later;
  for (std::size_t i = cut; i-- > 0;) {
    auto& r = log[i];
    if (r.type == 'S') synced_later.insert(r.file);
    if (r.type == 'D') synced_later.erase(r.file);  // a delete starts the file's history over
    durable[i] = r.type != 'W' || synced_later.count(r.file) > 0;
  }
  for (std::size_t i = 0; i < cut; ++i) {
    auto& r = log[i];
    auto path = dir + "/" + r.file;
    if (r.type == 'D') {
      std::remove(path.c_str());
    } else if (r.type == 'T') {
      std::FILE* f = std::fopen(path.c_str(), "r+b");
      if (!f) f = std::fopen(path.c_str(), "w+b");
      if (f) {
        [[maybe_unused]] int rc = ::ftruncate(fileno(f), r.offset);
        std::fclose(f);
      }
    } else if (r.type == 'W' && (durable[i] || keep_unsynced(i))) {
      std::FILE* f = std::fopen(path.c_str(), "r+b");
      if (!f) f = std::fopen(path.c_str(), "w+b");
      if (f) {
        std::fseek(f, r.offset, SEEK_SET);
        std::fwrite(r.data.data(), 1, r.data.size(), f);
        std::fclose(f);
      }
    }
  }
}

report read_report(const std::string& path) {
  report r;
  std::ifstream in(path);
  std::string l;
  while (std::getline(in, l)) {
    if (l.rfind("fired ", 0) == 0) r.fired = true;
    unsigned long long rd = 0, wr = 0, sy = 0;
    if (std::sscanf(l.c_str(), "ops reads=%llu writes=%llu syncs=%llu", &rd, &wr, &sy) == 3)
      r.ops = counts{rd, wr, sy, r.fired};
  }
  return r;
}

#ifdef TETHER_FAULT_PRELOAD
namespace {
// The preload library's entry: take the plan from the environment, register,
// and keep the children this process starts free of it.
void install_from_env() {
  const char* spec = std::getenv("TETHER_FAULT");
  if (!spec) return;
  auto p = parse_plan(spec);
  if (!p) {
    std::fprintf(stderr, "TETHER_FAULT='%s' does not parse\n", spec);
    std::abort();
  }
  if (const char* r = std::getenv("TETHER_FAULT_REPORT")) p->report_path = r;
  if (const char* r = std::getenv("TETHER_FAULT_RECORD")) p->record_path = r;
  install(*p);
  std::atexit(write_counts);
  ::unsetenv("LD_PRELOAD");
  ::unsetenv("TETHER_FAULT");
  ::unsetenv("TETHER_FAULT_REPORT");
  ::unsetenv("TETHER_FAULT_RECORD");
}
// A dynamic initializer, not __attribute__((constructor)): it must run after
// `g` of this file was constructed.
const bool k_installed_from_env = (install_from_env(), true);
}  // namespace
#endif

}  // namespace tether::test::fault
