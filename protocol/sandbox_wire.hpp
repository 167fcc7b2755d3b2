#pragma once
// The sandbox daemon's wire protocol: JSON lines over a Unix socket.
//
// Every request is one JSON object on one line with a "type" and an optional
// "id" (an unsigned integer the client picks; every reply to that request
// echoes it). The first request on a connection must be `hello`, which
// negotiates the protocol version and the connection mode. A malformed or
// unknown request gets an `error` reply and the connection stays usable.
// docs/sandbox.md describes every message.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "tether/protocol/ids.hpp"
#include "tether/protocol/json.hpp"
#include "tether/protocol/notice.hpp"

namespace tether::protocol::sandbox {

/// The protocol version this build speaks.
inline constexpr std::int64_t k_version = 1;
/// Longest request line the daemon accepts.
inline constexpr std::size_t k_max_line = 1 << 20;

/// A read-only connection may look (attach, list) but never start or stop anything.
enum class conn_mode { read_write, read_only };
std::string_view to_string(conn_mode m);

// ---- requests -------------------------------------------------------------------

struct hello_req {
  std::int64_t version = k_version;
  conn_mode mode = conn_mode::read_write;
  std::string client;  // free text for logs
};

struct exec_req {
  std::string command;  // run as `bash -c` (through the launcher, see docs)
  std::string cwd;      // absolute; must exist
  std::vector<std::pair<std::string, std::string>> env;  // the command's whole environment
  std::vector<std::string> secret_names;                 // extra names whose values are scrubbed
  bool isolate = false;                                  // run inside bubblewrap
  bool allow_network = false;                            // only with isolate
  job_id job;  // optional: a caller-chosen id (idempotent exec)
  std::int64_t tail_lines = 40;
  std::int64_t tail_bytes = 4096;
  std::int64_t preview_bytes = 200;
};

struct attach_req {
  job_id job;
  std::uint64_t offset = 0;           // stream offset to read from
  bool follow = false;                // keep streaming until the job ends
  std::uint64_t max_bytes = 1 << 16;  // per output message
};

struct kill_req {
  job_id job;
  std::optional<std::int64_t> wait_ms;  // TERM→KILL escalation wait; daemon default if absent
};

struct list_req {
  std::optional<std::uint64_t> after_revision;  // answer once the revision is past this
};

struct expire_req {
  std::optional<job_id> job;  // expire this completed job now (all completed jobs if absent)
};

using request_body = std::variant<hello_req, exec_req, attach_req, kill_req, list_req, expire_req>;

struct request {
  std::uint64_t id = 0;
  request_body body;
};

/// One request line (without the newline), decoded; errors name the field.
decoded<request> decode_request(std::string_view line);
/// One line, without the trailing newline.
std::string encode(const request& r);

// ---- replies ------------------------------------------------------------------------

struct error_rep {
  std::string code;  // "invalid", "not_found", "refused", "unsupported_version", "io", ...
  std::string message;
};

struct hello_rep {
  std::int64_t version = k_version;
  sandbox_id sandbox;
  std::uint64_t generation = 0;
  conn_mode mode = conn_mode::read_write;
  std::int64_t pid = 0;  // the daemon's pid
};

struct started_rep {
  job_id job;
  std::int64_t pid = 0;
  bool existing = false;  // the job id was already known: nothing new was started
};

struct output_rep {
  job_id job;
  std::uint64_t offset = 0;   // stream offset of data[0]
  std::string data;           // raw (scrubbed) bytes; base64 on the wire
  std::uint64_t skipped = 0;  // bytes before `offset` no longer retained
};

/// Summary of one job, as list shows it.
struct job_summary {
  job_id job;
  job_state state = job_state::running;
  std::string preview;
  std::int64_t pid = 0;
  std::int64_t exit_code = -1;
  std::uint64_t output_bytes = 0;
};

struct status_rep {
  job_id job;
  std::uint64_t output_bytes = 0;
  std::optional<shell_completion> done;  // set once the job has ended
};

struct killed_rep {
  shell_completion done;
};

struct jobs_rep {
  std::uint64_t revision = 0;
  std::vector<job_summary> jobs;
};

struct expired_rep {
  std::vector<job_id> jobs;
};

using reply_body = std::variant<error_rep, hello_rep, started_rep, output_rep, status_rep,
                                killed_rep, jobs_rep, expired_rep>;

struct reply {
  std::uint64_t id = 0;
  reply_body body;
};

decoded<reply> decode_reply(std::string_view line);
std::string encode(const reply& r);

json::value to_json(const shell_completion& c);
decoded<shell_completion> completion_from_json(const json::value& v, std::string prefix);

std::string base64_encode(std::string_view bytes);
decoded<std::string> base64_decode(std::string_view text, std::string field = "data");

/// Job ids travel as directory names: 1-128 of [A-Za-z0-9_.-], not starting with '.'.
bool valid_job_id(std::string_view id);

}  // namespace tether::protocol::sandbox
