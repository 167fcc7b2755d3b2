#include "tether/testing/scenario.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/use_future.hpp>
#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <iostream>
#include <map>
#include <set>
#include <sstream>

#include "tether/actors/host.hpp"
#include "tether/protocol/notice.hpp"
#include "tether/runtime/crash_point.hpp"
#include "tether/sandbox/daemon_process.hpp"
#include "tether/testing/scripted_agent.hpp"

namespace tether::testing::scenario {

using namespace tether::actors;

namespace fs = std::filesystem;
using namespace std::string_literals;

// ---------------------------------------------------------------------------
// Parsing

namespace {

struct word {
  std::string text;
  bool quoted = false;
};

std::string show(const word& w) {
  return w.quoted ? "\"" + w.text + "\"" : "'" + w.text + "'";
}

bool is_name(const std::string& s) {
  if (s.empty() || s[0] == '.' || s[0] == '-') return false;
  return std::all_of(s.begin(), s.end(), [](unsigned char c) {
    return std::isalnum(c) || c == '_' || c == '-' || c == '.';
  });
}

// Reads the words of one line: unquoted words end at blanks or ';' (which is
// a word of its own); "quoted strings" take \" \\ \n \t; '#' starts a comment.
result<std::vector<word>> split(const std::string& line, const std::string& where) {
  std::vector<word> out;
  std::size_t i = 0;
  while (i < line.size()) {
    char c = line[i];
    if (c == ' ' || c == '\t' || c == '\r') {
      ++i;
    } else if (c == '#') {
      break;
    } else if (c == ';') {
      out.push_back({";", false});
      ++i;
    } else if (c == '"') {
      word w{"", true};
      ++i;
      bool closed = false;
      while (i < line.size()) {
        char d = line[i++];
        if (d == '"') {
          closed = true;
          break;
        }
        if (d != '\\') {
          w.text += d;
          continue;
        }
        if (i >= line.size()) break;
        char e = line[i++];
        switch (e) {
          case 'n':
            w.text += '\n';
            break;
          case 't':
            w.text += '\t';
            break;
          case '"':
            w.text += '"';
            break;
          case '\\':
            w.text += '\\';
            break;
          default:
            return error{errc::invalid, where + "unknown escape '\\" + std::string(1, e) +
                                            "' in a quoted string (use \\n \\t \\\" \\\\)"};
        }
      }
      if (!closed)
        return error{errc::invalid, where + "the quoted string \"" + w.text + "\" is not closed"};
      out.push_back(std::move(w));
    } else {
      word w;
      while (i < line.size() && line[i] != ' ' && line[i] != '\t' && line[i] != '\r' &&
             line[i] != ';') {
        if (line[i] == '"')
          return error{errc::invalid,
                       where + "stray '\"' inside the word '" + w.text + "\"': quote a whole word"};
        w.text += line[i++];
      }
      out.push_back(std::move(w));
    }
  }
  return out;
}

// Reads the words of one line in order, with errors that name the line, the
// step and the word.
class line_reader {
 public:
  line_reader(std::vector<word> w, std::string where, std::string step)
      : w_(std::move(w)), where_(std::move(where)), step_(std::move(step)) {}

  bool done() const { return i_ >= w_.size(); }
  bool at(const char* keyword) const { return !done() && !w_[i_].quoted && w_[i_].text == keyword; }
  const word& peek() const { return w_[i_]; }
  void skip() { ++i_; }
  void set_step(std::string s) { step_ = std::move(s); }

  error fail(const std::string& message) const {
    return error{errc::invalid, where_ + step_ + ": " + message};
  }
  error missing(const std::string& what) const {
    return fail("missing " + what + " at the end of the line");
  }

  result<std::string> name(const std::string& what) {
    if (done()) return missing(what);
    const auto& w = w_[i_];
    if (w.quoted || !is_name(w.text) || w.text == ";")
      return fail("expected " + what + " (letters, digits, _ . -), found " + show(w));
    ++i_;
    return w.text;
  }
  result<std::string> text(const std::string& what) {
    if (done()) return missing(what + " (a \"quoted string\")");
    const auto& w = w_[i_];
    if (!w.quoted) return fail("expected " + what + " (a \"quoted string\"), found " + show(w));
    ++i_;
    return w.text;
  }
  result<long> number(const std::string& what, long min, long max) {
    if (done()) return missing(what);
    const auto& w = w_[i_];
    char* end = nullptr;
    errno = 0;
    long v = w.quoted || w.text.empty() ? 0 : std::strtol(w.text.c_str(), &end, 10);
    if (w.quoted || w.text.empty() || *end != '\0' || errno != 0 || v < min || v > max)
      return fail(what + " " + show(w) + " is not a whole number from " + std::to_string(min) +
                  " to " + std::to_string(max));
    ++i_;
    return v;
  }
  result<std::string> keyword(const std::string& what, std::initializer_list<const char*> options) {
    std::string list;
    for (auto o : options) list += (list.empty() ? "" : ", ") + std::string(o);
    if (done()) return missing(what + " (" + list + ")");
    const auto& w = w_[i_];
    for (auto o : options)
      if (!w.quoted && w.text == o) {
        ++i_;
        return w.text;
      }
    return fail(show(w) + " is not " + what + " (expected " + list + ")");
  }
  // "2", "last"
  result<int> position(const std::string& what) {
    if (at("last")) {
      ++i_;
      return -1;
    }
    auto n = number(what + " (a position from 1, or last)", 1, 1000000);
    if (!n) return n.error();
    return static_cast<int>(*n);
  }
  result<void> end() {
    if (done()) return {};
    return fail("unexpected " + show(w_[i_]) + " after the end of the step");
  }

