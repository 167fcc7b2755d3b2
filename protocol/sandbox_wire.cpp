#include "tether/protocol/sandbox_wire.hpp"

#include <array>

namespace tether::protocol::sandbox {

std::string_view to_string(conn_mode m) {
  return m == conn_mode::read_only ? "read_only" : "read_write";
}

namespace {

// Like parse_json, but command text and environment values may hold any bytes.
decoded<json::value> parse_line(std::string_view text) {
  json::parse_options opts;
  opts.allow_invalid_utf8 = true;
  json::stream_parser p({}, opts);
  boost::system::error_code ec;
  std::size_t n = p.write_some(text.data(), text.size(), ec);
  if (!ec && n < text.size()) ec = json::error::extra_data;
  if (!ec) p.finish(ec);
  if (ec)
    return decode_error{"",
                        "not valid JSON at byte " + std::to_string(n) + " (" + ec.message() + ")"};
  // Last-wins would let {"type":"list","type":"exec"} pass for a list.
  if (auto dup = first_duplicate_key(text, opts))
    return decode_error{*dup, "appears twice in one object; nothing was done"};
  return p.release();
}

decoded<std::uint64_t> u64(const fields& f, std::string_view key) {
  // Unsigned fields take the whole range (ids up to 2^64-1).
  if (auto it = f.obj().find(key); it != f.obj().end() && it->value().is_uint64())
    return it->value().get_uint64();
  auto v = f.i64(key);
  if (!v) return v.error();
  if (*v < 0) return decode_error{f.path(key), "must not be negative"};
  return static_cast<std::uint64_t>(*v);
}

decoded<std::optional<std::uint64_t>> opt_u64(const fields& f, std::string_view key) {
  if (!f.has(key)) return std::optional<std::uint64_t>{};
  auto v = u64(f, key);
  if (!v) return v.error();
  return std::optional<std::uint64_t>(*v);
}

decoded<job_id> job_field(const fields& f, std::string_view key = "job") {
  auto s = f.str(key);
  if (!s) return s.error();
  if (!valid_job_id(*s))
    return decode_error{f.path(key), "'" + s->substr(0, 64) +
                                         "' is not a job id (1-128 of A-Z a-z 0-9 _ . -, not "
                                         "starting with '.')"};
  return job_id(*s);
}

decoded<std::int64_t> bounded_i64(const fields& f, std::string_view key, std::int64_t dflt,
                                  std::int64_t lo, std::int64_t hi) {
  auto v = f.opt_i64(key);
  if (!v) return v.error();
  if (!*v) return dflt;
  if (**v < lo || **v > hi)
    return decode_error{f.path(key), "must be between " + std::to_string(lo) + " and " +
                                         std::to_string(hi) + ", got " + std::to_string(**v)};
  return **v;
}

decoded<conn_mode> mode_field(const fields& f) {
  auto m = f.opt_str("mode");
  if (!m) return m.error();
  if (!*m || **m == "read_write") return conn_mode::read_write;
  if (**m == "read_only") return conn_mode::read_only;
  return decode_error{f.path("mode"),
                      "must be \"read_write\" or \"read_only\", got \"" + **m + "\""};
}

#define TRY_ASSIGN(lhs, expr)       \
  do {                              \
    auto tmp_ = (expr);             \
    if (!tmp_) return tmp_.error(); \
    lhs = std::move(*tmp_);         \
  } while (0)

decoded<request_body> decode_hello(const fields& f) {
  hello_req r;
  TRY_ASSIGN(r.version, f.i64("v"));
  TRY_ASSIGN(r.mode, mode_field(f));
  auto c = f.opt_str("client");
  if (!c) return c.error();
  r.client = c->value_or("");
  return request_body(std::move(r));
}

decoded<request_body> decode_exec(const fields& f) {
  exec_req r;
  // A NUL would cut the text the kernel passes on: bash, chdir and the job
  // would see less than what was checked, recorded and scrubbed.
  auto no_nul = [&](const std::string& v, std::string field) -> std::optional<decode_error> {
    if (v.find('\0') == std::string::npos) return std::nullopt;
    return decode_error{std::move(field),
                        "contains a NUL byte at " + std::to_string(v.find('\0')) +
                            " (the process would see only the text before it); nothing was "
                            "started"};
  };
  TRY_ASSIGN(r.command, f.str("command"));
  if (r.command.empty()) return decode_error{f.path("command"), "must not be empty"};
  if (auto e = no_nul(r.command, f.path("command"))) return *e;
  TRY_ASSIGN(r.cwd, f.str("cwd"));
  if (auto e = no_nul(r.cwd, f.path("cwd"))) return *e;
  if (r.cwd.empty() || r.cwd.front() != '/')
    return decode_error{f.path("cwd"), "must be an absolute path, got '" + r.cwd + "'"};
  if (f.has("env")) {
    const json::object* env;
    TRY_ASSIGN(env, f.object("env"));
    for (auto& kv : *env) {
      if (!kv.value().is_string())
        return decode_error{f.path("env") + "." + std::string(kv.key()), "expected a string"};
      std::string k(kv.key());
      if (k.empty() || k.find('=') != std::string::npos || k.find('\0') != std::string::npos)
        return decode_error{f.path("env"), "'" + k + "' is not a variable name"};
      std::string v(kv.value().get_string());
      if (auto e = no_nul(v, f.path("env") + "." + k)) return *e;
      r.env.emplace_back(std::move(k), std::move(v));
    }
  }
  if (f.has("secret_names")) {
    const json::array* names;
    TRY_ASSIGN(names, f.array("secret_names"));
    for (std::size_t i = 0; i < names->size(); ++i) {
      if (!(*names)[i].is_string())
        return decode_error{f.path("secret_names") + "[" + std::to_string(i) + "]",
                            "expected a string"};
      r.secret_names.emplace_back((*names)[i].get_string());
    }
  }
  auto iso = f.opt_bool("isolate");
  if (!iso) return iso.error();
  r.isolate = iso->value_or(false);
  auto net = f.opt_bool("allow_network");
  if (!net) return net.error();
  r.allow_network = net->value_or(false);
  if (f.has("job")) TRY_ASSIGN(r.job, job_field(f));
  TRY_ASSIGN(r.tail_lines, bounded_i64(f, "tail_lines", 40, 0, 10000));
  TRY_ASSIGN(r.tail_bytes, bounded_i64(f, "tail_bytes", 4096, 0, 1 << 20));
  TRY_ASSIGN(r.preview_bytes, bounded_i64(f, "preview_bytes", 200, 16, 1 << 16));
  return request_body(std::move(r));
}

decoded<request_body> decode_attach(const fields& f) {
  attach_req r;
  TRY_ASSIGN(r.job, job_field(f));
  std::optional<std::uint64_t> off;
  TRY_ASSIGN(off, opt_u64(f, "offset"));
  r.offset = off.value_or(0);
  auto fol = f.opt_bool("follow");
  if (!fol) return fol.error();
  r.follow = fol->value_or(false);
  std::int64_t mb;
  TRY_ASSIGN(mb, bounded_i64(f, "max_bytes", 1 << 16, 1, 1 << 20));
  r.max_bytes = static_cast<std::uint64_t>(mb);
  return request_body(std::move(r));
}

decoded<request_body> decode_kill(const fields& f) {
  kill_req r;
  TRY_ASSIGN(r.job, job_field(f));
  auto w = f.opt_i64("wait_ms");
  if (!w) return w.error();
  if (*w && (**w < 0 || **w > 3600000))
    return decode_error{f.path("wait_ms"), "must be between 0 and 3600000"};
  r.wait_ms = *w;
  return request_body(std::move(r));
}

decoded<request_body> decode_list(const fields& f) {
  list_req r;
  TRY_ASSIGN(r.after_revision, opt_u64(f, "after_revision"));
  return request_body(std::move(r));
}

decoded<request_body> decode_expire(const fields& f) {
  expire_req r;
  if (f.has("job")) {
    job_id j;
    TRY_ASSIGN(j, job_field(f));
    r.job = std::move(j);
  }
  return request_body(std::move(r));
}

json::object envelope(std::string_view type, std::uint64_t id) {
  json::object o;
  o["type"] = type;
  if (id) o["id"] = id;
  return o;
}

struct request_encoder {
  json::object& o;
  void operator()(const hello_req& r) {
    o["v"] = r.version;
    o["mode"] = to_string(r.mode);
    if (!r.client.empty()) o["client"] = r.client;
  }
  void operator()(const exec_req& r) {
    o["command"] = r.command;
    o["cwd"] = r.cwd;
    json::object env;
    for (auto& [k, v] : r.env) env[k] = v;
    o["env"] = std::move(env);
    if (!r.secret_names.empty()) {
      json::array a;
      for (auto& n : r.secret_names) a.emplace_back(n);
      o["secret_names"] = std::move(a);
    }
    o["isolate"] = r.isolate;
    o["allow_network"] = r.allow_network;
    if (!r.job.empty()) o["job"] = r.job.str();
    o["tail_lines"] = r.tail_lines;
    o["tail_bytes"] = r.tail_bytes;
    o["preview_bytes"] = r.preview_bytes;
  }
  void operator()(const attach_req& r) {
    o["job"] = r.job.str();
    o["offset"] = r.offset;
    o["follow"] = r.follow;
    o["max_bytes"] = r.max_bytes;
  }
  void operator()(const kill_req& r) {
    o["job"] = r.job.str();
    if (r.wait_ms) o["wait_ms"] = *r.wait_ms;
  }
  void operator()(const list_req& r) {
    if (r.after_revision) o["after_revision"] = *r.after_revision;
  }
  void operator()(const expire_req& r) {
    if (r.job) o["job"] = r.job->str();
  }
};

std::string_view type_of(const request_body& b) {
  static constexpr std::array<std::string_view, 6> names = {"hello", "exec", "attach",
                                                            "kill",  "list", "expire"};
  return names[b.index()];
}

std::string_view type_of(const reply_body& b) {
  static constexpr std::array<std::string_view, 8> names = {
      "error", "hello", "started", "output", "status", "killed", "jobs", "expired"};
  return names[b.index()];
}

}  // namespace

bool valid_job_id(std::string_view id) {
  if (id.empty() || id.size() > 128 || id.front() == '.') return false;
  for (char c : id)
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
          c == '-' || c == '.'))
      return false;
  return true;
}

