#include "tether/protocol/scrub.hpp"

#include <algorithm>
#include <array>
#include <cctype>

namespace tether::protocol {

namespace {

using spans = std::vector<scrub_span>;

bool is_alpha(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}
bool is_digit(char c) {
  return c >= '0' && c <= '9';
}
bool is_alnum(char c) {
  return is_alpha(c) || is_digit(c);
}
bool is_upper(char c) {
  return c >= 'A' && c <= 'Z';
}
bool is_lower(char c) {
  return c >= 'a' && c <= 'z';
}
bool is_space(char c) {
  return c == ' ' || c == '\t';
}
bool is_eol(char c) {
  return c == '\n' || c == '\r';
}
char lower(char c) {
  return is_upper(c) ? static_cast<char>(c - 'A' + 'a') : c;
}

std::string to_lower(std::string_view s) {
  std::string o(s);
  for (auto& c : o) c = lower(c);
  return o;
}

bool contains(std::string_view s, std::string_view w) {
  return s.find(w) != std::string_view::npos;
}
bool starts_with(std::string_view s, std::string_view w) {
  return s.substr(0, w.size()) == w;
}
bool ends_with(std::string_view s, std::string_view w) {
  return s.size() >= w.size() && s.substr(s.size() - w.size()) == w;
}

// ---- names -------------------------------------------------------------------

constexpr std::array<std::string_view, 9> k_env_words = {
    "key", "token", "secret", "password", "passwd", "credential", "auth", "cookie", "session"};

// Parts that contain a secret word but name ordinary things.
constexpr std::array<std::string_view, 26> k_benign_parts = {
    "monkey",       "donkey",      "turkey",        "hockey",     "jockey",   "whiskey",
    "hotkey",       "tokens",      "tokenizer",     "tokenizers", "tokenize", "tokenized",
    "tokenization", "tokenizing",  "author",        "authors",    "authored", "authoring",
    "authority",    "authorities", "authoritative", "authorship", "sessions", "keyless",
    "passkeys",     "keys"};

std::vector<std::string> name_parts(std::string_view name) {
  std::vector<std::string> parts;
  std::string cur;
  for (std::size_t i = 0; i < name.size(); ++i) {
    char c = name[i];
    if (!is_alnum(c)) {
      if (!cur.empty()) parts.push_back(std::move(cur)), cur.clear();
      continue;
    }
    bool boundary = false;
    if (is_upper(c) && i > 0) {
      char p = name[i - 1];
      bool next_lower = i + 1 < name.size() && is_lower(name[i + 1]);
      boundary = is_lower(p) || is_digit(p) || (is_upper(p) && next_lower);
    }
    if (boundary && !cur.empty()) parts.push_back(std::move(cur)), cur.clear();
    cur.push_back(lower(c));
  }
  if (!cur.empty()) parts.push_back(std::move(cur));
  return parts;
}

bool secret_part(std::string_view p) {
  if (std::find(k_benign_parts.begin(), k_benign_parts.end(), p) != k_benign_parts.end())
    return false;
  if (p == "pass" || p == "pw" || p == "pat") return true;
  for (std::string_view w :
       {"password", "passwd", "passphrase", "secret", "credential", "cookie", "token", "session"})
    if (contains(p, w)) return true;
  if (ends_with(p, "key")) return true;
  if (starts_with(p, "auth") || ends_with(p, "auth")) return true;
  return false;
}

// Names whose value runs to the end of the line (HTTP-header style).
bool header_like(std::string_view lname) {
  return lname == "authorization" || lname == "proxy-authorization" || lname == "cookie" ||
         lname == "set-cookie" || lname == "www-authenticate";
}

bool auth_scheme(std::string_view w) {
  auto l = to_lower(w);
  return l == "bearer" || l == "basic" || l == "token" || l == "bot" || l == "digest" ||
         l == "negotiate" || l == "apikey" || l == "key";
}

// Values that are clearly not secrets themselves.
bool placeholder_value(std::string_view v) {
  if (v.empty()) return true;
  if (v.front() == '$' || v.front() == '%' || v.front() == '<' || v.front() == '{') return true;
  if (v == k_redacted) return true;
  if (std::all_of(v.begin(), v.end(), [](char c) { return c == '*' || c == 'x' || c == 'X'; }))
    return true;
  if (v.size() > 16) return false;  // longer than every word below
  auto l = to_lower(v);
  return l == "null" || l == "none" || l == "true" || l == "false" || l == "undefined" ||
         l == "nil" || l == "required" || l == "optional";
}

// ---- character classes for prefixed tokens ------------------------------------

enum class cs {
  upper_digit,
  lower_digit,
  alnum,
  alnum_us,
  alnum_dash,
  b64url,
  b64url_dot,
  hex_lower,
  hex,
  b64
};

bool in_cs(cs k, char c) {
  switch (k) {
    case cs::upper_digit:
      return is_upper(c) || is_digit(c);
    case cs::lower_digit:
      return is_lower(c) || is_digit(c);
    case cs::alnum:
      return is_alnum(c);
    case cs::alnum_us:
      return is_alnum(c) || c == '_';
    case cs::alnum_dash:
      return is_alnum(c) || c == '-';
    case cs::b64url:
      return is_alnum(c) || c == '_' || c == '-';
    case cs::b64url_dot:
      return is_alnum(c) || c == '_' || c == '-' || c == '.';
    case cs::hex_lower:
      return is_digit(c) || (c >= 'a' && c <= 'f');
    case cs::hex:
      return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
    case cs::b64:
      return is_alnum(c) || c == '+' || c == '/' || c == '=' || c == '_' || c == '-';
  }
  return false;
}

struct token_rule {
  std::string_view prefix;
  cs set;
  std::size_t min;
  std::size_t max;
  bool mixed = false;  // the body must hold a letter and a digit
};

// Credential formats recognised by a fixed prefix.
constexpr token_rule k_token_rules[] = {
    // cloud providers
    {"AKIA", cs::upper_digit, 16, 16},
    {"ASIA", cs::upper_digit, 16, 16},
    {"ABIA", cs::upper_digit, 16, 16},
    {"ACCA", cs::upper_digit, 16, 16},
    {"AGPA", cs::upper_digit, 16, 16},
    {"AIDA", cs::upper_digit, 16, 16},
    {"AIPA", cs::upper_digit, 16, 16},
    {"ANPA", cs::upper_digit, 16, 16},
    {"ANVA", cs::upper_digit, 16, 16},
    {"AROA", cs::upper_digit, 16, 16},
    {"APKA", cs::upper_digit, 16, 16},
    {"ASCA", cs::upper_digit, 16, 16},
    {"AIza", cs::b64url, 35, 35},
    {"ya29.", cs::b64url_dot, 20, 2048},
    {"dop_v1_", cs::hex_lower, 64, 64},
    {"doo_v1_", cs::hex_lower, 64, 64},
    {"hvs.", cs::b64url, 20, 512},
    {"hvb.", cs::b64url, 20, 512},
    {"AGE-SECRET-KEY-1", cs::upper_digit, 50, 80},
    // version control and CI
    {"ghp_", cs::alnum, 36, 255},
    {"gho_", cs::alnum, 36, 255},
    {"ghu_", cs::alnum, 36, 255},
    {"ghs_", cs::alnum, 36, 255},
    {"ghr_", cs::alnum, 36, 255},
    {"github_pat_", cs::alnum_us, 22, 255},
    {"glpat-", cs::b64url, 20, 255},
    {"gldt-", cs::b64url, 20, 255},
    {"glrt-", cs::b64url, 20, 255},
    {"glptt-", cs::b64url, 20, 255},
    {"glcbt-", cs::b64url, 20, 255},
    {"glsoat-", cs::b64url, 20, 255},
    {"gloas-", cs::b64url, 20, 255},
    {"glimt-", cs::b64url, 20, 255},
    {"ATBB", cs::alnum, 28, 255},
    {"CCIPAT_", cs::alnum_us, 20, 255},
    {"bkua_", cs::hex_lower, 40, 40},
    {"dckr_pat_", cs::b64url, 20, 255},
    {"rubygems_", cs::hex_lower, 48, 48},
    {"npm_", cs::alnum, 36, 36},
    {"pypi-", cs::b64url, 50, 512},
    // chat platforms
    {"xoxb-", cs::alnum_dash, 10, 255},
    {"xoxp-", cs::alnum_dash, 10, 255},
    {"xoxa-", cs::alnum_dash, 10, 255},
    {"xoxr-", cs::alnum_dash, 10, 255},
    {"xoxs-", cs::alnum_dash, 10, 255},
    {"xoxe-", cs::alnum_dash, 10, 255},
    {"xapp-", cs::alnum_dash, 10, 255},
    // API keys with known prefixes
    {"sk_live_", cs::alnum, 16, 255},
    {"sk_test_", cs::alnum, 16, 255},
    {"rk_live_", cs::alnum, 16, 255},
    {"rk_test_", cs::alnum, 16, 255},
    {"whsec_", cs::b64, 16, 255},
    {"sk-ant-", cs::b64url, 20, 255, true},
    {"sk-proj-", cs::b64url, 20, 255, true},
    {"sk-", cs::b64url, 20, 255, true},
    {"hf_", cs::alnum, 30, 64},
    {"gsk_", cs::alnum, 40, 64},
    {"r8_", cs::alnum, 30, 64},
    {"pplx-", cs::alnum, 40, 64},
    {"xai-", cs::alnum, 40, 128},
    {"lin_api_", cs::alnum, 30, 64},
    {"SG.", cs::b64url_dot, 60, 80},
    {"glc_", cs::b64, 32, 255},
    {"shpat_", cs::hex, 32, 32},
    {"shpss_", cs::hex, 32, 32},
    {"shpca_", cs::hex, 32, 32},
    {"shppa_", cs::hex, 32, 32},
    {"key-", cs::lower_digit, 32, 32, true},  // Mailgun: hex or base36
    {"SK", cs::hex_lower, 32, 32},
    {"nfp_", cs::alnum, 30, 64},
    {"sq0atp-", cs::b64url, 20, 64},
    {"sq0csp-", cs::b64url, 40, 64},
};

// The first position at or after `from` where `stop(c)` holds (or t.size()),
// remembering the last answer: a later search starting inside an already
// scanned stretch reuses it, so overlapping candidates never rescan a run.
class next_stop {
 public:
  using stop_fn = bool (*)(char);
  explicit next_stop(stop_fn stop) : stop_(stop) {}
  std::size_t find(std::string_view t, std::size_t from) {
    if (from >= from_ && from <= at_) return at_;
    std::size_t i = from;
    while (i < t.size() && !stop_(t[i])) ++i;
    from_ = from;
    at_ = i;
    return i;
  }

