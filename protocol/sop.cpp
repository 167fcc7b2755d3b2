#include "tether/protocol/sop.hpp"

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

namespace tether::protocol {

namespace {

constexpr std::int64_t k_mib = 1024 * 1024;
constexpr std::size_t k_max_text = 64 * 1024;  // a command or a prompt, in bytes
constexpr std::int64_t k_no_max = std::numeric_limits<std::int64_t>::max();

struct range {
  std::int64_t lo, hi;
};
constexpr range k_retries{0, 100};
constexpr range k_max_visits{1, 100000};
constexpr range k_timeout{0, k_no_max};
constexpr range k_max_output{1, k_mib};
constexpr range k_max_concurrent{1, 10000};
constexpr range k_max_payload{0, k_mib};

constexpr std::array<std::string_view, 9> k_sop_keys = {
    "name",      "description",         "agent",      "max_concurrent", "max_payload_bytes",
    "approvers", "approval_timeout_ms", "on_timeout", "steps"};
constexpr std::array<std::string_view, 15> k_step_keys = {"name",
                                                          "kind",
                                                          "command",
                                                          "cwd",
                                                          "prompt",
                                                          "next",
                                                          "on_failure",
                                                          "retries",
                                                          "max_visits",
                                                          "timeout_ms",
                                                          "max_output_bytes",
                                                          "idempotent",
                                                          "approvers",
                                                          "approval_timeout_ms",
                                                          "on_timeout"};
constexpr std::array<sop_step_kind, 4> k_kinds = {sop_step_kind::shell, sop_step_kind::prompt,
                                                  sop_step_kind::approval,
                                                  sop_step_kind::checkpoint};
constexpr std::array<sop_timeout_action, 3> k_actions = {
    sop_timeout_action::escalate, sop_timeout_action::cancel, sop_timeout_action::auto_approve};

std::string in_quotes(std::string_view s) {
  return "'" + std::string(s) + "'";
}

decode_error under(const std::string& prefix, const decode_error& e) {
  if (prefix.empty()) return e;
  return decode_error{e.field.empty() ? prefix : prefix + "." + e.field, e.problem};
}

bool name_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
         c == '.' || c == '-';
}

template <std::size_t N>
std::optional<decode_error> unknown_key(const fields& f, const std::array<std::string_view, N>& k) {
  for (const auto& kv : f.obj())
    if (std::find(k.begin(), k.end(), std::string_view(kv.key())) == k.end()) {
      std::string known;
      for (auto n : k) known += (known.empty() ? "" : ", ") + std::string(n);
      return decode_error{f.path(kv.key()), "unknown field (known: " + known + ")"};
    }
  return std::nullopt;
}

// "steps[2] (deploy)": how an error names a step.
std::string step_path(std::size_t i, std::string_view name) {
  std::string p = "steps[" + std::to_string(i) + "]";
  if (!name.empty()) p += " (" + std::string(name) + ")";
  return p;
}

std::string a_step(sop_step_kind k) {
  return (k == sop_step_kind::approval ? "an " : "a ") + std::string(to_string(k)) + " step";
}

std::optional<decode_error> outside(std::string field, std::int64_t v, range r) {
  if (v >= r.lo && v <= r.hi) return std::nullopt;
  std::string want = r.hi == k_no_max ? ">= " + std::to_string(r.lo)
                                      : "in " + std::to_string(r.lo) + ".." + std::to_string(r.hi);
  return decode_error{std::move(field), "must be " + want + ", not " + std::to_string(v)};
}

std::int64_t as_i64(std::size_t n) {
  return static_cast<std::int64_t>(std::min<std::size_t>(n, k_no_max));
}

std::optional<decode_error> check_name(std::string field, const std::string& name) {
  if (name.empty() || name.size() > 64 || !std::all_of(name.begin(), name.end(), name_char))
    return decode_error{std::move(field), in_quotes(name) + " is not 1..64 of A-Z a-z 0-9 _ . -"};
  return std::nullopt;
}

std::optional<decode_error> check_approvers(const std::string& field,
                                            const std::vector<std::string>& names) {
  for (std::size_t i = 0; i < names.size(); ++i)
    if (names[i].empty())
      return decode_error{field + "[" + std::to_string(i) + "]", "an approver is a non-empty name"};
  return std::nullopt;
}

std::optional<decode_error> check_text(const char* field, const std::string& text,
                                       sop_step_kind k) {
  if (text.empty()) return decode_error{field, a_step(k) + " needs a " + field};
  if (text.size() > k_max_text)
    return decode_error{field, "is " + std::to_string(text.size()) + " bytes, more than " +
                                   std::to_string(k_max_text)};
  return std::nullopt;
}

std::optional<decode_error> check_target(const sop_definition& d, const char* field,
                                         const std::string& target) {
  if (target.empty() || target == sop_end || target == sop_fail || d.index_of(target))
    return std::nullopt;
  return decode_error{field, in_quotes(target) + " is not a step of this SOP, \"end\" or \"fail\""};
}

// Step i's problems, with fields relative to the step.
std::optional<decode_error> check_step(const sop_definition& d, std::size_t i) {
  const sop_step& s = d.steps[i];
  if (auto e = check_name("name", s.name)) return e;
  if (s.name == sop_end || s.name == sop_fail)
    return decode_error{"name", in_quotes(s.name) + " is reserved (a transition target)"};
  for (std::size_t k = 0; k < i; ++k)
    if (d.steps[k].name == s.name)
      return decode_error{"name", "duplicate of " + step_path(k, d.steps[k].name)};
  switch (s.kind) {
    case sop_step_kind::shell:
      if (auto e = check_text("command", s.command, s.kind)) return e;
      if (!s.cwd.empty() && s.cwd.front() != '/')
        return decode_error{"cwd", in_quotes(s.cwd) + " is not an absolute path"};
      break;
    case sop_step_kind::prompt:
      if (auto e = check_text("prompt", s.prompt, s.kind)) return e;
      break;
    case sop_step_kind::approval:
    case sop_step_kind::checkpoint:
      break;
  }
  if (s.kind != sop_step_kind::shell && !s.command.empty())
    return decode_error{"command", a_step(s.kind) + " has no command"};
  if (s.kind != sop_step_kind::prompt && !s.prompt.empty())
    return decode_error{"prompt", a_step(s.kind) + " has no prompt"};
  if (s.kind != sop_step_kind::shell && !s.cwd.empty())
    return decode_error{"cwd", "only a shell step has a cwd"};
  if (s.kind != sop_step_kind::approval) {
    if (!s.approvers.empty())
      return decode_error{"approvers", "only an approval step has approvers"};
    if (s.approval_timeout_ms)
      return decode_error{"approval_timeout_ms", "only an approval step has an approval timeout"};
    if (s.on_timeout)
      return decode_error{"on_timeout", "only an approval step has a timeout action"};
  }
  if (auto e = outside("retries", s.retries, k_retries)) return e;
  if (auto e = outside("max_visits", s.max_visits, k_max_visits)) return e;
  if (auto e = outside("timeout_ms", s.timeout_ms, k_timeout)) return e;
  if (auto e = outside("max_output_bytes", as_i64(s.max_output_bytes), k_max_output)) return e;
  if (auto e = check_approvers("approvers", s.approvers)) return e;
  if (s.approval_timeout_ms)
    if (auto e = outside("approval_timeout_ms", *s.approval_timeout_ms, k_timeout)) return e;
  if (auto e = check_target(d, "next", s.next)) return e;
  if (auto e = check_target(d, "on_failure", s.on_failure)) return e;
  // Nobody may approve and no timeout fires (whatever its action): only a
  // cancel from outside could end the wait.
  if (s.kind == sop_step_kind::approval && d.approvers_of(i).empty() &&
      d.approval_timeout_of(i) == 0)
    return decode_error{"approvers",
                        "nobody may approve (neither the step nor the SOP names an approver) and "
                        "the approval timeout is 0 (none): the wait could never end; name an "
                        "approver or set approval_timeout_ms"};
  return std::nullopt;
}

// ---- decoding --------------------------------------------------------------

template <class T>
std::optional<decode_error> read_int(const fields& f, std::string_view key, range r, T& out) {
  auto n = f.opt_i64(key);
  if (!n) return n.error();
  if (!*n) return std::nullopt;
  if (auto e = outside(f.path(key), **n, r)) return e;
  out = static_cast<T>(**n);
  return std::nullopt;
}

std::optional<decode_error> read_str(const fields& f, std::string_view key, std::string& out) {
  auto s = f.opt_str(key);
  if (!s) return s.error();
  if (*s) out = std::move(**s);
  return std::nullopt;
}

std::optional<decode_error> read_names(const fields& f, std::string_view key,
                                       std::vector<std::string>& out) {
  if (!f.has(key)) return std::nullopt;
  auto a = f.array(key);
  if (!a) return a.error();
  for (std::size_t i = 0; i < (*a)->size(); ++i) {
    const auto& v = (**a)[i];
    if (!v.is_string())
      return decode_error{
          f.path(key) + "[" + std::to_string(i) + "]",
          std::string("expected a string, got ") + json::to_string(v.kind()).data()};
    out.emplace_back(v.get_string());
  }
  return std::nullopt;
}

template <class E, std::size_t N>
decoded<std::optional<E>> read_enum(const fields& f, std::string_view key,
                                    const std::array<E, N>& all) {
  auto s = f.opt_str(key);
  if (!s) return s.error();
  if (!*s) return std::optional<E>();
  std::string known;
  for (E e : all) {
    if (to_string(e) == **s) return std::optional<E>(e);
    known += (known.empty() ? "" : ", ") + std::string(to_string(e));
  }
  return decode_error{f.path(key), in_quotes(**s) + " is not one of " + known};
}

decoded<sop_step> step_from_json(const json::value& v, const std::string& prefix) {
  auto f = fields::of(v, prefix);
  if (!f) return f.error();
  if (auto e = unknown_key(*f, k_step_keys)) return *e;
  sop_step s;
  auto name = f->str("name");
  if (!name) return name.error();
  s.name = std::move(*name);
  auto kind = read_enum(*f, "kind", k_kinds);
  if (!kind) return kind.error();
  if (*kind) s.kind = **kind;
  for (auto [key, out] :
       {std::pair{"command", &s.command}, std::pair{"cwd", &s.cwd}, std::pair{"prompt", &s.prompt},
        std::pair{"next", &s.next}, std::pair{"on_failure", &s.on_failure}})
    if (auto e = read_str(*f, key, *out)) return *e;
  if (auto e = read_int(*f, "retries", k_retries, s.retries)) return *e;
  if (auto e = read_int(*f, "max_visits", k_max_visits, s.max_visits)) return *e;
  if (auto e = read_int(*f, "timeout_ms", k_timeout, s.timeout_ms)) return *e;
  if (auto e = read_int(*f, "max_output_bytes", k_max_output, s.max_output_bytes)) return *e;
  auto idempotent = f->opt_bool("idempotent");
  if (!idempotent) return idempotent.error();
  s.idempotent = idempotent->value_or(false);
  if (auto e = read_names(*f, "approvers", s.approvers)) return *e;
  if (f->has("approval_timeout_ms")) {
    std::int64_t ms = 0;
    if (auto e = read_int(*f, "approval_timeout_ms", k_timeout, ms)) return *e;
    s.approval_timeout_ms = ms;
  }
  auto on_timeout = read_enum(*f, "on_timeout", k_actions);
  if (!on_timeout) return on_timeout.error();
  s.on_timeout = *on_timeout;
  return s;
}

// 1-based line and column (in characters: UTF-8 continuation bytes are not
// counted) of byte `offset` of `text`.
std::string line_and_column(std::string_view text, std::size_t offset) {
  std::size_t line = 1, column = 1;
  for (std::size_t i = 0; i < std::min(offset, text.size()); ++i) {
    if (text[i] == '\n') {
      ++line;
      column = 1;
    } else if ((static_cast<unsigned char>(text[i]) & 0xC0) != 0x80) {
      ++column;
    }
  }
  return "line " + std::to_string(line) + ", column " + std::to_string(column);
}

}  // namespace

