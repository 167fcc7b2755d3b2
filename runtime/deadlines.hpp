#pragma once
// The deadlines of every ask's timeout, on one thread.
//
// A steady_timer per ask costs a timer-queue insert and, when the reply comes
// first (nearly always), a cancel that posts an aborted wait through the
// asker's scheduler. Here a deadline is an entry in an ordered map under a
// mutex, watched by one thread that sleeps until the earliest: arming an
// entry later than the thread's next wake (every ask of the same timeout)
// wakes nobody, and removing one wakes nobody either.
//
// An entry holds the asker's executor with its outstanding work tracked, so
// the asker's io_context keeps running while an ask waits for its reply or
// its timeout, as it did while a timer was pending, and may run out of work
// as soon as the entry is removed or fired. It holds a weak pointer to what
// it would expire and a plain function to call with it, so an entry whose
// target is gone is dropped unrun. The function runs on the deadline thread,
// outside the mutex (an ask's expiry sets its one_shot, which posts the
// asker's resumption onto the asker's executor).
#include <boost/asio/any_io_executor.hpp>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

namespace tether::runtime {

class deadlines {
 public:
  using clock = std::chrono::steady_clock;
  /// What fires: `expire(target, name, after)` with the target still alive.
  struct entry {
    std::weak_ptr<void> target;
    void (*expire)(void* target, const std::string& name,
                   std::chrono::milliseconds after) = nullptr;
    std::string name;
    std::chrono::milliseconds after{};
    boost::asio::any_io_executor work;  // held until the entry fires or is removed
  };
  /// Names an armed entry, to remove it.
  struct ticket {
    clock::time_point at;
    std::uint64_t seq = 0;
  };

  /// The process's one deadline thread (started on first use, never stopped).
  static deadlines& instance();

  /// Arms `e` to fire `e.after` from now. Thread-safe.
  ticket arm(entry e);
  /// Removes an entry that has not fired (a fired one is already gone). Thread-safe.
  void remove(const ticket& t);
  /// Entries armed and not yet fired or removed.
  std::size_t pending();

 private:
  using key = std::pair<clock::time_point, std::uint64_t>;
  deadlines();
  void loop();

  std::mutex m_;
  std::condition_variable cv_;
  std::map<key, entry> entries_;
  std::uint64_t seq_ = 0;
  // When the thread wakes next (max: only when told). It is moved earlier by
  // an arm, never later, so a run of asks that each arm and remove an entry
  // of the same timeout wakes the thread once per timeout, not once per ask.
  clock::time_point sleeping_until_ = clock::time_point::max();
  std::thread thread_;
};

}  // namespace tether::runtime
