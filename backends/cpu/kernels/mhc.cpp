// mhc.cpp — the cpu backend's native mHC stream kernels (ops/mhc/apply.py has the contracts):
// mhc_pre_apply_mix (out = Σ_m x[m] · mix[m]) and mhc_post (out[n] = x · post[n] + Σ_m comb[m][n] ·
// residual[m]) and their backwards, bf16 streams, fp32 mixes, fp32 products and sums, each bf16
// output rounded once. The backwards' sums over H add products of two bf16 values (exact in fp32)
// in double, rounded once to fp32: within an fp32 rounding of the exact sum, whatever H
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

// 8 exact fp32 products added to two double accumulators
inline void add_pd(__m256d* lo, __m256d* hi, __m256 p) {
  *lo = _mm256_add_pd(*lo, _mm256_cvtps_pd(_mm256_castps256_ps128(p)));
  *hi = _mm256_add_pd(*hi, _mm256_cvtps_pd(_mm256_extractf128_ps(p, 1)));
}
inline double hsum_pd(__m256d lo, __m256d hi) {
  alignas(32) double v[4];
  _mm256_store_pd(v, _mm256_add_pd(lo, hi));
  return (v[0] + v[1]) + (v[2] + v[3]);
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

// Backward of pre_apply_mix: o_grad bf16 [N, H], x bf16 [N, M, H], mix fp32 [N, M] -> x_grad bf16
// [N, M, H] = o_grad · mix[m], mix_grad fp32 [N, M] = Σ_h o_grad · x[m].
PK_EXPORT void pk_mhc_pre_apply_mix_bwd(const uint16_t* g, const uint16_t* x, const float* mix, uint16_t* x_grad,
                                        float* mix_grad, int64_t N, int64_t M, int64_t H, int nthreads) {
  pk::parallel_blocks(N, pick(nthreads, N * M * H * 4, N), [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const uint16_t* gt = g + t * H;
      for (int64_t m = 0; m < M; ++m) {
        const uint16_t* xs = x + (t * M + m) * H;
        uint16_t* xg = x_grad + (t * M + m) * H;
        const float w = mix[t * M + m];
        double sum = 0.0;
        int64_t h = 0;
#if defined(__AVX2__)
        __m256d lo = _mm256_setzero_pd(), hi = _mm256_setzero_pd();
        for (; h + 8 <= H; h += 8) {
          const __m256 gv = load_bf16x8(gt + h);
          store_bf16x8(xg + h, _mm256_mul_ps(gv, _mm256_set1_ps(w)));
          add_pd(&lo, &hi, _mm256_mul_ps(gv, load_bf16x8(xs + h)));
        }
        sum = hsum_pd(lo, hi);
#endif
        for (; h < H; ++h) {
          const float gv = pk::bf16_to_f32(gt[h]);
          xg[h] = pk::f32_to_bf16(gv * w);
          sum += double(gv * pk::bf16_to_f32(xs[h]));
        }
        mix_grad[t * M + m] = float(sum);
      }
    }
  });
}

// Backward of post: d_out bf16 [N, M, H] (g), x bf16 [N, H], residual bf16 [N, M, H], post fp32
// [N, M], comb fp32 [N, M, M] -> d_x bf16 [N, H] = Σ_n g[n] · post[n], d_residual bf16 [N, M, H]
// [m] = Σ_n comb[m][n] · g[n], d_post fp32 [N, M] [n] = Σ_h g[n] · x, d_comb fp32 [N, M, M] [m][n]
// = Σ_h residual[m] · g[n]. M <= 16 (the Python side checks).
PK_EXPORT void pk_mhc_post_bwd(const uint16_t* g, const uint16_t* x, const uint16_t* residual, const float* post,
                               const float* comb, uint16_t* d_x, uint16_t* d_residual, float* d_post, float* d_comb,
                               int64_t N, int64_t M, int64_t H, int nthreads) {
  pk::parallel_blocks(N, pick(nthreads, N * M * H * 6, N), [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const uint16_t* gt = g + t * M * H;
      const uint16_t* xt = x + t * H;
      const uint16_t* rs = residual + t * M * H;
      const float* p = post + t * M;
      const float* c = comb + t * M * M;
      double sp[16] = {0}, sc[256] = {0};
      int64_t h = 0;
#if defined(__AVX2__)
      __m256d ap[32], ac[512];
      for (int64_t i = 0; i < 2 * M; ++i) ap[i] = _mm256_setzero_pd();
      for (int64_t i = 0; i < 2 * M * M; ++i) ac[i] = _mm256_setzero_pd();
      for (; h + 8 <= H; h += 8) {
        const __m256 xv = load_bf16x8(xt + h);
        __m256 gv[16], rv[16];
        for (int64_t n = 0; n < M; ++n) gv[n] = load_bf16x8(gt + n * H + h);
        for (int64_t m = 0; m < M; ++m) rv[m] = load_bf16x8(rs + m * H + h);
        __m256 dx = _mm256_mul_ps(gv[0], _mm256_set1_ps(p[0]));
        for (int64_t n = 1; n < M; ++n) dx = _mm256_add_ps(dx, _mm256_mul_ps(gv[n], _mm256_set1_ps(p[n])));
        store_bf16x8(d_x + t * H + h, dx);
        for (int64_t m = 0; m < M; ++m) {
          __m256 dr = _mm256_mul_ps(gv[0], _mm256_set1_ps(c[m * M]));
          for (int64_t n = 1; n < M; ++n) dr = _mm256_add_ps(dr, _mm256_mul_ps(gv[n], _mm256_set1_ps(c[m * M + n])));
          store_bf16x8(d_residual + (t * M + m) * H + h, dr);
          for (int64_t n = 0; n < M; ++n) {
            const int64_t i = m * M + n;
            add_pd(&ac[2 * i], &ac[2 * i + 1], _mm256_mul_ps(rv[m], gv[n]));
          }
        }
        for (int64_t n = 0; n < M; ++n) add_pd(&ap[2 * n], &ap[2 * n + 1], _mm256_mul_ps(gv[n], xv));
      }
      for (int64_t i = 0; i < M; ++i) sp[i] = hsum_pd(ap[2 * i], ap[2 * i + 1]);
      for (int64_t i = 0; i < M * M; ++i) sc[i] = hsum_pd(ac[2 * i], ac[2 * i + 1]);
#endif
      for (; h < H; ++h) {
        const float xv = pk::bf16_to_f32(xt[h]);
        float gv[16], rv[16];
        for (int64_t n = 0; n < M; ++n) gv[n] = pk::bf16_to_f32(gt[n * H + h]);
        for (int64_t m = 0; m < M; ++m) rv[m] = pk::bf16_to_f32(rs[m * H + h]);
        float dx = gv[0] * p[0];
        for (int64_t n = 1; n < M; ++n) dx += gv[n] * p[n];
        d_x[t * H + h] = pk::f32_to_bf16(dx);
        for (int64_t m = 0; m < M; ++m) {
          float dr = gv[0] * c[m * M];
          for (int64_t n = 1; n < M; ++n) dr += gv[n] * c[m * M + n];
          d_residual[(t * M + m) * H + h] = pk::f32_to_bf16(dr);
          for (int64_t n = 0; n < M; ++n) sc[m * M + n] += double(rv[m] * gv[n]);
        }
        for (int64_t n = 0; n < M; ++n) sp[n] += double(gv[n] * xv);
      }
      for (int64_t n = 0; n < M; ++n) d_post[t * M + n] = float(sp[n]);
      for (int64_t i = 0; i < M * M; ++i) d_comb[t * M * M + i] = float(sc[i]);
    }
  });
}