// ---- public ----------------------------------------------------------------

std::string_view to_string(sop_step_kind k) {
  switch (k) {
    case sop_step_kind::shell:
      return "shell";
    case sop_step_kind::prompt:
      return "prompt";
    case sop_step_kind::approval:
      return "approval";
    case sop_step_kind::checkpoint:
      return "checkpoint";
  }
  return "unknown";
}

std::string_view to_string(sop_timeout_action a) {
  switch (a) {
    case sop_timeout_action::escalate:
      return "escalate";
    case sop_timeout_action::cancel:
      return "cancel";
    case sop_timeout_action::auto_approve:
      return "auto_approve";
  }
  return "unknown";
}

std::optional<std::size_t> sop_definition::index_of(std::string_view n) const {
  for (std::size_t i = 0; i < steps.size(); ++i)
    if (steps[i].name == n) return i;
  return std::nullopt;
}

std::string sop_definition::success_target(std::size_t i) const {
  const auto& s = steps.at(i);
  if (!s.next.empty()) return s.next;
  return i + 1 < steps.size() ? steps[i + 1].name : std::string(sop_end);
}

std::string sop_definition::failure_target(std::size_t i) const {
  const auto& s = steps.at(i);
  return s.on_failure.empty() ? std::string(sop_fail) : s.on_failure;
}

