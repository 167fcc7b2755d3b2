#include "tether/runtime/actor.hpp"

#include <typeinfo>

namespace tether::runtime::detail {

std::string describe(std::exception_ptr e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& x) {
    return std::string(typeid(x).name()) + ": " + x.what();
  } catch (...) {
    return "unknown exception";
  }
}

actor_id next_actor_id() {
  static std::atomic<actor_id> next{1};
  return next.fetch_add(1, std::memory_order_relaxed);
}

}  // namespace tether::runtime::detail
