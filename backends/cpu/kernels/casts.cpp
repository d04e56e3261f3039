// casts.cpp — the cpu backend's native quantizers: per-token / per-block FP8 casts, the per-token
// FP4 (E2M1) cast, SwiGLU fused with the per-token FP8 cast, and TileKernels' per-token E5M6 cast
// (12-bit codes, eight per 12 bytes; layouts/e5m6.py has the rule). Each reads its input once from
// memory: a block's values are loaded for its amax and quantized while they are still in L1/L2.
//
// Numerics follow the contracts' references exactly: amax in fp32 clamped to >= 1e-4, the scale
// amax / 448 (or / 6) computed in fp32 and rounded up to a power of two when asked, q = x / sf (a
// true division, as torch does) clamped and rounded to nearest even (c10's conversion rules).
// NaN propagates into its block's scale and values as in the reference.
#include "pk_native.h"
#include "pk_pool.h"

#include <vector>

namespace {

enum InKind : int { kF32 = 0, kBF16 = 1, kF16 = 2 };

inline float load1(const void* x, int kind, int64_t i) {
  if (kind == kF32) return static_cast<const float*>(x)[i];
  const uint16_t h = static_cast<const uint16_t*>(x)[i];
  if (kind == kBF16) return pk::bf16_to_f32(h);
#if defined(__F16C__)
  return _cvtsh_ss(h);
#else
  // portable fp16 -> fp32
  const uint32_t sign = uint32_t(h & 0x8000) << 16, e = (h >> 10) & 0x1F, m = h & 0x3FF;
  if (e == 0) return (sign ? -1.0f : 1.0f) * float(m) * 5.9604644775390625e-8f;
  if (e == 31) return pk::bits_f32(sign | 0x7F800000u | (m << 13));
  return pk::bits_f32(sign | ((e + 112) << 23) | (m << 13));
#endif
}

inline float scale_from_amax(float amax, float max_code, bool ue8m0) {
  // NaN amax stays NaN (max(NaN, floor) in the reference's clamp_min propagates it)
  const float a = std::isnan(amax) ? amax : std::max(amax, pk::kAmaxFloor);
  const float sf = a / max_code;
  return ue8m0 && !std::isnan(sf) ? pk::ceil_to_ue8m0(sf) : sf;
}

inline uint8_t quant_fp8(float x, float sf) {
  float q = x / sf;
  if (!std::isnan(q)) q = std::min(pk::kFp8Max, std::max(-pk::kFp8Max, q));
  return pk::f32_to_fp8(q);
}

#if defined(__AVX512F__)
inline __m512 load16(const void* x, int kind, int64_t i, __mmask16 m) {
  if (kind == kF32) return _mm512_maskz_loadu_ps(m, static_cast<const float*>(x) + i);
  const __m256i h = _mm256_maskz_loadu_epi16(m, static_cast<const uint16_t*>(x) + i);
  if (kind == kBF16) return pk::bf16x16_to_f32(h);
  return _mm512_cvtph_ps(h);
}

inline __mmask16 tail_mask(int64_t left) { return left >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << left) - 1); }

// max |x| over 16 lanes, NaN-propagating (a NaN lane makes the result NaN)
struct AbsMax {
  __m512 v = _mm512_setzero_ps();
  __mmask16 nan = 0;
  inline void add(__m512 x) {
    nan |= _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    v = _mm512_max_ps(v, _mm512_abs_ps(x));
  }
  inline float get() const { return nan ? std::nanf("") : _mm512_reduce_max_ps(v); }
};