const std::vector<std::string>& sop_definition::approvers_of(std::size_t i) const {
  const auto& s = steps.at(i);
  return s.approvers.empty() ? approvers : s.approvers;
}

std::int64_t sop_definition::approval_timeout_of(std::size_t i) const {
  return steps.at(i).approval_timeout_ms.value_or(approval_timeout_ms);
}

sop_timeout_action sop_definition::on_timeout_of(std::size_t i) const {
  return steps.at(i).on_timeout.value_or(on_timeout);
}

std::optional<decode_error> check(const sop_definition& d) {
  if (auto e = check_name("name", d.name)) return e;
  if (auto e = outside("max_concurrent", d.max_concurrent, k_max_concurrent)) return e;
  if (auto e = outside("max_payload_bytes", as_i64(d.max_payload_bytes), k_max_payload)) return e;
  if (auto e = check_approvers("approvers", d.approvers)) return e;
  if (auto e = outside("approval_timeout_ms", d.approval_timeout_ms, k_timeout)) return e;
  if (d.steps.empty()) return decode_error{"steps", "a SOP needs at least one step"};
  for (std::size_t i = 0; i < d.steps.size(); ++i)
    if (auto e = check_step(d, i)) return under(step_path(i, d.steps[i].name), *e);
  return std::nullopt;
}

