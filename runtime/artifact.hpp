#pragma once
// Artifacts: a task's output published as a file, atomically and durably, and
// named by the SHA-256 of its exact bytes.
//
// publish_artifact() writes a temporary file in the target directory, fsyncs
// it, renames it over the final name and fsyncs the directory: a reader (or a
// recovery after a crash) sees either no file or the whole file, never a
// prefix, and once it returns the file survives a power cut.
#include <cstddef>
#include <filesystem>
#include <string>
#include <string_view>

#include "tether/runtime/error.hpp"

namespace tether::runtime {

/// "sha256:" and the 64 lowercase hex digits of the SHA-256 of `bytes`
/// (OpenSSL's EVP interface).
std::string sha256_digest(std::string_view bytes);

/// Writes `bytes` to `dir`/`name` as described above, creating `dir` (and its
/// parents) if needed. Returns the final path. An error names the path and
/// the step that failed; the temporary file is removed then.
result<std::string> publish_artifact(const std::filesystem::path& dir, const std::string& name,
                                     std::string_view bytes);

/// The whole file at `path`, at most `max_bytes` of it: errc::not_found if
/// there is none, errc::invalid if it is larger (it is not read then).
result<std::string> read_artifact(const std::string& path, std::size_t max_bytes);

}  // namespace tether::runtime
