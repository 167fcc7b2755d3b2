// The sandbox daemon's records survive a power loss: the record writer's
// system calls are checked in order through an injectable file_ops, a power
// cut after each of them is replayed (writes not synced may or may not reach
// the disk), and a temp a crash left behind is removed at the daemon's start
// with the previous record kept.
#include <sys/stat.h>

#include <cerrno>
#include <fstream>
#include <map>
#include <optional>

#include "job_store.hpp"
#include "sandbox_support.hpp"

using namespace tether;
using namespace tether::test;
namespace sbx = tether::sandboxd;
namespace fs = std::filesystem;

namespace {

// Makes every call and records it (writes collapsed into one "write NAME"; failed opens,
// which change nothing, left out).
struct recording_ops : sbx::file_ops {
  std::vector<std::string> calls;
  std::map<int, std::string> names;  // open fd -> file name
  std::optional<std::string> fail_fsync_of;

  static std::string base(const char* p) { return fs::path(p).filename().string(); }
  int open(const char* path, int flags, mode_t mode) override {
    int fd = sbx::file_ops::open(path, flags, mode);
    if (fd < 0) return fd;  // changed nothing (a slot's spare temp that is not there)
    names[fd] = base(path);
    calls.push_back("open " + base(path));
    return fd;
  }
  ssize_t write(int fd, const void* data, std::size_t n) override {
    auto c = "write " + names[fd];
    if (calls.empty() || calls.back() != c) calls.push_back(c);
    return sbx::file_ops::write(fd, data, n);
  }
  int fsync(int fd) override {
    calls.push_back("fsync " + names[fd]);
    if (fail_fsync_of && *fail_fsync_of == names[fd]) {
      errno = EIO;
      return -1;
    }
    return sbx::file_ops::fsync(fd);
  }
  int close(int fd) override {
    calls.push_back("close " + names[fd]);
    names.erase(fd);
    return sbx::file_ops::close(fd);
  }
  int rename(const char* from, const char* to) override {
    calls.push_back("rename " + base(from) + " " + base(to));
    return sbx::file_ops::rename(from, to);
  }
};

sbx::job_record record_of(const std::string& job, const std::string& state) {
  sbx::job_record r;
  r.job = job;
  r.command = "make test";
  r.cwd = "/work";
  r.state = state;
  r.pid = 42;
  return r;
}

std::string slurp(const fs::path& p) {
  std::ifstream f(p);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

// What DIR/job.json may hold after a power cut just after call `cut` of
// `calls` (0: before the first), replayed as a journalling filesystem may:
// the temp's bytes reach the disk only if synced (else the file may be empty
// or hold any prefix); a rename reaches the disk only if the directory was
// synced after it (else it may or may not). Returns every possible content.
std::vector<std::string> after_power_cut(const std::vector<std::string>& calls, std::size_t cut,
                                         const std::string& old_text, const std::string& new_text) {
  bool data_synced = false, renamed = false, rename_synced = false;
  for (std::size_t i = 0; i < cut; ++i) {
    const auto& c = calls[i];
    if (c.rfind("fsync job.json.tmp", 0) == 0) data_synced = true;
    if (c.rfind("rename ", 0) == 0) renamed = true;
    if (renamed && c.rfind("fsync ", 0) == 0 && c.find("job.json") == std::string::npos)
      rename_synced = true;
  }
  std::vector<std::string> out;
  if (!renamed || !rename_synced) out.push_back(old_text);  // the rename was not applied
  if (renamed) {
    if (data_synced) {
      out.push_back(new_text);
    } else {
      out.push_back("");
      out.push_back(new_text.substr(0, new_text.size() / 2));
      out.push_back(new_text);
    }
  }
  return out;
}

}  // namespace

TEST_CASE("a record write syncs its temp before the rename and the directory after it",
          "[sandbox][records]") {
  scratch_dir dir("sbx-record-order");
  auto job_dir = dir.path() / "job_a";
  REQUIRE(fs::create_directory(job_dir));
  recording_ops ops;
  auto w = sbx::write_record(job_dir, record_of("job_a", "running"), ops);
  INFO((w ? std::string("ok") : w.error().message));
  REQUIRE(w.has_value());
  std::vector<std::string> want = {"open job.json.tmp",
                                   "write job.json.tmp",
                                   "fsync job.json.tmp",
                                   "close job.json.tmp",
                                   "rename job.json.tmp job.json",
                                   "open job_a",
                                   "fsync job_a",
                                   "close job_a"};
  CHECK(ops.calls == want);
  auto back = sbx::read_record(job_dir);
  REQUIRE(back.has_value());
  CHECK(back->state == "running");

  // The same order through a slot's ready-made temp.
  std::ofstream(job_dir / "job.json.tmp.0").flush();
  recording_ops spare;
  REQUIRE(sbx::write_record(job_dir, record_of("job_a", "exited"), spare).has_value());
  std::vector<std::string> want_spare = {"open job.json.tmp.0",
                                         "write job.json.tmp.0",
                                         "fsync job.json.tmp.0",
                                         "close job.json.tmp.0",
                                         "rename job.json.tmp.0 job.json",
                                         "open job_a",
                                         "fsync job_a",
                                         "close job_a"};
  CHECK(spare.calls == want_spare);
}

TEST_CASE("a power cut at any step of a record write leaves the old record or the new one, whole",
          "[sandbox][records]") {
  scratch_dir dir("sbx-record-cut");
  auto job_dir = dir.path() / "job_b";
  REQUIRE(fs::create_directory(job_dir));
  REQUIRE(sbx::write_record(job_dir, record_of("job_b", "starting")).has_value());
  auto old_text = slurp(job_dir / "job.json");
  recording_ops ops;
  REQUIRE(sbx::write_record(job_dir, record_of("job_b", "running"), ops).has_value());
  auto new_text = slurp(job_dir / "job.json");
  REQUIRE(old_text != new_text);
  for (std::size_t cut = 0; cut <= ops.calls.size(); ++cut) {
    INFO("power cut after " << cut << " of " << ops.calls.size() << " calls"
                            << (cut ? " (last: " + ops.calls[cut - 1] + ")" : std::string()));
    for (auto& image : after_power_cut(ops.calls, cut, old_text, new_text)) {
      INFO("job.json after the cut: '" << image << "'");
      CHECK((image == old_text || image == new_text));
    }
  }
  // Once write_record has returned, the new record is the only possible one.
  INFO("calls: " << ops.calls.size());
  CHECK(after_power_cut(ops.calls, ops.calls.size(), old_text, new_text) ==
        std::vector<std::string>{new_text});
}

TEST_CASE("a record write whose sync fails reports it and leaves the previous record",
          "[sandbox][records]") {
  scratch_dir dir("sbx-record-eio");
  auto job_dir = dir.path() / "job_c";
  REQUIRE(fs::create_directory(job_dir));
  REQUIRE(sbx::write_record(job_dir, record_of("job_c", "starting")).has_value());
  recording_ops ops;
  ops.fail_fsync_of = "job.json.tmp";
  auto w = sbx::write_record(job_dir, record_of("job_c", "running"), ops);
  REQUIRE_FALSE(w.has_value());
  CHECK(w.error().code == errc::io);
  CHECK_THAT(w.error().message, Catch::Contains("cannot sync"));
  CHECK_THAT(w.error().message, Catch::Contains("job.json was left as it was"));
  for (auto& c : ops.calls) CHECK(c.rfind("rename", 0) != 0);
  auto back = sbx::read_record(job_dir);
  REQUIRE(back.has_value());
  CHECK(back->state == "starting");
}

TEST_CASE("a torn record temp left by a crash is removed at start and the previous record is kept",
          "[sandbox][records]") {
  sandbox_daemon d("sbx-record-torn");
  auto cwd = d.dir().path().string();
  protocol::job_id job;
  auto launch = [&]() -> awaitable<void> {
    auto c = co_await connect(d.socket());
    auto done = co_await run_to_end(*c, command("echo kept; exit 3", cwd));
    job = protocol::job_id(done.job);
  };
  run(launch());
  d.stop();
  // A crash in the middle of rewriting the record: half a record in temps.
  auto job_dir = fs::path(d.options().state_dir) / "jobs" / job.str();
  auto record = slurp(job_dir / "job.json");
  REQUIRE_FALSE(record.empty());
  auto half = record.substr(0, record.size() / 2);
  std::ofstream(job_dir / "job.json.tmp") << half;
  std::ofstream(job_dir / "job.json.tmp.1") << half;
  d.start();
  auto check = [&]() -> awaitable<void> {
    auto ro = co_await connect(d.socket(), wire::conn_mode::read_only);
    auto p = co_await ro->poll(job);
    REQUIRE(p.has_value());
    REQUIRE(p->has_value());
    CHECK((*p)->status.exit_code == 3);
    CHECK((*p)->tail == "kept\n");
  };
  run(check());
  CHECK_FALSE(fs::exists(job_dir / "job.json.tmp"));
  CHECK_FALSE(fs::exists(job_dir / "job.json.tmp.1"));
  CHECK(slurp(job_dir / "job.json") == record);
  auto log = d.log();
  INFO(log);
  CHECK_THAT(log, Catch::Contains("job " + job.str() + ": removed job.json.tmp"));
  CHECK_THAT(log, Catch::Contains("a record write the daemon did not finish before it stopped; "
                                  "the previous record (state exited) was kept"));
}
