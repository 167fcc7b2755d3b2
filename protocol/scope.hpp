#pragma once
// The owner scope of a job: who may see, wait on and cancel it. The runtime
// supplies it when the job is admitted; nothing the model passes can set it.
#include <cstdint>

#include "tether/protocol/ids.hpp"
#include "tether/protocol/json.hpp"

namespace tether::protocol {

struct owner_scope {
  tenant_id tenant;
  session_id thread;
  turn_id turn;
  sandbox_id sandbox;
  std::uint64_t generation = 0;  // sandbox generation; 0 = none proven

  friend bool operator==(const owner_scope&, const owner_scope&) = default;
  /// Same tenant and thread and turn: the scope that owns a job.
  bool owns(const owner_scope& job) const {
    return tenant == job.tenant && thread == job.thread && turn == job.turn;
  }
};

json::value to_json(const owner_scope& s);
decoded<owner_scope> scope_from_json(const json::value& v, std::string prefix = "scope");

}  // namespace tether::protocol