 private:
  std::vector<word> w_;
  std::size_t i_ = 0;
  std::string where_;
  std::string step_;
};

result<expectation::text_op> text_op(line_reader& r) {
  auto op = r.keyword("a text check", {"contains", "lacks", "equals"});
  if (!op) return op.error();
  return *op == "contains" ? expectation::text_op::contains
         : *op == "lacks"  ? expectation::text_op::lacks
                           : expectation::text_op::equals;
}

const std::vector<const char*>& boot_fields() {
  static const std::vector<const char*> f = {"delivered",
                                             "cleared",
                                             "kept",
                                             "exhausted",
                                             "resumed_top",
                                             "resumed_children",
                                             "jobs_reattached",
                                             "jobs_finished_while_down",
                                             "jobs_lost",
                                             "jobs_redelivered"};
  return f;
}

// NAME "DESCRIPTION" "PROMPT": the session a spawn or fork creates (or a
// spawn follows up), into a.target, a.description and a.text.
result<void> parse_session_start(line_reader& r, action& a, const std::string& what) {
  auto c = r.name(what == "child" ? "the child session name" : "the new session's name");
  if (!c) return c.error();
  a.target = *c;
  auto d = r.text("the " + what + "'s description");
  if (!d) return d.error();
  a.description = *d;
  auto p = r.text("the " + what + "'s prompt");
  if (!p) return p.error();
  a.text = *p;
  return {};
}

result<action> parse_action(line_reader& r) {
  auto verb = r.keyword("an action", {"say", "fail", "raise", "shell", "spawn", "wake-self",
                                      "wait-until-interrupted", "interrupt", "job", "job-status",
                                      "job-wait", "job-cancel", "fork", "delegate"});
  if (!verb) return verb.error();
  action a;
  using k = action::kind;
  if (*verb == "say" || *verb == "fail" || *verb == "raise") {
    a.what = *verb == "say" ? k::say : *verb == "fail" ? k::fail : k::raise;
    auto t = r.text("the " + *verb + " text");
    if (!t) return t.error();
    a.text = *t;
  } else if (*verb == "shell") {
    a.what = k::shell;
    auto g = r.name("a gate name");
    if (!g) return g.error();
    a.text = *g;
  } else if (*verb == "spawn") {
    a.what = k::spawn;
    if (auto s = parse_session_start(r, a, "child"); !s) return s.error();
    while (!r.done() && !r.at(";")) {
      auto opt = r.keyword("a spawn option", {"background", "foreground", "notify", "agent"});
      if (!opt) return opt.error();
      if (*opt == "background" || *opt == "foreground") {
        a.background = *opt == "background";
      } else if (*opt == "notify") {
        auto v = r.keyword("a notify setting", {"on", "off", "default"});
        if (!v) return v.error();
        if (*v != "default") a.notify = *v == "on";
      } else {
        auto ag = r.name("an agent name");
        if (!ag) return ag.error();
        a.agent = *ag;
      }
    }
  } else if (*verb == "wake-self") {
    a.what = k::wake_self;
    if (!r.done() && !r.at(";")) {
      auto n = r.number("the wake count", 1, 1000);
      if (!n) return n.error();
      a.count = static_cast<int>(*n);
    }
  } else if (*verb == "wait-until-interrupted") {
    a.what = k::wait_cancel;
  } else if (*verb == "job") {
    a.what = k::job;
    auto c = r.text("the job's command");
    if (!c) return c.error();
    if (c->empty()) return r.fail("the job's command is empty");
    a.text = *c;
    if (r.at("as")) {
      r.skip();
      auto n = r.name("the job's name");
      if (!n) return n.error();
      if (n->size() > 64) return r.fail("the job name '" + *n + "' is longer than 64 characters");
      a.target = *n;
    }
  } else if (*verb == "job-status" || *verb == "job-wait" || *verb == "job-cancel") {
    a.what = *verb == "job-status" ? k::job_status
             : *verb == "job-wait" ? k::job_wait
                                   : k::job_cancel;
    auto n = r.name("the job's name");
    if (!n) return n.error();
    a.target = *n;
  } else if (*verb == "fork") {
    a.what = k::fork;
    if (auto s = parse_session_start(r, a, "fork"); !s) return s.error();
  } else if (*verb == "delegate") {
    a.what = k::delegate;
    auto ag = r.name("the delegate's agent");
    if (!ag) return ag.error();
    a.agent = *ag;
    auto p = r.text("the delegate's prompt");
    if (!p) return p.error();
    a.text = *p;
    if (!r.at("as")) return r.fail("a delegate needs a name: delegate AGENT \"PROMPT\" as NAME");
    r.skip();
    auto n = r.name("the delegate's name");
    if (!n) return n.error();
    a.target = *n;
  } else {
    a.what = k::interrupt;
    auto t = r.name("the session to interrupt");
    if (!t) return t.error();
    a.target = *t;
  }
  return a;
}

result<expectation> parse_expect(line_reader& r) {
  expectation e;
  using k = expectation::kind;
  auto subject = r.keyword("an expectation subject", {"inbox", "transcript", "jobs", "job",
                                                      "inline", "session", "boot", "delegate"});
  if (!subject) return subject.error();
  r.set_step("expect " + *subject);
  if (*subject == "inbox") {
    auto s = r.name("the session name");
    if (!s) return s.error();
    e.session = *s;
    if (r.at("count")) {
      r.skip();
      e.what = k::inbox_count;
      auto n = r.number("the row count", 0, 1000000);
      if (!n) return n.error();
      e.number = *n;
      return e;
    }
    if (r.at("any") || r.at("none")) {
      e.what = r.at("any") ? k::inbox_any : k::inbox_none;
      r.skip();
      auto op = r.keyword("a text check", {"contains", "equals"});
      if (!op) return op.error();
      e.op = *op == "contains" ? expectation::text_op::contains : expectation::text_op::equals;
      auto t = r.text("the text to compare");
      if (!t) return t.error();
      e.text = *t;
      return e;
    }
    if (r.at("unordered")) {
      r.skip();
      e.what = k::inbox_unordered;
      auto op = r.keyword("a text check", {"contains"});
      if (!op) return op.error();
      do {
        auto t = r.text("a text to find");
        if (!t) return t.error();
        e.texts.push_back(*t);
      } while (!r.done());
      return e;
    }
    auto pos = r.position("the inbox row");
    if (!pos) return pos.error();
    e.position = *pos;
    auto check = r.keyword("an inbox check",
                           {"contains", "lacks", "equals", "acked", "pending", "from", "id"});
    if (!check) return check.error();
    if (*check == "id") {
      e.what = k::inbox_id;
      auto how = r.keyword("an id check", {"prefix", "equals", "job"});
      if (!how) return how.error();
      e.text = *how;
      if (*how == "job") {
        auto j = r.name("the job's name");
        if (!j) return j.error();
        e.job = *j;
      } else {
        auto t = r.text(*how == "prefix" ? "the id's prefix" : "the id");
        if (!t) return t.error();
        e.texts.push_back(*t);
      }
    } else if (*check == "acked" || *check == "pending") {
      e.what = k::inbox_state;
      e.text = *check;
    } else if (*check == "from") {
      e.what = k::inbox_from;
      auto f = r.name("the sending session");
      if (!f) return f.error();
      e.text = *f;
    } else {
      e.what = k::inbox_text;
      e.op = *check == "contains" ? expectation::text_op::contains
             : *check == "lacks"  ? expectation::text_op::lacks
                                  : expectation::text_op::equals;
      auto t = r.text("the text to compare");
      if (!t) return t.error();
      e.text = *t;
    }
    return e;
  }
  if (*subject == "transcript") {
    auto s = r.name("the session name");
    if (!s) return s.error();
    e.session = *s;
    auto what = r.keyword("a transcript check", {"reports", "answers", "answer", "notices"});
    if (!what) return what.error();
    if (*what == "answer") {
      e.what = k::transcript_answer;
      auto op = text_op(r);
      if (!op) return op.error();
      e.op = *op;
      auto t = r.text("the text to compare");
      if (!t) return t.error();
      e.text = *t;
      return e;
    }
    e.what = *what == "reports"   ? k::transcript_reports
             : *what == "notices" ? k::transcript_notices
                                  : k::transcript_answers;
    auto n = r.number("the " + *what + " count", 0, 1000000);
    if (!n) return n.error();
    e.number = *n;
    return e;
  }
  if (*subject == "jobs") {
    e.what = k::jobs_count;
    for (;;) {
      auto f = r.keyword("a jobs filter or count",
                         {"status", "kind", "mode", "parent", "child", "count"});
      if (!f) return f.error();
      if (*f == "count") break;
      result<std::string> v =
          *f == "status" ? r.keyword("a job status", {"running", "completed", "error", "cancelled"})
          : *f == "kind" ? r.keyword("a job kind", {"subagent", "shell"})
          : *f == "mode" ? r.keyword("a job mode", {"background", "none"})
                         : r.name("the " + *f + " session");
      if (!v) return v.error();
      (*f == "status"   ? e.status
       : *f == "kind"   ? e.job_kind
       : *f == "mode"   ? e.mode
       : *f == "parent" ? e.parent
                        : e.child) = *v;
    }
    auto n = r.number("the job count", 0, 1000000);
    if (!n) return n.error();
    e.number = *n;
    return e;
  }
  if (*subject == "delegate") {
    auto j = r.name("the delegate's name");
    if (!j) return j.error();
    e.job = *j;
    auto what = r.keyword("a delegate check", {"state"});
    if (!what) return what.error();
    e.what = k::delegate_state;
    auto v = r.keyword("a delegate state",
                       {"running", "completed", "failed", "cancelled", "lost", "timed_out"});
    if (!v) return v.error();
    e.text = *v;
    return e;
  }
  if (*subject == "job") {
    auto j = r.name("the job's name");
    if (!j) return j.error();
    e.job = *j;
    auto what = r.keyword("a job check", {"state", "exit", "failing-stage", "stage", "receipts",
                                          "receipt", "notice"});
    if (!what) return what.error();
    if (*what == "state") {
      e.what = k::job_state;
      auto v = r.keyword("a job state",
                         {"admitted", "running", "completed", "failed", "cancelled", "lost"});
      if (!v) return v.error();
      e.text = *v;
    } else if (*what == "exit") {
      e.what = k::job_exit;
      auto n = r.number("the exit code", -1, 255);
      if (!n) return n.error();
      e.number = *n;
    } else if (*what == "failing-stage") {
      e.what = k::job_failing_stage;
      if (r.at("none")) {
        r.skip();
        e.number = 0;
      } else {
        auto n = r.number("the failing stage (from 1, or none)", 1, 1000);
        if (!n) return n.error();
        e.number = *n;
      }
    } else if (*what == "stage") {
      auto n = r.number("the stage (from 1)", 1, 1000);
      if (!n) return n.error();
      e.stage = static_cast<int>(*n);
      auto c = r.keyword("a stage check", {"exit", "signal"});
      if (!c) return c.error();
      if (*c == "exit") {
        e.what = k::job_stage_exit;
        auto x = r.number("the stage's exit code", 0, 255);
        if (!x) return x.error();
        e.number = *x;
      } else {
        e.what = k::job_stage_signal;
        if (r.done()) return r.missing("a signal (SIGKILL, or its number)");
        auto w = r.peek();
        if (!w.quoted && w.text.rfind("SIG", 0) == 0) {
          int sig = 0;
          for (int i = 1; i < 65 && !sig; ++i)
            if (protocol::signal_name(i) == w.text) sig = i;
          if (!sig) return r.fail("'" + w.text + "' is not a signal name (SIGKILL, SIGTERM, ...)");
          r.skip();
          e.number = sig;
        } else {
          auto x = r.number("the signal (SIGKILL, or its number)", 1, 64);
          if (!x) return x.error();
          e.number = *x;
        }
      }
    } else if (*what == "receipts") {
      e.what = k::job_receipts;
      auto n = r.number("the receipt count", 0, 100);
      if (!n) return n.error();
      e.number = *n;
    } else if (*what == "receipt") {
      e.what = k::job_receipt;
      auto v = r.keyword("a receipt state", {"pending", "acked", "read", "dropped", "none"});
      if (!v) return v.error();
      e.text = *v;
    } else {
      e.what = k::job_notice;
      auto op = text_op(r);
      if (!op) return op.error();
      e.op = *op;
      auto t = r.text("the text to compare");
      if (!t) return t.error();
      e.text = *t;
    }
    return e;
  }
  if (*subject == "inline") {
    if (r.at("count")) {
      r.skip();
      e.what = k::inline_count;
      auto n = r.number("the inline result count", 0, 1000000);
      if (!n) return n.error();
      e.number = *n;
      return e;
    }
    e.what = k::inline_text;
    auto pos = r.position("the inline result");
    if (!pos) return pos.error();
    e.position = *pos;
    auto op = text_op(r);
    if (!op) return op.error();
    e.op = *op;
    auto t = r.text("the text to compare");
    if (!t) return t.error();
    e.text = *t;
    return e;
  }
  if (*subject == "session") {
    auto s = r.name("the session name");
    if (!s) return s.error();
    e.session = *s;
    auto what = r.keyword("a session check", {"idle", "busy", "claimed", "unclaimed", "notify",
                                              "outcome", "policy", "resumes", "parent", "gone"});
    if (!what) return what.error();
    if (*what == "parent") {
      e.what = k::session_parent;
      if (r.at("none")) {
        r.skip();
        e.text = "none";
      } else {
        auto p = r.name("the parent session (or none)");
        if (!p) return p.error();
        e.parent = *p;
        e.text = *p;
      }
    } else if (*what == "notify") {
      e.what = k::session_notify;
      auto v = r.keyword("a notify setting", {"on", "off", "default"});
      if (!v) return v.error();
      e.text = *v;
    } else if (*what == "outcome") {
      e.what = k::session_outcome;
      auto v = r.keyword("an idle outcome", {"completed", "error", "cancelled"});
      if (!v) return v.error();
      e.text = *v;
    } else if (*what == "policy") {
      e.what = k::session_policy;
      auto v = r.keyword("a job policy", {"withhold", "report_now"});
      if (!v) return v.error();
      e.text = *v;
    } else if (*what == "resumes") {
      e.what = k::session_resumes;
      auto n = r.number("the resume count", 0, 1000000);
      if (!n) return n.error();
      e.number = *n;
    } else {
      e.what = k::session_word;
      e.text = *what;
    }
    return e;
  }
  // boot
  e.what = k::boot_field;
  std::string list;
  for (auto f : boot_fields()) list += (list.empty() ? "" : ", ") + std::string(f);
  if (r.done()) return r.missing("a boot field (" + list + ")");
  auto f = r.name("a boot field");
  if (!f) return f.error();
  if (std::none_of(boot_fields().begin(), boot_fields().end(),
                   [&](const char* b) { return *f == b; }))
    return r.fail("'" + *f + "' is not a boot field (expected " + list + ")");
  e.text = *f;
  auto n = r.number("the count", 0, 1000000);
  if (!n) return n.error();
  e.number = *n;
  return e;
}

result<void> parse_crash_point(line_reader& r, step& st) {
  if (r.done()) return r.missing("a crash point name (see `tether crash-points`)");
  auto w = r.peek();
  r.skip();
  std::string name = w.text;
  auto colon = name.rfind(':');
  if (colon != std::string::npos) {
    std::string n = name.substr(colon + 1);
    char* end = nullptr;
    long k = n.empty() ? 0 : std::strtol(n.c_str(), &end, 10);
    if (n.empty() || *end != '\0' || k < 1)
      return r.fail("the hit count in " + show(w) + " must be a positive whole number");
    name.resize(colon);
  }
  auto names = runtime::crash_point_names();
  if (w.quoted || std::find(names.begin(), names.end(), name) == names.end())
    return r.fail("'" + name + "' is not a crash point (see `tether crash-points`)");
  st.text = w.text;
  return {};
}

// The gates a job's command runs (`gate NAME` as a word pair, as a `shell`
// action does), so that `shell NAME exits` can release them.
std::vector<std::string> job_gates(const std::string& command) {
  std::vector<std::string> words, out;
  std::string w;
  for (char c : command) {
    if (std::isspace(static_cast<unsigned char>(c)) || std::strchr(";|&()`'\"", c)) {
      if (!w.empty()) words.push_back(std::move(w));
      w.clear();
    } else {
      w += c;
    }
  }
  if (!w.empty()) words.push_back(std::move(w));
  for (std::size_t i = 0; i + 1 < words.size(); ++i)
    if (words[i] == "gate" && is_name(words[i + 1])) out.push_back(words[i + 1]);
  return out;
}

// Checks that every name refers to something the script creates.
result<void> check_names(script& s) {
  std::set<std::string> sessions, gates, jobs, delegated;
  auto where = [&](int line) { return s.file + ":" + std::to_string(line) + ": "; };
  for (auto& st : s.steps)
    if (st.what == step::kind::session) sessions.insert(st.name);
  for (auto& t : s.turns)
    for (auto& a : t.actions) {
      if (a.what == action::kind::spawn || a.what == action::kind::fork) sessions.insert(a.target);
      // A delegated task's session plays the turns of its agent's name.
      if (a.what == action::kind::delegate) {
        sessions.insert(a.agent);
        delegated.insert(a.target);
      }
      if (a.what == action::kind::shell) gates.insert(a.text);
      if (a.what == action::kind::job) {
        for (auto& g : job_gates(a.text)) gates.insert(g);
        if (!a.target.empty() && !jobs.insert(a.target).second)
          return error{errc::invalid, where(t.line) + "on: a job named '" + a.target +
                                          "' is launched twice (each job name once a file)"};
      }
    }
  s.gates.assign(gates.begin(), gates.end());
  auto known_job = [&](int line, const std::string& n) -> result<void> {
    if (n.empty() || jobs.count(n)) return {};
    return error{errc::invalid, where(line) + "no turn launches a job named '" + n +
                                    "' (add `job \"COMMAND\" as " + n + "` to a turn)"};
  };
  for (auto& t : s.turns)
    for (auto& a : t.actions)
      if (a.what == action::kind::job_status || a.what == action::kind::job_wait ||
          a.what == action::kind::job_cancel)
        if (auto r = known_job(t.line, a.target); !r) return r;
  auto known_delegate = [&](int line, const std::string& n) -> result<void> {
    if (delegated.count(n)) return {};
    return error{errc::invalid, where(line) + "no turn delegates a task named '" + n +
                                    "' (add `delegate AGENT \"PROMPT\" as " + n + "` to a turn)"};
  };
  auto known = [&](int line, const std::string& n) -> result<void> {
    if (n.empty() || sessions.count(n)) return {};
    return error{errc::invalid, where(line) + "session '" + n + "' is never created (no 'session " +
                                    n + "' step and no turn spawns it)"};
  };
  for (auto& t : s.turns) {
    if (auto r = known(t.line, t.session); !r) return r;
    for (auto& a : t.actions)
      if (a.what == action::kind::interrupt)
        if (auto r = known(t.line, a.target); !r) return r;
  }
  for (std::size_t i = 0; i < s.steps.size(); ++i) {
    auto& st = s.steps[i];
    if (st.what == step::kind::wait_turn &&
        std::none_of(s.turns.begin(), s.turns.end(),
                     [&](const turn& t) { return t.session == st.name && t.ordinal == st.code; }))
      return error{errc::invalid, where(st.line) + "wait turn: session '" + st.name +
                                      "' has no turn for input " + std::to_string(st.code) +
                                      " (add `on " + st.name + " " + std::to_string(st.code) +
                                      ": ...`)"};
    if (st.what == step::kind::shell_exit && !gates.count(st.name))
      return error{errc::invalid, where(st.line) + "no turn starts a shell on gate '" + st.name +
                                      "' (add `shell " + st.name + "` to a turn)"};
    if (st.what == step::kind::job_read)
      if (auto r = known_job(st.line, st.name); !r) return r;
    if (st.what == step::kind::wait_delegate)
      if (auto r = known_delegate(st.line, st.name); !r) return r;
    if (st.what != step::kind::shell_exit && st.what != step::kind::session &&
        st.what != step::kind::crash && st.what != step::kind::job_read &&
        st.what != step::kind::wait_delegate)
      if (auto r = known(st.line, st.name); !r) return r;
    if (st.what == step::kind::expect) {
      auto& e = st.expect;
      if (e.what == expectation::kind::delegate_state) {
        if (auto r = known_delegate(st.line, e.job); !r) return r;
      } else if (auto r = known_job(st.line, e.job); !r) {
        return r;
      }
      for (auto* n : {&e.session, &e.parent, &e.child})
        if (auto r = known(st.line, *n); !r) return r;
      if (e.what == expectation::kind::inbox_from)
        if (auto r = known(st.line, e.text); !r) return r;
    }
    if (st.what == step::kind::crash) {
      std::size_t j = i + 1;
      for (; j < s.steps.size() && s.steps[j].what != step::kind::restart; ++j) {
        auto& in = s.steps[j];
        if (in.what == step::kind::expect || in.what == step::kind::crash)
          return error{
              errc::invalid,
              where(in.line) + "'" + (in.what == step::kind::expect ? "expect" : "crash") +
                  "' between 'crash at' (line " + std::to_string(st.line) +
                  ") and 'restart': that host is expected to die; check after the restart"};
      }
      if (j == s.steps.size())
        return error{errc::invalid,
                     where(st.line) + "'crash at " + st.text + "' needs a 'restart' step after it"};
    }
  }
  return {};
}

}  // namespace

result<script> parse(const std::string& text, const std::string& file) {
  script s;
  s.file = file;
  std::istringstream in(text);
  std::string line;
  int n = 0;
  std::set<std::pair<std::string, int>> turn_keys;
  while (std::getline(in, line)) {
    ++n;
    std::string where = file + ":" + std::to_string(n) + ": ";
    auto words = split(line, where);
    if (!words) return words.error();
    if (words->empty()) continue;
    if ((*words)[0].quoted || (*words)[0].text == ";")
      return error{errc::invalid,
                   where + "a line starts with a step name, not " + show((*words)[0])};
    std::string verb = (*words)[0].text;
    line_reader r(std::move(*words), where, verb);
    r.skip();

    if (verb == "on") {
      turn t;
      t.line = n;
      auto sname = r.name("the session name");
      if (!sname) return sname.error();
      t.session = *sname;
      if (r.done()) return r.missing("the input ordinal followed by ':'");
      auto w = r.peek();
      std::string num = w.text;
      bool colon = !num.empty() && num.back() == ':';
      if (colon) num.pop_back();
      char* end = nullptr;
      long k = num.empty() || w.quoted ? 0 : std::strtol(num.c_str(), &end, 10);
      if (w.quoted || num.empty() || *end != '\0' || k < 1 || k > 1000000)
        return r.fail("the input ordinal " + show(word{num, w.quoted}) +
                      " is not a whole number from 1");
      t.ordinal = static_cast<int>(k);
      r.skip();
      if (!colon) {
        if (!r.at(":"))
          return r.done() ? r.missing("':' after the input ordinal")
                          : r.fail("expected ':' after the input ordinal, found " + show(r.peek()));
        r.skip();
      }
      if (!turn_keys.insert({t.session, t.ordinal}).second)
        return r.fail("session '" + t.session + "' already has a turn for input " +
                      std::to_string(t.ordinal));
      if (r.done()) return r.missing("an action");
      for (;;) {
        auto a = parse_action(r);
        if (!a) return a.error();
        t.actions.push_back(std::move(*a));
        if (r.done()) break;
        if (!r.at(";")) return r.fail("expected ';' between actions, found " + show(r.peek()));
        r.skip();
        if (r.done()) break;  // a trailing ';' is fine
      }
      s.turns.push_back(std::move(t));
      continue;
    }

    if (verb == "sandbox") {
      if (s.sandbox) return r.fail("the sandbox is given already (one `sandbox` line a file)");
      if (auto e = r.end(); !e) return e.error();
      s.sandbox = true;
      continue;
    }
    if (verb == "env") {
      if (r.done()) return r.missing("the variable's name");
      auto w = r.peek();
      bool ok = !w.quoted && !w.text.empty() &&
                !std::isdigit(static_cast<unsigned char>(w.text[0])) &&
                std::all_of(w.text.begin(), w.text.end(),
                            [](unsigned char c) { return std::isalnum(c) || c == '_'; });
      if (!ok)
        return r.fail("expected an environment variable name (letters, digits, _), found " +
                      show(w));
      r.skip();
      if (w.text == "PATH")
        return r.fail("PATH is the runner's (it puts the gate script first); set another name");
      if (std::any_of(s.env.begin(), s.env.end(), [&](auto& kv) { return kv.first == w.text; }))
        return r.fail("'" + w.text + "' is set already");
      auto v = r.text("the variable's value");
      if (!v) return v.error();
      if (auto e = r.end(); !e) return e.error();
      s.env.emplace_back(w.text, *v);
      continue;
    }

    step st;
    st.line = n;
    {
      auto b = line.find_first_not_of(" \t");
      auto e = line.find_last_not_of(" \t\r");
      st.source = line.substr(b, e - b + 1);
    }
    using k = step::kind;
    if (verb == "session") {
      st.what = k::session;
      auto nm = r.name("the session name");
      if (!nm) return nm.error();
      st.name = *nm;
      st.text = *nm;
      if (!r.done()) {
        auto d = r.text("the description");
        if (!d) return d.error();
        st.text = *d;
      }
    } else if (verb == "prompt" || verb == "steer") {
      st.what = verb == "prompt" ? k::prompt : k::steer;
      auto nm = r.name("the session name");
      if (!nm) return nm.error();
      st.name = *nm;
      auto t = r.text("the " + verb + " text");
      if (!t) return t.error();
      st.text = *t;
    } else if (verb == "wake" || verb == "interrupt" || verb == "background" || verb == "delete") {
      st.what = verb == "wake"        ? k::wake
                : verb == "interrupt" ? k::interrupt
                : verb == "delete"    ? k::delete_session
                                      : k::background;
      auto nm = r.name("the session name");
      if (!nm) return nm.error();
      st.name = *nm;
    } else if (verb == "revert") {
      st.what = k::revert;
      auto nm = r.name("the session name");
      if (!nm) return nm.error();
      st.name = *nm;
      auto v = r.keyword("a revert action", {"stage", "clear"});
      if (!v) return v.error();
      st.flag = *v == "stage";
    } else if (verb == "shell") {
      st.what = k::shell_exit;
      auto g = r.name("the gate name");
      if (!g) return g.error();
      st.name = *g;
      auto ex = r.keyword("the word", {"exits"});
      if (!ex) return ex.error();
      if (!r.done() && !r.peek().quoted) {
        auto c = r.number("the exit code", 0, 255);
        if (!c) return c.error();
        st.code = static_cast<int>(*c);
      }
      if (!r.done()) {
        auto o = r.text("the shell's output");
        if (!o) return o.error();
        st.text = *o;
      }
    } else if (verb == "wait") {
      auto what = r.keyword("a wait",
                            {"quiescent", "shells", "idle", "parked", "turn", "jobs", "delegate"});
      if (!what) return what.error();
      st.what = *what == "quiescent"  ? k::wait_quiescent
                : *what == "shells"   ? k::wait_shells
                : *what == "jobs"     ? k::wait_jobs
                : *what == "delegate" ? k::wait_delegate
                : *what == "idle"     ? k::wait_idle
                : *what == "parked"   ? k::wait_parked
                                      : k::wait_turn;
      if (st.what == k::wait_idle || st.what == k::wait_parked || st.what == k::wait_turn) {
        auto nm = r.name("the session name");
        if (!nm) return nm.error();
        st.name = *nm;
      } else if (st.what == k::wait_delegate) {
        auto nm = r.name("the delegate's name");
        if (!nm) return nm.error();
        st.name = *nm;
      }
      if (st.what == k::wait_turn) {
        auto o = r.number("the input ordinal", 1, 1000000);
        if (!o) return o.error();
        st.code = static_cast<int>(*o);
      }
    } else if (verb == "job") {
      st.what = k::job_read;
      auto nm = r.name("the job's name");
      if (!nm) return nm.error();
      st.name = *nm;
      auto v = r.keyword("a job call", {"status", "wait", "cancel"});
      if (!v) return v.error();
      st.text = *v;
    } else if (verb == "crash") {
      st.what = k::crash;
      auto at = r.keyword("the word", {"at"});
      if (!at) return at.error();
      if (auto c = parse_crash_point(r, st); !c) return c.error();
    } else if (verb == "restart") {
      st.what = k::restart;
    } else if (verb == "expect") {
      st.what = k::expect;
      auto e = parse_expect(r);
      if (!e) return e.error();
      st.expect = std::move(*e);
      st.name = st.expect.session;
    } else {
      return error{errc::invalid, where + "'" + verb +
                                      "' is not a step (expected session, on, prompt, steer, "
                                      "wake, interrupt, delete, revert, background, shell, job, "
                                      "wait, "
                                      "crash, restart, expect, sandbox, env)"};
    }
    if (auto e = r.end(); !e) return e.error();
    s.steps.push_back(std::move(st));
  }
  if (auto c = check_names(s); !c) return c.error();
  return s;
}

result<script> parse_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f)
    return error{errc::not_found, "cannot read scenario '" + path + "': " + std::strerror(errno)};
  std::stringstream ss;
  ss << f.rdbuf();
  return parse(ss.str(), path);
}

