#include "slot_pool.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "job_store.hpp"

namespace tether::sandboxd {

namespace fs = std::filesystem;

slot_pool::slot_pool(fs::path spare_dir, std::size_t target)
    : dir_(std::move(spare_dir)), target_(target) {
  std::error_code ec;
  fs::remove_all(dir_, ec);  // half-built slots of an earlier run
  make_private_dir(dir_);
  thread_ = std::thread([this] { run(); });
}

slot_pool::~slot_pool() {
  {
    std::lock_guard lk(m_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

std::optional<fs::path> slot_pool::take() {
  std::optional<fs::path> p;
  {
    std::lock_guard lk(m_);
    if (ready_.empty()) return std::nullopt;
    p = std::move(ready_.front());
    ready_.pop_front();
  }
  cv_.notify_one();
  return p;
}

void slot_pool::run() {
  unsigned long n = 0;
  for (;;) {
    {
      std::unique_lock lk(m_);
      cv_.wait(lk, [&] { return stop_ || ready_.size() < target_; });
      if (stop_) return;
    }
    fs::path building = dir_ / ("building-" + std::to_string(n));
    fs::path ready = dir_ / ("ready-" + std::to_string(n));
    ++n;
    if (make_private_dir(building)) return;  // the state dir is unusable; launches fall back
    bool ok = true;
    std::vector<std::string> files = {"output", "status"};
    for (int k = 0; k < k_record_spares; ++k) files.push_back("job.json.tmp." + std::to_string(k));
    for (auto& f : files) {
      int fd = ::open((building / f).c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC,
                      0600);
      if (fd < 0)
        ok = false;
      else
        ::close(fd);
    }
    if (!ok || ::rename(building.c_str(), ready.c_str()) != 0) return;
    std::lock_guard lk(m_);
    ready_.push_back(ready);
  }
}

}  // namespace tether::sandboxd
