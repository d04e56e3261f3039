// selftest_topk.cpp — topk (topk.cpp), checked by its properties: the selection holds the k largest
// values of the row's valid range (ties included), distinct indices in range, values equal to the
// input at those indices, descending when sorted; rows shorter than k padded with the fill values.
#include "../topk.cpp"

#include <algorithm>
#include <set>

#include "selftest.h"

namespace {

using selftest::Rng;

bool run_case(int* failures, int64_t b, int64_t n, int64_t k, bool sorted, Rng& rng) {
  std::vector<float> x(static_cast<size_t>(b * n));
  for (auto& v : x) v = rng.uniform() < 0.2 ? float(rng.below(8)) : float(rng.normal());  // many ties
  std::vector<int32_t> end(static_cast<size_t>(b));
  for (int64_t r = 0; r < b; ++r) end[r] = r == 0 ? int32_t(k / 2) : int32_t(n - rng.below(n / 4 + 1));
  std::vector<int64_t> idx(size_t(b * k), 12345);
  std::vector<float> val(size_t(b * k), NAN);
  float fill = -INFINITY;
  uint32_t fill_bits;
  std::memcpy(&fill_bits, &fill, 4);
  TopkCall call{x.data(), 0, b, n, n, end.data(), k, sorted, idx.data(), 1, -1, val.data(), int64_t(fill_bits), 2};
  const int64_t nan_rows = pk_topk(&call);
  int64_t bad_rows = 0;
  for (int64_t r = 0; r < b; ++r) {
    const int64_t len = std::min<int64_t>(end[r], n), got = std::min(k, len);
    std::vector<float> row(x.begin() + r * n, x.begin() + r * n + len);
    std::sort(row.begin(), row.end(), std::greater<float>());
    std::vector<float> chosen;
    std::set<int64_t> seen;
    bool ok = true;
    for (int64_t j = 0; j < k; ++j) {
      const int64_t i = idx[r * k + j];
      if (j >= got) {
        ok = ok && i == -1 && std::isinf(val[r * k + j]);
        continue;
      }
      ok = ok && i >= 0 && i < len && seen.insert(i).second && val[r * k + j] == x[r * n + i];
      if (ok) chosen.push_back(x[r * n + i]);
      if (ok && sorted && j > 0) ok = val[r * k + j - 1] >= val[r * k + j];
    }
    std::sort(chosen.begin(), chosen.end(), std::greater<float>());
    ok = ok && std::equal(chosen.begin(), chosen.end(), row.begin());
    bad_rows += !ok;
  }
  char name[96], detail[64];
  std::snprintf(name, sizeof name, "topk %lldx%lld k=%lld%s", (long long)b, (long long)n, (long long)k,
                sorted ? " sorted" : "");
  std::snprintf(detail, sizeof detail, "%lld rows wrong", (long long)bad_rows);
  return selftest::check(failures, name, nan_rows == 0 && bad_rows == 0, detail);
}

}  // namespace

int selftest_topk() {
  int failures = 0;
  Rng rng(41);
  run_case(&failures, 4, 1024, 8, false, rng);    // the scan for small k
  run_case(&failures, 3, 5000, 200, true, rng);   // the radix select
  run_case(&failures, 65, 2048, 64, false, rng);  // enough work for threads
  return failures;
}
