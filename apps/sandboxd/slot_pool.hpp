#pragma once
// Ready-made job directories. Creating a directory entry costs about 0.3 ms on
// the disks we run on, and a job needs six (its directory, three record
// temps, output, status); renaming costs a few µs. A helper thread keeps a
// few directories with those files already created in DIR/spare, and a launch
// renames one into place, so the daemon's event loop never waits on creation.
#include <condition_variable>
#include <deque>
#include <filesystem>
#include <mutex>
#include <optional>
#include <thread>

namespace tether::sandboxd {

class slot_pool {
 public:
  /// The record temps a slot holds; write_record() uses them before creating one.
  static constexpr int k_record_spares = 3;

  slot_pool(std::filesystem::path spare_dir, std::size_t target = 16);
  ~slot_pool();
  slot_pool(const slot_pool&) = delete;
  slot_pool& operator=(const slot_pool&) = delete;

  /// A ready directory to rename into place, or nullopt if none is ready.
  std::optional<std::filesystem::path> take();

 private:
  void run();
  std::filesystem::path dir_;
  std::size_t target_;
  std::mutex m_;
  std::condition_variable cv_;
  std::deque<std::filesystem::path> ready_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace tether::sandboxd
