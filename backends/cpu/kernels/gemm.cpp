// gemm.cpp — the cpu backend's native GEMM family: D = C + A·Bᵀ for fp8 (block-scaled), bf16 and
// fp8 x fp4 operands, dense and grouped (contiguous / masked), in one pass over "segments".
//
// A segment is a run of rows of A and D that multiply one group's B: (first row, row count, group).
// A dense GEMM is one segment; a grouped GEMM lists its groups' valid rows, so padding rows are
// never read or written. Two engines share that description:
//  - "fma": A rows are dequantized once to fp32 (a·sfa rounded as the reference rounds it), B is
//    dequantized in registers / L1 (b·sfb likewise), products accumulate in fp32 with FMA. It
//    reads every B byte once per call: the decode engine (few rows) and the portable fallback.
//    Segments of up to 4 rows take dot products (B rows as vectors); longer ones an outer-product
//    micro-kernel over k-major panels of B (the "panel path").
//  - "amx" (x86 with AMX-BF16): A and B hold raw element values in bf16 (exact for e4m3 and e2m1),
//    tiles multiply in fp32, and every `promote` K-elements the tile sums are scaled by sfa·sfb
//    and added to fp32 accumulators (DeepGEMM's per-block promotion), so any scale (power of two or
//    not) is applied in fp32. B comes pre-packed in VNNI tile order (packed once at ingest).
// Python validates every argument before calling; these functions trust shapes and pointers.
#include "pk_native.h"
#include "pk_pool.h"
#include "simd_f32.h"

#include <sys/syscall.h>
#include <unistd.h>

#include <cstdlib>
#include <memory>
#include <vector>

namespace {

enum Kind : int { kFp8 = 0, kBf16 = 1, kFp4 = 2 };

struct Seg {
  int64_t row, rows, group;
};

#if defined(__AVX512F__)
#define PK_VL 16
#elif defined(__AVX2__)
#define PK_VL 8
#else
#define PK_VL 1
#endif
constexpr int VL = PK_VL;

inline int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// ---- dequantization of rows to fp32 ----------------------------------------------------------------

// out[0..k_pad) = values of one row: fp8·scale (per block of g), bf16, or e2m1·scale; zero past K.
void dequant_row(const void* src, int kind, const float* scale, int64_t g, int64_t K, int64_t k_pad, float* out) {
  if (kind == kBf16) {
    const uint16_t* s = static_cast<const uint16_t*>(src);
    int64_t k = 0;
#if defined(__AVX512F__)
    for (; k + 16 <= K; k += 16)
      _mm512_storeu_ps(out + k, pk::bf16x16_to_f32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + k))));
#endif
    for (; k < K; ++k) out[k] = pk::bf16_to_f32(s[k]);
  } else if (kind == kFp8) {
    const uint8_t* s = static_cast<const uint8_t*>(src);
    for (int64_t k0 = 0; k0 < K; k0 += g) {
      const int64_t k1 = std::min(K, k0 + g);
      const float sf = scale[k0 / g];
      int64_t k = k0;
#if defined(__AVX512F__)
      const __m512 vs = _mm512_set1_ps(sf);
      for (; k + 16 <= k1; k += 16) {
        __m512 v = pk::fp8x16_to_f32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s + k)));
        _mm512_storeu_ps(out + k, _mm512_mul_ps(v, vs));
      }
#endif
      for (; k < k1; ++k) out[k] = pk::fp8_to_f32(s[k]) * sf;
    }
  } else {  // e2m1, two codes per byte, even element in the low nibble
    const uint8_t* s = static_cast<const uint8_t*>(src);
    for (int64_t k = 0; k < K; ++k) {
      const uint8_t code = (k & 1) ? (s[k >> 1] >> 4) : (s[k >> 1] & 0xF);
      out[k] = pk::kE2m1Values[code] * scale[k / g];
    }
  }
  for (int64_t k = K; k < k_pad; ++k) out[k] = 0.0f;
}

// Whether sf·2^8 is exact (it is unless it overflows): then (v·2^-8)·(sf·2^8), with v·2^-8 exact
// (the fp16 conversion's output), is the real product v·sf rounded once — bit for bit the reference's
// v·sf, in one multiply instead of two. Zeros, infinities and NaN behave alike both ways.
inline bool scale256_exact(float sf) { return !(std::isinf(sf * 256.0f) && !std::isinf(sf)); }

// Same as dequant_row for B tiles, without the per-element branch on the fp4 path when possible.
inline void dequant_b_row(const uint8_t* row_bytes, int kind, const float* scale, int64_t g, int64_t k0,
                          int64_t k1, float* out) {
  // [k0, k1) of one B row into out[0 .. k1-k0); any k0 (even for e2m1): each scale block is cut at k0 and
  // k1, and every element gets the same v·sf whatever the cut
  if (kind == kBf16) {
    const uint16_t* s = reinterpret_cast<const uint16_t*>(row_bytes);
    int64_t k = k0;
#if defined(__AVX512F__)
    for (; k + 16 <= k1; k += 16)
      _mm512_storeu_ps(out + (k - k0),
                       pk::bf16x16_to_f32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + k))));
#elif defined(__AVX2__)
    for (; k + 8 <= k1; k += 8)
      _mm256_storeu_ps(out + (k - k0), pk::bf16x8_to_f32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s + k))));
#endif
    for (; k < k1; ++k) out[k - k0] = pk::bf16_to_f32(s[k]);
    return;
  }
  for (int64_t b0 = k0, b1; b0 < k1; b0 = b1) {
    b1 = std::min(k1, (b0 / g + 1) * g);
    const float sf = scale[b0 / g];
    int64_t k = b0;
    if (kind == kFp8) {
#if defined(__AVX512F__)
      if (scale256_exact(sf)) {  // (v·2^-8)·(sf·2^8): one multiply, the same rounding as v·sf
        const __m512 vs = _mm512_set1_ps(sf * 256.0f);
        for (; k + 16 <= b1; k += 16)
          _mm512_storeu_ps(out + (k - k0), _mm512_mul_ps(pk::fp8x16_to_f32_scaled(_mm_loadu_si128(
                                                             reinterpret_cast<const __m128i*>(row_bytes + k))), vs));
      }
      const __m512 vs = _mm512_set1_ps(sf);
      for (; k + 16 <= b1; k += 16) {
        __m512 v = pk::fp8x16_to_f32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row_bytes + k)));
        _mm512_storeu_ps(out + (k - k0), _mm512_mul_ps(v, vs));
      }
#elif defined(__AVX2__)
      if (scale256_exact(sf)) {  // (v·2^-8)·(sf·2^8): one multiply, the same rounding as v·sf
        const __m256 vs = _mm256_set1_ps(sf * 256.0f);
        for (; k + 16 <= b1; k += 16) {
          __m256 lo, hi;
          pk::fp8x16_to_f32x2_scaled(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row_bytes + k)), &lo, &hi);
          _mm256_storeu_ps(out + (k - k0), _mm256_mul_ps(lo, vs));
          _mm256_storeu_ps(out + (k - k0) + 8, _mm256_mul_ps(hi, vs));
        }
      }
      const __m256 vs = _mm256_set1_ps(sf);
      for (; k + 8 <= b1; k += 8) {
        // v·2^-8·2^8 is exact, so one rounding happens (·sf), as in the reference's v·sf
        __m256 v = pk::fp8x8_to_f32_scaled(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(row_bytes + k)));
        _mm256_storeu_ps(out + (k - k0), _mm256_mul_ps(_mm256_mul_ps(v, _mm256_set1_ps(256.0f)), vs));
      }
#endif
      for (; k < b1; ++k) out[k - k0] = pk::fp8_to_f32(row_bytes[k]) * sf;
    } else {
#if defined(__AVX512F__)
      const __m512 table = _mm512_loadu_ps(pk::kE2m1Values);
      const __m512 vs = _mm512_set1_ps(sf);
      for (; k + 16 <= b1; k += 16) {  // k is even here (g and k0 are even)
        __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(row_bytes + (k >> 1)));
        __m128i w = _mm_cvtepu8_epi16(bytes);
        __m128i pairs = _mm_or_si128(_mm_and_si128(w, _mm_set1_epi16(0x0F)),
                                     _mm_slli_epi16(_mm_srli_epi16(w, 4), 8));
        __m512 v = _mm512_permutexvar_ps(_mm512_cvtepu8_epi32(pairs), table);
        _mm512_storeu_ps(out + (k - k0), _mm512_mul_ps(v, vs));
      }
#endif
      for (; k < b1; ++k) {
        const uint8_t code = (k & 1) ? (row_bytes[k >> 1] >> 4) : (row_bytes[k >> 1] & 0xF);
        out[k - k0] = pk::kE2m1Values[code] * sf;
      }
    }
  }
}

// ---- the fma engine ---------------------------------------------------------------------------------

