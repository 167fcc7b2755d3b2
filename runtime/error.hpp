#pragma once
// The error value every layer above runtime returns on the expected path.
#include <boost/assert/source_location.hpp>
#include <boost/system/result.hpp>
#include <ostream>
#include <stdexcept>
#include <string>
#include <string_view>

namespace tether {

enum class errc {
  closed,     // a mailbox or connection no longer takes requests
  stopped,    // the actor stopped before answering
  timeout,    // an ask ran past its deadline
  cancelled,  // the asker cancelled
  failed,     // a handler threw; the message carries what
  dropped,    // a request was destroyed without a reply
  not_found,  // no such thing, or not owned by the caller
  conflict,   // a compare-and-set lost or a unique id repeated
  invalid,    // bad input from a caller or a file
  corrupt,    // persisted state that does not parse
  refused,    // the operation is not allowed in this state
  io,         // the operating system or SQLite failed
};

std::string_view to_string(errc c) noexcept;

/// A code plus a message that says what was wrong and what was kept.
struct error {
  errc code = errc::failed;
  std::string message;
  /// The peer (e.g. the sandbox daemon) answered with this error: the channel
  /// worked, whatever the code says.
  bool answered = false;

  friend bool operator==(const error&, const error&) = default;
  friend std::ostream& operator<<(std::ostream& os, const error& e) {
    return os << to_string(e.code) << ": " << e.message;
  }
};

/// Thrown only at the API edge, by result<T>::value() on an error.
class error_exception : public std::runtime_error {
 public:
  explicit error_exception(error e);
  const error& err() const noexcept { return err_; }

 private:
  error err_;
};

[[noreturn]] void throw_exception_from_error(const error& e, const boost::source_location& loc);

template <class T = void>
using result = boost::system::result<T, error>;

inline error make_error(errc c, std::string msg) {
  return error{c, std::move(msg)};
}

}  // namespace tether
