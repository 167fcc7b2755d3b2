#pragma once
// Who owns a background task, and whether that owner is provably gone.
//
// A delegate records the identity of the process that runs it. Recovery may
// reclaim the delegate only when that process is gone: reclaiming one whose
// owner still runs would run the work twice. So every answer here fails
// closed: anything that cannot be read or parsed is `uncertain`, never `gone`,
// and only `gone` licenses a reclaim.
//
// An identity is the pid plus what tells a reused pid apart: the process's
// start time (whole seconds since boot, from /proc/<pid>/stat) and the boot's
// id (a pid of another boot is gone whatever it names now). The nonce is
// random per process, so two records of one process can be told from records
// of another, but no liveness rule uses it: another process cannot be asked
// for its nonce.
//
// Start times are whole seconds, so a pid reused within the same second as
// its owner started reads as the owner still alive: the conservative answer
// (at worst a reclaim waits for the new process to end). A zombie whose start
// time matches is alive too, until its parent reaps it.
//
// Linux only: it reads /proc and /proc/sys/kernel/random/boot_id.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "tether/runtime/error.hpp"

namespace tether::runtime {

/// What identifies a process across pid reuse and reboots.
struct process_identity {
  int pid = 0;
  std::uint64_t start_s = 0;  // start time, whole seconds since boot (/proc/<pid>/stat field 22)
  std::string boot_id;        // /proc/sys/kernel/random/boot_id, trimmed
  std::string nonce;          // 32 lowercase hex chars, random per process; empty from identity_of

  friend bool operator==(const process_identity&, const process_identity&) = default;
};

/// This process's identity, computed on first use and fixed for the process's
/// life (a forked child computes its own). Thread-safe. If /proc cannot be
/// read, start_s is 0 and boot_id empty, and every probe is then uncertain.
const process_identity& current_process_identity();

/// The identity of a live process by pid, read from /proc (nonce empty); an
/// error names the pid and what could not be read.
result<process_identity> identity_of(int pid);

/// "v1:<pid>:<start_s>:<boot_id>:<nonce>": what a delegate records.
std::string to_string(const process_identity& id);

/// Parses to_string's form. Any deviation (another version, a missing or extra
/// field, a pid or start time that is not a plain decimal, pid <= 0, a boot id
/// that is empty or not lowercase hex and '-', a nonce that is not 32 lowercase
/// hex chars) is an `invalid` error naming the field and quoting the text
/// (at most 120 bytes of it, non-printable bytes escaped).
result<process_identity> parse_process_identity(std::string_view text);

enum class owner_liveness { alive, gone, uncertain };
std::string_view to_string(owner_liveness s);

/// A probe's answer and, in words, why.
struct owner_probe {
  owner_liveness state = owner_liveness::uncertain;
  std::string why;
};

/// Is the recorded owner still running? In order:
///  - text that does not parse: uncertain (why quotes the parse error);
///  - a pid <= 0 or an empty boot id (struct form), or this boot's id
///    unreadable: uncertain;
///  - another boot's id: gone;
///  - this very process (pid, start_s and boot id equal): alive;
///  - kill(pid, 0): ESRCH gone; any errno but EPERM uncertain;
///  - the pid's start time from /proc/<pid>/stat: another start time gone
///    (the pid was reused), the same alive. Unreadable: gone if kill(pid, 0)
///    now says ESRCH (it exited meanwhile); else alive after EPERM (it exists,
///    not ours to signal), uncertain otherwise.
/// EPERM still consults the start time: for an owner that ran as our user,
/// EPERM means another user's process now holds the pid, a reuse that the
/// start time proves; taking EPERM alone for alive would keep such a delegate
/// from ever being reclaimed. The nonce is not compared (see above).
owner_probe probe_owner(std::string_view recorded);
owner_probe probe_owner(const process_identity& recorded);

/// Internal, exposed for tests: the start time in clock ticks (field 22) of a
/// /proc/<pid>/stat line, parsed after the line's last ')' since the command
/// name (field 2) may hold spaces and parentheses; nullopt if malformed.
std::optional<std::uint64_t> start_ticks_from_stat(std::string_view stat_line);

}  // namespace tether::runtime
