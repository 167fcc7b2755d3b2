#include "tether/sandbox/framing.hpp"

namespace tether::sandbox {

namespace {
// A partial line's buffer gives its memory back once it is empty again.
constexpr std::size_t k_keep_capacity = 64u << 10;

// A partial line's length without a last "\r", which may be the start of its end.
std::size_t content_size(std::string_view partial) {
  return partial.size() - (!partial.empty() && partial.back() == '\r' ? 1 : 0);
}
}  // namespace

line_splitter::line_splitter(std::size_t max_line, std::string what)
    : max_(max_line), what_(std::move(what)) {}

error line_splitter::too_long() const {
  return error{errc::invalid,
               what_ + " is longer than " + std::to_string(max_) + " bytes; it was discarded"};
}

void line_splitter::feed(std::string_view bytes) {
  if (discarding_) {
    // The rest of a line over the limit: dropped up to and with its "\n".
    auto nl = bytes.find('\n');
    if (nl == std::string_view::npos) return;
    bytes.remove_prefix(nl + 1);
    discarding_ = false;
  }
  buf_.append(bytes);
}

std::optional<result<std::string>> line_splitter::next() {
  for (;;) {
    auto nl = buf_.find('\n', pos_ + scanned_);
    if (nl == std::string::npos) {
      // No complete line left: keep only the partial one, at the front.
      buf_.erase(0, pos_);
      pos_ = 0;
      scanned_ = buf_.size();
      if (buf_.empty() && buf_.capacity() > k_keep_capacity) std::string().swap(buf_);
      // Already over the limit, whatever ends it (a last "\r" may be its CRLF's):
      // refused now, so a line over the limit is never buffered whole.
      if (content_size(buf_) > max_) {
        buf_.clear();
        scanned_ = 0;
        discarding_ = true;
        return result<std::string>(too_long());
      }
      return std::nullopt;
    }
    std::string_view line(buf_.data() + pos_, nl - pos_);
    pos_ = nl + 1;
    scanned_ = 0;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.size() > max_) return result<std::string>(too_long());
    if (line.find_first_not_of(" \t") == std::string_view::npos) continue;
    return result<std::string>(std::string(line));
  }
}

result<std::string> frame(std::string line) {
  if (auto nl = line.find('\n'); nl != std::string::npos)
    return error{errc::invalid, "refusing to frame a line holding a newline at byte " +
                                    std::to_string(nl) + " of " + std::to_string(line.size()) +
                                    ": it would be read as two lines; nothing was sent"};
  if (!line.empty() && line.back() == '\r')
    return error{errc::invalid,
                 "refusing to frame a line ending in a carriage return: it would be read "
                 "without it; nothing was sent"};
  if (line.find_first_not_of(" \t") == std::string::npos)
    return error{errc::invalid,
                 "refusing to frame a line of only spaces and tabs: it would be skipped; "
                 "nothing was sent"};
  line.push_back('\n');
  return line;
}

}  // namespace tether::sandbox