// c10's float -> e4m3fn rule on 16 lanes (inputs already clamped to +-448 or NaN)
inline __m128i f32x16_to_fp8(__m512 f) {
  __m512i bits = _mm512_castps_si512(f);
  const __m512i sign = _mm512_and_si512(bits, _mm512_set1_epi32(int(0x80000000u)));
  bits = _mm512_xor_si512(bits, sign);
  const __mmask16 big = _mm512_cmpge_epu32_mask(bits, _mm512_set1_epi32(1087 << 20));
  const __mmask16 small = _mm512_cmplt_epu32_mask(bits, _mm512_set1_epi32(121 << 23));
  const __m512i denorm = _mm512_set1_epi32(141 << 23);
  const __m512i rs = _mm512_sub_epi32(
      _mm512_castps_si512(_mm512_add_ps(_mm512_castsi512_ps(bits), _mm512_castsi512_ps(denorm))), denorm);
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(bits, 20), _mm512_set1_epi32(1));
  const __m512i rn = _mm512_srli_epi32(
      _mm512_add_epi32(_mm512_add_epi32(bits, _mm512_set1_epi32(int(uint32_t(7 - 127) << 23) + 0x7FFFF)), odd), 20);
  __m512i r = _mm512_mask_mov_epi32(rn, small, rs);
  r = _mm512_mask_mov_epi32(r, big, _mm512_set1_epi32(0x7F));
  r = _mm512_or_si512(_mm512_and_si512(r, _mm512_set1_epi32(0xFF)), _mm512_srli_epi32(sign, 24));
  return _mm512_cvtepi32_epi8(r);
}

inline __m512 clamp_fp8(__m512 q) {  // NaN lanes pass through (max/min return the second operand on NaN)
  const __m512 lo = _mm512_max_ps(_mm512_set1_ps(-pk::kFp8Max), q);
  return _mm512_min_ps(_mm512_set1_ps(pk::kFp8Max), lo);
}
#endif

// One (gm x gk) block of rows r0.. (count rows), columns k0..k0+kn of x [.., K] -> q, and its scale.
// `bad` counts blocks whose amax is NaN or Inf while ue8m0: they have no power-of-two scale and the
// caller refuses the input (the contract's error).
float cast_block_fp8(const void* x, int kind, int64_t K, int64_t r0, int64_t rows, int64_t k0, int64_t kn,
                     bool ue8m0, uint8_t* q, int64_t* bad) {
  float amax;
#if defined(__AVX512F__)
  AbsMax am;
  for (int64_t r = r0; r < r0 + rows; ++r)
    for (int64_t k = 0; k < kn; k += 16) am.add(load16(x, kind, r * K + k0 + k, tail_mask(kn - k)));
  amax = am.get();
  if (ue8m0 && !std::isfinite(amax)) ++*bad;
  const float sf = scale_from_amax(amax, pk::kFp8Max, ue8m0);
  const __m512 vsf = _mm512_set1_ps(sf);
  for (int64_t r = r0; r < r0 + rows; ++r)
    for (int64_t k = 0; k < kn; k += 16) {
      const __mmask16 m = tail_mask(kn - k);
      const __m512 v = clamp_fp8(_mm512_div_ps(load16(x, kind, r * K + k0 + k, m), vsf));
      _mm_mask_storeu_epi8(q + r * K + k0 + k, m, f32x16_to_fp8(v));
    }
#else
  amax = 0.0f;
  bool nan = false;
  for (int64_t r = r0; r < r0 + rows; ++r)
    for (int64_t k = 0; k < kn; ++k) {
      const float v = load1(x, kind, r * K + k0 + k);
      nan |= std::isnan(v);
      amax = std::max(amax, std::fabs(v));
    }
  if (nan) amax = std::nanf("");
  if (ue8m0 && !std::isfinite(amax)) ++*bad;
  const float sf = scale_from_amax(amax, pk::kFp8Max, ue8m0);
  for (int64_t r = r0; r < r0 + rows; ++r)
    for (int64_t k = 0; k < kn; ++k) q[r * K + k0 + k] = quant_fp8(load1(x, kind, r * K + k0 + k), sf);
#endif
  return sf;
}

inline int pick_threads(int nthreads, double bytes, int64_t tasks) {
  if (bytes < 262144.0) return 1;  // below ~256 KiB a parallel region costs more than it saves
  return std::max<int>(1, std::min<int64_t>(nthreads, tasks));
}

// ---- FP4 ---------------------------------------------------------------------------------------------

