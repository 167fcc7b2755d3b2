#pragma once
// Lets Catch2 print boost::system::result values whose T is not streamable.
#include <boost/system/result.hpp>
#include <catch2/catch.hpp>
#include <sstream>

namespace Catch {
template <class T, class E>
struct StringMaker<boost::system::result<T, E>> {
  static std::string convert(const boost::system::result<T, E>& r) {
    if (r) return "ok";
    std::ostringstream os;
    os << "error: " << r.error();
    return os.str();
  }
};
}  // namespace Catch