 private:
  stop_fn stop_;
  std::size_t from_ = std::string_view::npos;
  std::size_t at_ = 0;
};

// After an ANSI control sequence (ESC [ params final-letter): the letter ends
// the sequence, not a word, so a token glued to it still starts a word.
bool after_ansi(std::string_view t, std::size_t at) {
  if (at < 3) return false;
  char fin = t[at - 1];
  if (fin < '@' || fin > '~') return false;
  std::size_t i = at - 1;
  std::size_t lo = at > 40 ? at - 40 : 0;
  while (i > lo && ((t[i - 1] >= '0' && t[i - 1] <= '9') || t[i - 1] == ';' || t[i - 1] == '?'))
    --i;
  return i >= 2 && t[i - 1] == '[' && t[i - 2] == '\x1b';
}

// Short or word-like prefixes ("sk-", "key-") must not follow a letter (as in
// "task-…", "monkey-…"); a digit before them is no word ("91hf_…", a counter or
// a byte count glued on). Longer, distinctive prefixes are caught even when
// glued to a word ("idAKIA…", "stripeKeysk_live_…").
bool needs_boundary(const token_rule& r) {
  return r.prefix.size() < 4 || r.prefix == "key-" || r.prefix == "xai-";
}

// Linear: every run of the rule's characters is scanned once per rule, and
// an occurrence of the prefix inside an already scanned run reuses its end.
void match_token_rules(std::string_view t, spans& out) {
  for (const auto& r : k_token_rules) {
    std::size_t run_begin = std::string_view::npos, run_end = 0;
    for (std::size_t at = t.find(r.prefix); at != std::string_view::npos;
         at = t.find(r.prefix, at + 1)) {
      if (at > 0 && is_alpha(t[at - 1]) && needs_boundary(r) && !after_ansi(t, at)) continue;
      std::size_t b = at + r.prefix.size();
      std::size_t e;
      if (run_begin != std::string_view::npos && b >= run_begin && b <= run_end) {
        e = run_end;
      } else {
        e = b;
        while (e < t.size() && in_cs(r.set, t[e])) ++e;
        run_begin = b;
        run_end = e;
      }
      std::size_t n = e - b;
      if (n < r.min || n > r.max) continue;
      if (r.mixed) {
        bool letter = false, digit = false;
        for (std::size_t i = b; i < e && !(letter && digit); ++i)
          letter |= is_alpha(t[i]), digit |= is_digit(t[i]);
        if (!letter || !digit) continue;
      }
      out.push_back({at, e});
    }
  }
}

void match_jwt(std::string_view t, spans& out) {
  auto run = [&](std::size_t i) {
    while (i < t.size() && in_cs(cs::b64url, t[i])) ++i;
    return i;
  };
  for (std::size_t at = t.find("eyJ"); at != std::string_view::npos; at = t.find("eyJ", at + 1)) {
    if (at > 0 && (in_cs(cs::b64url, t[at - 1]) || t[at - 1] == '.')) continue;
    std::size_t e1 = run(at);
    if (e1 - at < 10 || e1 >= t.size() || t[e1] != '.') continue;
    std::size_t e2 = run(e1 + 1);
    if (e2 - e1 - 1 < 10) continue;
    std::size_t end = e2;
    if (e2 < t.size() && t[e2] == '.') end = run(e2 + 1);
    out.push_back({at, end});
  }
}

void match_telegram(std::string_view t, spans& out) {
  for (std::size_t at = t.find(":AA"); at != std::string_view::npos; at = t.find(":AA", at + 1)) {
    std::size_t b = at;
    while (b > 0 && at - b <= 10 && is_digit(t[b - 1])) --b;
    if (at - b < 8 || at - b > 10 || (b > 0 && is_alnum(t[b - 1]))) continue;
    std::size_t e = at + 1;
    while (e < t.size() && in_cs(cs::b64url, t[e])) ++e;
    if (e - at - 1 < 32) continue;
    out.push_back({b, e});
  }
}

void match_webhooks(std::string_view t, spans& out) {
  for (std::string_view host :
       {"hooks.slack.com/services/", "hooks.slack.com/workflows/", "discord.com/api/webhooks/",
        "discordapp.com/api/webhooks/", "webhook.office.com/webhookb2/"}) {
    for (std::size_t at = t.find(host); at != std::string_view::npos; at = t.find(host, at + 1)) {
      std::size_t b = at + host.size();
      std::size_t e = b;
      while (e < t.size() && (in_cs(cs::b64url, t[e]) || t[e] == '/' || t[e] == '@')) ++e;
      if (e - b >= 8) out.push_back({b, e});
    }
  }
}

void match_bearer(std::string_view t, spans& out) {
  std::string l = to_lower(t);
  for (std::size_t at = l.find("bearer"); at != std::string::npos; at = l.find("bearer", at + 1)) {
    if (at > 0 && is_alnum(t[at - 1])) continue;
    std::size_t b = at + 6;
    if (b >= t.size() || !is_space(t[b])) continue;
    while (b < t.size() && is_space(t[b])) ++b;
    std::size_t e = b;
    while (e < t.size() &&
           (is_alnum(t[e]) || std::string_view("._~+/=-").find(t[e]) != std::string_view::npos))
      ++e;
    if (e - b >= 8) out.push_back({b, e});
  }
}

bool url_stop(char c) {
  return is_space(c) || is_eol(c) || std::string_view("\"'<>`\\").find(c) != std::string_view::npos;
}

// scheme://user:PASSWORD@host. The password may hold '/', '?' or '#'
// (mysql://root:pa/ss@db); "host:8080/path@x" is a port, not a password.
void match_url_password(std::string_view t, spans& out) {
  constexpr std::size_t k_max_part = 256;
  next_stop at_or_stop([](char c) { return c == '@' || url_stop(c); });
  for (std::size_t at = t.find("://"); at != std::string_view::npos; at = t.find("://", at + 1)) {
    if (at == 0 || !is_alpha(t[at - 1])) continue;
    std::size_t b = at + 3;
    // The user part stops at ':' (or anything that ends an authority).
    std::size_t colon = b;
    while (colon < t.size() && colon - b <= k_max_part && !url_stop(t[colon]) &&
           std::string_view(":/?#@").find(t[colon]) == std::string_view::npos)
      ++colon;
    if (colon >= t.size() || t[colon] != ':' || colon - b > k_max_part) continue;
    std::size_t pb = colon + 1;
    std::size_t atsign = at_or_stop.find(t, pb);
    if (atsign >= t.size() || t[atsign] != '@' || atsign - pb > k_max_part) continue;
    auto pw = t.substr(pb, atsign - pb);
    auto cut = pw.find_first_of("/?#");
    if (cut != std::string_view::npos) {
      auto first = pw.substr(0, cut);
      if (std::all_of(first.begin(), first.end(), is_digit)) continue;  // a port
      // The password's '@' is the last one before the host: an '@' later in a path is not.
    }
    if (placeholder_value(pw)) continue;
    out.push_back({pb, atsign});
  }
}

bool is_name_char(char c) {
  return is_alnum(c) || c == '_' || c == '-' || c == '.';
}

bool word_end(char c) {
  return is_space(c) || is_eol(c) || c == '"' || c == '\'' || c == ';' || c == '&' || c == '|';
}

// The start of the line holding t[at], looking back at most 128 bytes.
std::size_t line_start(std::string_view t, std::size_t at) {
  std::size_t lo = at > 128 ? at - 128 : 0;
  std::size_t b = at;
  while (b > lo && !is_eol(t[b - 1])) --b;
  return b;
}

// Command-line credentials: `curl -u user:PASS` / `--user user:PASS`, and
// `mysql -pPASS` (also mysqldump, mysqladmin, mariadb).
void match_cli_credentials(std::string_view t, spans& out) {
  for (std::string_view flag : {" -u ", " -u", " --user ", " --user="}) {
    bool glued = flag.back() != ' ';
    for (std::size_t at = t.find(flag); at != std::string_view::npos; at = t.find(flag, at + 1)) {
      std::size_t v = at + flag.size();
      if (glued && flag == " -u" && (v >= t.size() || is_space(t[v]) || t[v] == '=')) continue;
      if (v < t.size() && (t[v] == '"' || t[v] == '\'')) ++v;
      std::size_t e = v;
      while (e < t.size() && e - v <= 256 && !word_end(t[e])) ++e;
      auto cred = t.substr(v, e - v);
      auto colon = cred.find(':');
      if (colon == std::string_view::npos || colon == 0 || e - v > 256) continue;
      if (placeholder_value(cred.substr(colon + 1))) continue;
      out.push_back({v + colon + 1, e});
    }
  }
  for (std::string_view tool : {"mysql", "mariadb"}) {
    std::size_t done_to = 0;
    for (std::size_t at = t.find(tool); at != std::string_view::npos; at = t.find(tool, at + 1)) {
      if (at < done_to) continue;
      std::size_t eol = at;
      while (eol < t.size() && !is_eol(t[eol])) ++eol;
      done_to = eol;
      for (std::size_t p = t.find(" -p", at); p != std::string_view::npos && p < eol;
           p = t.find(" -p", p + 1)) {
        std::size_t v = p + 3;
        if (v >= eol || word_end(t[v])) continue;  // bare -p prompts for it
        std::size_t e = v;
        if (t[v] == '"' || t[v] == '\'') {
          char q = t[v++];
          e = v;
          while (e < eol && t[e] != q) ++e;
        } else {
          while (e < eol && !word_end(t[e])) ++e;
        }
        if (!placeholder_value(t.substr(v, e - v))) out.push_back({v, e});
      }
    }
  }
}

// .netrc: `machine HOST login USER password PASS` (also one per line).
void match_netrc(std::string_view t, spans& out) {
  for (std::size_t at = t.find("password"); at != std::string_view::npos;
       at = t.find("password", at + 1)) {
    if (at > 0 && !is_space(t[at - 1]) && !is_eol(t[at - 1])) continue;
    std::size_t v = at + 8;
    if (v >= t.size() || !is_space(t[v])) continue;
    while (v < t.size() && is_space(t[v])) ++v;
    std::size_t e = v;
    while (e < t.size() && e - v <= 256 && !is_space(t[e]) && !is_eol(t[e])) ++e;
    if (e == v || e - v > 256) continue;
    auto before = t.substr(line_start(t, at), at - line_start(t, at));
    bool netrc =
        contains(before, "machine ") || contains(before, "login ") || contains(before, "default ");
    if (!netrc || placeholder_value(t.substr(v, e - v))) continue;
    out.push_back({v, e});
  }
}

// <password>PASS</password>, <apiKey>…</apiKey>: an element whose name looks secret.
void match_xml(std::string_view t, spans& out) {
  for (std::size_t at = t.find('<'); at != std::string_view::npos; at = t.find('<', at + 1)) {
    std::size_t nb = at + 1, ne = nb;
    while (ne < t.size() && ne - nb <= 64 && is_name_char(t[ne])) ++ne;
    if (ne == nb || ne >= t.size() || t[ne] != '>' || !is_alpha(t[nb])) continue;
    if (!looks_secret_name(t.substr(nb, ne - nb))) continue;
    std::size_t v = ne + 1, e = v;
    while (e < t.size() && e - v <= 4096 && t[e] != '<' && !is_eol(t[e])) ++e;
    if (e >= t.size() || t[e] != '<' || e - v > 4096) continue;
    if (placeholder_value(t.substr(v, e - v))) continue;
    out.push_back({v, e});
  }
}

// -----BEGIN ... PRIVATE KEY----- blocks: the body between the armour lines.
// Every search resumes where the last one ended, so the text is read once.
void match_pem(std::string_view t, bool open_at_from, std::size_t from, std::size_t check,
               bool* open_at_check, spans& out) {
  constexpr std::size_t k_max_header = 128;
  std::size_t end_from = std::string_view::npos, end_at = 0;
  auto find_end = [&](std::size_t from_pos) {
    if (end_from != std::string_view::npos && from_pos >= end_from &&
        (end_at == std::string_view::npos || from_pos <= end_at))
      return end_at;
    end_from = from_pos;
    end_at = t.find("-----END ", from_pos);
    return end_at;
  };
  bool open_check = false;
  auto add_body = [&](std::size_t b) {
    std::size_t e = find_end(b);
    std::size_t body_end = e == std::string_view::npos ? t.size() : e;
    if (body_end > b) out.push_back({b, body_end});
    if (b <= check && (e == std::string_view::npos || e > check)) open_check = true;
    return e == std::string_view::npos ? t.size() : e + 9;
  };
  std::size_t pos = 0;
  if (open_at_from) {
    // Unless a BEGIN in the look-behind reopens it below, the block runs from `from`.
    auto begin_before = t.substr(0, from).rfind("-----BEGIN ");
    if (begin_before == std::string_view::npos) pos = add_body(from);
  }
  for (std::size_t at = t.find("-----BEGIN ", pos); at != std::string_view::npos;
       at = t.find("-----BEGIN ", pos)) {
    std::string_view header = t.substr(at, k_max_header);
    header = header.substr(0, header.find('\n'));
    if (!contains(header, "PRIVATE KEY")) {
      pos = at + 11;
      continue;
    }
    // The body starts after the header's closing dashes.
    std::size_t close = header.find("-----", 11);
    std::size_t b = close == std::string_view::npos ? at + header.size() : at + close + 5;
    pos = add_body(b);
    if (pos >= t.size()) break;
  }
  if (open_at_check) *open_at_check = open_check;
}

// NAME=value, NAME: value, "name": "value", --name=value, --name value.
// Linear: a value's end is found through next_stop caches, so separators
// inside one long value (a=a=a=…) do not rescan it.
void match_assignments(std::string_view t, const scrubber& s, spans& out) {
  auto value_stop = [](char c) {
    return is_space(c) || is_eol(c) ||
           std::string_view("\"'`,;&|<>)}]").find(c) != std::string_view::npos;
  };
  next_stop unquoted(value_stop);
  next_stop to_eol([](char c) { return is_eol(c); });
  next_stop to_dq([](char c) { return is_eol(c) || c == '"'; });
  next_stop to_sq([](char c) { return is_eol(c) || c == '\''; });
  std::size_t trim_from = std::string_view::npos, trim_to = 0;
  char trim_encl = 0;
  std::size_t i = 0;
  while (i < t.size()) {
    std::size_t sep = t.find_first_of("=: ", i);
    if (sep == std::string_view::npos) break;
    i = sep + 1;
    char sc = t[sep];
    // The name ends at `sep`, or before a closing quote, or before spaces.
    std::size_t ne = sep;
    if (sc != ' ')
      while (ne > 0 && is_space(t[ne - 1])) --ne;
    char quote = 0;
    if (ne > 0 && (t[ne - 1] == '"' || t[ne - 1] == '\'')) quote = t[--ne];
    std::size_t nb = ne;
    while (nb > 0 && is_name_char(t[nb - 1])) --nb;
    if (nb == ne) continue;
    if (quote && (nb == 0 || t[nb - 1] != quote)) continue;
    std::string_view name = t.substr(nb, ne - nb);
    bool flag = starts_with(name, "--");
    if (sc == ' ' && (!flag || quote)) continue;  // "NAME value" only for --flags
    std::string_view bare = name;
    while (!bare.empty() && bare.front() == '-') bare.remove_prefix(1);
    if (bare.empty() || !is_alpha(bare.front())) continue;
    if (!looks_secret_name(bare) && !s.is_registered_name(bare)) continue;

    std::size_t v = sep + 1;
    if (sc == '=') {
      if (v < t.size() && t[v] == '=') continue;  // ==
      if (sep > 0 && std::string_view("!<>=").find(t[sep - 1]) != std::string_view::npos) continue;
      if (v < t.size() && t[v] == '>') ++v;  // =>
    } else if (sc == ':') {
      if (v < t.size() && t[v] == '=') {
        ++v;  // :=
      } else if (!(v >= t.size() || is_space(t[v]) || t[v] == '"' || t[v] == '\'' || quote)) {
        continue;  // "name:value" without a space is more often a key path than a secret
      }
    }
    while (v < t.size() && is_space(t[v])) ++v;
    if (v >= t.size() || is_eol(t[v])) continue;
    std::size_t vb = v, ve;
    std::string lname = to_lower(bare);
    if (t[v] == '"' || t[v] == '\'') {
      char q = t[v];
      vb = v + 1;
      auto& to_q = q == '"' ? to_dq : to_sq;
      ve = to_q.find(t, vb);
      // An escaped quote does not close the value.
      while (ve < t.size() && t[ve] == q && ve > vb && t[ve - 1] == '\\') ve = to_q.find(t, ve + 1);
    } else if (header_like(lname)) {
      // To the end of the line, or to the quote that encloses `-H "Name: value"`.
      char encl = nb > 0 && (t[nb - 1] == '"' || t[nb - 1] == '\'') ? t[nb - 1] : 0;
      ve = encl == '"' ? to_dq.find(t, vb) : encl == '\'' ? to_sq.find(t, vb) : to_eol.find(t, vb);
      // Trailing blanks before one line end are trimmed once, not once per candidate.
      if (ve == trim_from && encl == trim_encl) {
        ve = std::max(vb, trim_to);
      } else {
        trim_from = ve;
        trim_encl = encl;
        while (ve > vb && (is_space(t[ve - 1]) || (encl && t[ve - 1] == '\\'))) --ve;
        trim_to = ve;
      }
      // "Bearer $TOKEN": the scheme is followed by a reference, not a credential.
      auto value = t.substr(vb, ve - vb);
      auto sp = value.find(' ');
      if (sp != std::string_view::npos && auth_scheme(value.substr(0, sp))) {
        auto cred = value.substr(sp);
        while (!cred.empty() && is_space(cred.front())) cred.remove_prefix(1);
        if (placeholder_value(cred)) continue;
      }
    } else {
      ve = unquoted.find(t, vb);
      // "Authorization: Bearer abc" style: a scheme word, then the credential.
      if (ve - vb <= 16 && auth_scheme(t.substr(vb, ve - vb)) && ve < t.size() && is_space(t[ve])) {
        std::size_t w = ve;
        while (w < t.size() && is_space(t[w])) ++w;
        std::size_t we = unquoted.find(t, w);
        if (we > w) vb = w, ve = we;
      }
    }
    if (flag && sc == ' ' && t[vb] == '-') continue;
    if (placeholder_value(t.substr(vb, ve - vb))) continue;
    out.push_back({vb, ve});
    i = std::max(i, ve);
  }
}

void match_values(std::string_view t, const std::vector<std::string>& values, spans& out) {
  for (const auto& v : values)
    for (std::size_t at = t.find(v); at != std::string_view::npos; at = t.find(v, at + 1))
      out.push_back({at, at + v.size()});
}

void merge(spans& s) {
  std::sort(s.begin(), s.end(), [](const scrub_span& a, const scrub_span& b) {
    return a.begin < b.begin || (a.begin == b.begin && a.end > b.end);
  });
  spans m;
  for (auto& x : s) {
    if (x.end <= x.begin) continue;
    if (!m.empty() && x.begin <= m.back().end)
      m.back().end = std::max(m.back().end, x.end);
    else
      m.push_back(x);
  }
  s.swap(m);
}

}  // namespace

bool env_name_is_secret(std::string_view name) {
  auto l = to_lower(name);
  for (auto w : k_env_words)
    if (contains(l, w)) return true;
  return false;
}

bool looks_secret_name(std::string_view name) {
  for (auto& p : name_parts(name))
    if (secret_part(p)) return true;
  return false;
}

scrub_rules scrub_rules::from_env(const std::vector<std::pair<std::string, std::string>>& env,
                                  const std::vector<std::string>& extra_names) {
  scrub_rules r;
  r.secret_names = extra_names;
  auto registered = [&](const std::string& n) {
    return std::any_of(extra_names.begin(), extra_names.end(),
                       [&](const std::string& x) { return to_lower(x) == to_lower(n); });
  };
  for (auto& [k, v] : env) {
    if (!env_name_is_secret(k) && !registered(k)) continue;
    // A value with line breaks is matched line by line: output is scrubbed per line.
    std::size_t b = 0;
    while (b <= v.size()) {
      std::size_t e = v.find_first_of("\r\n", b);
      if (e == std::string::npos) e = v.size();
      std::string piece = v.substr(b, e - b);
      if (piece.size() >= k_min_secret_value &&
          std::find(r.secret_values.begin(), r.secret_values.end(), piece) == r.secret_values.end())
        r.secret_values.push_back(std::move(piece));
      b = e + 1;
    }
  }
  // Longest first, so a value containing another is redacted whole.
  std::sort(r.secret_values.begin(), r.secret_values.end(),
            [](const std::string& a, const std::string& b) { return a.size() > b.size(); });
  return r;
}

scrubber::scrubber(scrub_rules rules) : rules_(std::move(rules)) {
  auto& v = rules_.secret_values;
  v.erase(std::remove_if(v.begin(), v.end(),
                         [](const std::string& x) { return x.size() < k_min_secret_value; }),
          v.end());
}

bool scrubber::is_registered_name(std::string_view name) const {
  auto l = to_lower(name);
  return std::any_of(rules_.secret_names.begin(), rules_.secret_names.end(),
                     [&](const std::string& n) { return to_lower(n) == l; });
}

std::vector<scrub_span> scrubber::find(std::string_view text, bool pem_open, std::size_t pem_from,
                                       std::size_t check, bool* pem_open_at) const {
  spans out;
  match_values(text, rules_.secret_values, out);
  match_pem(text, pem_open, pem_from, check, pem_open_at, out);
  match_token_rules(text, out);
  match_jwt(text, out);
  match_telegram(text, out);
  match_webhooks(text, out);
  match_bearer(text, out);
  match_url_password(text, out);
  match_assignments(text, *this, out);
  match_cli_credentials(text, out);
  match_netrc(text, out);
  match_xml(text, out);
  merge(out);
  return out;
}

std::string apply_spans(std::string_view text, const std::vector<scrub_span>& sp, std::size_t from,
                        std::size_t to) {
  std::string out;
  out.reserve(to - from);
  std::size_t pos = from;
  for (const auto& s : sp) {
    if (s.end <= from || s.begin >= to) continue;
    std::size_t b = std::max(s.begin, from), e = std::min(s.end, to);
    if (b > pos) out.append(text.substr(pos, b - pos));
    out.append(k_redacted);
    pos = e;
  }
  if (pos < to) out.append(text.substr(pos, to - pos));
  return out;
}

std::string scrubber::scrub(std::string_view text) const {
  return apply_spans(text, find(text), 0, text.size());
}

// ---- streaming ------------------------------------------------------------------

std::string stream_scrubber::emit(std::size_t cut, bool keep_context) {
  std::string buf = context_ + pending_;
  std::size_t from = context_.size();
  std::size_t end = from + cut;
  bool open_after = false;
  auto sp = s_->find(buf, pem_open_, from, end, &open_after);
  std::string out = apply_spans(buf, sp, from, end);
  // One secret across an emission cut is one visible redaction, not two.
  bool starts_redacted = false, ends_redacted = false;
  for (const auto& x : sp) {
    starts_redacted |= x.begin <= from && x.end > from;
    ends_redacted |= end > from && x.begin < end && x.end >= end;
  }
  if (starts_redacted && last_redacted_ && out.compare(0, k_redacted.size(), k_redacted) == 0)
    out.erase(0, k_redacted.size());
  if (end > from) last_redacted_ = ends_redacted;
  pem_open_ = open_after;
  if (keep_context) {
    std::size_t keep = std::min(k_overlap, end);
    context_.assign(buf, end - keep, keep);
  } else {
    context_.clear();
  }
  pending_.erase(0, cut);
  return out;
}

std::string stream_scrubber::feed(std::string_view chunk) {
  // Only the new chunk is searched for a line break: held bytes have none.
  std::size_t before = pending_.size();
  pending_.append(chunk);
  auto nl = chunk.find_last_of("\n\r");
  if (nl != std::string_view::npos) return emit(before + nl + 1, false);
  if (pending_.size() > k_max_hold) return emit(pending_.size() - k_overlap, true);
  return {};
}

std::string stream_scrubber::finish() {
  std::string out = emit(pending_.size(), false);
  pem_open_ = false;
  return out;
}

}  // namespace tether::protocol
