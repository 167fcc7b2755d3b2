#include "tether/protocol/notice.hpp"

#include <array>
#include <charconv>
#include <cstring>

#include "tether/protocol/output_tail.hpp"

namespace tether::protocol {

std::string_view to_string(job_state s) {
  switch (s) {
    case job_state::running:
      return "running";
    case job_state::exited:
      return "exited";
    case job_state::killed:
      return "killed";
    case job_state::unknown:
      return "unknown";
  }
  return "unknown";
}

bool parse(std::string_view s, job_state& out) {
  for (auto v : {job_state::running, job_state::exited, job_state::killed, job_state::unknown})
    if (s == to_string(v)) {
      out = v;
      return true;
    }
  return false;
}

std::string_view to_string(capture_kind c) {
  switch (c) {
    case capture_kind::per_stage:
      return "per_stage";
    case capture_kind::shell_only:
      return "shell_only";
    case capture_kind::none:
      return "none";
  }
  return "none";
}

bool parse(std::string_view s, capture_kind& out) {
  for (auto v : {capture_kind::per_stage, capture_kind::shell_only, capture_kind::none})
    if (s == to_string(v)) {
      out = v;
      return true;
    }
  return false;
}

std::string signal_name(int sig) {
  static constexpr std::array<const char*, 32> names = {
      nullptr,     "SIGHUP",  "SIGINT",    "SIGQUIT", "SIGILL",   "SIGTRAP", "SIGABRT", "SIGBUS",
      "SIGFPE",    "SIGKILL", "SIGUSR1",   "SIGSEGV", "SIGUSR2",  "SIGPIPE", "SIGALRM", "SIGTERM",
      "SIGSTKFLT", "SIGCHLD", "SIGCONT",   "SIGSTOP", "SIGTSTP",  "SIGTTIN", "SIGTTOU", "SIGURG",
      "SIGXCPU",   "SIGXFSZ", "SIGVTALRM", "SIGPROF", "SIGWINCH", "SIGIO",   "SIGPWR",  "SIGSYS"};
  if (sig > 0 && sig < static_cast<int>(names.size())) return names[sig];
  return "signal " + std::to_string(sig);
}

// ---- the last pipeline of a command list ----------------------------------

namespace {

bool is_space(char c) {
  return c == ' ' || c == '\t';
}
bool is_word_end(char c) {
  return is_space(c) || c == '\n' || c == ';' || c == '&' || c == '|' || c == ')' || c == '(';
}

std::string trim(std::string_view s) {
  while (!s.empty() && (is_space(s.front()) || s.front() == '\n')) s.remove_prefix(1);
  while (!s.empty() && (is_space(s.back()) || s.back() == '\n')) s.remove_suffix(1);
  return std::string(s);
}

class pipeline_splitter {
 public:
  explicit pipeline_splitter(std::string_view s) : s_(s) {}