decoded<request> decode_request(std::string_view line) {
  auto v = parse_line(line);
  if (!v) return v.error();
  auto f = fields::of(*v);
  if (!f) return f.error();
  request r;
  auto id = opt_u64(*f, "id");
  if (!id) return id.error();
  r.id = id->value_or(0);
  auto type = f->str("type");
  if (!type) return type.error();
  decoded<request_body> body = decode_error{"type", "unknown request type '" + *type +
                                                        "' (known: hello, exec, attach, kill, "
                                                        "list, expire)"};
  if (*type == "hello") body = decode_hello(*f);
  if (*type == "exec") body = decode_exec(*f);
  if (*type == "attach") body = decode_attach(*f);
  if (*type == "kill") body = decode_kill(*f);
  if (*type == "list") body = decode_list(*f);
  if (*type == "expire") body = decode_expire(*f);
  if (!body) return body.error();
  r.body = std::move(*body);
  return r;
}

std::string encode(const request& r) {
  json::object o = envelope(type_of(r.body), r.id);
  std::visit(request_encoder{o}, r.body);
  return json::serialize(o);
}

// ---- completions ----------------------------------------------------------------------

json::value to_json(const shell_completion& c) {
  const auto& s = c.status;
  json::array stages;
  for (auto& st : s.stages)
    stages.push_back(
        json::object{{"command", st.command}, {"code", st.code}, {"signal", st.signal}});
  json::object o{{"job", c.job},
                 {"state", to_string(s.state)},
                 {"exit_code", s.exit_code},
                 {"shell_code", s.shell_code},
                 {"signal", s.signal},
                 {"stages", std::move(stages)},
                 {"failing_stage", s.failing_stage},
                 {"capture", to_string(s.capture)},
                 {"reason", s.reason},
                 {"preview", c.preview.text},
                 {"preview_truncated_bytes", c.preview.truncated_bytes},
                 {"tail", c.tail},
                 {"tail_omitted_bytes", c.tail_omitted_bytes},
                 {"tail_lines", c.tail_lines},
                 {"output_bytes", c.output_bytes},
                 {"started_at_ms", c.started_at_ms},
                 {"ended_at_ms", c.ended_at_ms}};
  return o;
}

