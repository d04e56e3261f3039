// pk_native.h — scalar and SIMD helpers shared by every host C++ source of portable_kernels.
//
// Rule: conversions here are bit-exact with torch's CPU conversions (c10's scalar rules), so a
// native kernel that dequantizes or quantizes produces the same numbers as the contracts'
// references. SIMD paths exist for AVX-512 and AVX2 (selected by the -march of the build); every
// function also has a portable scalar form, which is what NEON and generic builds compile.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#ifdef _OPENMP
#include <omp.h>
#endif

#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

#if defined(__x86_64__) && defined(__linux__) && defined(__AVX512F__)
#include <sys/syscall.h>  // amx_permitted asks the kernel for the tile data
#include <unistd.h>
#endif

#define PK_EXPORT extern "C" __attribute__((visibility("default")))

namespace pk {

constexpr float kFp8Max = 448.0f;
constexpr float kFp4Max = 6.0f;
constexpr float kAmaxFloor = 1e-4f;

inline uint32_t f32_bits(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }
inline float bits_f32(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }

// ---- bf16 -------------------------------------------------------------------------------------

inline float bf16_to_f32(uint16_t h) { return bits_f32(uint32_t(h) << 16); }

// Round to nearest even, NaN -> 0x7FC0 (c10::BFloat16's rule).
inline uint16_t f32_to_bf16(float f) {
  uint32_t u = f32_bits(f);
  if (std::isnan(f)) return 0x7FC0;
  u += 0x7FFFu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

// ---- fp8 e4m3fn ------------------------------------------------------------------------------

// Exact value of an e4m3fn byte. 0x7F / 0xFF are NaN.
inline float fp8_to_f32(uint8_t b) {
  uint32_t sign = uint32_t(b & 0x80) << 24;
  uint32_t e = (b >> 3) & 0xF, m = b & 7;
  if (e == 0xF && m == 7) return bits_f32(sign | 0x7FC00000u);
  float v = e == 0 ? float(m) * 0.001953125f /* 2^-9 */ : bits_f32(((e + 120) << 23) | (m << 20));
  return sign ? -v : v;
}

// c10's fp8e4m3fn_from_fp32_value: round to nearest even; |f| >= 480 gives NaN, so callers clamp
// to +-448 first (the quantizers' contract).
inline uint8_t f32_to_fp8(float f) {
  uint32_t bits = f32_bits(f);
  const uint32_t sign = bits & 0x80000000u;
  bits ^= sign;
  uint8_t r;
  if (bits >= (1087u << 20)) {
    r = 0x7F;
  } else if (bits < (121u << 23)) {
    const uint32_t denorm = 141u << 23;
    r = uint8_t(f32_bits(bits_f32(bits) + bits_f32(denorm)) - denorm);
  } else {
    uint32_t odd = (bits >> 20) & 1u;
    bits += (uint32_t(7 - 127) << 23) + 0x7FFFFu + odd;
    r = uint8_t(bits >> 20);
  }
  return uint8_t(r | (sign >> 24));
}

// bf16 bits of an e4m3fn byte's value (exact: e4m3 fits in bf16). NaN codes give a bf16 NaN.
inline uint16_t fp8_to_bf16_bits(uint8_t b) { return uint16_t(f32_bits(fp8_to_f32(b)) >> 16); }

// ---- fp4 e2m1 ----------------------------------------------------------------------------------

constexpr float kE2m1Values[16] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f,
                                   -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

// E2M1 code of a finite float: nearest, ties to the even code, |x| > 6 saturates (layouts.fp4).
inline uint8_t f32_to_e2m1(float x) {
  uint8_t sign = std::signbit(x) ? 8 : 0;
  float mag = std::min(std::fabs(x), kFp4Max);
  uint8_t idx;
  if (mag < 1.0f) {
    // 2|x| rounded half-to-even: 0 -> 0, 0.5 -> idx 1, 1.0 -> idx 2
    float t = mag * 2.0f + 8388608.0f;
    idx = uint8_t(f32_bits(t) - 0x4B000000u);
  } else {
    uint32_t bits = f32_bits(mag);
    uint32_t i = (bits >> 22) & 1u;
    i += bits + 0x1FFFFFu;
    idx = uint8_t((i >> 22) - 252);
  }
  return uint8_t(idx | sign);
}

// ---- UE8M0 ---------------------------------------------------------------------------------------

// ceil_to_ue8m0 of a positive finite scale: biased exponent (+1 if mantissa != 0), clamped [1, 254].
inline float ceil_to_ue8m0(float s) {
  uint32_t u = f32_bits(s) & 0x7FFFFFFFu;
  int32_t e = int32_t(u >> 23) + ((u & 0x7FFFFFu) != 0 ? 1 : 0);
  e = std::min(254, std::max(1, e));
  return bits_f32(uint32_t(e) << 23);
}

inline bool is_pow2_scale(float s) { return (f32_bits(s) & 0x807FFFFFu) == 0 && s != 0.0f; }

// ---- threads -------------------------------------------------------------------------------------

inline int thread_count(int requested) { return requested < 1 ? 1 : requested; }

#if defined(__x86_64__) && defined(__linux__) && defined(__AVX512F__)
// ---- AMX ----------------------------------------------------------------------------------------

// The tile configuration ldtilecfg reads (palette 1).
struct alignas(64) TileConfig {
  uint8_t palette, start_row, reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};

// Whether this CPU has AMX-BF16 and AMX-TILE and the kernel lets this process use the tile data
// (asked once per process: ARCH_REQ_XCOMP_PERM for XTILEDATA).
inline bool amx_permitted() {
  static int state = -1;
  if (state < 0) {
    unsigned a, b, c, d;
    __asm__("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(7), "c"(0));
    const bool cpu = ((d >> 22) & 1) && ((d >> 24) & 1);  // AMX-BF16, AMX-TILE
    state = cpu && syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) == 0;
  }
  return state == 1;
}

#pragma GCC push_options
#pragma GCC target("amx-tile")
// Tiles 0-7 configured as `rows` x 64 bytes (palette 1), the one shape the AMX engines use.
inline void load_tile_config(int rows) {
  TileConfig cfg{};
  cfg.palette = 1;
  for (int t = 0; t < 8; ++t) {
    cfg.rows[t] = uint8_t(rows);
    cfg.colsb[t] = 64;
  }
  // the intrinsic's asm names only 8 bytes of cfg as input: keep the other stores alive
  __asm__ volatile("" : : "r"(&cfg) : "memory");
  _tile_loadconfig(&cfg);
}
#pragma GCC pop_options
#endif

// ---- SIMD ---------------------------------------------------------------------------------------

#if defined(__AVX512F__)
// 16 e4m3 bytes -> 16 floats times 2^-8 (fp16 trick: the e4m3 bits shifted into an fp16 are the
// same value scaled by 2^-8, subnormals included; the hardware fp16 conversion is exact).
// Sign-extended to 16 bits and shifted left by 7, a byte's sign lands in bits 15 and 14 and its
// exponent and mantissa in fp16's fields below; clearing bit 14 leaves the fp16 (3 ops, not 6).
inline __m512 fp8x16_to_f32_scaled(__m128i bytes) {
  const __m256i w = _mm256_slli_epi16(_mm256_cvtepi8_epi16(bytes), 7);
  return _mm512_cvtph_ps(_mm256_and_si256(w, _mm256_set1_epi16(int16_t(0xBFFF))));
}
inline __m512 fp8x16_to_f32(__m128i bytes) {
  return _mm512_mul_ps(fp8x16_to_f32_scaled(bytes), _mm512_set1_ps(256.0f));
}
inline __m512 bf16x16_to_f32(__m256i h) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
// Round to nearest even like f32_to_bf16 (NaN -> 0x7FC0); vcvtneps2bf16 would flush denormals.
inline __m256i f32x16_to_bf16(__m512 v) {
  __m512i u = _mm512_castps_si512(v);
  __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7FFF)), odd), 16);
  __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
  r = _mm512_mask_mov_epi32(r, nan, _mm512_set1_epi32(0x7FC0));
  return _mm512_cvtepi32_epi16(r);
}
inline float hsum(__m512 v) { return _mm512_reduce_add_ps(v); }
// 16 x 16 transpose of 32-bit elements: on return r[j] holds element j of every input row.
inline void transpose16(__m512i r[16]) {
  __m512i t[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);      // a0 b0 a1 b1 | per 128-bit lane
    t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);  // a2 b2 a3 b3
  }
  for (int i = 0; i < 16; i += 4) {
    r[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);      // a0 b0 c0 d0
    r[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);  // a1 b1 c1 d1
    r[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);  // a2 b2 c2 d2
    r[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);  // a3 b3 c3 d3
  }
  // r[4g + e] holds, in lane L, element 4L + e of rows 4g..4g+3
  for (int e = 0; e < 4; ++e) {
    // lanes: (rows 0-3 | rows 4-7) and (rows 8-11 | rows 12-15), element lanes 0,1 then 2,3
    t[e] = _mm512_shuffle_i32x4(r[e], r[4 + e], 0x44);       // L0 L1 of g0, L0 L1 of g1
    t[4 + e] = _mm512_shuffle_i32x4(r[e], r[4 + e], 0xEE);   // L2 L3 of g0, L2 L3 of g1
    t[8 + e] = _mm512_shuffle_i32x4(r[8 + e], r[12 + e], 0x44);
    t[12 + e] = _mm512_shuffle_i32x4(r[8 + e], r[12 + e], 0xEE);
  }
  for (int e = 0; e < 4; ++e) {
    // element 4L + e for L = 0..3: gather lane L of the four row groups
    r[e] = _mm512_shuffle_i32x4(t[e], t[8 + e], 0x88);        // L0: g0 g1 g2 g3
    r[4 + e] = _mm512_shuffle_i32x4(t[e], t[8 + e], 0xDD);    // L1
    r[8 + e] = _mm512_shuffle_i32x4(t[4 + e], t[12 + e], 0x88);   // L2
    r[12 + e] = _mm512_shuffle_i32x4(t[4 + e], t[12 + e], 0xDD);  // L3
  }
}
// exp(x): range reduction by ln 2 and a degree-6 polynomial (about 1 ulp), saturating to 0 / inf
// outside [-87.3, 88.7] as expf does.
inline __m512 exp16(__m512 x) {
  x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.33654f)), _mm512_set1_ps(88.72283f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(_mm512_mul_ps(p, r), r, _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  return _mm512_scalef_ps(p, n);
}
#endif

#if defined(__AVX2__)
inline __m256 fp8x8_to_f32_scaled(__m128i bytes8) {
  __m128i w = _mm_cvtepu8_epi16(bytes8);
  __m128i mag = _mm_slli_epi16(_mm_and_si128(w, _mm_set1_epi16(0x7F)), 7);
  __m128i sgn = _mm_slli_epi16(_mm_and_si128(w, _mm_set1_epi16(0x80)), 8);
  return _mm256_cvtph_ps(_mm_or_si128(mag, sgn));
}
// 16 e4m3 bytes -> two vectors of 8 floats times 2^-8 (the fp16 trick of fp8x16_to_f32_scaled:
// sign-extend, shift left by 7, clear bit 14; 3 integer ops for 16 values, then two conversions).
inline void fp8x16_to_f32x2_scaled(__m128i bytes, __m256* lo, __m256* hi) {
  const __m256i w = _mm256_and_si256(_mm256_slli_epi16(_mm256_cvtepi8_epi16(bytes), 7), _mm256_set1_epi16(int16_t(0xBFFF)));
  *lo = _mm256_cvtph_ps(_mm256_castsi256_si128(w));
  *hi = _mm256_cvtph_ps(_mm256_extracti128_si256(w, 1));
}
inline __m256 bf16x8_to_f32(__m128i h) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
// exp(x) like exp16: the same reduction and polynomial; 2^n applied as two normal factors (n in
// [-126, 128] after the clamp), so results underflow gradually like expf.
inline __m256 exp8(__m256 x) {
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.33654f)), _mm256_set1_ps(88.72283f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(_mm256_mul_ps(p, r), r, _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  const __m256i ni = _mm256_cvtps_epi32(n), half = _mm256_srai_epi32(ni, 1);
  const __m256 f1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(half, _mm256_set1_epi32(127)), 23));
  const __m256 f2 = _mm256_castsi256_ps(
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_sub_epi32(ni, half), _mm256_set1_epi32(127)), 23));
  return _mm256_mul_ps(_mm256_mul_ps(p, f1), f2);
}
inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
#endif

}  // namespace pk