  pipeline_shape last() {
    std::size_t i = 0;
    std::size_t stage_start = 0;
    std::vector<std::string> current;
    std::vector<std::string> last_nonempty;
    bool command_start = true;
    auto end_stage = [&](std::size_t at) {
      current.push_back(trim(s_.substr(stage_start, at - stage_start)));
    };
    auto end_pipeline = [&](std::size_t at) {
      end_stage(at);
      bool any = false;
      for (auto& st : current) any = any || !st.empty();
      if (any) last_nonempty = current;
      current.clear();
    };
    while (i < s_.size()) {
      char c = s_[i];
      if (c == '\\') {
        i += 2;
        command_start = false;
        continue;
      }
      if (c == '\'') {
        auto e = s_.find('\'', i + 1);
        i = e == std::string_view::npos ? s_.size() : e + 1;
        command_start = false;
        continue;
      }
      if (c == '"' || c == '`') {
        i = skip_quoted(i, c);
        command_start = false;
        continue;
      }
      if (c == '#' && (i == 0 || is_space(s_[i - 1]) || s_[i - 1] == '\n')) {
        auto e = s_.find('\n', i);
        i = e == std::string_view::npos ? s_.size() : e;
        continue;
      }
      if (c == '<' && s_.substr(i, 2) == "<<" && s_.substr(i, 3) != "<<<") {
        i = note_heredoc(i + 2);
        continue;
      }
      if (c == '(') {
        ++depth_;
        ++i;
        command_start = true;
        continue;
      }
      if (c == ')') {
        if (depth_ > 0) --depth_;
        ++i;
        continue;
      }
      if (command_start && !is_space(c) && c != '\n') {
        // A word in command position may open or close a compound command.
        std::size_t e = i;
        while (e < s_.size() && !is_word_end(s_[e])) ++e;
        std::string_view w = s_.substr(i, e - i);
        if (w == "{" || w == "if" || w == "for" || w == "while" || w == "until" || w == "case" ||
            w == "select") {
          ++depth_;
        } else if (w == "}" || w == "fi" || w == "done" || w == "esac") {
          if (depth_ > 0) --depth_;
        }
        bool keeps_start = w == "{" || w == "!" || w == "then" || w == "do" || w == "else" ||
                           w == "elif" || w == "time" || w == "if" || w == "while" || w == "until";
        command_start = keeps_start;
        i = e;
        continue;
      }
      if (c == '\n' && !pending_heredocs_.empty()) {
        if (depth_ == 0) end_pipeline(i);
        i = skip_heredoc_bodies(i + 1);
        if (depth_ == 0) stage_start = i;
        command_start = true;
        continue;
      }
      if (depth_ == 0) {
        bool prev_redirect = i > 0 && (s_[i - 1] == '>' || s_[i - 1] == '<');
        if (c == '\n' || c == ';') {
          end_pipeline(i);
          stage_start = ++i;
          command_start = true;
          continue;
        }
        if (c == '&') {
          if (s_.substr(i, 2) == "&&") {
            end_pipeline(i);
            i += 2;
            stage_start = i;
            command_start = true;
            continue;
          }
          if (!prev_redirect && s_.substr(i, 2) != "&>") {
            end_pipeline(i);
            stage_start = ++i;
            command_start = true;
            continue;
          }
        }
        if (c == '|') {
          if (s_.substr(i, 2) == "||") {
            end_pipeline(i);
            i += 2;
            stage_start = i;
            command_start = true;
            continue;
          }
          if (!(i > 0 && s_[i - 1] == '>')) {
            end_stage(i);
            i += s_.substr(i, 2) == "|&" ? 2 : 1;
            stage_start = i;
            command_start = true;
            continue;
          }
        }
      } else if (c == '\n' || c == ';' || c == '&' || c == '|') {
        command_start = c != '&' || s_.substr(i, 2) == "&&";
        ++i;
        continue;
      }
      if (!is_space(c)) command_start = false;
      ++i;
    }
    end_pipeline(s_.size());
    pipeline_shape shape;
    if (!last_nonempty.empty()) {
      auto& first = last_nonempty.front();
      if (first.size() >= 2 && first[0] == '!' && is_space(first[1])) {
        shape.negated = true;
        first = trim(std::string_view(first).substr(1));
      }
    }
    shape.stages = std::move(last_nonempty);
    return shape;
  }

 private:
  std::size_t skip_quoted(std::size_t i, char q) {
    for (++i; i < s_.size(); ++i) {
      if (s_[i] == '\\') {
        ++i;
        continue;
      }
      if (s_[i] == q) return i + 1;
    }
    return s_.size();
  }

  // After "<<": remembers the delimiter; the body starts at the next newline.
  std::size_t note_heredoc(std::size_t i) {
    bool strip_tabs = i < s_.size() && s_[i] == '-';
    if (strip_tabs) ++i;
    while (i < s_.size() && is_space(s_[i])) ++i;
    std::string delim;
    while (i < s_.size() && !is_word_end(s_[i]) && s_[i] != '<' && s_[i] != '>') {
      if (s_[i] != '\'' && s_[i] != '"' && s_[i] != '\\') delim.push_back(s_[i]);
      ++i;
    }
    if (!delim.empty()) pending_heredocs_.push_back({delim, strip_tabs});
    return i;
  }

  std::size_t skip_heredoc_bodies(std::size_t i) {
    for (auto& h : pending_heredocs_) {
      while (i < s_.size()) {
        auto e = s_.find('\n', i);
        std::string_view line = s_.substr(i, e == std::string_view::npos ? s_.npos : e - i);
        if (h.strip_tabs)
          while (!line.empty() && line.front() == '\t') line.remove_prefix(1);
        i = e == std::string_view::npos ? s_.size() : e + 1;
        if (line == h.delim) break;
      }
    }
    pending_heredocs_.clear();
    return i;
  }

