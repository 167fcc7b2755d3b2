#pragma once
// The daemon's state directory:
//
//   DIR/sandbox.json         {"sandbox_id", "generation"}: who this sandbox is
//   DIR/lock                 flock'd by the running daemon (one per directory)
//   DIR/sock                 the Unix socket
//   DIR/jobs/<id>/job.json   one record per job (see job_record)
//   DIR/jobs/<id>/output     scrubbed output: the stream while running, head+tail after
//   DIR/jobs/<id>/status     the launcher's capture line (fd 63 of the shell)
//
// Records (job.json, the final output, sandbox.json) are replaced durably, in
// the order a power cut cannot reorder: write the temp, fsync it, rename it
// over the record, fsync the directory. A record the daemon acknowledged (or
// acted on: a job is spawned only once its `starting` record is durable, and
// runs its command only once its `running` record is) is on disk, whole,
// after a power loss; a temp a crash left behind is never read as a record
// (recover() removes it and says so). The output stream appended while a job
// runs is not synced: it is what the job wrote, not a record. Nothing here
// holds a raw secret: commands are stored scrubbed and output is scrubbed
// before it is written.
#include <sys/types.h>

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "tether/protocol/notice.hpp"
#include "tether/runtime/error.hpp"

namespace tether::sandboxd {

namespace fs = std::filesystem;

struct identity {
  std::string sandbox_id;
  std::uint64_t generation = 0;
};

/// Loads DIR/sandbox.json or creates it. `replace` bumps the generation and
/// drops the previous generation's job records. A `wanted_id` that differs
/// from the stored one is refused unless `replace` is set.
result<identity> load_identity(const fs::path& dir, const std::string& wanted_id, bool replace);

struct job_record {
  std::string job;
  std::string command;             // scrubbed
  protocol::pipeline_shape shape;  // of the raw command, each stage scrubbed
  std::string cwd;
  bool isolate = false;
  std::string state = "starting";  // starting, running, then a protocol::job_state
  std::int64_t pid = 0;
  std::uint64_t pid_start = 0;
  std::int64_t started_at_ms = 0;
  std::int64_t tail_lines = 40, tail_bytes = 4096, preview_bytes = 200;
  bool kill_requested = false;
  std::optional<protocol::shell_completion> done;
  // Output layout once done: `output` holds head_len bytes of head, then the
  // tail, which ends the stream of output_total bytes.
  std::uint64_t output_total = 0;
  std::uint64_t head_len = 0;
  bool output_final = false;
};

/// The system calls a durable write makes, behind an interface so a test can
/// record their order or fail one. Each returns what the call would (-1 with
/// errno on failure).
class file_ops {
 public:
  virtual ~file_ops() = default;
  virtual int open(const char* path, int flags, mode_t mode);
  virtual ssize_t write(int fd, const void* data, std::size_t n);
  virtual int fsync(int fd);
  virtual int close(int fd);
  virtual int rename(const char* from, const char* to);
};
/// The real calls.
file_ops& system_file_ops();

/// Replaces DIR/job.json durably (see the top of this file).
result<void> write_record(const fs::path& job_dir, const job_record& r,
                          file_ops& ops = system_file_ops());
result<job_record> read_record(const fs::path& job_dir);

/// Temps of DIR/job.json (and of `output`) holding bytes: writes a crash cut
/// short, or finished but never renamed. Never a record.
std::vector<fs::path> leftover_temps(const fs::path& job_dir);

/// Creates `dir` (one level) mode 0700, or makes an existing one 0700: job
/// ids embed turn ids, so no other local user may list them.
std::error_code make_private_dir(const fs::path& dir);
/// Replaces `p` durably: temp, fsync, rename, fsync of p's directory.
result<void> write_file_atomic(const fs::path& p, std::string_view content,
                               file_ops& ops = system_file_ops());
/// fsyncs a directory, so the entries created or renamed in it survive a power loss.
result<void> sync_dir(const fs::path& dir, file_ops& ops = system_file_ops());
/// Whole file, or an error naming it.
result<std::string> read_file(const fs::path& p);

std::int64_t now_ms();

}  // namespace tether::sandboxd