// ---------------------------------------------------------------------------
// Running

namespace {

using protocol::session_id;

script_action to_script_action(const action& a) {
  using k = script_action::kind;
  script_action s;
  switch (a.what) {
    case action::kind::say:
      s.what = k::say;
      break;
    case action::kind::fail:
      s.what = k::fail;
      break;
    case action::kind::raise:
      s.what = k::raise;
      break;
    case action::kind::shell:
      s.what = k::shell;
      break;
    case action::kind::spawn:
      s.what = k::spawn;
      break;
    case action::kind::wake_self:
      s.what = k::wake_self;
      break;
    case action::kind::wait_cancel:
      s.what = k::wait_cancel;
      break;
    case action::kind::interrupt:
      s.what = k::interrupt;
      break;
    case action::kind::job:
      s.what = k::job;
      break;
    case action::kind::job_status:
      s.what = k::job_status;
      break;
    case action::kind::job_wait:
      s.what = k::job_wait;
      break;
    case action::kind::job_cancel:
      s.what = k::job_cancel;
      break;
    case action::kind::fork:
      s.what = k::fork;
      break;
    case action::kind::delegate:
      s.what = k::delegate;
      break;
  }
  s.text = a.what == action::kind::shell ? "gate " + a.text : a.text;
  s.child = a.target;
  s.description = a.description;
  s.agent = a.agent;
  s.notify = a.notify;
  s.background = a.background;
  s.count = a.count;
  return s;
}

std::string indent(const std::string& text) {
  std::string out = "          | ";
  for (char c : text) {
    out += c;
    if (c == '\n') out += "          | ";
  }
  return out;
}

std::string describe_status(int status) {
  if (WIFSIGNALED(status))
    return "it died by signal " + std::to_string(WTERMSIG(status)) + " (" +
           strsignal(WTERMSIG(status)) + "), not SIGKILL";
  if (WIFEXITED(status)) {
    int c = WEXITSTATUS(status);
    if (c == 0) return "it ran every step and the crash point was never reached";
    return "it exited with status " + std::to_string(c) +
           (c == 1     ? " (a step failed)"
            : c == 127 ? " (the crash process could not be started)"
                       : "");
  }
  return "wait status " + std::to_string(status);
}

awaitable<bool> quiescent(host* h, bool shells) {
  co_await h->wait_quiescent(shells);
  co_return true;
}

// No job is live and no receipt is being handed over; then nothing runs.
awaitable<bool> jobs_quiet(host* h) {
  co_await h->jobs().wait_idle();
  co_await h->wait_quiescent(true);
  co_return true;
}

class runner {
 public:
  runner(const script& s, run_options o)
      : s_(s),
        o_(std::move(o)),
        out_(o_.out ? *o_.out : std::cout),
        agents_(std::make_shared<scripted_agents>()) {
    for (auto& t : s_.turns) {
      script_turn st;
      for (auto& a : t.actions) st.actions.push_back(to_script_action(a));
      agents_->on_input(session_id(t.session), t.ordinal, std::move(st));
    }
  }
  ~runner() {
    if (res_.stuck)
      (void)host_.release();  // wedged: shutting it down could hang; the process exit ends it
    else
      close_host();
    stop_sandbox();
    for (int fd : gate_fds_) ::close(fd);
  }

