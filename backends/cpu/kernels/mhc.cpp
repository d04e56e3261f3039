// mhc.cpp — the cpu backend's native mHC stream kernels (ops/mhc/apply.py has the contracts):
// mhc_pre_apply_mix (out = Σ_m x[m] · mix[m]) and mhc_post (out[n] = x · post[n] + Σ_m comb[m][n] ·
// residual[m]), bf16 streams, fp32 mixes, fp32 products and sums, each output rounded once to bf16
// (round to nearest even, NaN -> 0x7FC0 as c10). One pass over the streams per token: the reference
// widens the whole [N, M, H] block to fp32 first. Tokens split over the worker threads; with AVX2,
// 8 hidden values per step, the rest scalar (the generic build is all scalar).
#include "pk_native.h"
#include "pk_pool.h"

namespace {

#if defined(__AVX2__)
inline __m256 load_bf16x8(const uint16_t* p) {
  return pk::bf16x8_to_f32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
inline void store_bf16x8(uint16_t* p, __m256 v) {
  const __m256i u = _mm256_castps_si256(v);
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  __m256i r = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7FFF)), odd), 16);
  const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
  r = _mm256_blendv_epi8(r, _mm256_set1_epi32(0x7FC0), nan);
  const __m128i packed = _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), packed);
}
#endif

inline int pick(int nthreads, int64_t bytes, int64_t tokens) {
  if (bytes < (int64_t(1) << 18)) return 1;
  return int(std::max<int64_t>(1, std::min<int64_t>(nthreads, tokens)));
}

}  // namespace

// x bf16 [N, M, H], mix fp32 [N, M] -> out bf16 [N, H]. Sizes validated by the Python side.
PK_EXPORT void pk_mhc_pre_apply_mix(const uint16_t* x, const float* mix, uint16_t* out, int64_t N, int64_t M,
                                    int64_t H, int nthreads) {
  pk::parallel_blocks(N, pick(nthreads, N * M * H * 2, N), [&](int64_t begin, int64_t end) {
    for (int64_t n = begin; n < end; ++n) {
      const uint16_t* xs = x + n * M * H;
      const float* w = mix + n * M;
      uint16_t* o = out + n * H;
      int64_t h = 0;
#if defined(__AVX2__)
      for (; h + 8 <= H; h += 8) {
        __m256 acc = _mm256_mul_ps(load_bf16x8(xs + h), _mm256_set1_ps(w[0]));
        for (int64_t m = 1; m < M; ++m)
          acc = _mm256_add_ps(acc, _mm256_mul_ps(load_bf16x8(xs + m * H + h), _mm256_set1_ps(w[m])));
        store_bf16x8(o + h, acc);
      }
#endif
      for (; h < H; ++h) {
        float acc = pk::bf16_to_f32(xs[h]) * w[0];
        for (int64_t m = 1; m < M; ++m) acc += pk::bf16_to_f32(xs[m * H + h]) * w[m];
        o[h] = pk::f32_to_bf16(acc);
      }
    }
  });
}

// x bf16 [N, H], residual bf16 [N, M, H], post fp32 [N, M], comb fp32 [N, M, M] (comb[m][n] takes
// stream m into stream n) -> out bf16 [N, M, H]. Sizes validated by the Python side.
PK_EXPORT void pk_mhc_post(const uint16_t* x, const uint16_t* residual, const float* post, const float* comb,
                           uint16_t* out, int64_t N, int64_t M, int64_t H, int nthreads) {
  pk::parallel_blocks(N, pick(nthreads, N * M * H * 4, N), [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const uint16_t* xt = x + t * H;
      const uint16_t* rs = residual + t * M * H;
      const float* p = post + t * M;
      const float* c = comb + t * M * M;
      uint16_t* o = out + t * M * H;
      for (int64_t n = 0; n < M; ++n) {
        int64_t h = 0;
#if defined(__AVX2__)
        for (; h + 8 <= H; h += 8) {
          __m256 acc = _mm256_mul_ps(load_bf16x8(xt + h), _mm256_set1_ps(p[n]));
          for (int64_t m = 0; m < M; ++m)
            acc = _mm256_add_ps(acc, _mm256_mul_ps(load_bf16x8(rs + m * H + h), _mm256_set1_ps(c[m * M + n])));
          store_bf16x8(o + n * H + h, acc);
        }
#endif
        for (; h < H; ++h) {
          float acc = pk::bf16_to_f32(xt[h]) * p[n];
          for (int64_t m = 0; m < M; ++m) acc += pk::bf16_to_f32(rs[m * H + h]) * c[m * M + n];
          o[n * H + h] = pk::f32_to_bf16(acc);
        }
      }
    }
  });
}
