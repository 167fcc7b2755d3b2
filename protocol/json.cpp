#include "tether/protocol/json.hpp"

#include <stdexcept>

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
    return decode_error{"", "not valid JSON at byte " + std::to_string(n) + " (" + ec.message() + ")"};
  return p.release();
}

std::string to_text(const json::value& v) { return json::serialize(v); }

decoded<fields> fields::of(const json::value& v, std::string prefix) {
  if (!v.is_object())
    return decode_error{prefix, std::string("expected an object, got ") + json::to_string(v.kind()).data()};
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
  return decode_error{std::move(path),
                      std::string("expected ") + want + ", got " + json::to_string(v.kind()).data()};
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
