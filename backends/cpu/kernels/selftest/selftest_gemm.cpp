// selftest_gemm.cpp — fp8_gemm_nt's fma engine (gemm.cpp): D = A·Bᵀ with A per-token (1 x 128) and
// B per-block (128 x 128) scaled e4m3, against a double-precision product of the dequantized
// values; shapes with K and N tails, few-row (decode) and many-row segments.
#include "../gemm.cpp"

#include "selftest.h"

namespace {

using selftest::Rng;

// e4m3 codes of x / sf (sf a power of two per block) and the scales, like per_token/per_block_cast.
void quantize(const std::vector<float>& x, int64_t rows, int64_t K, int64_t gm, int64_t gk, std::vector<uint8_t>& q,
              std::vector<float>& sf) {
  const int64_t bm = (rows + gm - 1) / gm, bk = (K + gk - 1) / gk;
  q.assign(size_t(rows * K), 0);
  sf.assign(size_t(bm * bk), 0);
  for (int64_t i = 0; i < bm; ++i)
    for (int64_t j = 0; j < bk; ++j) {
      float amax = 0;
      for (int64_t r = i * gm; r < std::min(rows, (i + 1) * gm); ++r)
        for (int64_t k = j * gk; k < std::min(K, (j + 1) * gk); ++k) amax = std::max(amax, std::fabs(x[r * K + k]));
      const float s = pk::ceil_to_ue8m0(std::max(amax, pk::kAmaxFloor) / pk::kFp8Max);
      sf[i * bk + j] = s;
      for (int64_t r = i * gm; r < std::min(rows, (i + 1) * gm); ++r)
        for (int64_t k = j * gk; k < std::min(K, (j + 1) * gk); ++k)
          q[r * K + k] = pk::f32_to_fp8(std::min(pk::kFp8Max, std::max(-pk::kFp8Max, x[r * K + k] / s)));
    }
}

bool run_case(int* failures, int64_t M, int64_t N, int64_t K, Rng& rng) {
  std::vector<float> a(static_cast<size_t>(M * K)), b(static_cast<size_t>(N * K));
  for (auto& v : a) v = float(rng.normal());
  for (auto& v : b) v = float(rng.normal() * 0.05);
  std::vector<uint8_t> qa, qb;
  std::vector<float> sa, sb;
  quantize(a, M, K, 1, 128, qa, sa);
  quantize(b, N, K, 128, 128, qb, sb);
  const int64_t bk = (K + 127) / 128, bn = (N + 127) / 128;
  std::vector<float> d(size_t(M * N), NAN);  // poisoned
  GemmCall call{qa.data(), kFp8, sa.data(), 128, K, bk, qb.data(), kFp8, sb.data(), 128, 128, K, bk, N * K, bk * bn,
                d.data(), 0, nullptr, 0, nullptr, 1, M, N, K, /*engine fma*/ 0, 0, 0, 2, 0};
  const int rc = pk_gemm(&call);
  std::vector<double> got(d.begin(), d.end()), want(static_cast<size_t>(M * N));
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      double s = 0;
      for (int64_t k = 0; k < K; ++k)
        s += double(pk::fp8_to_f32(qa[m * K + k])) * sa[m * bk + k / 128] *
             double(pk::fp8_to_f32(qb[n * K + k])) * sb[(n / 128) * bk + k / 128];
      want[m * N + n] = s;
    }
  const double diff = selftest::calc_diff(got, want);
  char name[96], detail[96];
  std::snprintf(name, sizeof name, "fp8_gemm_nt %lldx%lldx%lld", (long long)M, (long long)N, (long long)K);
  std::snprintf(detail, sizeof detail, "rc %d, calc_diff %.2e", rc, diff);
  return selftest::check(failures, name, rc == 0 && diff < 1e-10, detail);
}

}  // namespace

int selftest_gemm() {
  int failures = 0;
  Rng rng(21);
  run_case(&failures, 1, 256, 256, rng);
  run_case(&failures, 3, 200, 300, rng);
  run_case(&failures, 37, 130, 520, rng);
  return failures;
}
