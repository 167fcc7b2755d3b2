#pragma once
// The one JSON-lines framing of the sandbox wire (docs/sandbox.md, Wire
// protocol), used by both ends: the daemon (apps/sandboxd) reads requests and
// the client (sandbox/client.hpp) reads replies with line_splitter, and both
// write every message with frame().
//
// The policy, as version 1 of the wire has it:
// - a line ends at "\n"; a "\r" right before it is dropped (CRLF peers work);
// - a line longer than the reader's limit (not counting its "\r\n" or "\n")
//   is discarded whole, its bytes dropped as they arrive and never buffered
//   past the limit, with one error naming the limit; reading goes on with the
//   line after it. What a line yields never depends on how reads cut it;
// - a line holding only spaces and tabs (within the limit) is skipped.
#include <cstddef>
#include <limits>
#include <optional>
#include <string>
#include <string_view>

#include "tether/runtime/error.hpp"

namespace tether::sandbox {

/// No limit on a line's length (the client's replies: an attach chunk of up to
/// 1 MiB is longer in base64 than a request may be).
inline constexpr std::size_t k_unbounded_line = std::numeric_limits<std::size_t>::max();

/// Splits a byte stream into lines, incrementally: feed() what a read gave,
/// then take next() until it says no complete line is buffered. A partial line
/// waits for the next feed(). Holds at most one partial line of `max_line` bytes.
class line_splitter {
 public:
  /// `what` names the lines in the over-limit error ("request line").
  explicit line_splitter(std::size_t max_line, std::string what = "line");

  /// Appends bytes read from the peer.
  void feed(std::string_view bytes);

  /// The next complete line without its "\n" (and a "\r" before it); an error
  /// (errc::invalid, "<what> is longer than N bytes; it was discarded") once
  /// per line over the limit; nullopt when no complete line is buffered.
  std::optional<result<std::string>> next();

  /// Bytes of a partial line waiting for its end.
  std::size_t buffered() const { return buf_.size() - pos_; }

 private:
  error too_long() const;

  std::size_t max_;
  std::string what_;
  std::string buf_;
  std::size_t pos_ = 0;      // where the first line not yet taken starts
  std::size_t scanned_ = 0;  // bytes from pos_ known to hold no "\n"
  bool discarding_ = false;  // dropping the rest of a line over the limit
};

/// One line on the wire: `line` followed by "\n". Refused, with nothing
/// framed: a line holding "\n" (it would be read as two; the error names the
/// offset), ending in "\r" (read without it) or holding only spaces and tabs
/// (skipped), so that every framed line is read back as itself. JSON text
/// from the wire codecs is never refused, so callers framing wire::encode()
/// take .value(): a refusal there is a bug.
result<std::string> frame(std::string line);

}  // namespace tether::sandbox
