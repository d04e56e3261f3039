// selftest_casts.cpp — per_token_cast_to_fp8 / per_block_cast_to_fp8 (casts.cpp): codes and scales
// equal, byte for byte, those of the scalar rules (amax, floor, ceil to UE8M0 or not, x / sf
// clamped to ±448, c10's round to nearest even), with K and row tails.
#include "../casts.cpp"

#include "selftest.h"

namespace {

using selftest::Rng;

bool run_case(int* failures, int64_t MN, int64_t K, int64_t gm, int64_t gk, bool ue8m0, bool bf16, Rng& rng) {
  std::vector<float> x(static_cast<size_t>(MN * K));
  for (auto& v : x) v = float(rng.normal() * (rng.uniform() < 0.01 ? 40.0 : 1.0));
  std::vector<uint16_t> xb(x.size());
  if (bf16)
    for (size_t i = 0; i < x.size(); ++i) {
      xb[i] = pk::f32_to_bf16(x[i]);
      x[i] = pk::bf16_to_f32(xb[i]);
    }
  const int64_t bm = (MN + gm - 1) / gm, bk = (K + gk - 1) / gk;
  std::vector<uint8_t> q(x.size(), 0xAA);
  std::vector<float> sf(size_t(bm * bk), NAN);
  const int64_t bad = pk_cast_fp8(bf16 ? static_cast<const void*>(xb.data()) : x.data(), bf16 ? kBF16 : kF32, 1,
                                  MN, K, gm, gk, ue8m0, q.data(), sf.data(), 2);
  int64_t wrong_codes = 0, wrong_scales = 0;
  for (int64_t i = 0; i < bm; ++i)
    for (int64_t j = 0; j < bk; ++j) {
      float amax = 0;
      for (int64_t r = i * gm; r < std::min(MN, (i + 1) * gm); ++r)
        for (int64_t k = j * gk; k < std::min(K, (j + 1) * gk); ++k) amax = std::max(amax, std::fabs(x[r * K + k]));
      float s = std::max(amax, pk::kAmaxFloor) / pk::kFp8Max;
      if (ue8m0) s = pk::ceil_to_ue8m0(s);
      wrong_scales += pk::f32_bits(s) != pk::f32_bits(sf[i * bk + j]);
      for (int64_t r = i * gm; r < std::min(MN, (i + 1) * gm); ++r)
        for (int64_t k = j * gk; k < std::min(K, (j + 1) * gk); ++k)
          wrong_codes += q[r * K + k] != pk::f32_to_fp8(std::min(pk::kFp8Max, std::max(-pk::kFp8Max, x[r * K + k] / s)));
    }
  char name[96], detail[96];
  std::snprintf(name, sizeof name, "cast_fp8 %lldx%lld blocks %lldx%lld%s%s", (long long)MN, (long long)K,
                (long long)gm, (long long)gk, ue8m0 ? " ue8m0" : "", bf16 ? " bf16" : " fp32");
  std::snprintf(detail, sizeof detail, "%lld codes and %lld scales differ", (long long)wrong_codes,
                (long long)wrong_scales);
  return selftest::check(failures, name, bad == 0 && wrong_codes == 0 && wrong_scales == 0, detail);
}

}  // namespace

int selftest_casts() {
  int failures = 0;
  Rng rng(31);
  run_case(&failures, 7, 300, 1, 128, true, true, rng);     // per token, bf16, K tail
  run_case(&failures, 5, 256, 1, 128, false, false, rng);   // per token, fp32 scales
  run_case(&failures, 130, 200, 128, 128, true, false, rng);  // per block, both tails
  return failures;
}