json::value to_json(const sop_definition& d) {
  json::object o;
  o["name"] = d.name;
  o["description"] = d.description;
  o["agent"] = d.agent;
  o["max_concurrent"] = d.max_concurrent;
  o["max_payload_bytes"] = as_i64(d.max_payload_bytes);
  json::array approvers(d.approvers.begin(), d.approvers.end());
  o["approvers"] = std::move(approvers);
  o["approval_timeout_ms"] = d.approval_timeout_ms;
  o["on_timeout"] = to_string(d.on_timeout);
  json::array steps;
  for (const auto& s : d.steps) {
    json::object j;
    j["name"] = s.name;
    j["kind"] = to_string(s.kind);
    j["command"] = s.command;
    j["cwd"] = s.cwd;
    j["prompt"] = s.prompt;
    j["next"] = s.next;
    j["on_failure"] = s.on_failure;
    j["retries"] = s.retries;
    j["max_visits"] = s.max_visits;
    j["timeout_ms"] = s.timeout_ms;
    j["max_output_bytes"] = as_i64(s.max_output_bytes);
    j["idempotent"] = s.idempotent;
    json::array step_approvers(s.approvers.begin(), s.approvers.end());
    j["approvers"] = std::move(step_approvers);
    // null: the SOP's.
    j["approval_timeout_ms"] =
        s.approval_timeout_ms ? json::value(*s.approval_timeout_ms) : json::value(nullptr);
    j["on_timeout"] = s.on_timeout ? json::value(to_string(*s.on_timeout)) : json::value(nullptr);
    steps.push_back(std::move(j));
  }
  o["steps"] = std::move(steps);
  return o;
}

