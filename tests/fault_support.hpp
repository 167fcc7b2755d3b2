#pragma once
// Running the `tether` CLI's stories on the fault VFS (tests/fault_vfs.hpp)
// and reading what they left: the report story (`tether demo --story`) and the
// jobs story (`tether jobs-story --story`), each with its restart (`--resume`).
#include <SQLiteCpp/Database.h>
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "catch_result.hpp"
#include "fault_vfs.hpp"
#include "support.hpp"
#include "tether/persistence/task_store.hpp"
#include "tether/persistence/writer.hpp"

namespace tether::test {

inline const std::string k_fault_cli = std::string(TETHER_BIN_DIR) + "/tether";

/// True when the long loops were asked for (TETHER_FAULT_ALL=1): every fault
/// point instead of a sample.
inline bool fault_all() {
  const char* e = std::getenv("TETHER_FAULT_ALL");
  return e && std::string(e) == "1";
}

/// How a story run on the fault VFS ended.
struct fault_run {
  int status = 0;      // raw wait status of `timeout`
  std::string output;  // what it printed
  fault::report rep;
  bool exited() const { return WIFEXITED(status) && WEXITSTATUS(status) != 124; }
  bool hung() const { return WIFEXITED(status) && WEXITSTATUS(status) == 124; }
};

/// Runs `args` of the `tether` CLI with the fault VFS preloaded under `spec`
/// (see TETHER_FAULT), tracing crash points into DIR/trace and, if `record`,
/// recording every write and sync into DIR/io.log. A run that does not end
/// within `limit` seconds is stopped and reported as hung.
inline fault_run run_on_fault_vfs(const std::filesystem::path& dir, const std::string& spec,
                                  std::vector<std::string> args, bool record = false,
                                  int limit = 60) {
  std::filesystem::create_directories(dir);
  auto report = (dir / "fault-report").string();
  std::vector<std::string> argv{"/bin/sh",
                                "-c",
                                "exec \"$@\" 2>&1",
                                "sh",
                                "/usr/bin/timeout",
                                "-k",
                                "5",
                                std::to_string(limit),
                                "/usr/bin/env",
                                std::string("LD_PRELOAD=") + TETHER_FAULT_VFS_LIB,
                                "TETHER_FAULT=" + spec,
                                "TETHER_FAULT_REPORT=" + report,
                                "TETHER_CRASH_TRACE=" + (dir / "trace").string()};
  if (record) argv.push_back("TETHER_FAULT_RECORD=" + (dir / "io.log").string());
  // The preloaded library comes before the sanitizer runtime in a sanitized build.
  const char* asan = std::getenv("ASAN_OPTIONS");
  argv.push_back(std::string("ASAN_OPTIONS=") + (asan ? std::string(asan) + ":" : "") +
                 "verify_asan_link_order=0");
  argv.push_back(k_fault_cli);
  for (auto& a : args) argv.push_back(std::move(a));
  fault_run r;
  r.status = run_process(argv, &r.output);
  r.rep = fault::read_report(report);
  return r;
}

/// Crash points in DIR/trace, by name.
inline std::map<std::string, int> trace_counts(const std::filesystem::path& trace,
                                               std::size_t up_to = std::string::npos) {
  std::ifstream in(trace);
  std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (up_to < all.size()) all.resize(up_to);
  std::map<std::string, int> hits;
  std::size_t b = 0;
  for (std::size_t e; (e = all.find('\n', b)) != std::string::npos; b = e + 1)
    hits[all.substr(b, e - b)]++;
  return hits;
}

/// PRAGMA integrity_check of a closed database ("ok" when sound).
inline std::string integrity(const std::string& db) {
  SQLite::Database d(db, SQLite::OPEN_READWRITE);
  return d.execAndGet("PRAGMA integrity_check").getString();
}

/// What the report story left in its database.
struct report_outcome {
  bool exists = false;              // a parent session
  bool child = false;               // the background child session the parent spawned
  std::vector<std::string> bodies;  // parent inbox bodies, shell ids normalised
  int pending = 0;                  // inbox rows not acknowledged
  int transcript_mismatches = 0;    // inbox bodies not exactly once in the transcript
  int stray_transcript_reports = 0;
  int outbox_rows = 0;  // owed reports not yet delivered
  int claimed_sessions = 0;
  int receipts = 0;            // job receipts
  int receipts_not_acked = 0;  // of those, pending or dropped
};

inline report_outcome read_report_outcome(const std::string& db) {
  report_outcome o;
  // A fault at the very first write leaves an empty file: nothing was
  // acknowledged, and an empty file is (rightly) refused as a database.
  if (!std::filesystem::exists(db) || std::filesystem::file_size(db) == 0) return o;
  auto w = persistence::writer::open(persistence::db_options{db});
  REQUIRE(w);
  persistence::task_store store(**w, db);
  auto parent = store.session(protocol::session_id("ses_parent"));
  REQUIRE(parent);
  o.exists = parent->has_value();
  auto child = store.session(protocol::session_id("ses_audit"));
  REQUIRE(child);
  o.child = child->has_value();
  auto inbox = store.inbox(protocol::session_id("ses_parent"));
  auto msgs = store.messages(protocol::session_id("ses_parent"));
  auto jobs = store.outstanding_jobs();
  auto sessions = store.sessions();
  REQUIRE(inbox);
  REQUIRE(msgs);
  REQUIRE(jobs);
  REQUIRE(sessions);
  // A shell's id in a still-running list: an owned job's (job_), or a local
  // shell's (sh_) in a file an earlier build wrote.
  // A job id: minted (job_<hex>) or keyed by its turn (job_turn_<hex>_<key>).
  std::regex shell_id("shell \\((job|sh)_[0-9A-Za-z_.-]+\\)");
  std::multiset<std::string> transcript;
  for (auto& m : *msgs) {
    if (m.kind == "report") transcript.insert(m.text);
  }
  for (auto& r : *inbox) {
    o.bodies.push_back(std::regex_replace(r.body, shell_id, "shell (ID)"));
    o.pending += r.acked ? 0 : 1;
    if (transcript.count(r.body) != 1) ++o.transcript_mismatches;
  }
  o.stray_transcript_reports =
      static_cast<int>(transcript.size()) - static_cast<int>(inbox->size());
  o.outbox_rows = static_cast<int>(jobs->size());
  for (auto& s : *sessions) o.claimed_sessions += s.time_suspended ? 1 : 0;
  auto rs = store.all_receipts();
  REQUIRE(rs);
  for (auto& r : *rs) {
    ++o.receipts;
    o.receipts_not_acked += r.state != persistence::receipt_state::acked;
  }
  (*w)->stop();
  return o;
}

/// How many of the parent's inbox bodies are the child's final report.
inline int final_reports(const report_outcome& o) {
  int n = 0;
  for (auto& b : o.bodies) n += b.find("Route check finished") != std::string::npos;
  return n;
}

/// A directory name for a fault spec: a ':' in it would split the story's
/// PATH (the story's shell is found through DIR/bin) and the shell would not run.
inline std::string spec_dir(std::string spec) {
  for (auto& c : spec)
    if (c == ':') c = '_';
  return spec;
}

/// After a restart ran to the end: everything owed was delivered, exactly once;
/// once the child is on disk, its final report (or an error report saying
/// what failed when the fault broke a busy period) among them.
inline void check_delivered_once(const report_outcome& o) {
  CHECK(o.outbox_rows == 0);
  CHECK(o.claimed_sessions == 0);
  CHECK(o.pending == 0);
  CHECK(o.transcript_mismatches == 0);
  CHECK(o.stray_transcript_reports == 0);
  std::set<std::string> distinct(o.bodies.begin(), o.bodies.end());
  CHECK(distinct.size() == o.bodies.size());
  int finished = final_reports(o), errors = 0;
  for (auto& b : o.bodies) errors += b.find("state=\"error\"") != std::string::npos;
  CHECK(finished <= 1);
  INFO("the child exists, so its final report (or an error report) is owed to the parent");
  CHECK((!o.child || finished + errors >= 1));
}

}  // namespace tether::test
