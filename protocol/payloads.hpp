#pragma once
// Codecs for the JSON payloads the report store persists. Decoding never
// throws: a bad payload yields a decode_error naming the field.
#include <string>

#include "tether/protocol/json.hpp"

namespace tether::protocol {

/// messages.payload: the text of a transcript message.
struct message_payload {
  std::string text;
  friend bool operator==(const message_payload&, const message_payload&) = default;
};
json::value to_json(const message_payload& p);
decoded<message_payload> message_payload_from_json(const json::value& v,
                                                   std::string prefix = "payload");

/// jobs.payload: what a job is about (a subagent's description, a shell's command).
struct job_payload {
  std::string description;
  friend bool operator==(const job_payload&, const job_payload&) = default;
};
json::value to_json(const job_payload& p);
decoded<job_payload> job_payload_from_json(const json::value& v, std::string prefix = "payload");

/// Parses text and decodes it with `decode`; one error path for both steps.
template <class T, class F>
decoded<T> decode_text(std::string_view text, F decode) {
  auto v = parse_json(text);
  if (!v) return decode_error{"payload", v.error().problem};
  return decode(*v);
}

}  // namespace tether::protocol