  run_result run() {
    out_ << "scenario " << s_.file << "\n";
    if (!prepare(true) || !open_host()) {
      ++res_.failed;
      return res_;
    }
    for (std::size_t i = 0; i < s_.steps.size(); ++i) {
      const auto& st = s_.steps[i];
      if (st.what == step::kind::crash) {
        crash(i);
        while (i + 1 < s_.steps.size() && s_.steps[i + 1].what != step::kind::restart) ++i;
        continue;
      }
      if (!exec(st)) break;
    }
    if (!res_.stuck) close_host();
    stop_sandbox();
    out_ << s_.file << ": " << (res_.passed + res_.failed) << " expectation(s), " << res_.failed
         << " failed\n";
    if (res_.failed) {
      out_ << "timeline of the scripted turns:\n";
      int n = 0;
      for (auto& l : agents_->log()) out_ << "  " << ++n << ". " << l << "\n";
    }
    return res_;
  }

  int crash_segment(std::size_t crash_step) {
    if (!prepare(false) || !open_host()) return 1;
    for (std::size_t i = crash_step + 1;
         i < s_.steps.size() && s_.steps[i].what != step::kind::restart; ++i)
      if (!exec(s_.steps[i])) return 1;
    close_host();
    return 0;
  }

  bool stuck() const { return res_.stuck; }

