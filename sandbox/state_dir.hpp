#pragma once
// Where a sandbox lives and who may reach it: the state directory (only the
// effective uid controls it) and the uid check on both ends of its socket.
// Used by the client, by ensure_daemon() and by tether-sandboxd itself.
#include <string>

#include "tether/runtime/error.hpp"

namespace tether::sandbox {

/// The daemon's Unix socket in `state_dir`.
std::string socket_path_for(const std::string& state_dir);

/// The state directory of a host's local daemon (a host with no sandbox
/// configured): `<db_path>.sandbox`, unless its socket path would be too long
/// for a Unix socket; then $HOME/.tether/local/<hash of the absolute
/// db_path>.sandbox (else under $XDG_RUNTIME_DIR/tether-local), never a
/// shared directory. The same database always gets the same directory.
std::string local_state_dir_for(const std::string& db_path);

/// $TETHER_SANDBOX_DIR, else $HOME/.tether/sandbox, else $XDG_RUNTIME_DIR/tether-sandbox;
/// with none of them set, an error saying what to set (never a shared directory like /tmp).
result<std::string> default_state_dir();

/// Makes `dir` a state directory only the effective uid controls: creates it
/// 0700 if missing; refuses a symbolic link, a directory owned by another uid,
/// or one writable by group or others; tightens an owned 0755 one to 0700.
result<void> secure_state_dir(const std::string& dir);

/// The uid at the other end of a connected Unix socket (SO_PEERCRED) must be
/// our effective uid; `who` names the peer in the error ("the sandbox daemon at …").
result<void> check_peer_uid(int fd, const std::string& who);

}  // namespace tether::sandbox
