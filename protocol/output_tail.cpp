#include "tether/protocol/output_tail.hpp"

#include <algorithm>

namespace tether::protocol {

head_tail::head_tail(std::size_t head_limit, std::size_t tail_limit)
    : head_limit_(head_limit), tail_limit_(tail_limit) {}

void head_tail::append(std::string_view bytes) {
  total_ += bytes.size();
  if (head_.size() < head_limit_) {
    auto n = std::min(bytes.size(), head_limit_ - head_.size());
    head_.append(bytes.substr(0, n));
    bytes.remove_prefix(n);
  }
  if (bytes.empty()) return;
  tail_.append(bytes);
  std::size_t live = tail_.size() - tail_skip_;
  if (live > tail_limit_) tail_skip_ += live - tail_limit_;
  // Compact once the dead prefix outweighs the live bytes.
  if (tail_skip_ > tail_limit_ && tail_skip_ > tail_.size() / 2) {
    tail_.erase(0, tail_skip_);
    tail_skip_ = 0;
  }
}

head_tail head_tail::restore(std::string_view head, std::string_view tail, std::uint64_t total,
                             std::size_t head_limit, std::size_t tail_limit) {
  head_tail h(head_limit, tail_limit);
  h.append(head);
  h.append(tail);
  if (total > h.total_) h.total_ = total;  // the bytes between were dropped
  return h;
}

std::uint64_t head_tail::dropped() const {
  return total_ - head_.size() - tail().size();
}

head_tail::slice head_tail::read(std::uint64_t from, std::size_t max) const {
  slice s;
  if (from >= total_) {
    s.offset = total_;
    return s;
  }
  if (from < head_.size()) {
    s.offset = from;
    s.data.assign(std::string_view(head_).substr(from, max));
    // A read that ends the head continues into the tail only when nothing was dropped.
    if (s.data.size() < max && dropped() == 0) {
      s.data.append(tail().substr(0, max - s.data.size()));
    }
    return s;
  }
  std::uint64_t start = tail_start();
  if (from < start) {
    s.skipped = start - from;
    from = start;
  }
  s.offset = from;
  s.data.assign(tail().substr(from - start, max));
  return s;
}

std::string head_tail::last(std::size_t n) const {
  auto t = tail();
  if (t.size() >= n || dropped() > 0)
    return std::string(t.substr(t.size() - std::min(n, t.size())));
  std::size_t from_head = std::min(n - t.size(), head_.size());
  std::string out(std::string_view(head_).substr(head_.size() - from_head));
  out.append(t);
  return out;
}

namespace {

// Length of the valid UTF-8 sequence starting at s[i], or 0 if invalid.
std::size_t utf8_seq(std::string_view s, std::size_t i) {
  auto b = [&](std::size_t k) { return static_cast<unsigned char>(s[k]); };
  unsigned char c = b(i);
  if (c < 0x80) return 1;
  std::size_t n;
  unsigned lo = 0x80, hi = 0xBF;
  if (c >= 0xC2 && c <= 0xDF) {
    n = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    n = 3;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    n = 4;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  if (i + n > s.size()) return 0;
  if (b(i + 1) < lo || b(i + 1) > hi) return 0;
  for (std::size_t k = 2; k < n; ++k)
    if (b(i + k) < 0x80 || b(i + k) > 0xBF) return 0;
  return n;
}

bool is_continuation(char c) {
  return (static_cast<unsigned char>(c) & 0xC0) == 0x80;
}

}  // namespace

std::string_view utf8_prefix(std::string_view s, std::size_t max) {
  if (s.size() <= max) return s;
  // s[end] is the first byte left out; if it continues a sequence, that
  // sequence starts before `end` and goes too.
  std::size_t end = max;
  while (end > 0 && end + 3 > max && is_continuation(s[end])) --end;
  return s.substr(0, end);
}

std::string bounded_text(std::string_view s, std::size_t max) {
  auto out = utf8_sanitize(s);
  if (out.size() > max) out = std::string(utf8_prefix(out, max)) + "...[truncated]";
  return out;
}

std::optional<std::size_t> first_invalid_utf8(std::string_view s) {
  for (std::size_t i = 0; i < s.size();) {
    if (static_cast<unsigned char>(s[i]) < 0x80) {
      ++i;
      continue;
    }
    std::size_t n = utf8_seq(s, i);
    if (n == 0) return i;
    i += n;
  }
  return std::nullopt;
}

std::string utf8_sanitize(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (std::size_t i = 0; i < s.size();) {
    std::size_t n = utf8_seq(s, i);
    if (n == 0) {
      out.append("\xEF\xBF\xBD");
      ++i;
    } else {
      out.append(s.substr(i, n));
      i += n;
    }
  }
  return out;
}

tail_excerpt make_tail(std::string_view last_bytes, std::uint64_t total_bytes,
                       std::size_t max_lines, std::size_t max_bytes) {
  std::string_view s = last_bytes;
  // Lines are counted without a final newline, which ends the last line.
  std::size_t body = s.size();
  if (body > 0 && s[body - 1] == '\n') --body;
  std::size_t start = 0;
  std::size_t seen = 0;
  for (std::size_t i = body; i > 0; --i) {
    if (s[i - 1] == '\n' && ++seen == max_lines) {
      start = i;
      break;
    }
  }
  if (max_lines == 0) start = s.size();
  if (s.size() - start > max_bytes) start = s.size() - max_bytes;
  while (start < s.size() && is_continuation(s[start])) ++start;

  // Replacement characters (3 bytes each) can make the sanitised text longer
  // than the bytes it shows: drop whole source sequences from the front until
  // it fits, so `start` stays a position in the original bytes.
  std::size_t shown = 0;
  for (std::size_t i = start; i < s.size();) {
    std::size_t n = utf8_seq(s, i);
    shown += n == 0 ? 3 : n;
    i += n == 0 ? 1 : n;
  }
  while (shown > max_bytes && start < s.size()) {
    std::size_t n = utf8_seq(s, start);
    shown -= n == 0 ? 3 : n;
    start += n == 0 ? 1 : n;
  }
  std::string text = utf8_sanitize(s.substr(start));
  tail_excerpt t;
  t.omitted_bytes = total_bytes - std::min<std::uint64_t>(total_bytes, s.size() - start);
  if (!text.empty()) {
    t.lines = static_cast<std::size_t>(std::count(text.begin(), text.end(), '\n'));
    if (text.back() != '\n') ++t.lines;
  }
  t.text = std::move(text);
  return t;
}

}  // namespace tether::protocol
