#pragma once
// The lifecycle of every kind of task, as data: seed 001's change checklist
// answered once per kind (which subsystem owns it and which store is
// authoritative, how durable it is, what cancels it and what can remain in
// flight, which fields its rows populate, its states, whether startup
// recovery can repeat a side effect, whether delivery stays idempotent
// across a restart). `tether inspect DB --lifecycle` prints it;
// `tether inspect DB --task ID` prints one kind's entry beside that task's
// row as stored (read_task_record()).
//
// The state words are not copied: they are enumerated from the kinds' own
// enums (owned_state, delegate_state, job_status through task_state_word),
// so a state added to an enum appears here by itself, and the meaning of
// each is a switch without a default (-Wswitch names a state nobody
// described; tests/lifecycle_test.cpp fails on an empty meaning).
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tether/persistence/database.hpp"
#include "tether/protocol/ids.hpp"

namespace tether::persistence {

/// What survives the host process: nothing (process-local), enough for
/// recovery to settle the work truthfully but not run it on
/// (durably supervised), or enough to run it on (restart-resumable).
enum class durability { process_local, durably_supervised, restart_resumable };
std::string_view to_string(durability d);

/// Where a kind's tasks keep a checklist field.
enum class field_source {
  row,        // a column (or payload key) of the task's own row
  elsewhere,  // not on the task row, but recorded (another table, the receipts)
  absent,     // not recorded anywhere
};
std::string_view to_string(field_source s);

/// One field of the checklist for one kind.
struct field_use {
  std::string_view
      field;  // parent, child, agent, originator, tenant, depth, usage, owner, lease, goal
  field_source source = field_source::absent;
  std::string_view note;  // the column or payload key, or where else, or why absent
};

/// The checklist's fields, in print order.
const std::vector<std::string_view>& checklist_fields();
/// The row keys that would carry a field: a column name, or `payload.<key>`
/// for a key of the payload JSON. `tether inspect --task` reads every one of
/// them (a column this schema does not have reads as absent), whatever the
/// kind, so a column a later schema adds shows up.
const std::vector<std::string_view>& field_keys(std::string_view field);

struct state_meaning {
  std::string word;  // as stored in tasks.state
  bool terminal = false;
  std::string_view meaning;
};

struct lifecycle {
  std::string_view kind;      // tasks.kind
  std::string_view admitted;  // "yes" or why not (history only)
  std::string_view owner;     // the subsystem (actor) that owns its lifecycle
  std::string_view store;     // the authoritative store
  durability durable = durability::process_local;
  std::string_view durable_why;  // one line
  std::string_view cancel;       // which action cancels it
  std::string_view in_flight;    // what can remain in flight after it
  std::string_view states_from;  // the enum its state words come from
  std::vector<state_meaning> states;
  std::string_view waits;         // waiting, approval or checkpoint states
  std::vector<field_use> fields;  // one per checklist_fields(), in that order
  bool recovery_can_duplicate = false;
  std::string_view recovery;  // why (not)
  bool delivery_idempotent = false;
  std::string_view delivery;  // across a restart: why (not)
};

/// Every kind of task this build knows (the kinds boot's validation
/// accepts), in a fixed order. Built once.
const std::vector<lifecycle>& lifecycles();
/// One kind's entry; nullptr for a kind this build does not know.
const lifecycle* lifecycle_of(std::string_view kind);
/// The state words of `kind` (empty for an unknown kind).
std::vector<std::string> state_words(std::string_view kind);

/// One row as stored: every column's name and text (nullopt for NULL), in
/// the table's column order; columns a later schema adds come along.
struct raw_row {
  std::vector<std::pair<std::string, std::optional<std::string>>> columns;
  /// Whether the table has the column at all.
  bool has(std::string_view column) const;
  /// Its value: nullopt if the column is absent or NULL.
  std::optional<std::string> get(std::string_view column) const;
};

/// A task and what hangs off it, as stored, read in one read transaction.
struct task_record {
  raw_row task;
  std::vector<raw_row> receipts;          // by task_id, oldest first
  std::optional<raw_row> intent;          // its settlement intent, if one is left
  std::optional<raw_row> parent_session;  // the session its parent_id names, if any
  std::optional<raw_row> child_session;   // the session its child_id names, if any
};

/// Reads task `id` through a read connection of `readers` (never writes);
/// nullopt if there is no such task. REQUIRES: check_readable() passed.
result<std::optional<task_record>> read_task_record(reader_pool& readers,
                                                    const protocol::job_id& id);

}  // namespace tether::persistence
