#pragma once
// Decoding helpers: malformed input yields a decode_error naming the field and
// the problem; nothing throws to the caller.
#include <boost/json.hpp>
#include <boost/system/result.hpp>
#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>

namespace tether::protocol {

namespace json = boost::json;

struct decode_error {
  decode_error() = default;
  decode_error(std::string f, std::string p) : field(std::move(f)), problem(std::move(p)) {}
  std::string field;    // dotted path, "" for the document itself
  std::string problem;  // what was wrong
  std::string describe() const { return field.empty() ? problem : field + ": " + problem; }
  friend std::ostream& operator<<(std::ostream& os, const decode_error& e) {
    return os << e.describe();
  }
};

template <class T>
using decoded = boost::system::result<T, decode_error>;

[[noreturn]] void throw_exception_from_error(const decode_error& e,
                                             const boost::source_location& loc);

/// Parses text; the problem names the byte offset of a syntax error.
decoded<json::value> parse_json(std::string_view text);

std::string to_text(const json::value& v);

/// The first key that appears twice in one object of `text` (already known to
/// parse), if any. Boost.JSON keeps one of the two silently; a wire decoder
/// refuses such input instead of guessing which one the sender meant.
std::optional<std::string> first_duplicate_key(std::string_view text,
                                               const json::parse_options& opts = {});

/// Field access on an object with errors naming `prefix.key`.
class fields {
 public:
  static decoded<fields> of(const json::value& v, std::string prefix = {});

  decoded<std::string> str(std::string_view key) const;
  decoded<std::int64_t> i64(std::string_view key) const;
  decoded<bool> boolean(std::string_view key) const;
  decoded<const json::object*> object(std::string_view key) const;
  decoded<const json::array*> array(std::string_view key) const;
  bool has(std::string_view key) const;
  /// Absent or null → nullopt; present with another type → error.
  decoded<std::optional<std::string>> opt_str(std::string_view key) const;
  decoded<std::optional<std::int64_t>> opt_i64(std::string_view key) const;
  decoded<std::optional<bool>> opt_bool(std::string_view key) const;

  std::string path(std::string_view key) const;
  const json::object& obj() const { return *o_; }

 private:
  fields(const json::object* o, std::string prefix) : o_(o), prefix_(std::move(prefix)) {}
  decoded<const json::value*> get(std::string_view key) const;
  const json::object* o_;
  std::string prefix_;
};

}  // namespace tether::protocol
