#pragma once
// Wall-clock milliseconds for persisted timestamps.
#include <chrono>
#include <cstdint>

namespace tether::runtime {

inline std::int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace tether::runtime