namespace {
decoded<int> small_int(const fields& f, std::string_view key, int lo, int hi) {
  auto v = f.i64(key);
  if (!v) return v.error();
  if (*v < lo || *v > hi)
    return decode_error{f.path(key), "must be between " + std::to_string(lo) + " and " +
                                         std::to_string(hi) + ", got " + std::to_string(*v)};
  return static_cast<int>(*v);
}
}  // namespace

decoded<shell_completion> completion_from_json(const json::value& v, std::string prefix) {
  auto f = fields::of(v, prefix);
  if (!f) return f.error();
  shell_completion c;
  auto& s = c.status;
  TRY_ASSIGN(c.job, f->str("job"));
  std::string state;
  TRY_ASSIGN(state, f->str("state"));
  if (!parse(state, s.state))
    return decode_error{f->path("state"), "unknown job state '" + state + "'"};
  TRY_ASSIGN(s.exit_code, small_int(*f, "exit_code", -1, 255));
  TRY_ASSIGN(s.shell_code, small_int(*f, "shell_code", -1, 255));
  TRY_ASSIGN(s.signal, small_int(*f, "signal", 0, 64));
  const json::array* stages;
  TRY_ASSIGN(stages, f->array("stages"));
  for (std::size_t i = 0; i < stages->size(); ++i) {
    auto sf = fields::of((*stages)[i], f->path("stages") + "[" + std::to_string(i) + "]");
    if (!sf) return sf.error();
    stage_status st;
    TRY_ASSIGN(st.command, sf->str("command"));
    TRY_ASSIGN(st.code, small_int(*sf, "code", 0, 255));
    TRY_ASSIGN(st.signal, small_int(*sf, "signal", 0, 64));
    s.stages.push_back(std::move(st));
  }
  TRY_ASSIGN(s.failing_stage,
             small_int(*f, "failing_stage", -1, static_cast<int>(s.stages.size()) - 1));
  std::string cap;
  TRY_ASSIGN(cap, f->str("capture"));
  if (!parse(cap, s.capture))
    return decode_error{f->path("capture"), "unknown capture kind '" + cap + "'"};
  TRY_ASSIGN(s.reason, f->str("reason"));
  TRY_ASSIGN(c.preview.text, f->str("preview"));
  TRY_ASSIGN(c.preview.truncated_bytes, u64(*f, "preview_truncated_bytes"));
  TRY_ASSIGN(c.tail, f->str("tail"));
  TRY_ASSIGN(c.tail_omitted_bytes, u64(*f, "tail_omitted_bytes"));
  TRY_ASSIGN(c.tail_lines, u64(*f, "tail_lines"));
  TRY_ASSIGN(c.output_bytes, u64(*f, "output_bytes"));
  TRY_ASSIGN(c.started_at_ms, f->i64("started_at_ms"));
  TRY_ASSIGN(c.ended_at_ms, f->i64("ended_at_ms"));
  return c;
}

