#pragma once
// The raw baselines' admit (bench_settle's same-rows program, bench_recovery's
// inbox insert): the statements the runtime's admit_in_tx runs
// (persistence/task_store_reports.cpp), prepared on a plain connection: the
// parent's seq and last admission order, the inbox row, and the report's
// terminal receipt pending -> acked.
#include <SQLiteCpp/Database.h>
#include <SQLiteCpp/Statement.h>

#include <cstdint>
#include <string>

namespace tether::bench {

class raw_admit {
 public:
  explicit raw_admit(SQLite::Database& db)
      : seq_of_(db, "SELECT seq FROM sessions WHERE id = ?"),
        last_ord_(db, "SELECT coalesce(max(admitted_ord), 0) FROM inbox WHERE session_id = ?"),
        insert_(db,
                "INSERT OR IGNORE INTO inbox (session_id, notification_id, from_session, body, "
                "admitted_seq, admitted_at, admitted_ord) VALUES (?, ?, ?, ?, ?, ?, ?)"),
        acked_(db,
               "UPDATE receipts SET state = 'acked', updated_at = ? WHERE state = 'pending' AND "
               "transition != 'started' AND task_id IN (SELECT id FROM tasks WHERE "
               "notification_id = ? AND state != 'running')") {}

  /// The parent's seq and its last admission order, as each admit reads
  /// them; false if `parent` is no session.
  bool position(const std::string& parent, std::int64_t& seq, std::int64_t& ord) {
    seq_of_.reset();
    seq_of_.bind(1, parent);
    if (!seq_of_.executeStep()) return false;
    seq = seq_of_.getColumn(0).getInt64();
    seq_of_.reset();
    last_ord_.reset();
    last_ord_.bind(1, parent);
    last_ord_.executeStep();
    ord = last_ord_.getColumn(0).getInt64();
    last_ord_.reset();
    return true;
  }

  /// The inbox row at admission order `ord`, then its receipt acknowledged;
  /// returns the rows inserted (0: a repeat) and adds the receipts
  /// acknowledged to `acknowledged`.
  int admit(const std::string& parent, const std::string& nid, const std::string& from,
            const std::string& body, std::int64_t seq, std::int64_t now, std::int64_t ord,
            std::size_t& acknowledged) {
    insert_.reset();
    insert_.bind(1, parent);
    insert_.bind(2, nid);
    insert_.bind(3, from);
    insert_.bind(4, body);
    insert_.bind(5, seq);
    insert_.bind(6, now);
    insert_.bind(7, ord);
    int inserted = insert_.exec();
    acked_.reset();
    acked_.bind(1, now);
    acked_.bind(2, nid);
    acknowledged += static_cast<std::size_t>(acked_.exec());
    return inserted;
  }

 private:
  SQLite::Statement seq_of_, last_ord_, insert_, acked_;
};

}  // namespace tether::bench
