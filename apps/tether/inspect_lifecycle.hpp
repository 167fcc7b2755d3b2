#pragma once
// `tether inspect DB --lifecycle` and `tether inspect DB --task ID`: the
// lifecycle table of every kind of task (persistence/lifecycle.hpp), and one
// task's row read against its kind's entry. Read-only, like inspect.
#include <string>

namespace tether::cli {

/// Prints every kind's lifecycle entry; 0, or 1 if `path` is not readable.
int inspect_lifecycle(const std::string& path, bool as_json);
/// Prints task `id` with its kind's lifecycle entry; 1 if there is no such
/// task (the error names it) or the database is not readable.
int inspect_task(const std::string& path, const std::string& id, bool as_json);

}  // namespace tether::cli