// ---- replies ---------------------------------------------------------------------------

namespace {

struct reply_encoder {
  json::object& o;
  void operator()(const error_rep& r) {
    o["code"] = r.code;
    o["message"] = r.message;
  }
  void operator()(const hello_rep& r) {
    o["v"] = r.version;
    o["sandbox_id"] = r.sandbox.str();
    o["generation"] = r.generation;
    o["mode"] = to_string(r.mode);
    o["pid"] = r.pid;
  }
  void operator()(const started_rep& r) {
    o["job"] = r.job.str();
    o["pid"] = r.pid;
    o["existing"] = r.existing;
  }
  void operator()(const output_rep& r) {
    o["job"] = r.job.str();
    o["offset"] = r.offset;
    o["data_b64"] = base64_encode(r.data);
    o["skipped"] = r.skipped;
  }
  void operator()(const status_rep& r) {
    o["job"] = r.job.str();
    o["output_bytes"] = r.output_bytes;
    if (r.done) o["done"] = to_json(*r.done);
  }
  void operator()(const killed_rep& r) { o["done"] = to_json(r.done); }
  void operator()(const jobs_rep& r) {
    o["revision"] = r.revision;
    json::array a;
    for (auto& j : r.jobs)
      a.push_back(json::object{{"job", j.job.str()},
                               {"state", to_string(j.state)},
                               {"preview", j.preview},
                               {"pid", j.pid},
                               {"exit_code", j.exit_code},
                               {"output_bytes", j.output_bytes}});
    o["jobs"] = std::move(a);
  }
  void operator()(const expired_rep& r) {
    json::array a;
    for (auto& j : r.jobs) a.emplace_back(j.str());
    o["jobs"] = std::move(a);
  }
};

decoded<reply_body> decode_rep(std::string_view type, const fields& f) {
  if (type == "error") {
    error_rep r;
    TRY_ASSIGN(r.code, f.str("code"));
    TRY_ASSIGN(r.message, f.str("message"));
    return reply_body(std::move(r));
  }
  if (type == "hello") {
    hello_rep r;
    TRY_ASSIGN(r.version, f.i64("v"));
    std::string sb;
    TRY_ASSIGN(sb, f.str("sandbox_id"));
    r.sandbox = sandbox_id(sb);
    TRY_ASSIGN(r.generation, u64(f, "generation"));
    TRY_ASSIGN(r.mode, mode_field(f));
    TRY_ASSIGN(r.pid, f.i64("pid"));
    return reply_body(std::move(r));
  }
  if (type == "started") {
    started_rep r;
    TRY_ASSIGN(r.job, job_field(f));
    TRY_ASSIGN(r.pid, f.i64("pid"));
    TRY_ASSIGN(r.existing, f.boolean("existing"));
    return reply_body(std::move(r));
  }
  if (type == "output") {
    output_rep r;
    TRY_ASSIGN(r.job, job_field(f));
    TRY_ASSIGN(r.offset, u64(f, "offset"));
    std::string b64;
    TRY_ASSIGN(b64, f.str("data_b64"));
    TRY_ASSIGN(r.data, base64_decode(b64, f.path("data_b64")));
    TRY_ASSIGN(r.skipped, u64(f, "skipped"));
    return reply_body(std::move(r));
  }
  if (type == "status") {
    status_rep r;
    TRY_ASSIGN(r.job, job_field(f));
    TRY_ASSIGN(r.output_bytes, u64(f, "output_bytes"));
    if (f.has("done")) {
      auto it = f.obj().find("done");
      shell_completion c;
      TRY_ASSIGN(c, completion_from_json(it->value(), f.path("done")));
      r.done = std::move(c);
    }
    return reply_body(std::move(r));
  }
  if (type == "killed") {
    killed_rep r;
    auto it = f.obj().find("done");
    if (it == f.obj().end()) return decode_error{f.path("done"), "missing"};
    TRY_ASSIGN(r.done, completion_from_json(it->value(), f.path("done")));
    return reply_body(std::move(r));
  }
  if (type == "jobs") {
    jobs_rep r;
    TRY_ASSIGN(r.revision, u64(f, "revision"));
    const json::array* a;
    TRY_ASSIGN(a, f.array("jobs"));
    for (std::size_t i = 0; i < a->size(); ++i) {
      auto jf = fields::of((*a)[i], f.path("jobs") + "[" + std::to_string(i) + "]");
      if (!jf) return jf.error();
      job_summary s;
      TRY_ASSIGN(s.job, job_field(*jf));
      std::string st;
      TRY_ASSIGN(st, jf->str("state"));
      if (!parse(st, s.state))
        return decode_error{jf->path("state"), "unknown job state '" + st + "'"};
      TRY_ASSIGN(s.preview, jf->str("preview"));
      TRY_ASSIGN(s.pid, jf->i64("pid"));
      TRY_ASSIGN(s.exit_code, jf->i64("exit_code"));
      TRY_ASSIGN(s.output_bytes, u64(*jf, "output_bytes"));
      r.jobs.push_back(std::move(s));
    }
    return reply_body(std::move(r));
  }
  if (type == "expired") {
    expired_rep r;
    const json::array* a;
    TRY_ASSIGN(a, f.array("jobs"));
    for (std::size_t i = 0; i < a->size(); ++i) {
      if (!(*a)[i].is_string())
        return decode_error{f.path("jobs") + "[" + std::to_string(i) + "]", "expected a string"};
      r.jobs.emplace_back(std::string((*a)[i].get_string()));
    }
    return reply_body(std::move(r));
  }
  return decode_error{"type", "unknown reply type '" + std::string(type) + "'"};
}

}  // namespace

