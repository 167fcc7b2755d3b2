#pragma once
// Scrubbing credentials out of text that leaves the sandbox side (command
// previews, output tails, attached output). Redaction is visible: each secret
// becomes "[REDACTED]". Two passes, merged into one set of spans:
//
//  1. the exact values of secret-bearing environment variables given to the
//     command (names containing KEY, TOKEN, SECRET, PASSWORD, PASSWD,
//     CREDENTIAL, AUTH, COOKIE or SESSION, or registered explicitly), wherever
//     they appear; values shorter than k_min_secret_value bytes are skipped
//     because they would redact ordinary words;
//  2. well-known credential formats: cloud access keys, version-control and CI
//     tokens, chat-platform tokens and webhooks, API keys with known prefixes,
//     JWTs, bearer credentials, Authorization/Cookie headers, URLs with an
//     embedded password, private key blocks, and NAME=value / NAME: value
//     assignments (optionally `export`ed, quoted, or `--name=value` flags)
//     whose NAME looks secret.
//
// The matchers are hand-written (no std::regex): scrubbing runs on every
// output chunk of every job.
#include <cstddef>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace tether::protocol {

inline constexpr std::string_view k_redacted = "[REDACTED]";
inline constexpr std::size_t k_min_secret_value = 6;

/// Environment rule: the name contains one of the secret keywords (any case).
bool env_name_is_secret(std::string_view name);

/// Assignment rule: one of the name's parts (split at _ - . and camelCase)
/// is a secret word. Stricter than env_name_is_secret so that `Author:` or
/// `max_tokens=` in ordinary output stay untouched.
bool looks_secret_name(std::string_view name);

struct scrub_rules {
  std::vector<std::string> secret_values;  // redacted wherever they appear
  std::vector<std::string> secret_names;   // registered names, also for the assignment rule

  /// The values of every secret-bearing variable of `env`, plus those named in `extra_names`.
  static scrub_rules from_env(const std::vector<std::pair<std::string, std::string>>& env,
                              const std::vector<std::string>& extra_names = {});
};

/// A byte range [begin, end) to redact.
struct scrub_span {
  std::size_t begin;
  std::size_t end;
};

class scrubber {
 public:
  explicit scrubber(scrub_rules rules = {});

  /// `text` with every secret replaced by k_redacted.
  std::string scrub(std::string_view text) const;

  /// The spans to redact in `text`, sorted and merged. `pem_open` says a
  /// private key block opened before text[pem_from]; `pem_open_at`, if given,
  /// is set to whether a block is open at text[check].
  std::vector<scrub_span> find(std::string_view text, bool pem_open = false,
                               std::size_t pem_from = 0, std::size_t check = 0,
                               bool* pem_open_at = nullptr) const;

  bool is_registered_name(std::string_view name) const;

 private:
  scrub_rules rules_;
};

/// Scrubs a stream chunk by chunk. A secret split across chunks is caught:
/// bytes after the last line break are held back until the line completes
/// (or, for lines longer than k_max_hold, the last k_overlap bytes are held
/// and kept as look-behind context), so no part of a secret shorter than
/// k_overlap is ever emitted unredacted.
class stream_scrubber {
 public:
  static constexpr std::size_t k_overlap = 4096;
  static constexpr std::size_t k_max_hold = 16 * 1024;

  explicit stream_scrubber(const scrubber& s) : s_(&s) {}

  /// Scrubbed bytes that are safe to emit now (maybe empty).
  std::string feed(std::string_view chunk);
  /// Everything still held, scrubbed; the stream is over.
  std::string finish();
  /// Raw bytes held back, not yet emitted.
  std::size_t held() const { return pending_.size(); }

 private:
  std::string emit(std::size_t cut, bool keep_context);
  const scrubber* s_;    // not owned; must outlive this
  std::string context_;  // already emitted raw bytes kept for look-behind
  std::string pending_;  // raw bytes not yet emitted
  bool pem_open_ = false;
  bool last_redacted_ = false;  // the emitted bytes so far end inside a redaction
};

/// Repeating units that once made scrubbing quadratic (a prefix rescanned at
/// every occurrence, a value rescanned at every separator). Scrubbing text made
/// of any of them is linear; tests/scrub_test.cpp and bench/bench_scrub.cpp
/// prove and measure it.
struct scrub_worst_case {
  std::string_view name;
  std::string_view unit;
};
inline constexpr scrub_worst_case k_scrub_worst_cases[] = {
    {"sk-", "sk-"},
    {"xoxb-", "xoxb-"},
    {"ya29.", "ya29."},
    {"github_pat_", "github_pat_"},
    {"pem-begin", "-----BEGIN "},
    {"pem-private", "-----BEGIN PRIVATE KEY-----"},
    {"assignment-placeholder", "a_token=$"},
    {"assignment-quoted", "password=\"$ "},
    {"header-placeholder", "cookie: $ "},
    {"url-password", "u://a:b"},
    {"telegram", "123456789:AA"},
    {"jwt", "eyJ."},
    {"netrc-password", "password "},
    {"curl-user", " -u a:"},
    {"mysql-p", "mysql -p"},
    {"xml-secret", "<password>"},
};

/// Applies spans (sorted, merged) to text[from, to), clipping spans to it.
std::string apply_spans(std::string_view text, const std::vector<scrub_span>& spans,
                        std::size_t from, std::size_t to);

}  // namespace tether::protocol
