// selftest_routing.cpp — get_fused_mapping (routing.cpp) against the mapping written out directly:
// each expert's rows in (token, slot) order from its aligned segment start, padding rows -1.
#include "../routing.cpp"

#include "selftest.h"

namespace {

using selftest::Rng;

bool run_case(int* failures, int64_t T, int64_t k, int64_t E, int64_t align, Rng& rng) {
  std::vector<int64_t> idx(static_cast<size_t>(T * k));
  for (auto& e : idx) e = rng.uniform() < 0.1 ? -1 : rng.below(E);
  std::vector<int64_t> count(size_t(E), 0), start(size_t(E), 0);
  for (int64_t e : idx)
    if (e >= 0) ++count[e];
  int64_t rows = 0;
  for (int64_t e = 0; e < E; ++e) {
    start[e] = rows;
    rows += (count[e] + align - 1) / align * align;
  }
  const int64_t P = rows + 3;  // spare rows stay padding
  std::vector<int32_t> p2e(size_t(P), 7), p2t(size_t(P), 7), p2tk(size_t(P), 7), tk2p(size_t(T * k), 7);
  std::vector<int32_t> s(static_cast<size_t>(E)), en(static_cast<size_t>(E)), al(static_cast<size_t>(E));
  const int rc = pk_fused_mapping(idx.data(), 1, T, k, E, P, align, p2e.data(), p2t.data(), p2tk.data(), tk2p.data(),
                                  s.data(), en.data(), al.data());
  int64_t wrong = 0;
  std::vector<int64_t> next(start);
  std::vector<int32_t> w_p2e(size_t(P), -1), w_p2t(size_t(P), -1), w_p2tk(size_t(P), -1);
  for (int64_t i = 0; i < T * k; ++i) {
    const int64_t e = idx[i];
    if (e < 0) {
      wrong += tk2p[i] != -1;
      continue;
    }
    const int64_t pos = next[e]++;
    wrong += tk2p[i] != pos;
    w_p2e[pos] = int32_t(e);
    w_p2t[pos] = int32_t(i / k);
    w_p2tk[pos] = int32_t(i);
  }
  for (int64_t p = 0; p < P; ++p) wrong += (p2e[p] != w_p2e[p]) + (p2t[p] != w_p2t[p]) + (p2tk[p] != w_p2tk[p]);
  for (int64_t e = 0; e < E; ++e)
    wrong += (s[e] != start[e]) + (al[e] != (count[e] + align - 1) / align * align) + (en[e] != s[e] + al[e]);
  char name[96], detail[64];
  std::snprintf(name, sizeof name, "get_fused_mapping T=%lld k=%lld E=%lld align=%lld", (long long)T, (long long)k,
                (long long)E, (long long)align);
  std::snprintf(detail, sizeof detail, "rc %d, %lld entries differ", rc, (long long)wrong);
  return selftest::check(failures, name, rc == 0 && wrong == 0, detail);
}

}  // namespace

int selftest_routing() {
  int failures = 0;
  Rng rng(51);
  run_case(&failures, 37, 8, 16, 4, rng);
  run_case(&failures, 5, 2, 64, 128, rng);
  return failures;
}