constexpr int NR = 4;           // B rows per tile
constexpr int MR = 4;           // A rows per register block
constexpr int64_t KC = 1024;    // K elements per chunk: A chunk (<= 16 rows) and B tile stay in L1/L2
constexpr int64_t NRANGE = 64;  // columns per task: each task streams its own B rows once

#if PK_VL > 1
#if defined(__AVX512F__)
using vec = __m512;
inline vec vzero() { return _mm512_setzero_ps(); }
inline vec vload(const float* p) { return _mm512_loadu_ps(p); }
inline vec vfma(vec a, vec b, vec c) { return _mm512_fmadd_ps(a, b, c); }
inline float vsum(vec v) { return _mm512_reduce_add_ps(v); }
#else
using vec = __m256;
inline vec vzero() { return _mm256_setzero_ps(); }
inline vec vload(const float* p) { return _mm256_loadu_ps(p); }
inline vec vfma(vec a, vec b, vec c) { return _mm256_fmadd_ps(a, b, c); }
inline float vsum(vec v) { return pk::hsum(v); }
#endif
#endif

// out[i * ldo + j] += sum_k A[i][k] * B[j][k] over k in [0, kc) (kc a multiple of VL), for R A rows
// (stride lda) and NR B rows (stride ldb).
template <int R>
void fma_block(const float* A, int64_t lda, const float* B, int64_t ldb, int64_t kc, float* out, int64_t ldo) {
#if PK_VL > 1
  vec c[R][NR];
  for (int i = 0; i < R; ++i)
    for (int j = 0; j < NR; ++j) c[i][j] = vzero();
  for (int64_t k = 0; k < kc; k += VL) {
    vec b[NR];
    for (int j = 0; j < NR; ++j) b[j] = vload(B + j * ldb + k);
    for (int i = 0; i < R; ++i) {
      vec a = vload(A + i * lda + k);
      for (int j = 0; j < NR; ++j) c[i][j] = vfma(a, b[j], c[i][j]);
    }
  }
  for (int i = 0; i < R; ++i)
    for (int j = 0; j < NR; ++j) out[i * ldo + j] += vsum(c[i][j]);
#else
  for (int i = 0; i < R; ++i)
    for (int j = 0; j < NR; ++j) {
      float s = 0.0f;
      for (int64_t k = 0; k < kc; ++k) s += A[i * lda + k] * B[j * ldb + k];
      out[i * ldo + j] += s;
    }
#endif
}

struct Operand {
  const uint8_t* data;   // element bytes of row 0 (group 0)
  int kind;
  const float* scale;    // row-major scales of row-block 0 (group 0), or null
  int64_t gran_mn;       // rows per scale row
  int64_t gran_k;        // K elements per scale
  int64_t row_bytes;     // bytes between rows
  int64_t scale_ld;      // floats between scale rows
  int64_t group_bytes;   // bytes between groups (B only)
  int64_t group_scale;   // floats between groups' scales (B only)
};

struct Output {
  void* d;
  int d_bf16;
  const void* c;
  int c_bf16;
  int64_t ld;  // elements between rows of d and c
};

inline void write_out(const Output& o, int64_t r, int64_t n, float v) {
  if (o.c) {
    v += o.c_bf16 ? pk::bf16_to_f32(static_cast<const uint16_t*>(o.c)[r * o.ld + n])
                  : static_cast<const float*>(o.c)[r * o.ld + n];
  }
  if (o.d_bf16)
    static_cast<uint16_t*>(o.d)[r * o.ld + n] = pk::f32_to_bf16(v);
  else
    static_cast<float*>(o.d)[r * o.ld + n] = v;
}

#if defined(__AVX512F__)
#define PK_FMA_DIRECT 1
// R <= MR rows of A against NR B rows over elements [k0, k1), B dequantized in registers instead of
// into a tile: the same values as dequant_b_row, the same lanes (element k0 + 16i + l in lane l, +0
// past K like the tile's padding), the same fmadd order and the same sums as fma_block over the tile,
// so the bytes equal the tile path's; what is gone is the tile's store and reload, which for a few
// rows cost as much as the math. KIND: kFp8 (scale blocks of g elements, g a multiple of 16, k0 a
// multiple of g) or kBf16. rows[j] / scales[j]: B row j's bytes and its scale row (fp8).
// Software prefetch distance of fma_direct (AVX-512) in bytes of a B row. Measured 2026-12-03 on a
// Zen 5 (AVX-512, 1 thread, cold weights cycled over 256 MB, a standalone harness compiling this file
// with the build's flags): M=1 fp8 N=2048 K=7168 12.5 -> 17-19 GB/s (best 1024-2048), N=4096 K=1024
// 13.7 -> ~20 GB/s, N=1024 K=2048 13.7 -> ~20 GB/s; M=2 ~1.4x, M=4 ~1.25x; the hardware prefetchers
// alone do not keep NR interleaved row streams ahead. (The AVX2 form below has its own distance.)
constexpr int64_t kPrefetchAhead = 2048;

template <int R, int KIND>
void fma_direct(const float* Ab, int64_t lda, const uint8_t* const* rows, const float* const* scales, int64_t g,
                int64_t k0, int64_t k1, float* out, int64_t ldo) {
  __m512 c[R][NR];
  for (int i = 0; i < R; ++i)
    for (int j = 0; j < NR; ++j) c[i][j] = _mm512_setzero_ps();
  const int64_t span = KIND == kFp8 ? g : k1 - k0;  // elements sharing one scale
  for (int64_t kb = k0; kb < k1; kb += span) {
    const int64_t ke = std::min(k1, kb + span);
    __m512 mul[NR], sf[NR];
    bool split = false;  // some sf·2^8 overflows: that block multiplies by 2^8 and sf separately
    if (KIND == kFp8)
      for (int j = 0; j < NR; ++j) {
        const float s = scales[j][kb / g];
        split |= !scale256_exact(s);
        mul[j] = _mm512_set1_ps(s * 256.0f);
        sf[j] = _mm512_set1_ps(s);
      }
    auto step = [&](int64_t k, __mmask16 m) __attribute__((always_inline)) {
      __m512 b[NR];
      for (int j = 0; j < NR; ++j) {
        // a line of each row kPrefetchAhead bytes on (past a row's end: the next rows, which follow)
        if (((k * (KIND == kFp8 ? 1 : 2)) & 63) == 0)
          _mm_prefetch(reinterpret_cast<const char*>(rows[j]) + k * (KIND == kFp8 ? 1 : 2) + kPrefetchAhead,
                       _MM_HINT_T0);
        if (KIND == kFp8) {
          const __m512 v = pk::fp8x16_to_f32_scaled(_mm_maskz_loadu_epi8(m, rows[j] + k));
          b[j] = split ? _mm512_maskz_mul_ps(m, _mm512_mul_ps(v, _mm512_set1_ps(256.0f)), sf[j])
                       : _mm512_maskz_mul_ps(m, v, mul[j]);
        } else {
          b[j] = pk::bf16x16_to_f32(_mm256_maskz_loadu_epi16(m, reinterpret_cast<const uint16_t*>(rows[j]) + k));
        }
      }
      for (int i = 0; i < R; ++i) {
        const __m512 av = _mm512_loadu_ps(Ab + i * lda + (k - k0));
        for (int j = 0; j < NR; ++j) c[i][j] = _mm512_fmadd_ps(av, b[j], c[i][j]);
      }
    };
    int64_t k = kb;
    for (; k + 16 <= ke; k += 16) step(k, __mmask16(0xFFFF));
    if (k < ke) step(k, __mmask16((1u << (ke - k)) - 1));  // the last vector of K
  }
  for (int i = 0; i < R; ++i)
    for (int j = 0; j < NR; ++j) out[i * ldo + j] += _mm512_reduce_add_ps(c[i][j]);
}
#elif defined(__AVX2__)
#define PK_FMA_DIRECT 1
// The AVX2 form of the above: 8 lanes, the tile path's values (dequant_b_row's AVX2 branch: (v·2^-8)
// ·2^8·sf, two multiplies, one rounding) and its fmadd order, so again the tile path's bytes. The
// last vector of K is read through a buffer padded with zero codes and its lanes past K are
// cleared, as the tile pads with +0 (scale blocks, g a multiple of 8 here, hold whole vectors).
// Software prefetch distance of the AVX2 form (fp8 rows whose sf·2^8 is exact). AMD EPYC Zen 3,
// 1 thread, load ~1.7, cold weights, two builds paired in one process (2026-12-04): M=1 N=4096 K=1024
// 5.4 -> 8.2 GB/s (1.54x), N=7168 K=2048 1.17x, N=2048 K=512 1.22x, N=1024 K=1024 1.18x; N=2048
// K=7168 and M=4 unchanged (0.98x, 1.03x: bound by the widening there); 2048 bytes gained less.
constexpr int64_t kPrefetchAhead = 4096;

