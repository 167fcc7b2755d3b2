#include "tether/protocol/json.hpp"

#include <boost/json/basic_parser_impl.hpp>
#include <set>
#include <stdexcept>
#include <vector>

namespace tether::protocol {

void throw_exception_from_error(const decode_error& e, const boost::source_location&) {
  throw std::invalid_argument(e.describe());
}

decoded<json::value> parse_json(std::string_view text) {
  json::stream_parser p;
  boost::system::error_code ec;
  std::size_t n = p.write_some(text.data(), text.size(), ec);
  if (!ec && n < text.size()) ec = json::error::extra_data;
  if (!ec) p.finish(ec);
  if (ec)
    return decode_error{"",
                        "not valid JSON at byte " + std::to_string(n) + " (" + ec.message() + ")"};
  return p.release();
}

std::string to_text(const json::value& v) {
  return json::serialize(v);
}

namespace {

// A basic_parser handler that only tracks the keys of each open object.
struct key_tracker {
  static constexpr std::size_t max_object_size = std::size_t(-1);
  static constexpr std::size_t max_array_size = std::size_t(-1);
  static constexpr std::size_t max_key_size = std::size_t(-1);
  static constexpr std::size_t max_string_size = std::size_t(-1);
  using ec_t = boost::system::error_code;

  std::vector<std::set<std::string>> open;
  std::string key;
  std::optional<std::string> dup;

  bool on_document_begin(ec_t&) { return true; }
  bool on_document_end(ec_t&) { return true; }
  bool on_object_begin(ec_t&) {
    open.emplace_back();
    return true;
  }
  bool on_object_end(std::size_t, ec_t&) {
    open.pop_back();
    return true;
  }
  bool on_array_begin(ec_t&) { return true; }
  bool on_array_end(std::size_t, ec_t&) { return true; }
  bool on_key_part(json::string_view s, std::size_t, ec_t&) {
    key.append(s.data(), s.size());
    return true;
  }
  bool on_key(json::string_view s, std::size_t, ec_t& ec) {
    key.append(s.data(), s.size());
    if (!open.empty() && !open.back().insert(key).second) {
      dup = key;
      ec = json::error::syntax;  // stop: one is enough
      return false;
    }
    key.clear();
    return true;
  }
  bool on_string_part(json::string_view, std::size_t, ec_t&) { return true; }
  bool on_string(json::string_view, std::size_t, ec_t&) { return true; }
  bool on_number_part(json::string_view, ec_t&) { return true; }
  bool on_int64(std::int64_t, json::string_view, ec_t&) { return true; }
  bool on_uint64(std::uint64_t, json::string_view, ec_t&) { return true; }
  bool on_double(double, json::string_view, ec_t&) { return true; }
  bool on_bool(bool, ec_t&) { return true; }
  bool on_null(ec_t&) { return true; }
  bool on_comment_part(json::string_view, ec_t&) { return true; }
  bool on_comment(json::string_view, ec_t&) { return true; }
};

}  // namespace

std::optional<std::string> first_duplicate_key(std::string_view text,
                                               const json::parse_options& opts) {
  json::basic_parser<key_tracker> p(opts);
  boost::system::error_code ec;
  p.write_some(false, text.data(), text.size(), ec);
  return p.handler().dup;
}

decoded<fields> fields::of(const json::value& v, std::string prefix) {
  if (!v.is_object())
    return decode_error{prefix,
                        std::string("expected an object, got ") + json::to_string(v.kind()).data()};
  return fields(&v.get_object(), std::move(prefix));
}

std::string fields::path(std::string_view key) const {
  return prefix_.empty() ? std::string(key) : prefix_ + "." + std::string(key);
}

bool fields::has(std::string_view key) const {
  auto it = o_->find(key);
  return it != o_->end() && !it->value().is_null();
}

decoded<const json::value*> fields::get(std::string_view key) const {
  auto it = o_->find(key);
  if (it == o_->end()) return decode_error{path(key), "missing"};
  return &it->value();
}

namespace {
decode_error wrong(std::string path, const char* want, const json::value& v) {
  return decode_error{std::move(path), std::string("expected ") + want + ", got " +
                                           json::to_string(v.kind()).data()};
}
}  // namespace

decoded<std::string> fields::str(std::string_view key) const {
  auto v = get(key);
  if (!v) return v.error();
  if (!(*v)->is_string()) return wrong(path(key), "a string", **v);
  return std::string((*v)->get_string());
}

decoded<std::int64_t> fields::i64(std::string_view key) const {
  auto v = get(key);
  if (!v) return v.error();
  if ((*v)->is_int64()) return (*v)->get_int64();
  if ((*v)->is_uint64() && (*v)->get_uint64() <= INT64_MAX)
    return static_cast<std::int64_t>((*v)->get_uint64());
  return wrong(path(key), "an integer", **v);
}

decoded<bool> fields::boolean(std::string_view key) const {
  auto v = get(key);
  if (!v) return v.error();
  if (!(*v)->is_bool()) return wrong(path(key), "a boolean", **v);
  return (*v)->get_bool();
}

decoded<const json::object*> fields::object(std::string_view key) const {
  auto v = get(key);
  if (!v) return v.error();
  if (!(*v)->is_object()) return wrong(path(key), "an object", **v);
  return &(*v)->get_object();
}

decoded<const json::array*> fields::array(std::string_view key) const {
  auto v = get(key);
  if (!v) return v.error();
  if (!(*v)->is_array()) return wrong(path(key), "an array", **v);
  return &(*v)->get_array();
}

decoded<std::optional<std::string>> fields::opt_str(std::string_view key) const {
  if (!has(key)) return std::optional<std::string>{};
  auto r = str(key);
  if (!r) return r.error();
  return std::optional<std::string>(std::move(*r));
}

decoded<std::optional<std::int64_t>> fields::opt_i64(std::string_view key) const {
  if (!has(key)) return std::optional<std::int64_t>{};
  auto r = i64(key);
  if (!r) return r.error();
  return std::optional<std::int64_t>(*r);
}

decoded<std::optional<bool>> fields::opt_bool(std::string_view key) const {
  if (!has(key)) return std::optional<bool>{};
  auto r = boolean(key);
  if (!r) return r.error();
  return std::optional<bool>(*r);
}

}  // namespace tether::protocol