decoded<reply> decode_reply(std::string_view line) {
  auto v = parse_line(line);
  if (!v) return v.error();
  auto f = fields::of(*v);
  if (!f) return f.error();
  reply r;
  auto id = opt_u64(*f, "id");
  if (!id) return id.error();
  r.id = id->value_or(0);
  auto type = f->str("type");
  if (!type) return type.error();
  auto body = decode_rep(*type, *f);
  if (!body) return body.error();
  r.body = std::move(*body);
  return r;
}

std::string encode(const reply& r) {
  json::object o = envelope(type_of(r.body), r.id);
  std::visit(reply_encoder{o}, r.body);
  return json::serialize(o);
}

// ---- base64 ----------------------------------------------------------------------------

namespace {
constexpr std::string_view k_b64 =
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
}

std::string base64_encode(std::string_view in) {
  std::string out;
  out.reserve((in.size() + 2) / 3 * 4);
  std::size_t i = 0;
  auto byte = [&](std::size_t k) { return static_cast<unsigned char>(in[k]); };
  for (; i + 2 < in.size(); i += 3) {
    unsigned v = (byte(i) << 16) | (byte(i + 1) << 8) | byte(i + 2);
    out += k_b64[v >> 18];
    out += k_b64[(v >> 12) & 63];
    out += k_b64[(v >> 6) & 63];
    out += k_b64[v & 63];
  }
  if (i + 1 == in.size()) {
    unsigned v = byte(i) << 16;
    out += k_b64[v >> 18];
    out += k_b64[(v >> 12) & 63];
    out += "==";
  } else if (i + 2 == in.size()) {
    unsigned v = (byte(i) << 16) | (byte(i + 1) << 8);
    out += k_b64[v >> 18];
    out += k_b64[(v >> 12) & 63];
    out += k_b64[(v >> 6) & 63];
    out += '=';
  }
  return out;
}

