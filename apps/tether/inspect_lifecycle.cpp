// `tether inspect DB --lifecycle` and `tether inspect DB --task ID`
// (inspect_lifecycle.hpp). Every value taken from the file is scrubbed and
// bounded before it is printed; a field the row does not carry prints as
// "absent", never as a default.
#include "inspect_lifecycle.hpp"

#include <iostream>

#include "tether/persistence/lifecycle.hpp"
#include "tether/protocol/json.hpp"
#include "tether/protocol/output_tail.hpp"
#include "tether/protocol/scrub.hpp"
#include "tether/runtime/clock.hpp"
#include "tether/runtime/owner_identity.hpp"

namespace tether::cli {
namespace {

namespace json = boost::json;
using persistence::lifecycle;
using persistence::raw_row;
using persistence::task_record;

constexpr std::size_t k_bound = 200;  // bytes of any one value shown

// A value from the file as it may be shown: scrubbed, valid UTF-8, at most
// k_bound bytes (then marked), and, for text output, on one line.
std::string shown(std::string_view raw, bool one_line = true) {
  static const protocol::scrubber scrub;
  auto text = protocol::utf8_sanitize(scrub.scrub(raw));
  if (one_line) {
    std::string flat;
    for (char ch : text) {
      if (ch == '\n')
        flat += "\\n";
      else if (ch == '\r')
        flat += "\\r";
      else if (ch == '\t')
        flat += "\\t";
      else
        flat += ch;
    }
    text = std::move(flat);
  }
  if (text.size() <= k_bound) return text;
  auto total = text.size();
  return std::string(protocol::utf8_prefix(text, k_bound)) + "...[truncated, " +
         std::to_string(total) + " bytes]";
}

// A row key (a column, or payload.<key>) as stored; nullopt if absent, and
// `no_column` set when the table has no such column at all.
std::optional<std::string> value_of(const raw_row& row, std::string_view key, bool* no_column) {
  if (no_column) *no_column = false;
  if (key.substr(0, 8) == "payload.") {
    auto payload = row.get("payload");
    if (!payload) return std::nullopt;
    auto v = protocol::parse_json(*payload);
    if (!v || !v->is_object()) return std::nullopt;
    auto* e = v->as_object().if_contains(key.substr(8));
    if (!e || e->is_null()) return std::nullopt;
    if (e->is_string()) return std::string(e->as_string());
    return json::serialize(*e);
  }
  if (!row.has(key)) {
    if (no_column) *no_column = true;
    return std::nullopt;
  }
  return row.get(key);
}

std::string text_of(const std::optional<std::string>& v, bool no_column) {
  if (v) return shown(*v);
  return no_column ? "absent (no such column)" : "absent";
}

json::value json_of(const std::optional<std::string>& v) {
  return v ? json::value(shown(*v, false)) : json::value(nullptr);
}

// The completion JSON's key (a delegate's artifact, digest, bytes, error).
std::optional<std::string> completion_key(const raw_row& row, std::string_view key) {
  auto c = row.get("completion");
  if (!c) return std::nullopt;
  auto v = protocol::parse_json(*c);
  if (!v || !v->is_object()) return std::nullopt;
  auto* e = v->as_object().if_contains(key);
  if (!e || e->is_null()) return std::nullopt;
  if (e->is_string()) return std::string(e->as_string());
  return json::serialize(*e);
}

struct liveness {
  std::string word;  // absent, unparsable, alive, gone, uncertain
  std::string why;
};

liveness owner_liveness(const std::optional<std::string>& owner) {
  if (!owner || owner->empty()) return {"absent", "the row records no owner process"};
  auto parsed = runtime::parse_process_identity(*owner);
  if (!parsed) return {"unparsable", parsed.error().message};
  auto p = runtime::probe_owner(*parsed);
  return {std::string(runtime::to_string(p.state)), p.why};
}

std::string lease_text(const std::optional<std::string>& lease) {
  if (!lease) return "absent";
  std::int64_t ms = 0;
  try {
    ms = std::stoll(*lease);
  } catch (const std::exception&) {
    return shown(*lease) + " (not a number)";
  }
  auto left = ms - runtime::now_ms();
  return std::to_string(ms) + " ms since the epoch (" +
         (left >= 0 ? "ends in " + std::to_string(left / 1000) + " s"
                    : "ended " + std::to_string(-left / 1000) + " s ago") +
         ")";
}

const persistence::state_meaning* state_of(const lifecycle* l, const std::string& word) {
  if (!l) return nullptr;
  for (auto& s : l->states)
    if (s.word == word) return &s;
  return nullptr;
}

// ---- the lifecycle table ----------------------------------------------------------------

void print_entry(std::ostream& out, const lifecycle& l, const std::string& indent) {
  out << indent << "admitted:    " << l.admitted << "\n";
  out << indent << "owner:       " << l.owner << "\n";
  out << indent << "store:       " << l.store << "\n";
  out << indent << "durability:  " << to_string(l.durable) << ": " << l.durable_why << "\n";
  out << indent << "cancel:      " << l.cancel << "\n";
  out << indent << "in flight:   " << l.in_flight << "\n";
  out << indent << "states:      from " << l.states_from << "\n";
  for (auto& s : l.states)
    out << indent << "  " << s.word << std::string(s.word.size() < 10 ? 10 - s.word.size() : 1, ' ')
        << (s.terminal ? "terminal  " : "live      ") << s.meaning << "\n";
  out << indent << "waits:       " << l.waits << "\n";
  out << indent << "recovery:    " << (l.recovery_can_duplicate ? "can" : "cannot")
      << " duplicate a side effect: " << l.recovery << "\n";
  out << indent << "delivery:    " << (l.delivery_idempotent ? "idempotent" : "NOT idempotent")
      << " across a restart: " << l.delivery << "\n";
}

json::object entry_json(const lifecycle& l) {
  json::object o;
  o["kind"] = l.kind;
  o["admitted"] = l.admitted;
  o["owner"] = l.owner;
  o["store"] = l.store;
  o["durability"] = to_string(l.durable);
  o["durability_why"] = l.durable_why;
  o["cancel"] = l.cancel;
  o["in_flight"] = l.in_flight;
  o["states_from"] = l.states_from;
  json::array states;
  for (auto& s : l.states)
    states.push_back(
        json::object{{"word", s.word}, {"terminal", s.terminal}, {"meaning", s.meaning}});
  o["states"] = std::move(states);
  o["waits"] = l.waits;
  json::object fields;
  for (auto& f : l.fields)
    fields[f.field] = json::object{{"source", to_string(f.source)}, {"note", f.note}};
  o["fields"] = std::move(fields);
  o["recovery_can_duplicate"] = l.recovery_can_duplicate;
  o["recovery"] = l.recovery;
  o["delivery_idempotent"] = l.delivery_idempotent;
  o["delivery"] = l.delivery;
  return o;
}

void print_fields(std::ostream& out, const lifecycle& l, const std::string& indent) {
  for (auto& f : l.fields)
    out << indent << f.field << std::string(f.field.size() < 11 ? 11 - f.field.size() : 1, ' ')
        << to_string(f.source) << std::string(10 - to_string(f.source).size(), ' ') << f.note
        << "\n";
}

// ---- one task ---------------------------------------------------------------------------

void print_row(std::ostream& out, const raw_row& row, const std::string& indent) {
  for (auto& [name, value] : row.columns)
    out << indent << name << " = " << (value ? shown(*value) : "absent (NULL)") << "\n";
}

json::object row_json(const raw_row& row) {
  json::object o;
  for (auto& [name, value] : row.columns) o[name] = json_of(value);
  return o;
}

void print_task(std::ostream& out, const std::string& path, int version, const task_record& r) {
  auto kind = r.task.get("kind").value_or("");
  auto state = r.task.get("state").value_or("");
  const auto* l = persistence::lifecycle_of(kind);
  out << "task " << shown(r.task.get("id").value_or("")) << " in " << path << " (schema version "
      << version << ", read-only)\n";
  out << "  kind:        " << shown(kind)
      << (l ? "" : " (not a kind this build knows: no lifecycle entry)") << "\n";
  const auto* s = state_of(l, state);
  out << "  state:       " << shown(state);
  if (s)
    out << " (" << (s->terminal ? "terminal" : "live") << ": " << s->meaning << ")";
  else if (kind == "delegate" && state == "admitted")
    out << " (registered: the delegates actor reads it as running)";
  else
    out << " (not a state word of this kind's lifecycle)";
  out << "\n";
  if (l) {
    out << "\nlifecycle of " << l->kind << "\n";
    print_entry(out, *l, "  ");
  }

  out << "\nfields (where this kind keeps each; then this row's values)\n";
  for (auto f : persistence::checklist_fields()) {
    const persistence::field_use* use = nullptr;
    if (l)
      for (auto& u : l->fields)
        if (u.field == f) use = &u;
    out << "  " << f << std::string(f.size() < 11 ? 11 - f.size() : 1, ' ');
    if (use)
      out << to_string(use->source) << ": " << use->note << "\n";
    else
      out << "(no lifecycle entry)\n";
    for (auto key : persistence::field_keys(f)) {
      bool no_column = false;
      auto v = value_of(r.task, key, &no_column);
      out << "      " << key << " = " << text_of(v, no_column) << "\n";
    }
    if (f == "agent" && r.child_session)
      out << "      the child session's agent = " << text_of(r.child_session->get("agent"), false)
          << "\n";
    if (f == "tenant" && r.parent_session)
      out << "      the parent session's tenant = "
          << text_of(r.parent_session->get("tenant"), false) << "\n";
    if (f == "originator" && r.parent_session)
      out << "      the parent session's turn = " << text_of(r.parent_session->get("turn"), false)
          << "\n";
    if (f == "owner") {
      auto live = owner_liveness(value_of(r.task, "owner", nullptr));
      out << "      owner process: " << live.word << " (" << shown(live.why) << ")\n";
    }
    if (f == "lease") {
      auto lease = value_of(r.task, "lease_until", nullptr);
      out << "      lease: " << lease_text(lease)
          << (lease && s && s->terminal ? " (inert: the task is terminal)" : "") << "\n";
    }
  }

  if (r.intent) {
    out << "\nsettlement intent (written, not yet promoted)\n";
    print_row(out, *r.intent, "  ");
  } else {
    out << "\nsettlement intent: absent\n";
  }
  if (kind == "delegate") {
    out << "\nartifact (once terminal; never its content)\n";
    for (auto* key : {"artifact", "digest", "bytes", "error"})
      out << "  " << key << " = " << text_of(completion_key(r.task, key), false) << "\n";
  }

  out << "\nreceipts (" << r.receipts.size() << ", ids <task>/<transition>)\n";
  for (auto& rc : r.receipts)
    out << "  " << shown(rc.get("id").value_or("")) << "  " << text_of(rc.get("state"), false)
        << "  scope " << text_of(rc.get("scope"), false) << "\n      | "
        << text_of(rc.get("body"), false) << "\n";

  out << "\nrow (every column as stored)\n";
  print_row(out, r.task, "  ");
}

json::object task_json(const std::string& path, int version, const task_record& r) {
  auto kind = r.task.get("kind").value_or("");
  auto state = r.task.get("state").value_or("");
  const auto* l = persistence::lifecycle_of(kind);
  json::object o;
  o["database"] = path;
  o["schema_version"] = version;
  o["id"] = shown(r.task.get("id").value_or(""), false);
  o["kind"] = shown(kind, false);
  o["state"] = shown(state, false);
  const auto* s = state_of(l, state);
  o["state_known"] = s != nullptr;
  o["terminal"] = s ? json::value(s->terminal) : json::value(nullptr);
  o["lifecycle"] = l ? json::value(entry_json(*l)) : json::value(nullptr);
  json::object fields, missing_columns;
  for (auto f : persistence::checklist_fields()) {
    json::object values;
    json::array no_columns;
    for (auto key : persistence::field_keys(f)) {
      bool no_column = false;
      auto v = value_of(r.task, key, &no_column);
      values[key] = json_of(v);
      if (no_column) no_columns.push_back(json::value(key));
    }
    json::object field{{"values", std::move(values)}, {"no_such_column", std::move(no_columns)}};
    fields[f] = std::move(field);
  }
  o["fields"] = std::move(fields);
  if (r.child_session) o["child_session_agent"] = json_of(r.child_session->get("agent"));
  if (r.parent_session) {
    o["parent_session_tenant"] = json_of(r.parent_session->get("tenant"));
    o["parent_session_turn"] = json_of(r.parent_session->get("turn"));
  }
  auto live = owner_liveness(value_of(r.task, "owner", nullptr));
  o["owner_process"] = json::object{{"liveness", live.word}, {"why", shown(live.why, false)}};
  o["settlement_intent"] = r.intent ? json::value(row_json(*r.intent)) : json::value(nullptr);
  if (kind == "delegate") {
    json::object art;
    for (auto* key : {"artifact", "digest", "bytes", "error"})
      art[key] = json_of(completion_key(r.task, key));
    o["artifact"] = std::move(art);
  }
  json::array receipts;
  for (auto& rc : r.receipts) receipts.push_back(row_json(rc));
  o["receipts"] = std::move(receipts);
  o["row"] = row_json(r.task);
  return o;
}

}  // namespace

int inspect_lifecycle(const std::string& path, bool as_json) {
  auto version = persistence::check_readable(path);
  if (!version) {
    std::cerr << "tether inspect: " << version.error().message << "\n";
    return 1;
  }
  const auto& all = persistence::lifecycles();
  if (as_json) {
    json::array kinds;
    for (auto& l : all) kinds.push_back(entry_json(l));
    std::cout << protocol::to_text(json::object{{"lifecycles", std::move(kinds)}}) << "\n";
    return 0;
  }
  std::cout << "task lifecycles (" << all.size()
            << " kinds, one tasks table; seed 001's change checklist per kind)\n";
  for (auto& l : all) {
    std::cout << "\nkind " << l.kind << "\n";
    print_entry(std::cout, l, "  ");
    std::cout << "  fields:\n";
    print_fields(std::cout, l, "    ");
  }
  return 0;
}

int inspect_task(const std::string& path, const std::string& id, bool as_json) {
  auto version = persistence::check_readable(path);
  if (!version) {
    std::cerr << "tether inspect: " << version.error().message << "\n";
    return 1;
  }
  persistence::reader_pool readers(path);
  auto r = persistence::read_task_record(readers, protocol::job_id(id));
  if (!r) {
    std::cerr << "tether inspect: " << r.error().message << "\n";
    return 1;
  }
  if (!*r) {
    std::cerr << "tether inspect: no task '" << shown(id) << "' in " << path
              << "; the file was left untouched\n";
    return 1;
  }
  if (as_json)
    std::cout << protocol::to_text(task_json(path, *version, **r)) << "\n";
  else
    print_task(std::cout, path, *version, **r);
  return 0;
}

}  // namespace tether::cli