 private:
  // The scratch directory, the gate script and (in the process that owns
  // them) the gates: fifos held open read-write so a line written to one
  // waits there until its shell reads it, whenever that shell starts.
  bool prepare(bool own_gates) {
    std::error_code ec;
    dir_ = fs::absolute(o_.dir, ec);
    fs::create_directories(dir_ / "bin", ec);
    fs::create_directories(dir_ / "gates", ec);
    agents_->set_workspace(dir_ / "workspace");
    if (ec) return fail_setup("cannot create " + dir_.string() + ": " + ec.message());
    auto script = dir_ / "bin" / "gate";
    if (own_gates) {
      std::ofstream(script) << "#!/bin/bash\n"
                               "# gate NAME: runs until the scenario says `shell NAME exits`.\n"
                               "read -r code rest < \""
                            << (dir_ / "gates").string()
                            << "/$1\"\n"
                               "[ -n \"$rest\" ] && printf '%b\\n' \"$rest\"\n"
                               "exit \"${code:-0}\"\n";
      fs::permissions(script, fs::perms::owner_all, ec);
      for (auto& g : s_.gates) {
        auto p = dir_ / "gates" / g;
        if (::mkfifo(p.c_str(), 0600) != 0 && errno != EEXIST)
          return fail_setup("cannot make the gate " + p.string() + ": " + std::strerror(errno));
        int fd = ::open(p.c_str(), O_RDWR | O_CLOEXEC);
        if (fd < 0)
          return fail_setup("cannot open the gate " + p.string() + ": " + std::strerror(errno));
        gate_fds_.push_back(fd);
      }
    }
    std::string bin = (dir_ / "bin").string();
    const char* path = std::getenv("PATH");
    std::string cur = path ? path : "";
    if (cur.rfind(bin + ":", 0) != 0) ::setenv("PATH", (bin + ":" + cur).c_str(), 1);
    // `env` lines: the host's environment is every command's (a launch
    // passes none of its own), and the sandbox scrubs their secret values.
    for (auto& [name, value] : s_.env) ::setenv(name.c_str(), value.c_str(), 1);
    // Every scenario's shells and jobs run in a real sandbox daemon, started
    // here before the host opens rather than by the host on demand: the daemon
    // is this process's child, stopped (and reaped) when the scenario ends, so
    // no daemon outlives a run and nothing waits on an idle exit. Only the
    // process that owns the gates starts it; a crash segment's host connects.
    fs::create_directories(dir_ / "work", ec);
    if (ec) return fail_setup("cannot create " + (dir_ / "work").string() + ": " + ec.message());
    if (own_gates && !start_sandbox()) return false;
    return true;
  }

