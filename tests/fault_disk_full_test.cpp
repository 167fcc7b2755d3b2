// Disk full end to end (issue 16, part 6): a host on a size-limited tmpfs
// takes prompts until the disk fills. The prompt that does not fit fails with
// an error that says so; every prompt acknowledged before is on disk after a
// restart; once space is freed the same host takes work again and a restart
// leaves nothing owed. Needs root (mount); skipped with a reason otherwise.
#include <sys/mount.h>
#include <unistd.h>

#include <fstream>
#include <iostream>

#include "report_support.hpp"

using namespace tether;
namespace fs = std::filesystem;

TEST_CASE(
    "a host on a full disk refuses the prompt that does not fit with a clear error, keeps every "
    "acknowledged one, and goes on once space is freed",
    "[fault][disk]") {
  if (::geteuid() != 0) {
    WARN("skipped: mounting a size-limited tmpfs needs root");
    return;
  }
  test::scratch_dir mnt("fault-disk-full");
  REQUIRE(::mount("tmpfs", mnt.path().c_str(), "tmpfs", 0, "size=2m") == 0);
  const char* tmp = std::getenv("TETHER_TEST_TMP");
  struct unmount_at_end {
    std::string p;
    std::optional<std::string> tmp;
    ~unmount_at_end() {
      tmp ? ::setenv("TETHER_TEST_TMP", tmp->c_str(), 1) : ::unsetenv("TETHER_TEST_TMP");
      ::umount2(p.c_str(), MNT_DETACH);
    }
  } guard{mnt.path().string(), tmp ? std::optional<std::string>(tmp) : std::nullopt};
  // Ballast, removed later to free space.
  { std::ofstream(mnt.path() / "ballast") << std::string(512 * 1024, 'b'); }
  ::setenv("TETHER_TEST_TMP", mnt.path().c_str(), 1);

  std::vector<std::int64_t> acked;
  std::string refusal;
  {
    test::report_fixture f("host");
    auto s = f.sync(f.host->create_session("filler", protocol::session_id("filler")));
    REQUIRE(s);
    f.code("filler")->fn = [](test::agent_context&,
                              test::drain_input) -> boost::asio::awaitable<void> { co_return; };
    const std::string big(48 * 1024, 'p');
    for (int i = 0; i < 200 && refusal.empty(); ++i) {
      auto r = f.sync(f.host->prompt(*s, std::to_string(i) + big));
      if (r)
        acked.push_back(*r);
      else
        refusal = r.error().message;
    }
    INFO("the refusal: " << refusal);
    REQUIRE_FALSE(refusal.empty());  // the disk filled
    CHECK(refusal.find("full") != std::string::npos);
    CHECK(acked.size() > 5);

    fs::remove(mnt.path() / "ballast");
    auto again = f.sync(f.host->prompt(*s, "after the space was freed"));
    INFO((again ? "" : again.error().message));
    REQUIRE(again);
    acked.push_back(*again);

    // A restart on the same files: every acknowledged prompt is there, once,
    // and the owed drains run to the end. It needs room for their writes
    // (the busy periods the restart resumes, the WAL they grow): with only the
    // ballast's 512 KiB back the disk filled again in 1 run of 4, and the host
    // then rightly kept retrying its settle and never went quiet. So more
    // space is freed first, as an operator would.
    REQUIRE(::mount("tmpfs", mnt.path().c_str(), "tmpfs", MS_REMOUNT, "size=16m") == 0);
    f.restart();
    f.quiet();
    auto msgs = f.host->store().messages(protocol::session_id("filler"));
    REQUIRE(msgs);
    std::map<std::int64_t, int> seen;
    for (auto& m : *msgs)
      if (m.kind == "prompt") seen[m.seq]++;
    for (auto seq : acked) {
      INFO("acknowledged prompt seq " << seq);
      CHECK(seen[seq] == 1);
    }
    auto row = f.host->store().session(protocol::session_id("filler"));
    REQUIRE(row);
    REQUIRE(*row);
    CHECK_FALSE((*row)->time_suspended.has_value());  // nothing left claimed
  }
  std::cout << "disk full: " << acked.size() - 1
            << " prompts acknowledged before the refusal: " << refusal << "\n";
}
