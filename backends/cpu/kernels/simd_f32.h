// simd_f32.h — the fp32 vector primitives the register-blocked cpu engines share (the MLA FMA engine,
// the indexer logits): one set per ISA level the build selects — AVX-512, AVX2 + FMA, NEON, or the
// generic build (the compiler's 4-float vectors, multiply then add: baseline x86-64 has no FMA).
// VL lanes per vector; NV vectors per register row and MR rows fill the register file with
// accumulators (MR x NV) plus one row of B.
#pragma once

#include <cstring>

#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif
#if defined(__ARM_NEON) && !defined(__AVX2__)
#include <arm_neon.h>
#endif

namespace pk_simd {

#if defined(__AVX512F__)
constexpr int VL = 16, NV = 4, MR = 6;  // 24 accumulators of 32 zmm registers
using vec = __m512;
inline vec vzero() { return _mm512_setzero_ps(); }
inline vec vload(const float* p) { return _mm512_loadu_ps(p); }
inline void vstore(float* p, vec v) { _mm512_storeu_ps(p, v); }
inline vec vbcast(float x) { return _mm512_set1_ps(x); }
inline vec vfma(vec a, vec b, vec c) { return _mm512_fmadd_ps(a, b, c); }
inline vec vmul(vec a, vec b) { return _mm512_mul_ps(a, b); }
inline vec vadd(vec a, vec b) { return _mm512_add_ps(a, b); }
inline vec vrelu(vec a) { return _mm512_max_ps(_mm512_setzero_ps(), a); }  // NaN in a passes through
#elif defined(__AVX2__)
constexpr int VL = 8, NV = 2, MR = 6;  // 12 accumulators of 16 ymm registers
using vec = __m256;
inline vec vzero() { return _mm256_setzero_ps(); }
inline vec vload(const float* p) { return _mm256_loadu_ps(p); }
inline void vstore(float* p, vec v) { _mm256_storeu_ps(p, v); }
inline vec vbcast(float x) { return _mm256_set1_ps(x); }
inline vec vfma(vec a, vec b, vec c) { return _mm256_fmadd_ps(a, b, c); }
inline vec vmul(vec a, vec b) { return _mm256_mul_ps(a, b); }
inline vec vadd(vec a, vec b) { return _mm256_add_ps(a, b); }
inline vec vrelu(vec a) { return _mm256_max_ps(_mm256_setzero_ps(), a); }
#elif defined(__ARM_NEON)
constexpr int VL = 4, NV = 4, MR = 6;  // 24 accumulators of 32 q registers
using vec = float32x4_t;
inline vec vzero() { return vdupq_n_f32(0.0f); }
inline vec vload(const float* p) { return vld1q_f32(p); }
inline void vstore(float* p, vec v) { vst1q_f32(p, v); }
inline vec vbcast(float x) { return vdupq_n_f32(x); }
inline vec vfma(vec a, vec b, vec c) { return vfmaq_f32(c, a, b); }
inline vec vmul(vec a, vec b) { return vmulq_f32(a, b); }
inline vec vadd(vec a, vec b) { return vaddq_f32(a, b); }
inline vec vrelu(vec a) { return vmaxq_f32(vdupq_n_f32(0.0f), a); }
#else
constexpr int VL = 4, NV = 2, MR = 4;  // 8 accumulators of 16 xmm registers
typedef float vec __attribute__((vector_size(16)));
inline vec vzero() { return vec{0.0f, 0.0f, 0.0f, 0.0f}; }
inline vec vload(const float* p) { vec v; std::memcpy(&v, p, sizeof v); return v; }
inline void vstore(float* p, vec v) { std::memcpy(p, &v, sizeof v); }
inline vec vbcast(float x) { return vec{x, x, x, x}; }
inline vec vfma(vec a, vec b, vec c) { return a * b + c; }
inline vec vmul(vec a, vec b) { return a * b; }
inline vec vadd(vec a, vec b) { return a + b; }
inline vec vrelu(vec a) {
  for (int l = 0; l < 4; ++l) a[l] = a[l] < 0.0f ? 0.0f : a[l];  // NaN passes through
  return a;
}
#endif

}  // namespace pk_simd