  std::string sandbox_dir() const { return (dir_ / "sandbox").string(); }

  // A real tether-sandboxd in DIR/sandbox, unisolated, as our child (the
  // tests' way): found next to the running executable.
  bool start_sandbox() {
    sandbox::daemon_options o;
    o.state_dir = sandbox_dir();
    o.detach = false;
    auto d = sandbox::ensure_daemon(o);
    if (!d) return fail_setup("cannot start the sandbox daemon: " + d.error().message);
    daemon_ = *d;
    if (o_.verbose) out_ << "  ..    sandbox: tether-sandboxd pid " << daemon_->pid << "\n";
    return true;
  }

  void stop_sandbox() {
    if (!daemon_) return;
    auto d = *daemon_;
    daemon_.reset();
    if (!d.child || d.pid <= 0) return;
    if (res_.stuck) {
      ::kill(d.pid, SIGKILL);  // a wedged host may hold its connections: do not wait on it
      return;
    }
    if (auto r = sandbox::stop_daemon(d); !r)
      out_ << "  note  sandbox: " << r.error().message << "\n";
  }

  bool fail_setup(const std::string& why) {
    out_ << "  FAIL  setup: " << why << "\n";
    return false;
  }

  bool open_host() {
    host_options ho;
    ho.db_path = (dir_ / "tether.db").string();
    ho.agents = agents_;
    ho.jobs.sandbox_dir = sandbox_dir();
    ho.jobs.start_daemon = false;  // started by prepare()
    ho.jobs.cwd = (dir_ / "work").string();
    ho.log = [this](const std::string& w) {
      std::lock_guard lk(log_m_);
      out_ << "  note  " << w << "\n";
    };
    auto h = host::open(ho);
    if (!h) return fail_setup(h.error().message);
    host_ = std::move(*h);
    auto b = wait_for(host_->boot());
    if (!b) return false;
    if (!*b) return fail_setup("boot: " + b->error().message);
    boot_ = **b;
    return true;
  }

  void close_host() {
    if (!host_) return;
    host_->shutdown();
    host_.reset();
  }

  // Runs `a` on the host; nullopt (and the scenario is stuck) on a timeout.
  template <class T>
  std::optional<T> wait_for(awaitable<T> a) {
    auto f = asio::co_spawn(host_->pool().at(0), std::move(a), asio::use_future);
    if (f.wait_for(o_.wait_timeout) != std::future_status::ready) {
      res_.stuck = true;
      return std::nullopt;
    }
    return f.get();
  }

  void say(const char* tag, const step& st, const std::string& extra = "") {
    std::lock_guard lk(log_m_);
    out_ << "  " << tag << "line " << st.line << ": " << st.source;
    if (!extra.empty()) out_ << (extra.find('\n') == std::string::npos ? " — " : "\n") << extra;
    out_ << "\n";
  }

  // A step that could not be carried out ends the scenario.
  bool step_failed(const step& st, const std::string& why) {
    ++res_.failed;
    say("FAIL  ", st, why);
    return false;
  }

  bool timed_out(const step& st) {
    return step_failed(st, "no answer within " + std::to_string(o_.wait_timeout.count()) +
                               " ms; the scenario stops here");
  }

  template <class T>
  bool check(const step& st, const std::optional<result<T>>& r) {
    if (!r) return timed_out(st);
    if (!*r) return step_failed(st, (*r).error().message);
    return true;
  }

  bool exec(const step& st) {
    if (o_.verbose && st.what != step::kind::expect) say("..    ", st);
    using k = step::kind;
    session_id id(st.name);
    switch (st.what) {
      case k::session: {
        std::optional<session_id> want = id;
        return check(st, wait_for(host_->create_session(st.text, want)));
      }
      case k::prompt:
      case k::steer:
        return check(st, wait_for(host_->prompt(id, st.text, st.what == k::steer)));
      case k::wake: {
        auto s = host_->get(id);
        if (!s) return step_failed(st, s.error().message);
        host_->wake(**s, wake_scope::input, false);
        return true;
      }
      case k::interrupt:
        host_->interrupt(id);
        return true;
      case k::revert:
        return check(st, wait_for(host_->stage_revert(id, st.flag)));
      case k::background:
        return check(st, wait_for(host_->background(id)));
      case k::delete_session:
        return check(st, wait_for(host_->delete_session(id)));
      case k::shell_exit:
        return open_gate(st);
      case k::wait_quiescent: {
        auto r = wait_for(quiescent(host_.get(), false));
        return r ? true : timed_out(st);
      }
      case k::wait_idle:
        return check(st, wait_for(host_->wait_idle(id)));
      case k::wait_parked:
      case k::wait_turn: {
        bool ok = st.what == k::wait_parked ? agents_->wait_parked(id, o_.wait_timeout)
                                            : agents_->wait_played(id, st.code, o_.wait_timeout);
        if (!ok) {
          res_.stuck = true;
          return timed_out(st);
        }
        return true;
      }
      case k::restart:
        close_host();
        if (!open_host()) {
          ++res_.failed;
          return false;
        }
        return true;
      case k::wait_shells:  // every shell is a job
      case k::wait_jobs: {
        auto r = wait_for(jobs_quiet(host_.get()));
        return r ? true : timed_out(st);
      }
      case k::job_read:
        return job_call(st);
      case k::wait_delegate:
        return delegate_wait(st);
      case k::expect:
        expect(st);
        return true;
      case k::crash:
        return step_failed(st, "a crash step inside a crash segment");
    }
    return true;
  }

  // `wait delegate NAME`: its originator's wait, until the task is terminal.
  bool delegate_wait(const step& st) {
    auto d = agents_->delegated(st.name);
    if (!d) return step_failed(st, "no delegate named '" + st.name + "' was started (yet)");
    auto scope = host_->scope_of(d->owner);
    if (!scope) return step_failed(st, scope.error().message);
    auto& reg = host_->delegation();
    auto r = wait_for(reg.wait(*scope, d->id, o_.wait_timeout));
    if (!r) return timed_out(st);
    if (!*r) return step_failed(st, r->error().message);
    if ((*r)->state == persistence::delegate_state::running) return timed_out(st);
    // Its notice is handed over after the terminal write: wait for that too.
    auto ended = wait_for(delegate_ended(reg, d->id));
    return ended ? true : timed_out(st);
  }
  static boost::asio::awaitable<result<void>> delegate_ended(actors::delegates& reg,
                                                             protocol::job_id id) {
    co_await reg.worker_ended(std::move(id));
    co_return result<void>{};
  }

  // `job NAME status|wait|cancel`: the call its owner's tools make, in the
  // scope of the owner session's current (or last) turn.
  bool job_call(const step& st) {
    auto j = agents_->job(st.name);
    if (!j) return step_failed(st, "no job named '" + st.name + "' was launched (yet)");
    auto scope = host_->scope_of(j->owner);
    if (!scope) return step_failed(st, scope.error().message);
    auto& q = host_->jobs();
    auto r = st.text == "status" ? wait_for(q.status(*scope, j->id))
             : st.text == "wait" ? wait_for(q.wait(*scope, j->id))
                                 : wait_for(q.cancel(*scope, j->id));
    if (!check(st, r)) return false;
    if (o_.verbose)
      say("..    ", st, "job " + j->id.str() + " is " + std::string(to_string((**r).state)));
    return true;
  }