template <int R, int KIND>
void fma_direct(const float* Ab, int64_t lda, const uint8_t* const* rows, const float* const* scales, int64_t g,
                int64_t k0, int64_t k1, float* out, int64_t ldo) {
  __m256 c[R][NR];
  for (int i = 0; i < R; ++i)
    for (int j = 0; j < NR; ++j) c[i][j] = _mm256_setzero_ps();
  const int64_t span = KIND == kFp8 ? g : k1 - k0;
  const __m256 v256 = _mm256_set1_ps(256.0f);
  for (int64_t kb = k0; kb < k1; kb += span) {
    const int64_t ke = std::min(k1, kb + span);
    // scales stay scalars (broadcast where used): with 4 rows the 16 accumulators need the registers
    float sf[NR] = {}, mul[NR] = {};
    // no lambda: the accumulators must stay in registers. fp8 values are multiplied once by sf·2^8
    // where that is exact (one rounding either way, as in the tile), 16 values per step (one 16-byte
    // load and conversion per B row, its two halves consumed before the next row's)
    bool exact = true;
    if (KIND == kFp8)
      for (int j = 0; j < NR; ++j) {
        sf[j] = scales[j][kb / g];
        exact = exact && scale256_exact(sf[j]);
        mul[j] = sf[j] * 256.0f;
      }
    int64_t k = kb;
    if (KIND == kFp8 && exact)
      for (; k + 16 <= ke; k += 16)
        for (int j = 0; j < NR; ++j) {
          if ((k & 63) == 0) _mm_prefetch(reinterpret_cast<const char*>(rows[j] + k + kPrefetchAhead), _MM_HINT_T0);
          __m256 lo, hi;
          pk::fp8x16_to_f32x2_scaled(_mm_loadu_si128(reinterpret_cast<const __m128i*>(rows[j] + k)), &lo, &hi);
          const __m256 m = _mm256_set1_ps(mul[j]);
          lo = _mm256_mul_ps(lo, m);
          hi = _mm256_mul_ps(hi, m);
          for (int i = 0; i < R; ++i) {
            c[i][j] = _mm256_fmadd_ps(_mm256_loadu_ps(Ab + i * lda + (k - k0)), lo, c[i][j]);
            c[i][j] = _mm256_fmadd_ps(_mm256_loadu_ps(Ab + i * lda + (k + 8 - k0)), hi, c[i][j]);
          }
        }
    for (; k < ke; k += 8) {
      const int64_t n = std::min<int64_t>(8, ke - k);
      __m256 b[NR];
      for (int j = 0; j < NR; ++j) {
        if (KIND == kFp8) {
          __m128i bytes;
          if (n == 8) {
            bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(rows[j] + k));
          } else {
            uint8_t tail[8] = {};
            std::memcpy(tail, rows[j] + k, static_cast<size_t>(n));
            bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(tail));
          }
          const __m256 v = pk::fp8x8_to_f32_scaled(bytes);
          b[j] = exact ? _mm256_mul_ps(v, _mm256_set1_ps(mul[j]))
                       : _mm256_mul_ps(_mm256_mul_ps(v, v256), _mm256_set1_ps(sf[j]));
          if (n < 8) {  // lanes past K are +0 as in the tile, whatever the scale (inf · 0 would be NaN)
            const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
            b[j] = _mm256_and_ps(b[j], _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(int(n)), lane)));
          }
        } else {
          const uint16_t* src = reinterpret_cast<const uint16_t*>(rows[j]) + k;
          __m128i h;
          if (n == 8) {
            h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src));
          } else {
            uint16_t tail[8] = {};
            std::memcpy(tail, src, static_cast<size_t>(n) * 2);
            h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(tail));
          }
          b[j] = pk::bf16x8_to_f32(h);
        }
      }
      for (int i = 0; i < R; ++i) {
        const __m256 av = _mm256_loadu_ps(Ab + i * lda + (k - k0));
        for (int j = 0; j < NR; ++j) c[i][j] = _mm256_fmadd_ps(av, b[j], c[i][j]);
      }
    }
  }
  for (int i = 0; i < R; ++i)
    for (int j = 0; j < NR; ++j) out[i * ldo + j] += pk::hsum(c[i][j]);
}
#endif

// ---- the fma engine's panel path: segments of more than MR rows ----------------------------------
// An outer-product micro-kernel, C[R rows][PNC columns] += A·B with A's elements broadcast and a
// K step of B's columns loaded as vectors (simd_f32.h's blocks: AVX-512 6 x 64 in 24 zmm, AVX2 and
// NEON 6 x 16, generic 4 x 8). B is widened once per K slab of a column panel into an L1 buffer,
// k-major [k][PNC]: the values dequant_b_row gives (the reference's b·sf), transposed. Each output is
// one FMA chain over k in order (the sums of earlier slabs reloaded from `part`), with no horizontal
// sum, so the AVX-512, AVX2 and NEON builds give the same bytes (the generic build multiplies then
// adds). The form differs from the dot-product paths of segments of up to MR rows: a row's bytes
// depend on whether its segment has more than MR rows (within the contract's tolerance either way).
constexpr int PNC = pk_simd::VL * pk_simd::NV;  // columns per register block and panel
constexpr int PMR = pk_simd::MR;                // rows per register block
#if defined(__AVX512F__)
constexpr int64_t PKB = 128;  // K elements per slab: a 64-column panel of 32 KiB
#else
constexpr int64_t PKB = 256;  // 16-column panels of 16 KiB (8 columns: 8 KiB)
#endif
static_assert(PNC % 8 == 0 && PKB % 8 == 0, "panels are built from 8 x 8 transposes");

// C[r][0..PNC) += sum over k < kc, in order, of A[r * lda + k] * P[k * PNC + 0..PNC), for r < R.
template <int R>
inline void panel_block(const float* A, int64_t lda, const float* P, int64_t kc, float* C, int64_t ldc) {
  namespace v = pk_simd;  // (the dot-product paths above have their own `vec`)
  constexpr int NV = v::NV, W = v::VL;
  v::vec c[R][NV];
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < NV; ++j) c[r][j] = v::vload(C + r * ldc + j * W);
#pragma GCC unroll 4
  for (int64_t k = 0; k < kc; ++k) {
    v::vec b[NV];
    for (int j = 0; j < NV; ++j) b[j] = v::vload(P + k * PNC + j * W);
    for (int r = 0; r < R; ++r) {
      const v::vec x = v::vbcast(A[r * lda + k]);
      for (int j = 0; j < NV; ++j) c[r][j] = v::vfma(x, b[j], c[r][j]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < NV; ++j) v::vstore(C + r * ldc + j * W, c[r][j]);
}

// dst[i * ldd + j] = src[j * lds + i] for i, j < 8.
inline void transpose8(const float* src, int64_t lds, float* dst, int64_t ldd) {
#if defined(__AVX2__)
  __m256 r[8], t[8];
  for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(src + i * lds);
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int h = 0; h < 8; h += 4) {  // rows h..h+3: r[h + q] = (column q | column q + 4) of those rows
    r[h] = _mm256_shuffle_ps(t[h], t[h + 2], 0x44);
    r[h + 1] = _mm256_shuffle_ps(t[h], t[h + 2], 0xEE);
    r[h + 2] = _mm256_shuffle_ps(t[h + 1], t[h + 3], 0x44);
    r[h + 3] = _mm256_shuffle_ps(t[h + 1], t[h + 3], 0xEE);
  }
  for (int q = 0; q < 4; ++q) {
    _mm256_storeu_ps(dst + q * ldd, _mm256_permute2f128_ps(r[q], r[q + 4], 0x20));
    _mm256_storeu_ps(dst + (q + 4) * ldd, _mm256_permute2f128_ps(r[q], r[q + 4], 0x31));
  }
#else
  for (int i = 0; i < 8; ++i)
    for (int j = 0; j < 8; ++j) dst[i * ldd + j] = src[j * lds + i];
#endif
}

// B rows [n0, n0 + PNC) of this group (rows at or past `end` read as +0) over elements [k0, k1) ->
// panel[(k - k0) * PNC + j], rows past k1 up to a multiple of 8 +0. rows8: scratch of 8 x PKB floats.
void widen_panel(const Operand& b, const uint8_t* bg, const float* sg, int64_t n0, int64_t end, int64_t k0,
                 int64_t k1, float* rows8, float* panel) {
  const int64_t kn = k1 - k0, kn8 = round_up(kn, 8);
  for (int64_t j0 = 0; j0 < PNC; j0 += 8) {
    for (int64_t j = 0; j < 8; ++j) {
      float* dst = rows8 + j * PKB;
      const int64_t n = n0 + j0 + j;
      if (n < end) {
        // the task's rows are far apart and read a slab at a time: too many streams for the hardware
        // prefetchers, so fetch each row's next slab while this one is widened
        const uint8_t* row = bg + n * b.row_bytes;
        auto byte_of = [&](int64_t k) { return b.kind == kBf16 ? 2 * k : b.kind == kFp4 ? k / 2 : k; };
        const int64_t from = byte_of(k1), to = std::min(b.row_bytes, from + byte_of(k1 - k0));
        for (int64_t off = from; off < to; off += 64) __builtin_prefetch(row + off, 0, 3);
        dequant_b_row(row, b.kind, sg ? sg + (n / b.gran_mn) * b.scale_ld : nullptr, b.gran_k, k0, k1, dst);
        std::fill(dst + kn, dst + kn8, 0.0f);
      } else {
        std::fill(dst, dst + kn8, 0.0f);
      }
    }
    for (int64_t k = 0; k < kn8; k += 8) transpose8(rows8 + k, PKB, panel + k * PNC + j0, PNC);
  }
}

