#pragma once
// A test VFS in the manner of SQLite's own test harness (test_vfs.c): a
// sqlite3_vfs named "tether_fault" that wraps the default unix VFS, is made
// the default so every connection of the process goes through it, and can
//  - fail the Nth read, write or sync of a database file with a chosen code
//    (SQLITE_IOERR_*, SQLITE_FULL), once or from then on;
//  - record every write, truncate, delete and sync of a database file, with
//    the length the crash trace (TETHER_CRASH_TRACE) had at that moment, so a
//    test can rebuild what a power cut at any point would have left on disk.
//
// Built twice: into tether_tests (install() in process), and as a preload
// library (libtether_fault_vfs.so, -DTETHER_FAULT_PRELOAD) that reads its
// plan from the environment, so the `tether` CLI's own stories run on it:
//   TETHER_FAULT=read|write|sync:N:ioerr|full[:persistent]   (or "none": count only)
//   TETHER_FAULT_REPORT=FILE   appends "fired KIND N" when the fault fires and
//                              "ops reads=R writes=W syncs=S" at exit
//   TETHER_FAULT_RECORD=FILE   the write/sync log (see read_log)
// The preload removes LD_PRELOAD and these variables from its environment so
// the processes it starts (shells, daemons) run without it.
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace tether::test::fault {

enum class op { read, write, sync };

struct plan {
  std::optional<op> kind;   // none: count (and record) only
  std::uint64_t nth = 0;    // 1-based among ops of `kind` on database files
  int code = 0;             // what the failed call returns
  bool persistent = false;  // every later op of that kind fails too (a full disk)
  std::string report_path;
  std::string record_path;
};

/// Parses the TETHER_FAULT syntax; nullopt if it does not parse.
std::optional<plan> parse_plan(const std::string& spec);

/// Registers the shim as the default VFS (once per process) with `p`.
void install(const plan& p);

/// Ops seen since install().
struct counts {
  std::uint64_t reads = 0, writes = 0, syncs = 0;
  bool fired = false;
};
counts current();

/// One recorded file operation.
struct record {
  char type = 0;                // 'W' write, 'T' truncate, 'S' sync, 'D' delete
  std::string file;             // base name: tether.db, tether.db-wal, ...
  std::int64_t offset = 0;      // W: where; T: new size
  std::string data;             // W only
  std::uint64_t trace_len = 0;  // bytes in TETHER_CRASH_TRACE when the op began
};
std::vector<record> read_log(const std::string& path);

/// What a power cut just before log entry `cut` leaves: every write that a
/// later sync of its file (before `cut`) made durable, plus each not yet
/// synced write for which `keep_unsynced(index)` says so, applied in order
/// (deletes and truncates too) to files in `dir`.
void replay(const std::vector<record>& log, std::size_t cut, const std::string& dir,
            const std::function<bool(std::size_t)>& keep_unsynced);

/// Reads `report_path`: did the fault fire, and the op counts at exit.
struct report {
  bool fired = false;
  counts ops;
};
report read_report(const std::string& path);

}  // namespace tether::test::fault