  // Writes "CODE OUTPUT" into the gate; the shell reading it exits with CODE.
  bool open_gate(const step& st) {
    std::string out;
    for (char c : st.text) {
      if (c == '\\')
        out += "\\\\";
      else if (c == '\n')
        out += "\\n";
      else
        out += c;
    }
    std::string line = std::to_string(st.code) + " " + out + "\n";
    auto p = dir_ / "gates" / st.name;
    int fd = ::open(p.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0)
      return step_failed(st, "cannot open the gate " + p.string() + ": " + std::strerror(errno));
    auto n = ::write(fd, line.data(), line.size());
    ::close(fd);
    if (n != static_cast<ssize_t>(line.size()))
      return step_failed(st, "cannot write the gate " + p.string());
    return true;
  }

  void crash(std::size_t i) {
    const auto& st = s_.steps[i];
    if (o_.verbose) say("..    ", st);
    close_host();
    if (!o_.crash_segment) {
      ++res_.failed;
      say("FAIL  ", st, "this runner cannot start a crash process (no crash_segment)");
      return;
    }
    int status = o_.crash_segment(i, st.text);
    bool killed = WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL;
    record(killed, st, killed ? "" : describe_status(status));
  }

  void record(bool ok, const step& st, const std::string& got) {
    ok ? ++res_.passed : ++res_.failed;
    say(ok ? "ok    " : "FAIL  ", st, ok ? "" : got);
  }

  void expect(const step& st) {
    std::string got;
    bool ok = evaluate(st.expect, got);
    record(ok, st, got);
  }

  static bool compare(expectation::text_op op, const std::string& actual, const std::string& want) {
    switch (op) {
      case expectation::text_op::contains:
        return actual.find(want) != std::string::npos;
      case expectation::text_op::lacks:
        return actual.find(want) == std::string::npos;
      case expectation::text_op::equals:
        return actual == want;
    }
    return false;
  }

  template <class V>
  static const auto* pick(const std::vector<V>& rows, int position, std::string& got,
                          const char* what) {
    std::size_t n = rows.size();
    std::size_t p = position == -1 ? n : static_cast<std::size_t>(position);
    if (p < 1 || p > n) {
      got = std::string("there ") + (n == 1 ? "is 1 " : "are " + std::to_string(n) + " ") + what;
      return static_cast<const V*>(nullptr);
    }
    return &rows[p - 1];
  }

  bool number_is(long want, long have, std::string& got) {
    got = "got " + std::to_string(have);
    return want == have;
  }

  bool evaluate(const expectation& e, std::string& got) {
    using k = expectation::kind;
    auto& store = host_->store();
    session_id sid(e.session);
    auto failed_read = [&](const error& err) {
      got = "cannot read: " + err.message;
      return false;
    };
    switch (e.what) {
      case k::inbox_any:
      case k::inbox_none:
      case k::inbox_unordered: {
        auto rows = store.inbox(sid);
        if (!rows) return failed_read(rows.error());
        got = bodies(*rows);
        if (e.what == k::inbox_unordered) return matches_all(*rows, e.texts);
        bool some = std::any_of(rows->begin(), rows->end(),
                                [&](auto& row) { return compare(e.op, row.body, e.text); });
        return e.what == k::inbox_any ? some : !some;
      }
      case k::transcript_notices: {
        auto msgs = store.messages(sid);
        if (!msgs) return failed_read(msgs.error());
        long n =
            std::count_if(msgs->begin(), msgs->end(), [](auto& m) { return m.kind == "notice"; });
        return number_is(e.number, n, got);
      }
      case k::session_parent: {
        auto row = store.session(sid);
        if (!row) return failed_read(row.error());
        if (!*row) {
          got = "session '" + e.session + "' does not exist";
          return false;
        }
        std::string have = (*row)->parent ? (*row)->parent->str() : "none";
        got = "its parent is " + have;
        return have == e.text;
      }
      case k::job_state:
      case k::job_exit:
      case k::job_failing_stage:
      case k::job_stage_exit:
      case k::job_stage_signal:
      case k::job_receipts:
      case k::job_receipt:
      case k::job_notice:
        return evaluate_job(e, got);
      case k::delegate_state: {
        auto d = agents_->delegated(e.job);
        if (!d) {
          got = "no delegate named '" + e.job + "' was started";
          return false;
        }
        auto row = store.delegate(d->id);
        if (!row) return failed_read(row.error());
        if (!*row) {
          got = "delegated task " + d->id.str() + " has no row";
          return false;
        }
        std::string have(persistence::to_string((*row)->state));
        got = "it is " + have;
        return have == e.text;
      }
      case k::inbox_count:
      case k::inbox_text:
      case k::inbox_state:
      case k::inbox_id:
      case k::inbox_from: {
        auto rows = store.inbox(sid);
        if (!rows) return failed_read(rows.error());
        if (e.what == k::inbox_count) return number_is(e.number, rows->size(), got);
        auto* row = pick(*rows, e.position, got, "inbox row(s)");
        if (!row) return false;
        if (e.what == k::inbox_state) {
          got = std::string("it is ") + (row->acked ? "acked" : "pending");
          return row->acked == (e.text == "acked");
        }
        if (e.what == k::inbox_from) {
          got = "it is from " + (row->from ? row->from->str() : std::string("no session"));
          return row->from && row->from->str() == e.text;
        }
        if (e.what == k::inbox_id) {
          const auto id = row->nid.str();
          got = "its id is " + id;
          if (e.text == "prefix") return id.rfind(e.texts.at(0), 0) == 0;
          if (e.text == "equals") return id == e.texts.at(0);
          auto j = named(e.job, got);
          if (!j) return false;
          auto job = host_->store().job(j->id);
          if (!job) return failed_read(job.error());
          if (!*job || !persistence::is_terminal((*job)->state)) {
            got += "; job " + e.job + " has no terminal receipt yet";
            return false;
          }
          auto want = protocol::make_event_id(j->id, persistence::transition_of((*job)->state));
          got += "; job " + e.job + "'s terminal receipt is " + want.str();
          return id == want.str();
        }
        got = "the body is:\n" + indent(row->body);
        return compare(e.op, row->body, e.text);
      }
      case k::transcript_reports:
      case k::transcript_answers:
      case k::transcript_answer: {
        auto msgs = store.messages(sid);
        if (!msgs) return failed_read(msgs.error());
        long reports = 0, answers = 0;
        const persistence::message_row* last = nullptr;
        for (auto& m : *msgs) {
          reports += m.kind == "report";
          if (m.role == "assistant") {
            ++answers;
            if (m.status == "completed") last = &m;
          }
        }
        if (e.what == k::transcript_reports) return number_is(e.number, reports, got);
        if (e.what == k::transcript_answers) return number_is(e.number, answers, got);
        if (!last) {
          got = "the transcript has no completed answer";
          return false;
        }
        got = "the last answer is:\n" + indent(last->text);
        return compare(e.op, last->text, e.text);
      }
      case k::jobs_count: {
        // The outbox view: running tasks and owed reports (delivered tasks
        // stay in the store, terminal, and are not counted).
        auto jobs = store.outstanding_jobs();
        if (!jobs) return failed_read(jobs.error());
        // Shells are owned jobs: live ones run; a terminal one is outstanding
        // while its terminal receipt is pending. Its owner is its `child`.
        auto live = host_->store().live_jobs();
        if (!live) return failed_read(live.error());
        auto pending = host_->store().pending_receipts();
        if (!pending) return failed_read(pending.error());
        auto shell_row = [](const persistence::owned_job& j, persistence::job_status st) {
          persistence::job_row r;
          r.id = j.id;
          r.kind = "shell";
          r.child = j.scope.thread;
          r.status = st;
          return r;
        };
        for (auto& j : *live) jobs->push_back(shell_row(j, persistence::job_status::running));
        for (auto& rc : *pending) {
          if (rc.transition == protocol::transition::started) continue;
          auto j = host_->store().job(rc.job);
          if (!j) return failed_read(j.error());
          if (!*j) continue;  // a subagent's receipt: counted above
          auto st = rc.transition == protocol::transition::completed
                        ? persistence::job_status::completed
                    : rc.transition == protocol::transition::cancelled
                        ? persistence::job_status::cancelled
                        : persistence::job_status::error;
          jobs->push_back(shell_row(**j, st));
        }
        long n = 0;
        for (auto& j : *jobs) {
          if (!e.status.empty() && to_string(j.status) != e.status) continue;
          if (!e.job_kind.empty() && j.kind != e.job_kind) continue;
          if (!e.mode.empty() && j.mode != e.mode) continue;
          if (!e.parent.empty() && (!j.parent || j.parent->str() != e.parent)) continue;
          if (!e.child.empty() && (!j.child || j.child->str() != e.child)) continue;
          ++n;
        }
        bool ok = number_is(e.number, n, got);
        if (!ok)
          for (auto& j : *jobs)
            got += "\n          | " + j.id.str() + " " + j.kind + " " + j.mode + " " +
                   std::string(to_string(j.status)) +
                   " parent=" + (j.parent ? j.parent->str() : "-") +
                   " child=" + (j.child ? j.child->str() : "-");
        return ok;
      }
      case k::inline_count:
        return number_is(e.number, agents_->inline_results().size(), got);
      case k::inline_text: {
        auto results = agents_->inline_results();
        auto* r = pick(results, e.position, got, "inline result(s)");
        if (!r) return false;
        got = "the inline result is:\n" + indent(*r);
        return compare(e.op, *r, e.text);
      }
      case k::session_word:
      case k::session_notify:
      case k::session_outcome:
      case k::session_policy:
      case k::session_resumes: {
        auto row = store.session(sid);
        if (!row) return failed_read(row.error());
        if (!*row) {
          got = "session '" + e.session + "' does not exist";
          return e.text == "gone";
        }
        if (e.text == "gone") {
          got = "it exists";
          return false;
        }
        auto& s = **row;
        if (e.what == k::session_resumes) return number_is(e.number, s.resume_attempts, got);
        std::string have;
        if (e.what == k::session_notify)
          have = !s.notify ? "default" : *s.notify ? "on" : "off";
        else if (e.what == k::session_outcome)
          have = s.idle_outcome.value_or("none");
        else if (e.what == k::session_policy)
          have = s.job_policy;
        else if (e.text == "idle" || e.text == "busy")
          have = s.busy ? "busy" : "idle";
        else
          have = s.time_suspended ? "claimed" : "unclaimed";
        got = "it is " + have;
        return have == e.text;
      }
      case k::boot_field: {
        const auto& b = boot_;
        std::map<std::string, long> f = {{"delivered", b.delivered},
                                         {"cleared", b.cleared},
                                         {"kept", b.kept},
                                         {"exhausted", b.exhausted},
                                         {"resumed_top", b.resumed_top},
                                         {"resumed_children", b.resumed_children},
                                         {"jobs_reattached", b.jobs.reattached},
                                         {"jobs_finished_while_down", b.jobs.finished_while_down},
                                         {"jobs_lost", b.jobs.lost},
                                         {"jobs_redelivered", b.jobs.redelivered}};
        return number_is(e.number, f[e.text], got);
      }
    }
    return false;
  }