// What every task of one fma_engine call shares.
struct FmaCall {
  const Operand& a;
  const Operand& b;
  const Output& o;
  const Seg* segs;
  const int64_t* first;  // first[s]: segment s's first row in A
  const float* A;        // A rows dequantized, [sum rows, k_pad]
  int64_t N, K, k_pad, ranges, kc_step;
  bool direct;           // segments of <= MR rows dequantize B in registers (fma_direct)
};

// A thread's scratch, kept between calls so that small calls allocate nothing once warm; a buffer
// that grew past kKeep floats (a large call) is given back after the call.
struct FmaScratch {
  static constexpr size_t kKeep = size_t(1) << 16;
  std::vector<float> tile, part, rows;
  void trim() {
    for (auto* v : {&tile, &part, &rows})
      if (v->capacity() > kKeep) std::vector<float>().swap(*v);
  }
};

FmaScratch& fma_scratch() {
  static thread_local FmaScratch scratch;
  return scratch;
}

// One task = (segment, range of NRANGE columns): its B rows are read once, chunk by chunk.
void fma_task(const FmaCall& p, int64_t t, FmaScratch& sc) {
  const Operand& b = p.b;
  const int64_t s = t / p.ranges;
  const Seg& seg = p.segs[s];
  if (seg.rows == 0) return;
  const int64_t N = p.N, K = p.K, k_pad = p.k_pad;
  const int64_t c0 = (t % p.ranges) * NRANGE, c1 = std::min(N, c0 + NRANGE), cols = c1 - c0;
  const uint8_t* bg = b.data + seg.group * b.group_bytes;
  const float* sg = b.scale ? b.scale + seg.group * b.group_scale : nullptr;
  const bool panels = seg.rows > MR;
  const int64_t ldp = round_up(cols, panels ? PNC : NR);
  sc.part.assign(static_cast<size_t>(seg.rows * ldp), 0.0f);
  float* part = sc.part.data();
  if (panels) {
    // slabs of K outer, so the segment's A slab (rows x PKB) stays in L2 for every panel of the task
    sc.tile.resize(static_cast<size_t>((PNC + 8) * PKB));
    float* panel = sc.tile.data();
    float* rows8 = panel + PNC * PKB;
    for (int64_t k0 = 0; k0 < K; k0 += PKB) {
      const int64_t k1 = std::min(K, k0 + PKB), kn = k1 - k0;
      const float* Ab = p.A + p.first[s] * k_pad + k0;
      for (int64_t n0 = c0; n0 < c1; n0 += PNC) {
        widen_panel(b, bg, sg, n0, c1, k0, k1, rows8, panel);
        float* out = part + (n0 - c0);
        int64_t m = 0;
        for (; m + PMR <= seg.rows; m += PMR) panel_block<PMR>(Ab + m * k_pad, k_pad, panel, kn, out + m * ldp, ldp);
        const float* am = Ab + m * k_pad;
        float* om = out + m * ldp;
        switch (seg.rows - m) {
          case 5: if constexpr (PMR > 5) panel_block<5>(am, k_pad, panel, kn, om, ldp); break;
          case 4: if constexpr (PMR > 4) panel_block<4>(am, k_pad, panel, kn, om, ldp); break;
          case 3: panel_block<3>(am, k_pad, panel, kn, om, ldp); break;
          case 2: panel_block<2>(am, k_pad, panel, kn, om, ldp); break;
          case 1: panel_block<1>(am, k_pad, panel, kn, om, ldp); break;
          default: break;
        }
      }
    }
    for (int64_t i = 0; i < seg.rows; ++i)
      for (int64_t n = c0; n < c1; ++n) write_out(p.o, seg.row + i, n, part[i * ldp + (n - c0)]);
    return;
  }
#ifdef PK_FMA_DIRECT
  if (p.direct && seg.rows <= MR) {
    // Row groups outer, K chunks inner: each B row is streamed once from front to back (what the
    // prefetchers follow), and every output still receives its chunks' sums in chunk order, so
    // the bytes are those of the chunk-outer tile path.
    for (int64_t n0 = c0; n0 < c1; n0 += NR) {
      const uint8_t* rows[NR];
      const float* scales[NR];
      for (int j = 0; j < NR; ++j) {
        const int64_t n = n0 + j < c1 ? n0 + j : n0;  // past the range: a valid row, sums land in padding
        rows[j] = bg + n * b.row_bytes;
        scales[j] = sg ? sg + (n / b.gran_mn) * b.scale_ld : nullptr;
      }
      for (int64_t k0 = 0; k0 < K; k0 += p.kc_step) {
        const int64_t k1 = std::min(K, k0 + p.kc_step);
        const float* Ab = p.A + p.first[s] * k_pad + k0;
        float* out = part + (n0 - c0);
        const bool fp8 = b.kind == kFp8;
        switch (seg.rows) {
#define PK_DIRECT(R)                                                                                   \
  case R:                                                                                             \
    if (fp8)                                                                                          \
      fma_direct<R, kFp8>(Ab, k_pad, rows, scales, b.gran_k, k0, k1, out, ldp);                       \
    else                                                                                              \
      fma_direct<R, kBf16>(Ab, k_pad, rows, scales, b.gran_k, k0, k1, out, ldp);                      \
    break;
          PK_DIRECT(1)
          PK_DIRECT(2)
          PK_DIRECT(3)
          PK_DIRECT(4)
#undef PK_DIRECT
          default: break;
        }
      }
    }
    for (int64_t i = 0; i < seg.rows; ++i)
      for (int64_t n = c0; n < c1; ++n) write_out(p.o, seg.row + i, n, part[i * ldp + (n - c0)]);
    return;
  }
#endif
  const int64_t width_max = round_up(std::min(p.kc_step, K), VL);
  sc.tile.resize(static_cast<size_t>(NR * width_max));
  float* tile = sc.tile.data();
  for (int64_t k0 = 0; k0 < K; k0 += p.kc_step) {
    const int64_t k1 = std::min(K, k0 + p.kc_step);
    const int64_t width = round_up(k1 - k0, VL);
    const float* Ab = p.A + p.first[s] * k_pad + k0;
    for (int64_t n0 = c0; n0 < c1; n0 += NR) {
      const int64_t nr = std::min<int64_t>(NR, c1 - n0);
      for (int j = 0; j < NR; ++j) {
        float* dst = tile + j * width;
        if (j < nr) {
          const int64_t n = n0 + j;
          dequant_b_row(bg + n * b.row_bytes, b.kind, sg ? sg + (n / b.gran_mn) * b.scale_ld : nullptr, b.gran_k,
                        k0, k1, dst);
          std::fill(dst + (k1 - k0), dst + width, 0.0f);
        } else {
          std::fill(dst, dst + width, 0.0f);
        }
      }
      float* out = part + (n0 - c0);
      int64_t m = 0;
      for (; m + MR <= seg.rows; m += MR) fma_block<MR>(Ab + m * k_pad, k_pad, tile, width, width, out + m * ldp, ldp);
      switch (seg.rows - m) {
        case 3: fma_block<3>(Ab + m * k_pad, k_pad, tile, width, width, out + m * ldp, ldp); break;
        case 2: fma_block<2>(Ab + m * k_pad, k_pad, tile, width, width, out + m * ldp, ldp); break;
        case 1: fma_block<1>(Ab + m * k_pad, k_pad, tile, width, width, out + m * ldp, ldp); break;
        default: break;
      }
    }
  }
  for (int64_t i = 0; i < seg.rows; ++i)
    for (int64_t n = c0; n < c1; ++n) write_out(p.o, seg.row + i, n, part[i * ldp + (n - c0)]);
}

// Whether the fma engine may dequantize this B in registers (fma_direct): AVX-512 builds, fp8 with
// scale blocks of whole vectors, or bf16 (e2m1 keeps the tile path).
inline bool direct_ok(const Operand& b) {
#if defined(PK_FMA_DIRECT)
  return b.kind == kBf16 || (b.kind == kFp8 && b.gran_k % VL == 0);
#else
  (void)b;
  return false;
#endif
}

// Small problems (work below this many multiply-adds) run on the calling thread without entering
// an OpenMP region: a region costs more than they do.
constexpr double kFmaSerialWork = 4.0e6;

