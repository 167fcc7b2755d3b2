#pragma once
// Bounded output: what the sandbox daemon keeps of a job's (already scrubbed)
// output stream, and the short tail a completion notice shows.
//
// Offsets are byte positions in the whole stream, so a reader can resume
// from where it stopped even after the middle of a long stream was dropped.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace tether::protocol {

/// Keeps the first `head_limit` and the last `tail_limit` bytes of a stream.
class head_tail {
 public:
  static constexpr std::size_t k_default_limit = 1 << 20;  // head + tail, 1 MiB

  explicit head_tail(std::size_t head_limit = k_default_limit / 2,
                     std::size_t tail_limit = k_default_limit / 2);

  void append(std::string_view bytes);

  /// Rebuilds retention from persisted pieces: the head, and the tail that
  /// ends a stream of `total` bytes.
  static head_tail restore(std::string_view head, std::string_view tail, std::uint64_t total,
                           std::size_t head_limit = k_default_limit / 2,
                           std::size_t tail_limit = k_default_limit / 2);

  /// Bytes seen in total, retained or not.
  std::uint64_t total() const { return total_; }
  /// Retained bytes between head and tail were dropped when total() > limits.
  std::uint64_t dropped() const;
  std::string_view head() const { return head_; }
  /// The retained tail and the stream offset of its first byte.
  std::string_view tail() const { return std::string_view(tail_).substr(tail_skip_); }
  std::uint64_t tail_start() const { return total_ - tail().size(); }

  struct slice {
    std::uint64_t offset = 0;  // stream offset of data[0]
    std::string data;
    std::uint64_t skipped = 0;  // bytes from the requested offset that are no longer retained
  };
  /// Up to `max` retained bytes from stream offset `from`.
  slice read(std::uint64_t from, std::size_t max) const;

  /// The last `n` bytes retained before the end of the stream (fewer if dropped).
  std::string last(std::size_t n) const;

 private:
  std::size_t head_limit_;
  std::size_t tail_limit_;
  std::string head_;
  std::string tail_;           // bytes after the head; tail_[tail_skip_..] are retained
  std::size_t tail_skip_ = 0;  // compacted lazily so appends stay amortised O(1)
  std::uint64_t total_ = 0;
};

/// The part of a job's output a notice shows.
struct tail_excerpt {
  std::string text;             // valid UTF-8, at most the requested lines and bytes
  std::uint64_t omitted_bytes;  // stream bytes before `text` that are not shown
  std::size_t lines = 0;
};

/// The last `max_lines` lines of `last_bytes` (the end of a stream of
/// `total_bytes`), at most `max_bytes` long, starting on a UTF-8 boundary.
/// Invalid UTF-8 is shown as U+FFFD.
tail_excerpt make_tail(std::string_view last_bytes, std::uint64_t total_bytes,
                       std::size_t max_lines = 40, std::size_t max_bytes = 4096);

/// The longest prefix of `s` no longer than `max` bytes that does not split a
/// UTF-8 sequence.
std::string_view utf8_prefix(std::string_view s, std::size_t max);

/// The offset of the first byte of `s` that does not begin a valid UTF-8
/// sequence (overlong forms, surrogates and code points past U+10FFFF are
/// invalid), or nothing when all of `s` is valid.
std::optional<std::size_t> first_invalid_utf8(std::string_view s);

/// `s` with every invalid UTF-8 sequence replaced by U+FFFD.
std::string utf8_sanitize(std::string_view s);

/// utf8_sanitize(s), cut to at most `max` bytes on a UTF-8 boundary and then
/// marked "...[truncated]" when it was longer. Scrub before bounding.
std::string bounded_text(std::string_view s, std::size_t max);

}  // namespace tether::protocol