#if defined(__AVX512F__)
// E2M1 codes (0..15 in 32-bit lanes) of 16 finite floats, as pk::f32_to_e2m1
inline __m512i f32x16_to_e2m1(__m512 x) {
  const __m512i sign = _mm512_srli_epi32(_mm512_and_si512(_mm512_castps_si512(x), _mm512_set1_epi32(int(0x80000000u))), 28);
  const __m512 mag = _mm512_min_ps(_mm512_abs_ps(x), _mm512_set1_ps(pk::kFp4Max));
  const __m512i bits = _mm512_castps_si512(mag);
  __m512i big = _mm512_and_si512(_mm512_srli_epi32(bits, 22), _mm512_set1_epi32(1));
  big = _mm512_sub_epi32(_mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(big, bits), _mm512_set1_epi32(0x1FFFFF)), 22),
                         _mm512_set1_epi32(252));
  const __m512 t = _mm512_add_ps(_mm512_mul_ps(mag, _mm512_set1_ps(2.0f)), _mm512_set1_ps(8388608.0f));
  const __m512i small = _mm512_sub_epi32(_mm512_castps_si512(t), _mm512_set1_epi32(0x4B000000));
  const __mmask16 below = _mm512_cmp_ps_mask(mag, _mm512_set1_ps(1.0f), _CMP_LT_OQ);
  return _mm512_or_si512(_mm512_mask_mov_epi32(big, below, small), sign);
}
#endif

// One row of x (K elements, K even) -> packed codes (K/2 bytes) and ceil(K/gk) scales.
int64_t cast_row_fp4(const void* x, int kind, int64_t K, int64_t gk, bool ue8m0, uint8_t* q, float* scale,
                     std::vector<uint8_t>& codes) {
  int64_t bad = 0;
  codes.resize(static_cast<size_t>(K));
  for (int64_t k0 = 0, b = 0; k0 < K; k0 += gk, ++b) {
    const int64_t kn = std::min(gk, K - k0);
    float amax = 0.0f;
    bool nan = false;
    for (int64_t k = 0; k < kn; ++k) {
      const float v = load1(x, kind, k0 + k);
      nan |= std::isnan(v);
      amax = std::max(amax, std::fabs(v));
    }
    if (nan || !std::isfinite(amax)) ++bad;  // E2M1 has no NaN/Inf: always refused
    const float sf = scale_from_amax(amax, pk::kFp4Max, ue8m0);
    scale[b] = sf;
    int64_t k = 0;
#if defined(__AVX512F__)
    const __m512 vsf = _mm512_set1_ps(sf);
    for (; k + 16 <= kn; k += 16) {
      const __m512i c = f32x16_to_e2m1(_mm512_div_ps(load16(x, kind, k0 + k, 0xFFFF), vsf));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(codes.data() + k0 + k), _mm512_cvtepi32_epi8(c));
    }
#endif
    for (; k < kn; ++k) codes[k0 + k] = pk::f32_to_e2m1(load1(x, kind, k0 + k) / sf);
  }
  for (int64_t i = 0; i < K / 2; ++i) q[i] = uint8_t((codes[2 * i] & 0xF) | (codes[2 * i + 1] << 4));
  return bad;
}

// ---- SwiGLU ------------------------------------------------------------------------------------------

struct SwigluArgs {
  const void* x;
  int kind;
  int64_t M, I, per;
  bool round_sf;
  const int32_t* pos_to_token_topk;
  const float* topk_weights;
  int64_t weights_len;
  const int32_t* pos_to_expert;
  bool clamp;
  float clamp_value;
  int64_t* counts;  // [3] or null
  uint8_t* q;
  float* scale;
};