decoded<std::string> base64_decode(std::string_view in, std::string field) {
  if (in.size() % 4 != 0)
    return decode_error{field,
                        "base64 length " + std::to_string(in.size()) + " is not a multiple of 4"};
  std::string out;
  out.reserve(in.size() / 4 * 3);
  auto val = [](char c) -> int {
    auto p = k_b64.find(c);
    return p == std::string_view::npos ? -1 : static_cast<int>(p);
  };
  for (std::size_t i = 0; i < in.size(); i += 4) {
    int v[4];
    int pad = 0;
    for (int k = 0; k < 4; ++k) {
      char c = in[i + k];
      if (c == '=' && i + 4 == in.size() && k >= 2) {
        v[k] = 0;
        ++pad;
        continue;
      }
      if (pad) return decode_error{field, "bad base64 padding at byte " + std::to_string(i + k)};
      v[k] = val(c);
      if (v[k] < 0)
        return decode_error{field, "invalid base64 character at byte " + std::to_string(i + k)};
    }
    unsigned n = (v[0] << 18) | (v[1] << 12) | (v[2] << 6) | v[3];
    out += static_cast<char>(n >> 16);
    if (pad < 2) out += static_cast<char>((n >> 8) & 0xff);
    if (pad < 1) out += static_cast<char>(n & 0xff);
  }
  return out;
}

}  // namespace tether::protocol::sandbox