decoded<sop_definition> sop_from_json(const json::value& v, const std::string& prefix) {
  auto f = fields::of(v, prefix);
  if (!f) return f.error();
  if (auto e = unknown_key(*f, k_sop_keys)) return *e;
  sop_definition d;
  auto name = f->str("name");
  if (!name) return name.error();
  d.name = std::move(*name);
  if (auto e = read_str(*f, "description", d.description)) return *e;
  if (auto e = read_str(*f, "agent", d.agent)) return *e;
  if (auto e = read_int(*f, "max_concurrent", k_max_concurrent, d.max_concurrent)) return *e;
  if (auto e = read_int(*f, "max_payload_bytes", k_max_payload, d.max_payload_bytes)) return *e;
  if (auto e = read_names(*f, "approvers", d.approvers)) return *e;
  if (auto e = read_int(*f, "approval_timeout_ms", k_timeout, d.approval_timeout_ms)) return *e;
  auto on_timeout = read_enum(*f, "on_timeout", k_actions);
  if (!on_timeout) return on_timeout.error();
  if (*on_timeout) d.on_timeout = **on_timeout;
  auto steps = f->array("steps");
  if (!steps) return steps.error();
  for (std::size_t i = 0; i < (*steps)->size(); ++i) {
    const auto& sv = (**steps)[i];
    std::string_view step_name;
    if (sv.is_object())
      if (auto n = sv.get_object().if_contains("name"); n && n->is_string())
        step_name = n->get_string();
    auto s = step_from_json(sv, f->path(step_path(i, step_name)));
    if (!s) return s.error();
    d.steps.push_back(std::move(*s));
  }
  if (auto e = check(d)) return under(prefix, *e);
  return d;
}

decoded<sop_definition> parse_sop(std::string_view text) {
  json::stream_parser p;
  boost::system::error_code ec;
  std::size_t n = p.write_some(text.data(), text.size(), ec);
  if (!ec && n < text.size()) ec = json::error::extra_data;
  if (!ec) p.finish(ec);
  if (ec)
    return decode_error{
        "", "not valid JSON at " + line_and_column(text, n) + " (" + ec.message() + ")"};
  if (auto dup = first_duplicate_key(text))
    return decode_error{"", "the key " + in_quotes(*dup) + " appears twice in one object"};
  return sop_from_json(p.release());
}

decoded<std::vector<sop_definition>> load_sop_dir(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  auto st = fs::status(dir, ec);
  if (!fs::exists(st)) return decode_error{dir, "no such directory; no SOP was loaded"};
  if (!fs::is_directory(st)) return decode_error{dir, "is not a directory; no SOP was loaded"};
  std::vector<fs::path> files;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const auto& p = it->path();
    if (p.extension() != ".json") continue;
    std::error_code sec;
    auto s = fs::status(p, sec);
    if (fs::is_regular_file(s))
      files.push_back(p);
    else if (!fs::exists(s))  // a dangling link: meant as a SOP, and not one
      return decode_error{p.string(), "cannot be read (" + sec.message() + "); no SOP was loaded"};
  }
  if (ec) return decode_error{dir, "cannot be listed (" + ec.message() + "); no SOP was loaded"};
  std::sort(files.begin(), files.end(),
            [](const fs::path& a, const fs::path& b) { return a.filename() < b.filename(); });
  std::vector<sop_definition> out;
  std::vector<std::string> sources;  // out[i] came from sources[i]
  for (const auto& p : files) {
    std::string path = p.string();
    errno = 0;
    std::ifstream in(p, std::ios::binary);
    if (!in)
      return decode_error{
          path, "cannot be read (" + std::string(std::strerror(errno)) + "); no SOP was loaded"};
    std::ostringstream text;
    text << in.rdbuf();
    auto d = parse_sop(text.str());
    if (!d)
      return decode_error{d.error().field.empty() ? path : path + ": " + d.error().field,
                          d.error().problem};
    for (std::size_t k = 0; k < out.size(); ++k)
      if (out[k].name == d->name)
        return decode_error{path + ": name",
                            "the SOP " + in_quotes(d->name) + " is also defined by " + sources[k]};
    out.push_back(std::move(*d));
    sources.push_back(std::move(path));
  }
  return out;
}

}  // namespace tether::protocol