int64_t swiglu_rows(const SwigluArgs& s, int nthreads) {
  const int64_t nb = (s.I + s.per - 1) / s.per;
  int64_t c_gate = 0, c_up_hi = 0, c_up_lo = 0, bad = 0;
  const int threads = pick_threads(nthreads, double(s.M) * double(2 * s.I) * 2.0, s.M);
  std::atomic<int64_t> sums[4] = {};  // c_gate, c_up_hi, c_up_lo, bad of every block
  pk::parallel_blocks(s.M, threads, [&](int64_t r0, int64_t r1) {
    int64_t c_gate = 0, c_up_hi = 0, c_up_lo = 0, bad = 0;
    std::vector<float> y(static_cast<size_t>(s.I + 16));
    for (int64_t r = r0; r < r1; ++r) {
      bool valid = !(s.pos_to_expert && s.pos_to_expert[r] < 0);
      float w = 1.0f;
      if (s.pos_to_token_topk) {
        const int64_t p = s.pos_to_token_topk[r];
        valid = valid && p >= 0 && p < s.weights_len;  // out-of-range slots are padding (the contract refuses them)
        if (valid) w = s.topk_weights[p];
      }
      uint8_t* qr = s.q + r * s.I;
      float* sr = s.scale + r * nb;
      const int64_t xrow = r * 2 * s.I;
      if (!valid) {
        std::memset(qr, 0, static_cast<size_t>(s.I));
        const float sf0 = scale_from_amax(0.0f, pk::kFp8Max, s.round_sf);
        for (int64_t b = 0; b < nb; ++b) sr[b] = sf0;
        continue;
      }
      int64_t i = 0;
#if defined(__AVX512F__)
      const __m512 vc = _mm512_set1_ps(s.clamp_value);
      for (; i + 16 <= s.I; i += 16) {
        __m512 g = load16(s.x, s.kind, xrow + i, 0xFFFF);
        __m512 u = load16(s.x, s.kind, xrow + s.I + i, 0xFFFF);
        if (s.clamp) {
          c_gate += __builtin_popcount(_mm512_cmp_ps_mask(g, vc, _CMP_GT_OQ));
          c_up_hi += __builtin_popcount(_mm512_cmp_ps_mask(u, vc, _CMP_GT_OQ));
          c_up_lo += __builtin_popcount(_mm512_cmp_ps_mask(u, _mm512_sub_ps(_mm512_setzero_ps(), vc), _CMP_LT_OQ));
          g = _mm512_min_ps(g, vc);
          u = _mm512_max_ps(_mm512_min_ps(u, vc), _mm512_sub_ps(_mm512_setzero_ps(), vc));
        }
        const __m512 silu = _mm512_div_ps(g, _mm512_add_ps(_mm512_set1_ps(1.0f), pk::exp16(_mm512_sub_ps(_mm512_setzero_ps(), g))));
        __m512 v = _mm512_mul_ps(silu, u);
        if (s.topk_weights) v = _mm512_mul_ps(v, _mm512_set1_ps(w));
        _mm512_storeu_ps(y.data() + i, v);
      }
#endif
      for (; i < s.I; ++i) {
        float g = load1(s.x, s.kind, xrow + i), u = load1(s.x, s.kind, xrow + s.I + i);
        if (s.clamp) {
          c_gate += g > s.clamp_value;
          c_up_hi += u > s.clamp_value;
          c_up_lo += u < -s.clamp_value;
          g = std::min(g, s.clamp_value);
          u = std::max(std::min(u, s.clamp_value), -s.clamp_value);
        }
        float v = g / (1.0f + std::exp(-g)) * u;
        if (s.topk_weights) v *= w;
        y[i] = v;
      }
      for (int64_t b = 0; b < nb; ++b) {
        const int64_t k0 = b * s.per, kn = std::min(s.per, s.I - k0);
        sr[b] = cast_block_fp8(y.data(), kF32, s.I, 0, 1, k0, kn, s.round_sf, qr, &bad);
      }
    }
    sums[0] += c_gate;
    sums[1] += c_up_hi;
    sums[2] += c_up_lo;
    sums[3] += bad;
  });
  c_gate = sums[0].load(), c_up_hi = sums[1].load(), c_up_lo = sums[2].load(), bad = sums[3].load();
  if (s.counts) {
    s.counts[0] += c_gate;
    s.counts[1] += c_up_hi;
    s.counts[2] += c_up_lo;
  }
  return bad;
}

// ---- E5M6 --------------------------------------------------------------------------------------

constexpr float kE5m6Max = 65024.0f;