  struct heredoc {
    std::string delim;
    bool strip_tabs;
  };
  std::string_view s_;
  int depth_ = 0;
  std::vector<heredoc> pending_heredocs_;
};

bool parse_int(std::string_view s, int& out) {
  auto r = std::from_chars(s.data(), s.data() + s.size(), out);
  return r.ec == std::errc() && r.ptr == s.data() + s.size();
}

std::optional<std::vector<int>> parse_capture(std::string_view line) {
  while (!line.empty() && (line.back() == '\n' || line.back() == ' ')) line.remove_suffix(1);
  constexpr std::string_view tag = "pipestatus ";
  if (line.substr(0, tag.size()) != tag) return std::nullopt;
  line.remove_prefix(tag.size());
  std::vector<int> v;
  while (!line.empty()) {
    auto sp = line.find(' ');
    int n;
    if (!parse_int(line.substr(0, sp), n) || n < 0 || n > 255) return std::nullopt;
    v.push_back(n);
    if (sp == std::string_view::npos) break;
    line.remove_prefix(sp + 1);
  }
  if (v.size() < 2) return std::nullopt;
  return v;
}

int stage_signal(int code) {
  return code > 128 && code <= 128 + 64 ? code - 128 : 0;
}

}  // namespace

pipeline_shape last_pipeline(std::string_view command) {
  return pipeline_splitter(command).last();
}

std::string capture_script(std::string_view command) {
  std::string s(command);
  s += "\n__tether_ps=(\"${PIPESTATUS[@]}\" \"$?\"); "
       "printf 'pipestatus %s\\n' \"${__tether_ps[*]}\" >&63; "
       "exit \"${__tether_ps[-1]}\"";
  return s;
}

std::optional<std::string> find_capture_line(std::string_view text) {
  auto pos = text.rfind("pipestatus ");
  if (pos == std::string_view::npos) return std::nullopt;
  auto end = text.find('\n', pos);
  return std::string(text.substr(pos, end == std::string_view::npos ? end : end - pos));
}

job_status judge(const launch_outcome& o, const pipeline_shape& shape) {
  job_status s;
  std::optional<std::vector<int>> cap;
  if (o.capture_line) cap = parse_capture(*o.capture_line);
  if (o.shell) {
    if (o.shell->signalled) {
      s.signal = o.shell->code;
      s.shell_code = 128 + o.shell->code;
    } else {
      s.shell_code = o.shell->code;
    }
  }
  if (cap) {
    int dollar = cap->back();
    if (!o.shell) s.shell_code = dollar;
    s.capture = capture_kind::per_stage;
    bool negated = shape.negated;
    const auto& names = shape.stages;
    std::size_t n = cap->size() - 1;
    bool named = names.size() == n;
    std::vector<std::string> notes;
    for (std::size_t i = 0; i < n; ++i) {
      stage_status st;
      st.code = (*cap)[i];
      st.signal = stage_signal(st.code);
      if (named) st.command = names[i];
      s.stages.push_back(std::move(st));
    }
    if (negated) {
      notes.push_back("the last pipeline is negated with '!', so its stages do not decide");
    } else {
      for (std::size_t i = 0; i < n; ++i) {
        const auto& st = s.stages[i];
        if (st.code == 0) continue;
        if (st.signal == 13 && i + 1 < n) {
          notes.push_back("stage " + std::to_string(i + 1) +
                          " was ended by SIGPIPE after its reader stopped reading");
          continue;
        }
        s.failing_stage = static_cast<int>(i);
        break;
      }
    }
    s.exit_code = s.failing_stage >= 0 ? s.stages[s.failing_stage].code : s.shell_code;
    for (auto& n2 : notes) s.reason += (s.reason.empty() ? "" : "; ") + n2;
    s.state = o.kill_requested ? job_state::killed : job_state::exited;
    return s;
  }
  if (o.shell) {
    s.capture = capture_kind::shell_only;
    s.exit_code = s.shell_code;
    s.reason = o.shell->signalled
                   ? "per-stage capture did not run because the shell itself was killed"
                   : "per-stage capture did not run (the command ended the shell itself, e.g. "
                     "with exit or exec, or did not parse)";
    if (o.capture_line) s.reason = "the launcher's capture line did not parse";
    s.state = o.kill_requested ? job_state::killed : job_state::exited;
    return s;
  }
  s.state = job_state::unknown;
  s.exit_code = -1;
  s.capture = capture_kind::none;
  s.reason = o.unknown_reason.empty() ? "the exit status was not observed" : o.unknown_reason;
  return s;
}

// ---- rendering ---------------------------------------------------------------

command_preview make_preview(std::string_view scrubbed_command, std::size_t max_bytes) {
  std::string one_line;
  one_line.reserve(scrubbed_command.size());
  std::string_view s = scrubbed_command;
  while (!s.empty() && (s.back() == '\n' || is_space(s.back()))) s.remove_suffix(1);
  for (char c : s) {
    if (c == '\n')
      one_line += "\xE2\x8F\x8E";  // ⏎
    else if (c == '\r' || c == '\t')
      one_line += ' ';
    else
      one_line += c;
  }
  one_line = utf8_sanitize(one_line);
  command_preview p;
  auto cut = utf8_prefix(one_line, max_bytes);
  p.truncated_bytes = one_line.size() - cut.size();
  p.text.assign(cut);
  return p;
}

std::string escape_controls(std::string_view s) {
  static constexpr char hex[] = "0123456789abcdef";
  std::string out;
  out.reserve(s.size());
  for (std::size_t i = 0; i < s.size(); ++i) {
    auto c = static_cast<unsigned char>(s[i]);
    if (c == '\r' && i + 1 < s.size() && s[i + 1] == '\n') continue;  // CRLF: one line break
    if ((c < 0x20 && c != '\n' && c != '\t') || c == 0x7f) {
      out += "\\x";
      out += hex[c >> 4];
      out += hex[c & 15];
    } else if (c == 0xC2 && i + 1 < s.size() && static_cast<unsigned char>(s[i + 1]) >= 0x80 &&
               static_cast<unsigned char>(s[i + 1]) <= 0x9F) {
      auto d = static_cast<unsigned char>(s[++i]);  // U+0080..U+009F, a C1 control
      out += "\\u00";
      out += hex[d >> 4];
      out += hex[d & 15];
    } else {
      out += static_cast<char>(c);
    }
  }
  return out;
}

namespace {

std::string bounded(std::string_view s, std::size_t max) {
  auto cut = utf8_prefix(s, max);
  std::string out(cut);
  if (cut.size() < s.size()) out += "...";
  return out;
}

std::string stage_label(const job_status& s, std::size_t i) {
  std::string out = "stage " + std::to_string(i + 1) + " of " + std::to_string(s.stages.size());
  if (!s.stages[i].command.empty()) out += " (" + bounded(s.stages[i].command, 80) + ")";
  return out;
}

std::string code_text(int code, int sig) {
  if (sig) return "killed by " + signal_name(sig) + " (exit " + std::to_string(code) + ")";
  return "exit " + std::to_string(code);
}

std::string stage_codes(const job_status& s) {
  std::string out;
  for (auto& st : s.stages) out += (out.empty() ? "" : " ") + std::to_string(st.code);
  return out;
}

}  // namespace

std::string render_status_line(const job_status& s) {
  std::string out;
  switch (s.state) {
    case job_state::running:
      return "still running";
    case job_state::unknown:
      return "exit -1 (status unknown: " + s.reason + ")";
    case job_state::killed:
      out = "stopped on request; ";
      break;
    case job_state::exited:
      break;
  }
  if (s.failing_stage >= 0) {
    const auto& st = s.stages[s.failing_stage];
    out += stage_label(s, static_cast<std::size_t>(s.failing_stage)) +
           " failed: " + code_text(st.code, st.signal);
    if (s.stages.size() > 1) out += "; stage statuses " + stage_codes(s);
    out += "; the pipeline's own status was " + std::to_string(s.shell_code);
  } else {
    out += code_text(s.shell_code, s.signal ? s.signal : 0);
    if (s.stages.size() > 1) out += "; stage statuses " + stage_codes(s);
  }
  if (s.capture == capture_kind::shell_only)
    out += " (the shell's status only: " + s.reason + ")";
  else if (!s.reason.empty())
    out += " (note: " + s.reason + ")";
  return out;
}

int exit_code_for(const job_status& s) {
  if (s.state == job_state::unknown || s.exit_code < 0) return 255;
  return s.exit_code > 255 ? 255 : s.exit_code;
}

std::string render_notice(const shell_completion& c) {
  const auto& s = c.status;
  std::string verdict;
  switch (s.state) {
    case job_state::running:
      verdict = "is still running";
      break;
    case job_state::unknown:
      verdict = "ended with unknown status";
      break;
    case job_state::killed:
      verdict = "was stopped";
      break;
    case job_state::exited:
      verdict = s.exit_code == 0 ? "succeeded" : "failed";
      break;
  }
  std::string out = "[tether] background job " + c.job + " " + verdict + "\n";
  out += "command: " + escape_controls(c.preview.text);
  if (c.preview.truncated_bytes)
    out += " [... " + std::to_string(c.preview.truncated_bytes) + " more bytes not shown]";
  out += "\nstatus: " + escape_controls(render_status_line(s)) + "\n";
  if (c.output_bytes == 0 && c.tail.empty()) {
    out += "output: none\n";
    return out;
  }
  out += "output: " + std::to_string(c.output_bytes) + " bytes; last " +
         std::to_string(c.tail_lines) + (c.tail_lines == 1 ? " line" : " lines") + ":\n";
  if (c.tail_omitted_bytes)
    out += "[... " + std::to_string(c.tail_omitted_bytes) + " earlier bytes left out ...]\n";
  // Every output line is fenced with "| ", so no output can pass for a line of
  // the notice itself, and no control byte reaches a terminal or the model raw.
  std::string tail = escape_controls(c.tail);
  std::size_t b = 0;
  while (b < tail.size()) {
    std::size_t e = tail.find('\n', b);
    if (e == std::string::npos) e = tail.size();
    out += k_tail_fence;
    out.append(tail, b, e - b);
    out += '\n';
    b = e + 1;
  }
  return out;
}

}  // namespace tether::protocol
