#pragma once
// Distinct id types: a session_id cannot be passed where a job_id is wanted.
#include <boost/json/value.hpp>
#include <boost/json/value_from.hpp>
#include <boost/json/value_to.hpp>
#include <compare>
#include <functional>
#include <string>
#include <string_view>

namespace tether::protocol {

template <class Tag>
class id {
 public:
  id() = default;
  explicit id(std::string v) : v_(std::move(v)) {}
  const std::string& str() const { return v_; }
  bool empty() const { return v_.empty(); }
  friend auto operator<=>(const id&, const id&) = default;
  friend bool operator==(const id&, const id&) = default;

  friend void tag_invoke(boost::json::value_from_tag, boost::json::value& jv, const id& i) {
    jv = i.v_;
  }

 private:
  std::string v_;
};

using session_id = id<struct session_tag>;
using job_id = id<struct job_tag>;
using notification_id = id<struct notification_tag>;
using event_id = id<struct event_tag>;
using tenant_id = id<struct tenant_tag>;
using turn_id = id<struct turn_tag>;
using sandbox_id = id<struct sandbox_tag>;

/// Job transitions that yield receipts.
enum class transition { started, completed, failed, cancelled, lost, timed_out };
std::string_view to_string(transition t);
bool parse(std::string_view s, transition& out);

/// The stable id of a job's receipt for one transition: "<job>/<transition>".
event_id make_event_id(const job_id& job, transition t);

/// Mints unique, sortable ids: prefix + '_' + time in µs (at least 12 hex digits) +
/// counter (4 hex digits). The time never goes back: it is the wall clock, or
/// one µs past the last id minted or seen (mint_floor), whichever is later, so
/// a clock stepped back cannot mint an id older than one already stored.
std::string mint(std::string_view prefix);

/// A random UUID (version 4) in its 36-character text form.
std::string random_uuid();

/// Raises the time mint() starts from past `id` if it is a minted id
/// (anything else is ignored). The store calls it with the newest id it holds.
void mint_floor(std::string_view id);

/// The SQLite GLOB pattern that matches a minted id's tail ("_" + 17 hex
/// digits: a time of 13, as until 2112, and the counter), for the store to
/// find its newest id; tails of one length sort as their times.
std::string_view minted_glob();

}  // namespace tether::protocol

template <class Tag>
struct std::hash<tether::protocol::id<Tag>> {
  std::size_t operator()(const tether::protocol::id<Tag>& i) const noexcept {
    return std::hash<std::string>{}(i.str());
  }
};
