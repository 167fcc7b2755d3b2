// bench_scrub: scrubber throughput in bytes/s on ordinary log text and on each
// worst case of k_scrub_worst_cases (inputs that made the old scrubber
// quadratic), whole-text and streamed in 4 KiB chunks, in the same run. Each
// figure is the best of k_reps runs over k_bytes of text; the worst of the
// worst cases is printed too, next to ordinary text, with their ratio.
#include <algorithm>
#include <string>

#include "support.hpp"
#include "tether/protocol/scrub.hpp"

namespace {

using namespace tether;
namespace bench = tether::bench;
using bench::clock;

constexpr char k_bench[] = "bench_scrub";
constexpr std::size_t k_bytes = 4u << 20;
constexpr int k_reps = 3;

std::string fill(std::string_view unit) {
  std::string t;
  t.reserve(k_bytes + unit.size());
  while (t.size() < k_bytes) t += unit;
  return t;
}

// Best bytes/s over k_reps runs.
template <class Run>
double best_rate(const std::string& text, Run&& run) {
  double best = 0;
  for (int r = 0; r < k_reps; ++r) {
    auto t0 = clock::now();
    std::size_t out = run(text);
    double s = bench::seconds_since(t0);
    if (out == 0) return 0;  // keeps the result alive; an empty result is a bug
    best = std::max(best, static_cast<double>(text.size()) / s);
  }
  return best;
}

std::size_t whole(const protocol::scrubber& s, const std::string& text) {
  return s.scrub(text).size();
}

std::size_t streamed(const protocol::scrubber& s, const std::string& text) {
  protocol::stream_scrubber st(s);
  std::size_t n = 0;
  for (std::size_t i = 0; i < text.size(); i += 4096)
    n += st.feed(std::string_view(text).substr(i, 4096)).size();
  return n + st.finish().size();
}

}  // namespace

int main() {
  protocol::scrubber s(protocol::scrub_rules::from_env(
      {{"API_TOKEN", "tok-0123456789abcdef"}, {"DB_PASSWORD", "correct-horse-battery"}}));
  std::string ordinary = fill(
      "2024-05-01T12:00:00Z INFO compiling tether v0.1.0 (/work/tether) in 3.2s; "
      "GET https://example.com/api/v1/items?page=2 -> 200 (12 ms) sha=9f86d081884c7d65\n");
  auto w = [&](const std::string& t) { return whole(s, t); };
  auto st = [&](const std::string& t) { return streamed(s, t); };
  double ordinary_rate = best_rate(ordinary, w);
  bench::emit(k_bench, "ordinary_text_bytes_per_s", ordinary_rate, "bytes/s");
  bench::emit(k_bench, "ordinary_text_streamed_bytes_per_s", best_rate(ordinary, st), "bytes/s");
  double worst_rate = -1;
  std::string worst_name;
  for (const auto& c : protocol::k_scrub_worst_cases) {
    std::string text = fill(c.unit);
    double r = best_rate(text, w);
    double r2 = best_rate(text, st);
    bench::emit(k_bench, "worst_case_" + std::string(c.name) + "_bytes_per_s", r, "bytes/s");
    bench::emit(k_bench, "worst_case_" + std::string(c.name) + "_streamed_bytes_per_s", r2,
                "bytes/s");
    double m = std::min(r, r2);
    if (worst_rate < 0 || m < worst_rate) worst_rate = m, worst_name = c.name;
  }
  bench::emit(k_bench, "worst_case_min_bytes_per_s", worst_rate, "bytes/s");
  bench::emit(k_bench, "worst_case_min_over_ordinary", worst_rate / ordinary_rate, "ratio");
  std::fprintf(stderr, "bench_scrub: slowest worst case is '%s'\n", worst_name.c_str());
  return 0;
}
