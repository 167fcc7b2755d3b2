#include "tether/protocol/policy.hpp"

#include <algorithm>
#include <array>
#include <filesystem>

namespace tether::protocol {

namespace {

// `p` lexically normalised, without a trailing slash (but "/").
std::string normalised(std::string_view p) {
  auto n = std::filesystem::path(p).lexically_normal().string();
  if (n.size() > 1 && n.back() == '/') n.pop_back();
  return n;
}

bool is_normal_absolute(std::string_view p) {
  return !p.empty() && p.front() == '/' && normalised(p) == p;
}

bool inside(std::string_view path, std::string_view dir) {
  if (dir == "/") return !path.empty() && path.front() == '/';
  return path == dir ||
         (path.size() > dir.size() && path.substr(0, dir.size()) == dir && path[dir.size()] == '/');
}

std::string names(const std::set<std::string>& s) {
  std::string out;
  for (const auto& n : s) out += (out.empty() ? "" : ", ") + n;
  return out.empty() ? "none" : out;
}

// A set field narrows when it is a subset of the parent's (nullopt: all).
std::optional<decode_error> narrow_set(const char* field,
                                       const std::optional<std::set<std::string>>& parent,
                                       const std::optional<std::set<std::string>>& child) {
  if (!parent) return std::nullopt;
  if (!child)
    return decode_error{field, "would widen the parent's (" + names(*parent) +
                                   ") to every one; a child may only narrow its policy"};
  for (const auto& n : *child)
    if (!parent->count(n))
      return decode_error{field, "'" + n + "' is not in the parent's (" + names(*parent) +
                                     "); a child may only narrow its policy"};
  return std::nullopt;
}

decoded<std::optional<std::set<std::string>>> opt_names(const fields& f, std::string_view key) {
  if (!f.has(key) || f.obj().at(key).is_null()) return std::optional<std::set<std::string>>();
  auto a = f.array(key);
  if (!a) return a.error();
  std::set<std::string> out;
  for (std::size_t i = 0; i < (*a)->size(); ++i) {
    const auto& v = (**a)[i];
    if (!v.is_string() || v.as_string().empty())
      return decode_error{f.path(key) + "[" + std::to_string(i) + "]", "not a non-empty string"};
    out.emplace(v.as_string());
  }
  return std::optional<std::set<std::string>>(std::move(out));
}

decoded<std::optional<std::vector<std::string>>> opt_paths(const fields& f, std::string_view key) {
  auto s = opt_names(f, key);
  if (!s) return s.error();
  if (!*s) return std::optional<std::vector<std::string>>();
  return std::optional<std::vector<std::string>>(
      std::vector<std::string>((*s)->begin(), (*s)->end()));
}

json::value names_json(const std::optional<std::set<std::string>>& s) {
  if (!s) return nullptr;
  json::array a;
  for (const auto& n : *s) a.emplace_back(json::string(n));
  return a;
}

constexpr std::array<std::string_view, 7> k_keys = {
    "tools", "shells", "isolated", "network", "writable", "max_depth", "memory_scopes"};

std::optional<decode_error> unknown_key(const fields& f) {
  for (const auto& kv : f.obj())
    if (std::find(k_keys.begin(), k_keys.end(), std::string_view(kv.key())) == k_keys.end())
      return decode_error{f.path(kv.key()),
                          "unknown field (known: tools, shells, isolated, network, writable, "
                          "max_depth, memory_scopes)"};
  return std::nullopt;
}

}  // namespace

bool session_policy::allows_tool(std::string_view name) const {
  return !tools || tools->count(std::string(name)) > 0;
}

bool session_policy::allows_memory(std::string_view scope) const {
  return !memory_scopes || memory_scopes->count(std::string(scope)) > 0;
}

bool path_within(std::string_view path, const std::vector<std::string>& dirs) {
  if (path.empty() || path.front() != '/') return false;
  auto n = normalised(path);
  return std::any_of(dirs.begin(), dirs.end(), [&](const std::string& d) { return inside(n, d); });
}

bool session_policy::allows_path(std::string_view path) const {
  return !writable || path_within(path, *writable);
}

std::optional<decode_error> check(const session_policy& p) {
  if (p.max_depth < 0 || p.max_depth > 64)
    return decode_error{"max_depth", "must be in 0..64, not " + std::to_string(p.max_depth)};
  if (p.writable)
    for (const auto& w : *p.writable)
      if (!is_normal_absolute(w))
        return decode_error{"writable", "'" + w + "' is not an absolute, normal path"};
  return std::nullopt;
}

decoded<session_policy> narrow(const session_policy& parent, const policy_override& o) {
  session_policy c = parent;
  if (o.tools) {
    if (auto e = narrow_set("tools", parent.tools, o.tools)) return *e;
    c.tools = o.tools;
  }
  if (o.shells) {
    if (*o.shells && !parent.shells)
      return decode_error{"shells", "the parent may not run shells, so its child may not either"};
    c.shells = *o.shells;
  }
  if (o.isolated) {
    if (!*o.isolated && parent.isolated)
      return decode_error{"isolated", "the parent's shells run isolated, so its child's must too"};
    c.isolated = *o.isolated;
  }
  if (o.network) {
    if (*o.network && !parent.network)
      return decode_error{"network",
                          "the parent has no network, so its child may not have it either"};
    c.network = *o.network;
  }
  if (o.writable) {
    if (parent.writable == std::nullopt) {
      c.writable = o.writable;
    } else {
      for (const auto& w : *o.writable)
        if (!parent.allows_path(w))
          return decode_error{"writable",
                              "'" + w +
                                  "' is outside the parent's writable paths; a child may "
                                  "only narrow its policy"};
      c.writable = o.writable;
    }
  }
  if (o.max_depth) {
    if (*o.max_depth > parent.max_depth)
      return decode_error{
          "max_depth", "would raise the parent's " + std::to_string(parent.max_depth) + " to " +
                           std::to_string(*o.max_depth) + "; a child may only narrow its policy"};
    c.max_depth = *o.max_depth;
  }
  if (o.memory_scopes) {
    if (auto e = narrow_set("memory_scopes", parent.memory_scopes, o.memory_scopes)) return *e;
    c.memory_scopes = o.memory_scopes;
  }
  if (auto e = check(c)) return *e;
  return c;
}

json::value to_json(const session_policy& p) {
  json::object o;
  o["tools"] = names_json(p.tools);
  o["shells"] = p.shells;
  o["isolated"] = p.isolated;
  o["network"] = p.network;
  if (p.writable) {
    json::array a;
    for (const auto& w : *p.writable) a.emplace_back(json::string(w));
    o["writable"] = std::move(a);
  } else {
    o["writable"] = nullptr;
  }
  o["max_depth"] = p.max_depth;
  o["memory_scopes"] = names_json(p.memory_scopes);
  return o;
}

decoded<policy_override> override_from_json(const json::value& v, std::string prefix) {
  auto f = fields::of(v, std::move(prefix));
  if (!f) return f.error();
  if (auto e = unknown_key(*f)) return *e;
  policy_override o;
  auto tools = opt_names(*f, "tools");
  if (!tools) return tools.error();
  o.tools = std::move(*tools);
  auto shells = f->opt_bool("shells");
  if (!shells) return shells.error();
  o.shells = *shells;
  auto isolated = f->opt_bool("isolated");
  if (!isolated) return isolated.error();
  o.isolated = *isolated;
  auto network = f->opt_bool("network");
  if (!network) return network.error();
  o.network = *network;
  auto writable = opt_paths(*f, "writable");
  if (!writable) return writable.error();
  o.writable = std::move(*writable);
  auto depth = f->opt_i64("max_depth");
  if (!depth) return depth.error();
  if (*depth) {
    if (**depth < 0 || **depth > 64) return decode_error{f->path("max_depth"), "must be in 0..64"};
    o.max_depth = static_cast<int>(**depth);
  }
  auto scopes = opt_names(*f, "memory_scopes");
  if (!scopes) return scopes.error();
  o.memory_scopes = std::move(*scopes);
  return o;
}

decoded<session_policy> policy_from_json(const json::value& v, std::string prefix) {
  auto o = override_from_json(v, prefix);
  if (!o) return o.error();
  // Every field is written by to_json; a stored policy that lacks one is
  // refused rather than completed with a default that could widen it.
  auto f = fields::of(v, prefix);
  for (auto k : k_keys)
    if (!f->obj().contains(k)) return decode_error{f->path(k), "missing"};
  for (auto k : {"shells", "isolated", "network", "max_depth"})
    if (f->obj().at(k).is_null()) return decode_error{f->path(k), "null"};
  session_policy p;
  p.tools = o->tools;
  p.shells = *o->shells;
  p.isolated = *o->isolated;
  p.network = *o->network;
  p.writable = o->writable;
  p.max_depth = *o->max_depth;
  p.memory_scopes = o->memory_scopes;
  if (auto e = check(p)) return decode_error{prefix + "." + e->field, e->problem};
  return p;
}

}  // namespace tether::protocol
