#pragma once
// What `tether jobs-story` left on disk (its owner's turn, its three jobs a,
// b and c, their receipts and notices, the side-effect file), and the
// invariant every run of it must end in, crashed and restarted or not. Shared
// by the delivery crash matrix and the job recovery crash matrix.
#include <SQLiteCpp/Database.h>
#include <SQLiteCpp/Statement.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "catch_result.hpp"
#include "tether/persistence/task_store.hpp"
#include "tether/persistence/writer.hpp"
#include "tether/protocol/scope.hpp"

namespace tether::test {

using persistence::owned_state;
using persistence::receipt_state;

struct story_job {
  protocol::job_id id;
  owned_state state = owned_state::admitted;
  int terminal_receipts = 0;
  int undelivered = 0;  // terminal receipts pending or dropped
  bool acked = false;   // delivered as a notice (not read through a status call)
  int notices = 0;      // transcript notices naming the job
};

struct story_outcome {
  std::map<char, story_job> jobs;  // by key letter a, b, c
  std::map<char, int> ran;         // side-effect lines per letter
  int pending_inbox = 0;
  bool claimed = false;
  std::vector<std::string> texts;  // the owner's transcript and inbox bodies
};

inline const protocol::session_id k_story_owner{"ses_owner"};

inline story_outcome read_story_outcome(const std::filesystem::path& dir) {
  story_outcome o;
  auto db = (dir / "tether.db").string();
  auto w = persistence::writer::open(persistence::db_options{db});
  REQUIRE(w);
  persistence::task_store store(**w, db);
  auto msgs = store.messages(k_story_owner);
  REQUIRE(msgs);
  auto session = store.session(k_story_owner);
  REQUIRE(session);
  REQUIRE(*session);
  o.claimed = (*session)->time_suspended.has_value();
  auto inbox = store.inbox(k_story_owner);
  REQUIRE(inbox);
  for (auto& r : *inbox) {
    o.pending_inbox += r.acked ? 0 : 1;
    o.texts.push_back(r.body);
  }
  for (auto& m : *msgs) o.texts.push_back(m.text);
  REQUIRE((*session)->turn);
  auto jobs = store.jobs_of_turn(k_story_owner, *(*session)->turn);
  REQUIRE(jobs);
  for (auto& j : *jobs) {
    char key = j.id.str().back();
    auto& jo = o.jobs[key];
    jo.id = j.id;
    jo.state = j.state;
    auto rs = store.receipts_of(j.id);
    REQUIRE(rs);
    for (auto& r : *rs) {
      if (r.transition == protocol::transition::started) continue;
      ++jo.terminal_receipts;
      if (r.state == receipt_state::pending || r.state == receipt_state::dropped) ++jo.undelivered;
      jo.acked = r.state == receipt_state::acked;
    }
    for (auto& m : *msgs)
      if (m.kind == "notice" && m.text.find(j.id.str()) != std::string::npos) ++jo.notices;
  }
  std::ifstream side(dir / "side-effects");
  std::string l;
  while (std::getline(side, l))
    if (!l.empty()) o.ran[l[0]]++;
  (*w)->stop();
  return o;
}

/// After a story ran to the end, however often it was killed and restarted:
/// the turn settled with its three jobs, each terminal with exactly one
/// terminal receipt delivered (or read) once, and no command ran twice.
inline void check_story_outcome(story_outcome o) {
  CHECK_FALSE(o.claimed);       // the turn settled
  CHECK(o.pending_inbox == 0);  // everything admitted was taken
  REQUIRE(o.jobs.size() == 3);  // the replayed turn got its jobs back, no new ones
  for (auto& [key, j] : o.jobs) {
    INFO("job " << key);
    CHECK(persistence::is_terminal(j.state));
    CHECK(j.terminal_receipts == 1);  // exactly one terminal transition
    CHECK(j.undelivered == 0);        // delivered (or read by its owner)
    CHECK(j.notices <= 1);            // never twice
    if (j.acked) CHECK(j.notices == 1);
    // A job is lost only when the kill fell between its admission and its
    // dispatch (whichever point fired): then it never ran, and the replayed
    // turn did not run it either.
    if (j.state == owned_state::lost) CHECK(o.ran[static_cast<char>(key - 'a' + 'A')] == 0);
  }
  for (auto& [letter, count] : o.ran) {
    INFO("command " << letter);
    CHECK(count <= 1);  // no command ran twice
  }
  CHECK(o.ran['A'] == (o.jobs['a'].state == owned_state::completed ? 1 : 0));
  CHECK(o.ran['B'] == (o.jobs['b'].state == owned_state::failed ? 1 : 0));
  if (o.jobs['a'].state != owned_state::lost) CHECK(o.jobs['a'].state == owned_state::completed);
  if (o.jobs['b'].state != owned_state::lost) CHECK(o.jobs['b'].state == owned_state::failed);
  if (o.jobs['c'].state != owned_state::lost) CHECK(o.jobs['c'].state == owned_state::cancelled);
}

inline std::string scope_text(const protocol::owner_scope& s) {
  return protocol::to_text(protocol::to_json(s));
}

/// A receipt row written by hand into a closed database, as a crash or an
/// older build might have left it.
inline void insert_receipt(const std::string& db, const protocol::job_id& j, protocol::transition t,
                           const std::string& scope, const std::string& body,
                           const std::string& state = "pending") {
  SQLite::Database c(db, SQLite::OPEN_READWRITE);
  SQLite::Statement st(c,
                       "INSERT INTO receipts (id, task_id, transition, scope, body, state, "
                       "created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, 1, 1)");
  st.bind(1, protocol::make_event_id(j, t).str());
  st.bind(2, j.str());
  st.bind(3, std::string(protocol::to_string(t)));
  st.bind(4, scope);
  st.bind(5, body);
  st.bind(6, state);
  REQUIRE(st.exec() == 1);
}

}  // namespace tether::test
