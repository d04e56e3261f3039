// selftest.h — a standalone self-test of the cpu kernels, for builds Python cannot load (an ARM
// cross-compile run under qemu-user) and for any native build. Each selftest_<family>.cpp includes
// one kernel source, calls its exported functions on seeded inputs, and compares with a scalar
// reference written here in double precision (or with the exact rules of pk_native.h where the
// contract asks for identical bytes). No Python, no torch: the same numbers on every ISA.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <vector>

namespace selftest {

// xorshift64*: the same stream on every machine.
struct Rng {
  uint64_t s;
  explicit Rng(uint64_t seed) : s(seed * 0x9E3779B97F4A7C15ull + 1) {}
  uint64_t next() {
    s ^= s >> 12;
    s ^= s << 25;
    s ^= s >> 27;
    return s * 0x2545F4914F6CDD1Dull;
  }
  double uniform() { return double(next() >> 11) * (1.0 / 9007199254740992.0); }  // [0, 1)
  double normal() {  // Box-Muller
    const double u = uniform() + 1e-300, v = uniform();
    return std::sqrt(-2.0 * std::log(u)) * std::cos(6.283185307179586 * v);
  }
  int64_t below(int64_t n) { return int64_t(next() % uint64_t(n)); }
};

// DeepGEMM's calc_diff: 1 - 2·Σxy / Σ(x² + y²); 0 for equal vectors.
inline double calc_diff(const std::vector<double>& x, const std::vector<double>& y) {
  double xy = 0, xx = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    xy += x[i] * y[i];
    xx += x[i] * x[i] + y[i] * y[i];
  }
  return xx == 0 ? 0 : 1 - 2 * xy / xx;
}

// Records one check; returns ok.
inline bool check(int* failures, const char* name, bool ok, const char* detail = "") {
  std::printf("%s %s%s%s\n", ok ? "ok  " : "FAIL", name, *detail ? ": " : "", detail);
  if (!ok) ++*failures;
  return ok;
}

}  // namespace selftest

// One per kernel family (selftest_<family>.cpp); each returns its number of failed checks.
int selftest_mla();
int selftest_gemm();
int selftest_casts();
int selftest_topk();
int selftest_routing();
int selftest_mhc();
