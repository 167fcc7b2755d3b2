#pragma once
// The schema as an ordered list of migrations: step i brings user_version i to
// i+1. Steps are only ever appended.
#include <string>
#include <vector>

namespace tether::persistence {

const std::vector<std::string>& migrations();

/// What a step needs of the rows it copies, checked before it runs: `sql`
/// returns the key of one row the step would refuse (the first), or no row.
/// Such a row (written with the foreign keys off, by another tool) is then
/// refused by name, instead of the step failing with SQLite's bare
/// constraint error.
struct step_check {
  const char* table;
  const char* sql;
  const char* problem;
};
/// The check of step `step` (1-based, as user_version counts), or nullptr.
const step_check* check_before_step(int step);

}  // namespace tether::persistence