// TileKernels' float_to_e5m6 of one fp32 value (layouts/e5m6.py): fp16 bits rounded toward zero,
// the top 12 kept, plus one when (code & 1) + the fp32's low 17 mantissa bits > 0x10000.
inline uint32_t e5m6_code(float v) {
  const uint32_t b = pk::f32_bits(v);
  const uint32_t sign = (b >> 16) & 0x8000u, mant = b & 0x7FFFFFu;
  const int32_t exp = int32_t((b >> 23) & 0xFFu);
  uint32_t h = sign;
  if (exp == 255 && mant) h |= 0x7FFFu;
  else if (exp >= 143) h |= 0x7C00u;
  else if (exp >= 113) h |= (uint32_t(exp - 112) << 10) | (mant >> 13);
  else if (exp >= 103) h |= (mant | 0x800000u) >> (126 - exp);
  uint32_t c = h >> 4;
  c += ((c & 1u) + (b & 0x1FFFFu)) > 0x10000u ? 1u : 0u;
  return c & 0xFFFu;
}

// eight codes -> 12 bytes: three little-endian uint32 words (layouts/e5m6.py's diagram)
inline void pack_e5m6_group(const uint32_t* h, uint8_t* out) {
  const uint32_t w[3] = {(h[0] << 20) | (h[1] << 8) | (h[2] >> 4),
                         (h[2] << 28) | (h[3] << 16) | (h[4] << 4) | (h[5] >> 8),
                         (h[5] << 24) | (h[6] << 12) | h[7]};
  std::memcpy(out, w, 12);  // little-endian host (the layouts assume it too)
}

// One row: scales per block of `per`, then codes of x · inv packed eight at a time. A block with
// NaN/Inf and round_sf is counted in *bad (refused by the caller); without round_sf NaN/Inf
// propagate as in the reference, every NaN product encoded as the quiet NaN 0x7FC00000.
void cast_row_e5m6(const void* x, int kind, int64_t K, int64_t per, bool round_sf, uint8_t* q, float* scale,
                   std::vector<float>& inv, int64_t* bad) {
  const int64_t groups = (K + per - 1) / per;
  inv.resize(size_t(groups));
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t k0 = g * per, kn = std::min(per, K - k0);
    float amax = 0.0f;
    bool nan = false;
    for (int64_t k = 0; k < kn; ++k) {
      const float v = std::fabs(load1(x, kind, k0 + k));
      nan |= std::isnan(v);
      amax = std::max(amax, v);
    }
    if (nan) amax = pk::bits_f32(0x7FC00000u);
    amax = nan ? amax : std::max(amax, pk::kAmaxFloor);
    float sf = amax / kE5m6Max;
    if (round_sf) {
      if (!std::isfinite(sf)) {
        ++*bad;
        sf = 1.0f;
      }
      sf = pk::ceil_to_ue8m0(sf);
      inv[size_t(g)] = 1.0f / sf;
    } else {
      inv[size_t(g)] = kE5m6Max / amax;
    }
    scale[g] = sf;
  }
  uint32_t h[8];
  for (int64_t j = 0; j < K; j += 8) {
    for (int i = 0; i < 8; ++i) {
      const float v = load1(x, kind, j + i), s = inv[size_t((j + i) / per)];
      const float p = v * s;
      h[i] = e5m6_code(std::isnan(p) ? pk::bits_f32(0x7FC00000u) : p);  // the contract's one NaN
    }
    pack_e5m6_group(h, q + j / 8 * 12);
  }
}

}  // namespace

// x: [L, MN, K] contiguous (fp32 / bf16 / fp16 by in_kind); q: fp8 [L, MN, K]; scale: fp32
// [L, ceil(MN/gm), ceil(K/gk)]. One task per (l, row block); blocks of a task run in order.
// Returns the number of blocks refused (NaN/Inf amax with ue8m0).
PK_EXPORT int64_t pk_cast_fp8(const void* x, int in_kind, int64_t L, int64_t MN, int64_t K, int64_t gm, int64_t gk,
                           int ue8m0, void* q, float* scale, int nthreads) {
  const int64_t bm = (MN + gm - 1) / gm, bk = (K + gk - 1) / gk;
  const int64_t elem = in_kind == kF32 ? 4 : 2;
  const int threads = pick_threads(pk::thread_count(nthreads), double(L * MN * K) * elem, L * bm);
  return pk::parallel_blocks_sum(L * bm, threads, [&](int64_t t0, int64_t t1) {
    int64_t refused = 0;
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t l = t / bm, b = t % bm;
      const uint8_t* xl = static_cast<const uint8_t*>(x) + l * MN * K * elem;
      uint8_t* ql = static_cast<uint8_t*>(q) + l * MN * K;
      const int64_t r0 = b * gm, rows = std::min(gm, MN - r0);
      for (int64_t kb = 0; kb < bk; ++kb) {
        const int64_t k0 = kb * gk, kn = std::min(gk, K - k0);
        scale[(l * bm + b) * bk + kb] = cast_block_fp8(xl, in_kind, K, r0, rows, k0, kn, ue8m0 != 0, ql, &refused);
      }
    }
    return refused;
  });
}

