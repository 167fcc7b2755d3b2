#include "tether/protocol/scope.hpp"

namespace tether::protocol {

json::value to_json(const owner_scope& s) {
  return json::object{{"tenant", s.tenant.str()},
                      {"thread", s.thread.str()},
                      {"turn", s.turn.str()},
                      {"sandbox", s.sandbox.str()},
                      {"generation", s.generation}};
}

decoded<owner_scope> scope_from_json(const json::value& v, std::string prefix) {
  auto f = fields::of(v, std::move(prefix));
  if (!f) return f.error();
  owner_scope s;
  auto tenant = f->str("tenant");
  if (!tenant) return tenant.error();
  auto thread = f->str("thread");
  if (!thread) return thread.error();
  auto turn = f->str("turn");
  if (!turn) return turn.error();
  auto sandbox = f->str("sandbox");
  if (!sandbox) return sandbox.error();
  auto gen = f->i64("generation");
  if (!gen) return gen.error();
  if (*gen < 0) return decode_error{f->path("generation"), "must not be negative"};
  s.tenant = tenant_id(*tenant);
  s.thread = session_id(*thread);
  s.turn = turn_id(*turn);
  s.sandbox = sandbox_id(*sandbox);
  s.generation = static_cast<std::uint64_t>(*gen);
  return s;
}

}  // namespace tether::protocol