void fma_engine(const Operand& a, const Operand& b, const Output& o, const Seg* segs, int64_t nsegs, int64_t N,
                int64_t K, int nthreads, bool direct) {
  const int64_t k_pad = round_up(K, VL);
  FmaScratch& caller = fma_scratch();
  // first[s]: segment s's first row among the dequantized A rows [sum rows, k_pad] (zero past K)
  std::vector<int64_t> first(nsegs + 1, 0);
  for (int64_t s = 0; s < nsegs; ++s) first[s + 1] = first[s] + segs[s].rows;
  const int64_t total_rows = first[nsegs];
  if (total_rows == 0 || N == 0) return;
  caller.rows.resize(static_cast<size_t>(total_rows * k_pad));
  float* A = caller.rows.data();
  const int64_t ranges = (N + NRANGE - 1) / NRANGE;
  const int64_t tasks = nsegs * ranges;
  const int64_t kc_step = b.kind == kBf16 ? KC : std::max(b.gran_k, KC / b.gran_k * b.gran_k);
  const FmaCall p{a, b, o, segs, first.data(), A, N, K, k_pad, ranges, kc_step, direct && direct_ok(b)};
  auto dequant_a = [&](int64_t i) {
    const int64_t s = std::upper_bound(first.begin(), first.end(), i) - first.begin() - 1;
    const int64_t r = segs[s].row + (i - first[s]);
    dequant_row(a.data + r * a.row_bytes, a.kind, a.scale ? a.scale + r * a.scale_ld : nullptr, a.gran_k, K, k_pad,
                A + i * k_pad);
  };
  const double work = double(total_rows) * double(N) * double(K);
  const int threads =
      work < kFmaSerialWork ? 1 : std::max<int>(1, std::min<int64_t>(nthreads, std::max(tasks, total_rows)));
  if (threads == 1) {
    for (int64_t i = 0; i < total_rows; ++i) dequant_a(i);
    for (int64_t t = 0; t < tasks; ++t) fma_task(p, t, caller);
  } else {  // the library's own workers (pk_pool.h), not an OpenMP region
    pk::parallel_for(total_rows, threads, dequant_a);
    pk::parallel_for(tasks, threads, [&](int64_t t) {
      FmaScratch& mine = fma_scratch();
      fma_task(p, t, mine);
      if (&mine != &caller) mine.trim();  // a worker keeps at most kKeep floats between calls
    });
  }
  caller.trim();
}


// ---- the amx engine -------------------------------------------------------------------------------
#if defined(__x86_64__) && defined(__AVX512F__) && defined(__AVX512BW__)
#define PK_HAVE_AMX_CODE 1

constexpr int64_t TK = 32;         // K elements (bf16) per tile row
constexpr int64_t TM = 16;         // rows per tile
constexpr int64_t TILE = TM * TK;  // bf16 elements per A or B tile (1 KiB)
// Blocking (overridable with -D for tuning experiments; the defaults are what ships):
#ifndef PK_MCH
#define PK_MCH 512
#endif
#ifndef PK_NCH
#define PK_NCH 128
#endif
#ifndef PK_KCH
#define PK_KCH 512
#endif
#ifndef PK_PREFETCH_HINT
#define PK_PREFETCH_HINT _MM_HINT_T0
#endif
constexpr int64_t MCH = PK_MCH;    // rows of one task: each converted B panel serves MCH rows
constexpr int64_t NCH = PK_NCH;    // columns of one task (accumulators: MCH x NCH fp32 = 256 KiB)
constexpr int64_t KCH = PK_KCH;    // K elements per chunk: the B panel (32 x KCH bf16) stays in L1
constexpr int64_t PREFETCH_STEPS = 8;  // K steps (of 32) a B row is prefetched ahead of its conversion



// bf16 bits of the 128 non-negative e4m3 codes, as four 32-word tables (NaN code 0x7F -> 0x7FC0).
struct Fp8Table {
  __m512i t[4];
  Fp8Table() {
    alignas(64) uint16_t v[128];
    for (int c = 0; c < 128; ++c) v[c] = pk::fp8_to_bf16_bits(uint8_t(c));
    for (int i = 0; i < 4; ++i) t[i] = _mm512_load_si512(v + 32 * i);
  }
};

// 32 e4m3 bytes -> 32 bf16 words, exact (table lookup on the magnitude, then the sign bit).
inline __m512i fp8x32_to_bf16(__m256i bytes, const Fp8Table& lut) {
  const __m512i w = _mm512_cvtepu8_epi16(bytes);
  const __m512i lo = _mm512_permutex2var_epi16(lut.t[0], w, lut.t[1]);  // codes 0..63 (index bits 0-5)
  const __m512i hi = _mm512_permutex2var_epi16(lut.t[2], w, lut.t[3]);  // codes 64..127
  const __m512i v = _mm512_mask_mov_epi16(lo, _mm512_test_epi16_mask(w, _mm512_set1_epi16(0x40)), hi);
  return _mm512_or_si512(v, _mm512_slli_epi16(_mm512_and_si512(w, _mm512_set1_epi16(0x80)), 8));
}

// 16 bytes of packed e2m1 (32 codes, even element low) -> 32 bf16 words; `shift` adds a power-of-two
// exponent to every non-zero value (a folded UE8M0 scale; the result stays exact).
inline __m512i e2m1x32_to_bf16(__m128i bytes, int shift) {
  const __m512i d = _mm512_cvtepu8_epi32(bytes);
  const __m512i codes = _mm512_or_si512(_mm512_and_si512(d, _mm512_set1_epi32(0xF)),
                                        _mm512_slli_epi32(_mm512_and_si512(d, _mm512_set1_epi32(0xF0)), 12));
  const __m512i table = _mm512_set_epi16(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                                         (short)0xC0C0, (short)0xC080, (short)0xC040, (short)0xC000, (short)0xBFC0,
                                         (short)0xBF80, (short)0xBF00, (short)0x8000,
                                         0x40C0, 0x4080, 0x4040, 0x4000, 0x3FC0, 0x3F80, 0x3F00, 0x0000);
  __m512i v = _mm512_permutexvar_epi16(codes, table);
  if (shift != 0) {
    const __mmask32 nz = _mm512_test_epi16_mask(v, _mm512_set1_epi16(0x7FFF));
    v = _mm512_mask_add_epi16(v, nz, v, _mm512_set1_epi16(int16_t(shift * 128)));
  }
  return v;
}

struct BSource {
  const uint8_t* data;  // row 0 of this group
  int kind;
  int64_t row_bytes, N, K;
  const float* fold;    // e2m1 only: per-(row, gran_k) power-of-two scales folded into the values, or null
  int64_t fold_ld, fold_gran;
};

// B rows [n0, n0 + 32) x K steps [ks0, ks1) -> buf, VNNI tile order [2][ks1 - ks0][16 pairs][16 n][2].
// Each row's bytes one chunk (ks1 - ks0 steps) ahead are prefetched into L2: the next chunk of these
// rows is converted only after the other panels of the task, too late for L1.
void convert_b_panel(const BSource& b, int64_t n0, int64_t ks0, int64_t ks1, uint16_t* buf) {
  const int64_t steps = ks1 - ks0;
  static const Fp8Table lut;
  for (int t = 0; t < 2; ++t)
    for (int64_t ks = ks0; ks < ks1; ++ks) {
      __m512i r[16];
      const int64_t k0 = ks * TK;
      const int64_t kn = std::min<int64_t>(TK, b.K - k0);
      for (int i = 0; i < 16; ++i) {
        const int64_t n = n0 + t * 16 + i;
        if (n >= b.N || kn <= 0) {
          r[i] = _mm512_setzero_si512();
          continue;
        }
        const uint8_t* row = b.data + n * b.row_bytes;
        // B rows are far apart (one page or more): hardware prefetchers lose track of 32 such
        // streams, so fetch each row's next chunk ourselves
        const int64_t ahead = (k0 + (ks1 - ks0) * TK) * (b.kind == kBf16 ? 2 : 1) / (b.kind == kFp4 ? 2 : 1);
        if (ahead < b.row_bytes) _mm_prefetch(reinterpret_cast<const char*>(row + ahead), _MM_HINT_T1);
        if (b.kind == kBf16) {
          const __mmask32 m = kn >= 32 ? ~__mmask32(0) : __mmask32((1u << kn) - 1);
          r[i] = _mm512_maskz_loadu_epi16(m, reinterpret_cast<const uint16_t*>(row) + k0);
        } else if (b.kind == kFp8) {
          const __mmask32 m = kn >= 32 ? ~__mmask32(0) : __mmask32((1u << kn) - 1);
          r[i] = fp8x32_to_bf16(_mm256_maskz_loadu_epi8(m, row + k0), lut);
        } else {
          const int64_t nb = (kn + 1) / 2;  // K is even for e2m1
          const __mmask16 m = nb >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << nb) - 1);
          int shift = 0;
          if (b.fold) shift = int(pk::f32_bits(b.fold[n * b.fold_ld + k0 / b.fold_gran]) >> 23) - 127;
          r[i] = e2m1x32_to_bf16(_mm_maskz_loadu_epi8(m, row + k0 / 2), shift);
        }
      }
      pk::transpose16(r);
      uint16_t* dst = buf + (t * steps + (ks - ks0)) * TILE;
      for (int p = 0; p < 16; ++p) _mm512_store_si512(reinterpret_cast<__m512i*>(dst + p * 32), r[p]);
    }
}