  static std::string bodies(const std::vector<persistence::inbox_row>& rows) {
    if (rows.empty()) return "the inbox is empty";
    std::string out = "the bodies are:";
    int n = 0;
    for (auto& r : rows) out += "\n" + indent("[" + std::to_string(++n) + "] " + r.body);
    return out;
  }

  // Each text in a row of its own, whatever the order: a matching of texts
  // to rows (augmenting paths; inboxes here are small).
  static bool matches_all(const std::vector<persistence::inbox_row>& rows,
                          const std::vector<std::string>& texts) {
    std::vector<int> row_of_text(texts.size(), -1), text_of_row(rows.size(), -1);
    std::function<bool(std::size_t, std::vector<bool>&)> place = [&](std::size_t t,
                                                                     std::vector<bool>& seen) {
      for (std::size_t r = 0; r < rows.size(); ++r) {
        if (seen[r] || rows[r].body.find(texts[t]) == std::string::npos) continue;
        seen[r] = true;
        if (text_of_row[r] < 0 || place(static_cast<std::size_t>(text_of_row[r]), seen)) {
          text_of_row[r] = static_cast<int>(t);
          row_of_text[t] = static_cast<int>(r);
          return true;
        }
      }
      return false;
    };
    for (std::size_t t = 0; t < texts.size(); ++t) {
      std::vector<bool> seen(rows.size(), false);
      if (!place(t, seen)) return false;
    }
    return true;
  }

  std::optional<scripted_agents::named_job> named(const std::string& name, std::string& got) {
    auto j = agents_->job(name);
    if (!j) got = "no job named '" + name + "' was launched (yet)";
    return j;
  }

  bool evaluate_job(const expectation& e, std::string& got) {
    using k = expectation::kind;
    auto j = named(e.job, got);
    if (!j) return false;
    auto& receipts = host_->store();
    auto row = receipts.job(j->id);
    if (!row || !*row) {
      got = row ? "job " + j->id.str() + " has no row" : "cannot read: " + row.error().message;
      return false;
    }
    const auto& job = **row;
    const std::string state(persistence::to_string(job.state));
    if (e.what == k::job_state) {
      got = "it is " + state;
      return state == e.text;
    }
    if (e.what == k::job_receipts) {
      auto rs = receipts.receipts_of(j->id);
      if (!rs) return failed(got, rs.error());
      got = "got " + std::to_string(rs->size()) + ":";
      for (auto& r : *rs)
        got += " " + r.id.str() + " (" + std::string(persistence::to_string(r.state)) + ")";
      return static_cast<long>(rs->size()) == e.number;
    }
    if (!persistence::is_terminal(job.state)) {
      got = "job " + e.job + " is " + state + ", not terminal yet";
      return false;
    }
    if (e.what == k::job_receipt || e.what == k::job_notice) {
      auto rid = protocol::make_event_id(j->id, persistence::transition_of(job.state));
      auto r = receipts.receipt_by_id(rid);
      if (!r) return failed(got, r.error());
      if (e.what == k::job_receipt) {
        std::string have = *r ? std::string(persistence::to_string((**r).state)) : "none";
        got = rid.str() + " is " + have;
        return have == e.text;
      }
      if (!*r) {
        got = "job " + e.job + " has no " + rid.str() + " receipt";
        return false;
      }
      got = "the notice is:\n" + indent((**r).body);
      return compare(e.op, (**r).body, e.text);
    }
    if (!job.completion) {
      got = "job " + e.job + " (" + state + ") has no completion";
      return false;
    }
    const auto& st = job.completion->status;
    if (e.what == k::job_exit) return number_is(e.number, st.exit_code, got);
    if (e.what == k::job_failing_stage) {
      long have = st.failing_stage < 0 ? 0 : st.failing_stage + 1;
      got = have == 0 ? "no stage failed" : "stage " + std::to_string(have) + " failed";
      return have == e.number;
    }
    if (e.stage < 1 || static_cast<std::size_t>(e.stage) > st.stages.size()) {
      got = "the job has " + std::to_string(st.stages.size()) + " stage status(es)";
      return false;
    }
    const auto& stage = st.stages[static_cast<std::size_t>(e.stage) - 1];
    if (e.what == k::job_stage_exit) return number_is(e.number, stage.code, got);
    got = stage.signal ? "it was killed by " + protocol::signal_name(stage.signal)
                       : "no signal ended it (exit " + std::to_string(stage.code) + ")";
    return stage.signal == e.number;
  }

  static bool failed(std::string& got, const error& err) {
    got = "cannot read: " + err.message;
    return false;
  }

  const script& s_;
  run_options o_;
  std::ostream& out_;
  std::mutex log_m_;
  std::shared_ptr<scripted_agents> agents_;
  std::unique_ptr<host> host_;
  boot_report boot_;
  fs::path dir_;
  std::vector<int> gate_fds_;
  std::optional<sandbox::daemon_handle> daemon_;
  run_result res_;
};

}  // namespace

run_result run(const script& s, run_options opts) {
  runner r(s, std::move(opts));
  return r.run();
}

int run_crash_segment(const script& s, run_options opts, std::size_t crash_step) {
  runner r(s, std::move(opts));
  return r.crash_segment(crash_step);
}

}  // namespace tether::testing::scenario
