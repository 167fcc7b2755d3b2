#include "tether/runtime/error.hpp"

namespace tether {

std::string_view to_string(errc c) noexcept {
  switch (c) {
    case errc::closed:
      return "closed";
    case errc::stopped:
      return "stopped";
    case errc::timeout:
      return "timeout";
    case errc::cancelled:
      return "cancelled";
    case errc::failed:
      return "failed";
    case errc::dropped:
      return "dropped";
    case errc::not_found:
      return "not_found";
    case errc::conflict:
      return "conflict";
    case errc::invalid:
      return "invalid";
    case errc::corrupt:
      return "corrupt";
    case errc::refused:
      return "refused";
    case errc::io:
      return "io";
  }
  return "unknown";
}

error_exception::error_exception(error e)
    : std::runtime_error(std::string(to_string(e.code)) + ": " + e.message), err_(std::move(e)) {}

void throw_exception_from_error(const error& e, const boost::source_location&) {
  throw error_exception(e);
}

}  // namespace tether