#pragma GCC push_options
#pragma GCC target("amx-tile,amx-bf16")

inline void tile_config() { pk::load_tile_config(TM); }

inline void tile_release() { _tile_release(); }

// acc[m][n] += buf[m][n] * sa[m] * sb[n] for MT x 2 tiles of 16 x 16 fp32 (tile (i, j) at
// buf + (2 i + j) * 256); sa null means 1, sb null likewise.
template <int MT>
inline void promote(const float* buf, float* acc, int64_t acc_ld, const float* sa, const float* sb) {
  const __m512 sb0 = sb ? _mm512_loadu_ps(sb) : _mm512_set1_ps(1.0f);
  const __m512 sb1 = sb ? _mm512_loadu_ps(sb + 16) : _mm512_set1_ps(1.0f);
  for (int i = 0; i < MT; ++i)
    for (int r = 0; r < 16; ++r) {
      const int64_t m = i * 16 + r;
      const __m512 vsa = _mm512_set1_ps(sa ? sa[m] : 1.0f);
      float* arow = acc + m * acc_ld;
      const __m512 p0 = _mm512_load_ps(buf + (2 * i) * 256 + r * 16);
      const __m512 p1 = _mm512_load_ps(buf + (2 * i + 1) * 256 + r * 16);
      _mm512_storeu_ps(arow, _mm512_fmadd_ps(p0, _mm512_mul_ps(vsa, sb0), _mm512_loadu_ps(arow)));
      _mm512_storeu_ps(arow + 16, _mm512_fmadd_ps(p1, _mm512_mul_ps(vsa, sb1), _mm512_loadu_ps(arow + 16)));
    }
}

// One (16·MT x 32) block over K steps [0, steps) of the current chunk: tiles 0-3 accumulate C
// (0, 1 for rows 0-15; 2, 3 for rows 16-31), 4-5 hold A, 6-7 hold B. A tiles: a0 (rows 0-15) and
// a0 + a_tile_step (rows 16-31), K steps 1 KiB apart; B tiles: b0 and b0 + b_tile_step likewise.
// Every `spp` steps the sums are promoted: acc += sum * sa[kp] * sb[kp] (kp counted from kp0).
template <int MT>
void block(const uint16_t* a0, int64_t a_tile_step, const uint16_t* b0, int64_t b_tile_step, int64_t steps,
           int64_t spp, int64_t kp0, float* buf, float* acc, int64_t acc_ld, const float* sa, int64_t sa_ld,
           const float* sb, int64_t sb_ld) {
  for (int64_t p0 = 0; p0 < steps; p0 += spp) {
    const int64_t p1 = std::min(steps, p0 + spp);
    _tile_zero(0);
    _tile_zero(1);
    if (MT == 2) {
      _tile_zero(2);
      _tile_zero(3);
    }
    for (int64_t ks = p0; ks < p1; ++ks) {
      _tile_loadd(6, b0 + ks * TILE, 64);
      _tile_loadd(7, b0 + b_tile_step + ks * TILE, 64);
      _tile_loadd(4, a0 + ks * TILE, 64);
      _tile_dpbf16ps(0, 4, 6);
      _tile_dpbf16ps(1, 4, 7);
      if (MT == 2) {
        _tile_loadd(5, a0 + a_tile_step + ks * TILE, 64);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
      }
    }
    _tile_stored(0, buf, 64);
    _tile_stored(1, buf + 256, 64);
    if (MT == 2) {
      _tile_stored(2, buf + 512, 64);
      _tile_stored(3, buf + 768, 64);
    }
    const int64_t kp = kp0 + p0 / spp;
    promote<MT>(buf, acc, acc_ld, sa ? sa + kp * sa_ld : nullptr, sb ? sb + kp * sb_ld : nullptr);
  }
}

// Few-row segments (<= 16 rows) swap the operands' roles: the weight rows become the tiles' "A"
// side, which AMX reads row-major, so they are only widened to bf16 (no transpose), and the few
// activation rows are transposed once per call into the "B" side. C tiles hold [16 n x 16 m].
// Tiles 0-3 accumulate four n-tiles, 4-5 take weight tiles in turn, 6 holds the activations.
void block_t(const uint16_t* w, int64_t steps, const uint16_t* x, int64_t spp, int64_t kp0, float* buf, float* acc,
             const float* sw, int64_t sw_ld, const float* sx, int64_t sx_ld) {
  for (int64_t p0 = 0; p0 < steps; p0 += spp) {
    const int64_t p1 = std::min(steps, p0 + spp);
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (int64_t ks = p0; ks < p1; ++ks) {
      _tile_loadd(6, x + ks * TILE, 64);
      _tile_loadd(4, w + (0 * steps + ks) * TILE, 64);
      _tile_dpbf16ps(0, 4, 6);
      _tile_loadd(5, w + (1 * steps + ks) * TILE, 64);
      _tile_dpbf16ps(1, 5, 6);
      _tile_loadd(4, w + (2 * steps + ks) * TILE, 64);
      _tile_dpbf16ps(2, 4, 6);
      _tile_loadd(5, w + (3 * steps + ks) * TILE, 64);
      _tile_dpbf16ps(3, 5, 6);
    }
    _tile_stored(0, buf, 64);
    _tile_stored(1, buf + 256, 64);
    _tile_stored(2, buf + 512, 64);
    _tile_stored(3, buf + 768, 64);
    const int64_t kp = kp0 + p0 / spp;
    // acc [64 n][16 m] += buf * sw[n] * sx[m]
    const __m512 vx = sx ? _mm512_loadu_ps(sx + kp * sx_ld) : _mm512_set1_ps(1.0f);
    for (int64_t n = 0; n < 64; ++n) {
      const __m512 sc = sw ? _mm512_mul_ps(vx, _mm512_set1_ps(sw[kp * sw_ld + n])) : vx;
      _mm512_storeu_ps(acc + n * 16, _mm512_fmadd_ps(_mm512_load_ps(buf + n * 16), sc, _mm512_loadu_ps(acc + n * 16)));
    }
  }
}

#pragma GCC pop_options

// Raw bf16 bits of element k of an A row (fp8 / bf16).
inline uint16_t raw_bf16(const uint8_t* row, int kind, int64_t k) {
  if (kind == kBf16) return reinterpret_cast<const uint16_t*>(row)[k];
  return pk::fp8_to_bf16_bits(row[k]);
}

// A rows [r0, r0 + rows) (row_bytes apart) -> tile order [rtiles][ksteps][16][32] raw bf16,
// rows past `rows` and K past `K` zero.
void pack_a_tiles(const uint8_t* a, int kind, int64_t row_bytes, int64_t r0, int64_t rows, int64_t rtiles, int64_t K,
                  int64_t ksteps, uint16_t* out) {
  static const Fp8Table lut;
  for (int64_t rt = 0; rt < rtiles; ++rt)
    for (int64_t i = 0; i < TM; ++i) {
      const int64_t r = rt * TM + i;
      uint16_t* dst = out + rt * ksteps * TILE + i * TK;
      if (r >= rows) {
        for (int64_t ks = 0; ks < ksteps; ++ks) std::memset(dst + ks * TILE, 0, TK * 2);
        continue;
      }
      const uint8_t* row = a + (r0 + r) * row_bytes;
      for (int64_t ks = 0; ks < ksteps; ++ks) {
        uint16_t* t = dst + ks * TILE;
        const int64_t k0 = ks * TK;
        if (kind == kFp8 && k0 + TK <= K) {
          _mm512_storeu_si512(t, fp8x32_to_bf16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + k0)), lut));
        } else if (kind == kBf16 && k0 + TK <= K) {
          std::memcpy(t, reinterpret_cast<const uint16_t*>(row) + k0, TK * 2);
        } else {
          for (int64_t k = 0; k < TK; ++k) t[k] = k0 + k < K ? raw_bf16(row, kind, k0 + k) : 0;
        }
      }
    }
}

