#include "tether/protocol/payloads.hpp"

namespace tether::protocol {

json::value to_json(const message_payload& p) {
  return json::object{{"text", p.text}};
}

decoded<message_payload> message_payload_from_json(const json::value& v, std::string prefix) {
  auto f = fields::of(v, std::move(prefix));
  if (!f) return f.error();
  auto text = f->str("text");
  if (!text) return text.error();
  return message_payload{std::move(*text)};
}

json::value to_json(const job_payload& p) {
  return json::object{{"description", p.description}};
}

decoded<job_payload> job_payload_from_json(const json::value& v, std::string prefix) {
  auto f = fields::of(v, std::move(prefix));
  if (!f) return f.error();
  auto d = f->str("description");
  if (!d) return d.error();
  return job_payload{std::move(*d)};
}

}  // namespace tether::protocol
