// selftest_mhc.cpp — the mHC stream kernels (mhc.cpp) against sums in double: pre_apply_mix and
// post, each bf16 output within one bf16 ulp of the double result plus fp32 rounding of the
// terms' magnitudes; H not a multiple of 8 (scalar tails), M = 1 and 4, 1 and 2 threads.
#include "../mhc.cpp"

#include "selftest.h"

namespace {

using selftest::Rng;

uint16_t bf16_of(double v) { return pk::f32_to_bf16(float(v)); }
double val(uint16_t b) { return double(pk::bf16_to_f32(b)); }

bool near(double got, double want, double absum) {
  return std::fabs(got - want) <= std::fabs(want) * 0.0078125 + absum * 1e-6;
}

void run_case(int* failures, int64_t N, int64_t M, int64_t H, int threads, Rng& rng) {
  std::vector<uint16_t> x(size_t(N * M * H)), y(size_t(N * H)), out1(size_t(N * H), 0x7FC0), out2(size_t(N * M * H), 0x7FC0);
  std::vector<float> mix(size_t(N * M)), post(size_t(N * M)), comb(size_t(N * M * M));
  for (auto& v : x) v = bf16_of(rng.normal());
  for (auto& v : y) v = bf16_of(rng.normal());
  for (auto& v : mix) v = float(rng.normal());
  for (auto& v : post) v = float(rng.normal());
  for (auto& v : comb) v = float(rng.normal());
  pk_mhc_pre_apply_mix(x.data(), mix.data(), out1.data(), N, M, H, threads);
  pk_mhc_post(y.data(), x.data(), post.data(), comb.data(), out2.data(), N, M, H, threads);
  int64_t bad1 = 0, bad2 = 0;
  for (int64_t t = 0; t < N; ++t)
    for (int64_t h = 0; h < H; ++h) {
      double s = 0, a = 0;
      for (int64_t m = 0; m < M; ++m) {
        const double term = val(x[(t * M + m) * H + h]) * mix[t * M + m];
        s += term;
        a += std::fabs(term);
      }
      bad1 += !near(val(out1[t * H + h]), s, a);
      for (int64_t n = 0; n < M; ++n) {
        double s2 = val(y[t * H + h]) * post[t * M + n], a2 = std::fabs(s2);
        for (int64_t m = 0; m < M; ++m) {
          const double term = comb[(t * M + m) * M + n] * val(x[(t * M + m) * H + h]);
          s2 += term;
          a2 += std::fabs(term);
        }
        bad2 += !near(val(out2[(t * M + n) * H + h]), s2, a2);
      }
    }
  char detail[96];
  std::snprintf(detail, sizeof detail, "N=%lld M=%lld H=%lld threads=%d: %lld / %lld off", (long long)N,
                (long long)M, (long long)H, threads, (long long)bad1, (long long)bad2);
  selftest::check(failures, "mhc pre_apply_mix / post", bad1 == 0 && bad2 == 0, detail);
}

}  // namespace

int selftest_mhc() {
  int failures = 0;
  Rng rng(61);
  run_case(&failures, 9, 4, 77, 1, rng);
  run_case(&failures, 300, 4, 264, 2, rng);
  run_case(&failures, 5, 1, 13, 1, rng);
  return failures;
}