void amx_engine(const Operand& a, const Operand& b, const Output& o, const Seg* segs, int64_t nsegs, int64_t N,
                int64_t K, int64_t promo, bool fold_b, int nthreads) {
  const int64_t ksteps = (K + TK - 1) / TK;
  const int64_t spp = promo / TK;  // K steps per promotion
  const int64_t kp_count = (ksteps + spp - 1) / spp;
  const int64_t kc_steps = std::max<int64_t>(1, (KCH / TK) / spp) * spp;  // chunks hold whole promotion blocks
  const bool scaled_a = a.scale != nullptr, scaled_b = b.scale != nullptr && !fold_b;
  // per segment: packed A tiles (rows padded to 32) and per-row A scales per promotion block
  std::vector<int64_t> tile_first(nsegs + 1, 0);
  for (int64_t s = 0; s < nsegs; ++s) tile_first[s + 1] = tile_first[s] + (segs[s].rows + 31) / 32 * 2;
  const int64_t total_tiles = tile_first[nsegs];
  if (total_tiles == 0 || N == 0) return;
  std::unique_ptr<uint16_t[]> apk(new uint16_t[static_cast<size_t>(total_tiles * ksteps * TILE)]);  // all written
  std::vector<float> sa(scaled_a ? static_cast<size_t>(total_tiles * TM * kp_count) : 0);  // [kp][row]
  const int64_t sa_ld = total_tiles * TM;
  // tasks: (segment, chunk of MCH rows, chunk of NCH columns)
  std::vector<int64_t> task_first(nsegs + 1, 0);
  const int64_t nchunks = (N + NCH - 1) / NCH;
  for (int64_t s = 0; s < nsegs; ++s) task_first[s + 1] = task_first[s] + (segs[s].rows + MCH - 1) / MCH * nchunks;
  const int64_t tasks = task_first[nsegs];
  const int threads = std::max<int>(1, std::min<int64_t>(nthreads, std::max<int64_t>(tasks, total_tiles / 2)));
#pragma omp parallel num_threads(threads) if (threads > 1)
  {
#pragma omp for schedule(dynamic, 1)
    for (int64_t t = 0; t < total_tiles / 2; ++t) {  // pairs of row tiles (32 rows)
      const int64_t s = std::upper_bound(tile_first.begin(), tile_first.end(), 2 * t) - tile_first.begin() - 1;
      const int64_t r0 = (2 * t - tile_first[s]) * TM;
      const int64_t rows = std::max<int64_t>(0, std::min<int64_t>(32, segs[s].rows - r0));
      pack_a_tiles(a.data, a.kind, a.row_bytes, segs[s].row + r0, rows, 2, K, ksteps, apk.get() + 2 * t * ksteps * TILE);
      if (scaled_a)
        for (int64_t i = 0; i < 32; ++i)
          for (int64_t kp = 0; kp < kp_count; ++kp)
            sa[kp * sa_ld + 2 * t * TM + i] =
                i < rows ? a.scale[(segs[s].row + r0 + i) * a.scale_ld + (kp * promo) / a.gran_k] : 0.0f;
    }
    tile_config();
    std::vector<float> acc(static_cast<size_t>(MCH * NCH));
    std::vector<float> sb(scaled_b ? static_cast<size_t>(kp_count * NCH) : 0);
    std::unique_ptr<uint16_t[], void (*)(void*)> panel(
        static_cast<uint16_t*>(std::aligned_alloc(64, 2 * kc_steps * TILE * 2)), std::free);
    alignas(64) float buf[4 * 256];
#pragma omp for schedule(dynamic, 1)
    for (int64_t t = 0; t < tasks; ++t) {
      const int64_t s = std::upper_bound(task_first.begin(), task_first.end(), t) - task_first.begin() - 1;
      const Seg& seg = segs[s];
      const int64_t local = t - task_first[s];
      const int64_t m0 = (local / nchunks) * MCH, n0 = (local % nchunks) * NCH;
      const int64_t rows = std::min(MCH, seg.rows - m0), cols = std::min(NCH, N - n0);
      const int64_t rows32 = (rows + 31) / 32 * 32, cols32 = (cols + 31) / 32 * 32;
      for (int64_t i = 0; i < rows32; ++i) std::fill(acc.begin() + i * NCH, acc.begin() + i * NCH + cols32, 0.0f);
      if (scaled_b) {  // sb[kp][n] for this task's columns (0 past N)
        const float* sg = b.scale + seg.group * b.group_scale;
        for (int64_t kp = 0; kp < kp_count; ++kp)
          for (int64_t n = 0; n < NCH; ++n)
            sb[kp * NCH + n] = n < cols ? sg[((n0 + n) / b.gran_mn) * b.scale_ld + (kp * promo) / b.gran_k] : 0.0f;
      }
      BSource src{b.data + seg.group * b.group_bytes, b.kind, b.row_bytes, N, K,
                  fold_b ? b.scale + seg.group * b.group_scale : nullptr, b.scale_ld, b.gran_k};
      const uint16_t* ag = apk.get() + (tile_first[s] + m0 / TM) * ksteps * TILE;
      const float* sag = scaled_a ? sa.data() + (tile_first[s] + m0 / TM) * TM : nullptr;
      for (int64_t kc0 = 0; kc0 < ksteps; kc0 += kc_steps) {
        const int64_t kc1 = std::min(ksteps, kc0 + kc_steps), steps = kc1 - kc0;
        for (int64_t nb = 0; nb < cols32; nb += 32) {
          convert_b_panel(src, n0 + nb, kc0, kc1, panel.get());
          for (int64_t mb = 0; mb < rows32; mb += 32) {
            const uint16_t* am = ag + (mb / TM) * ksteps * TILE + kc0 * TILE;
            float* accb = acc.data() + mb * NCH + nb;
            const float* sam = sag ? sag + mb : nullptr;
            const float* sbn = scaled_b ? sb.data() + nb : nullptr;
            if (rows - mb <= 16)
              block<1>(am, ksteps * TILE, panel.get(), steps * TILE, steps, spp, kc0 / spp, buf, accb, NCH, sam,
                       sa_ld, sbn, NCH);
            else
              block<2>(am, ksteps * TILE, panel.get(), steps * TILE, steps, spp, kc0 / spp, buf, accb, NCH, sam,
                       sa_ld, sbn, NCH);
          }
        }
      }
      for (int64_t i = 0; i < rows; ++i)
        for (int64_t n = 0; n < cols; ++n) write_out(o, seg.row + m0 + i, n0 + n, acc[i * NCH + n]);
    }
    tile_release();
  }
}

// Weight rows [n0, n0 + 64) x K steps [ks0, ks1) -> buf, row-major tiles [4][ks1 - ks0][16 rows][32].
void convert_w_rows(const BSource& b, int64_t n0, int64_t ks0, int64_t ks1, uint16_t* buf) {
  static const Fp8Table lut;
  const int64_t steps = ks1 - ks0;
  for (int t = 0; t < 4; ++t)
    for (int i = 0; i < 16; ++i) {
      const int64_t n = n0 + 16 * t + i;
      const uint8_t* row = n < b.N ? b.data + n * b.row_bytes : nullptr;
      int shift_row = 0;
      for (int64_t ks = ks0; ks < ks1; ++ks) {
        uint16_t* dst = buf + (t * steps + (ks - ks0)) * TILE + i * 32;
        const int64_t k0 = ks * TK, kn = std::min<int64_t>(TK, b.K - k0);
        if (!row || kn <= 0) {
          _mm512_store_si512(dst, _mm512_setzero_si512());
          continue;
        }
        const int64_t ahead = (k0 + PREFETCH_STEPS * TK) * (b.kind == kBf16 ? 2 : 1) / (b.kind == kFp4 ? 2 : 1);
        if (ahead < b.row_bytes) _mm_prefetch(reinterpret_cast<const char*>(row + ahead), PK_PREFETCH_HINT);
        __m512i v;
        if (b.kind == kBf16) {
          const __mmask32 m = kn >= 32 ? ~__mmask32(0) : __mmask32((1u << kn) - 1);
          v = _mm512_maskz_loadu_epi16(m, reinterpret_cast<const uint16_t*>(row) + k0);
        } else if (b.kind == kFp8) {
          const __mmask32 m = kn >= 32 ? ~__mmask32(0) : __mmask32((1u << kn) - 1);
          v = fp8x32_to_bf16(_mm256_maskz_loadu_epi8(m, row + k0), lut);
        } else {
          const int64_t nb = (kn + 1) / 2;
          const __mmask16 m = nb >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << nb) - 1);
          if (b.fold) shift_row = int(pk::f32_bits(b.fold[n * b.fold_ld + k0 / b.fold_gran]) >> 23) - 127;
          v = e2m1x32_to_bf16(_mm_maskz_loadu_epi8(m, row + k0 / 2), shift_row);
        }
        _mm512_store_si512(dst, v);
      }
    }
}

