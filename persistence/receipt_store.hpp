#pragma once
// Owned jobs and their receipts: the durable half of the job queue (promises
// 2-5 of docs/design.md). Every state change is one named write operation through
// the single writer; the terminal transition is a compare-and-set, so of
// completion and cancellation exactly one wins and nothing overwrites it.
//
// Persisted state that does not parse is refused with an error naming the
// table, the key and the field; it is never skipped or deleted.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "tether/persistence/database.hpp"
#include "tether/persistence/writer.hpp"
#include "tether/protocol/ids.hpp"
#include "tether/protocol/notice.hpp"
#include "tether/protocol/scope.hpp"

namespace tether::persistence {

using protocol::event_id;
using protocol::job_id;
using protocol::owner_scope;

enum class owned_state { admitted, running, completed, failed, cancelled, lost };
std::string_view to_string(owned_state s);
bool is_terminal(owned_state s);
/// The transition a terminal state is reached by.
protocol::transition transition_of(owned_state terminal);

struct owned_job {
  job_id id;
  owner_scope scope;  // supplied by the runtime at admission, never by the model
  owned_state state = owned_state::admitted;
  std::string preview;                                   // the scrubbed command preview
  std::string channel = "api";                           // how it was launched: tool | cli | api
  std::optional<protocol::shell_completion> completion;  // once terminal
};

enum class receipt_state { pending, acked, read, dropped };
std::string_view to_string(receipt_state s);

struct receipt {
  event_id id;  // "<job>/<transition>"
  job_id job;
  protocol::transition transition = protocol::transition::started;
  owner_scope scope;
  std::string body;  // the notice the owner reads
  receipt_state state = receipt_state::pending;
  std::int64_t created_at = 0;
};

/// The reads, through read-only connections; on its own it serves tools like
/// `tether inspect` and never writes.
class receipt_reader {
 public:
  explicit receipt_reader(std::string path) : readers_(std::move(path)) {}

  /// Every owned job, oldest first.
  result<std::vector<owned_job>> all_jobs();
  /// Every receipt, oldest first.
  result<std::vector<receipt>> all_receipts();
  result<std::optional<owned_job>> job(const job_id& id);
  /// Jobs not yet terminal (admitted or running), oldest first. A row whose
  /// state word is unknown is refused (errc::corrupt), never skipped.
  result<std::vector<owned_job>> live_jobs();
  /// Every job of one turn, oldest first.
  result<std::vector<owned_job>> jobs_of_turn(const protocol::session_id& thread,
                                              const protocol::turn_id& turn);
  /// Receipts owed (pending), oldest first; an unknown state word is refused.
  result<std::vector<receipt>> pending_receipts();
  result<std::optional<receipt>> receipt_by_id(const event_id& id);
  result<std::vector<receipt>> receipts_of(const job_id& job);
  /// The generation this host is bound to for `sandbox`, if any.
  result<std::optional<std::uint64_t>> bound_generation(const protocol::sandbox_id& sandbox);

  /// Runs `fn` (which calls the reads above) on the read threads and resumes
  /// the caller on its executor: how an actor reads (reader_pool::offload).
  template <class F>
  auto offload(F fn) {
    return readers_.offload(std::move(fn));
  }

 protected:
  reader_pool readers_;
};

class receipt_store : public receipt_reader {
 public:
  receipt_store(writer& w, std::string path) : receipt_reader(std::move(path)), w_(w) {}

  // --- writes (each one request, answered after COMMIT) ---
  /// Writes the owner before anything is dispatched; an existing id is refused.
  awaitable<result<void>> admit(owned_job j);
  /// admitted → running, with the `started` receipt (recorded, not delivered:
  /// the launch already answered with the job id). False if not admitted.
  awaitable<result<bool>> mark_running(job_id id);
  /// The compare-and-set: admitted|running → `terminal`, with its pending
  /// receipt, in one transaction; returns that receipt. nullopt (nothing
  /// written) if the job was already terminal: the later transition is dropped.
  awaitable<result<std::optional<receipt>>> finish(
      job_id id, owned_state terminal, std::optional<protocol::shell_completion> completion,
      std::string body);
  /// pending → acked. False if it was not pending (acknowledging twice does nothing).
  awaitable<result<bool>> ack(event_id id);
  /// pending|acked → read: the owner read the result through a status call,
  /// so a session drain that has not shown it yet never will.
  awaitable<result<bool>> mark_read(event_id id);
  /// pending → dropped, for receipts refused on reload.
  awaitable<result<int>> drop(std::vector<event_id> ids);
  /// Records the sandbox generation this host is bound to.
  awaitable<result<void>> bind_sandbox(protocol::sandbox_id sandbox, std::uint64_t generation);

  writer& db_writer() { return w_; }

 private:
  writer& w_;
};

}  // namespace tether::persistence
