#pragma once
// The schema as an ordered list of migrations: step i brings user_version i to
// i+1. Steps are only ever appended.
#include <string>
#include <vector>

namespace tether::persistence {

const std::vector<std::string>& migrations();

}  // namespace tether::persistence