// x: [R, K] contiguous rows (K even) -> q uint8 [R, K/2] packed E2M1, scale fp32 [R, ceil(K/gk)].
// Returns the number of blocks holding NaN/Inf (refused by the caller).
PK_EXPORT int64_t pk_cast_fp4(const void* x, int in_kind, int64_t R, int64_t K, int64_t gk, int ue8m0, void* q,
                           float* scale, int nthreads) {
  const int64_t bk = (K + gk - 1) / gk;
  const int64_t elem = in_kind == kF32 ? 4 : 2;
  const int threads = pick_threads(pk::thread_count(nthreads), double(R * K) * elem, R);
  return pk::parallel_blocks_sum(R, threads, [&](int64_t r0, int64_t r1) {
    std::vector<uint8_t> codes;
    int64_t refused = 0;
    for (int64_t r = r0; r < r1; ++r)
      refused += cast_row_fp4(static_cast<const uint8_t*>(x) + r * K * elem, in_kind, K, gk, ue8m0 != 0,
                              static_cast<uint8_t*>(q) + r * (K / 2), scale + r * bk, codes);
    return refused;
  });
}

// x: [M, 2I] contiguous; gate = first half. Optional int32 [M] maps (null when absent), weights fp32
// [weights_len]; counts int64 [3] (added to) or null. q fp8 [M, I]; scale fp32 [M, ceil(I/per)].
// Returns the number of blocks refused (NaN/Inf amax with round_sf).
PK_EXPORT int64_t pk_swiglu_cast(const void* x, int in_kind, int64_t M, int64_t I, int64_t per, int round_sf,
                              const int32_t* pos_to_token_topk, const float* topk_weights, int64_t weights_len,
                              const int32_t* pos_to_expert, int clamp, float clamp_value, int64_t* counts, void* q,
                              float* scale, int nthreads) {
  SwigluArgs s{x, in_kind, M, I, per, round_sf != 0, pos_to_token_topk, topk_weights, weights_len, pos_to_expert,
               clamp != 0, clamp_value, counts, static_cast<uint8_t*>(q), scale};
  return swiglu_rows(s, pk::thread_count(nthreads));
}

// x: [M, K] contiguous rows (K % 8 == 0) -> q uint8 [M, K * 3 / 2] packed E5M6, scale fp32
// [M, ceil(K / per)]. Returns the number of blocks refused (NaN/Inf with round_sf).
PK_EXPORT int64_t pk_cast_e5m6(const void* x, int in_kind, int64_t M, int64_t K, int64_t per, int round_sf, void* q,
                            float* scale, int nthreads) {
  const int64_t groups = (K + per - 1) / per;
  const int64_t elem = in_kind == kF32 ? 4 : 2;
  const int threads = pick_threads(pk::thread_count(nthreads), double(M * K) * elem, M);
  return pk::parallel_blocks_sum(M, threads, [&](int64_t r0, int64_t r1) {
    std::vector<float> inv;
    int64_t refused = 0;
    for (int64_t r = r0; r < r1; ++r)
      cast_row_e5m6(static_cast<const uint8_t*>(x) + r * K * elem, in_kind, K, per, round_sf != 0,
                    static_cast<uint8_t*>(q) + r * (K / 8 * 12), scale + r * groups, inv, &refused);
    return refused;
  });
}