// Segments of at most 16 rows (decode): tasks (segment, 64 weight rows); see block_t.
void amx_small_engine(const Operand& a, const Operand& b, const Output& o, const Seg* segs, int64_t nsegs, int64_t N,
                      int64_t K, int64_t promo, bool fold_b, int nthreads) {
  static const Fp8Table lut;
  const int64_t ksteps = (K + TK - 1) / TK, spp = promo / TK, kp_count = (ksteps + spp - 1) / spp;
  // whole rows at once where the panel fits in L2 (4 tiles x 256 steps = 1 MiB): the task's 64 weight
  // rows are one contiguous region, so reading them row after row over all of K is one sequential
  // stream, which the hardware prefetchers follow (chunks of K would jump between 64 rows)
  const int64_t kc_steps = std::max<int64_t>(1, std::min<int64_t>(ksteps, 256) / spp) * spp;
  const bool scaled_a = a.scale != nullptr, scaled_b = b.scale != nullptr && !fold_b;
  const int64_t nchunks = (N + 63) / 64, tasks = nsegs * nchunks;
  // activations of every segment as VNNI tiles [seg][ksteps][16 pairs][16 rows][2], and their scales [seg][kp][16]
  std::unique_ptr<uint16_t[]> xpk(new uint16_t[static_cast<size_t>(nsegs * ksteps * TILE)]);
  std::vector<float> sx(scaled_a ? static_cast<size_t>(nsegs * kp_count * 16) : 0);
  const int threads = std::max<int>(1, std::min<int64_t>(nthreads, tasks));
#pragma omp parallel num_threads(threads) if (threads > 1)
  {
#pragma omp for schedule(static)
    for (int64_t s = 0; s < nsegs; ++s) {
      const Seg& seg = segs[s];
      for (int64_t ks = 0; ks < ksteps; ++ks) {
        __m512i r[16];
        const int64_t k0 = ks * TK, kn = std::min<int64_t>(TK, K - k0);
        for (int i = 0; i < 16; ++i) {
          if (i >= seg.rows) {
            r[i] = _mm512_setzero_si512();
            continue;
          }
          const uint8_t* row = a.data + (seg.row + i) * a.row_bytes;
          const __mmask32 m = kn >= 32 ? ~__mmask32(0) : __mmask32((1u << kn) - 1);
          r[i] = a.kind == kBf16 ? _mm512_maskz_loadu_epi16(m, reinterpret_cast<const uint16_t*>(row) + k0)
                                 : fp8x32_to_bf16(_mm256_maskz_loadu_epi8(m, row + k0), lut);
        }
        pk::transpose16(r);
        uint16_t* dst = xpk.get() + (s * ksteps + ks) * TILE;
        for (int p = 0; p < 16; ++p) _mm512_storeu_si512(dst + p * 32, r[p]);
      }
      if (scaled_a)
        for (int64_t kp = 0; kp < kp_count; ++kp)
          for (int64_t i = 0; i < 16; ++i)
            sx[(s * kp_count + kp) * 16 + i] =
                i < seg.rows ? a.scale[(seg.row + i) * a.scale_ld + (kp * promo) / a.gran_k] : 0.0f;
    }
    tile_config();
    std::unique_ptr<uint16_t[], void (*)(void*)> panel(
        static_cast<uint16_t*>(std::aligned_alloc(64, 4 * kc_steps * TILE * 2)), std::free);
    std::vector<float> acc(64 * 16), sw(scaled_b ? static_cast<size_t>(kp_count * 64) : 0);
    alignas(64) float buf[4 * 256];
#pragma omp for schedule(dynamic, 1)
    for (int64_t t = 0; t < tasks; ++t) {
      const int64_t s = t / nchunks, n0 = (t % nchunks) * 64;
      const Seg& seg = segs[s];
      if (seg.rows == 0) continue;
      std::fill(acc.begin(), acc.end(), 0.0f);
      if (scaled_b) {
        const float* sg = b.scale + seg.group * b.group_scale;
        for (int64_t kp = 0; kp < kp_count; ++kp)
          for (int64_t n = 0; n < 64; ++n)
            sw[kp * 64 + n] = n0 + n < N ? sg[((n0 + n) / b.gran_mn) * b.scale_ld + (kp * promo) / b.gran_k] : 0.0f;
      }
      BSource src{b.data + seg.group * b.group_bytes, b.kind, b.row_bytes, N, K,
                  fold_b ? b.scale + seg.group * b.group_scale : nullptr, b.scale_ld, b.gran_k};
      for (int64_t kc0 = 0; kc0 < ksteps; kc0 += kc_steps) {
        const int64_t kc1 = std::min(ksteps, kc0 + kc_steps);
        convert_w_rows(src, n0, kc0, kc1, panel.get());
        block_t(panel.get(), kc1 - kc0, xpk.get() + (s * ksteps + kc0) * TILE, spp, kc0 / spp, buf, acc.data(),
                scaled_b ? sw.data() : nullptr, 64, scaled_a ? sx.data() + s * kp_count * 16 : nullptr, 16);
      }
      for (int64_t i = 0; i < seg.rows; ++i)
        for (int64_t n = n0; n < std::min(N, n0 + 64); ++n) write_out(o, seg.row + i, n, acc[(n - n0) * 16 + i]);
    }
    tile_release();
  }
}

#endif  // x86-64 with AVX-512

}  // namespace

// ---- C ABI -----------------------------------------------------------------------------------------

// One GEMM call's arguments, packed by the Python wrapper (gemm.py, `_CALL`: 29 native int64 words,
// pointers as addresses) into a per-thread buffer, so a call crosses ctypes with one pointer instead
// of 27 converted arguments. Shapes: A rows of K elements (a_row_bytes apart), sfa [rows,
// ceil(K/a_gran_k)] (a_scale_ld apart) or null; B [G, N, K] (b_group_bytes / b_row_bytes apart), sfb
// [G, ceil(N/b_gran_n), ceil(K/b_gran_k)] or null; D and C [M, N] (ld N). segs: int64 [nsegs, 3] =
// (first row, rows, group), or null for the one dense segment (0, m, 0). engine: 0 fma, 1 amx (promo:
// K elements per promotion, a multiple of 32 dividing the scaled operands' K granularities; fold_b:
// e2m1 B with power-of-two scales folded into the values, not promoted).
struct GemmCall {
  const uint8_t* a;
  int64_t a_kind;
  const float* sfa;
  int64_t a_gran_k, a_row_bytes, a_scale_ld;
  const uint8_t* b;
  int64_t b_kind;
  const float* sfb;
  int64_t b_gran_n, b_gran_k, b_row_bytes, b_scale_ld, b_group_bytes, b_group_scale;
  void* d;
  int64_t d_bf16;
  const void* c;
  int64_t c_bf16;
  const int64_t* segs;
  int64_t nsegs, m, N, K, engine, promo, fold_b, threads;
  int64_t fma_tile;  // 1: the fma engine dequantizes B into tiles for every segment (tests compare paths)
};
static_assert(sizeof(void*) == 8 && sizeof(GemmCall) == 29 * 8, "GemmCall is 29 int64 words (gemm.py packs it)");

// Size of GemmCall in bytes (the wrapper checks it matches what it packs).
PK_EXPORT int64_t pk_gemm_call_size() { return sizeof(GemmCall); }

PK_EXPORT int pk_gemm_vector_length() { return VL; }

// 1 when the amx engine can run here (AMX-BF16 present and the kernel granted tile state).
PK_EXPORT int pk_amx_available() {
#ifdef PK_HAVE_AMX_CODE
  return pk::amx_permitted() ? 1 : 0;
#else
  return 0;
#endif
}

// D[rows of each segment] = C + A·B[group]ᵀ with the engine `p->engine`. Returns 0, or -1 when the amx
// engine was asked for and this build or CPU has no AMX (nothing was run).
PK_EXPORT int pk_gemm(const GemmCall* p) {
  const Operand A{p->a, int(p->a_kind), p->sfa, 1, p->a_gran_k, p->a_row_bytes, p->a_scale_ld, 0, 0};
  const Operand B{p->b, int(p->b_kind), p->sfb, p->b_gran_n, p->b_gran_k, p->b_row_bytes, p->b_scale_ld,
                  p->b_group_bytes, p->b_group_scale};
  const Output O{p->d, int(p->d_bf16), p->c, int(p->c_bf16), p->N};
  const Seg dense{0, p->m, 0};
  const Seg* sg = p->segs ? reinterpret_cast<const Seg*>(p->segs) : &dense;
  const int64_t nsegs = p->segs ? p->nsegs : 1;
  const int threads = pk::thread_count(int(p->threads));
  if (p->engine == 0) {
    fma_engine(A, B, O, sg, nsegs, p->N, p->K, threads, p->fma_tile == 0);
    return 0;
  }
#ifdef PK_HAVE_AMX_CODE
  if (!pk::amx_permitted()) return -1;  // never execute a tile instruction without the kernel's permission
  int64_t most = 0;
  for (int64_t s = 0; s < nsegs; ++s) most = std::max(most, sg[s].rows);
  if (most <= 16)
    amx_small_engine(A, B, O, sg, nsegs, p->N, p->K, p->promo, p->fold_b != 0, threads);
  else
    amx_engine(A, B, O, sg, nsegs, p->N, p->K, p->promo, p->fold_b != 0, threads);
  return 0;
#else
  return -1;
#endif
}
