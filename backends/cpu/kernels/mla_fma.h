// mla_fma.h — the FMA engine of the native MLA decode: every CPU (AVX-512, AVX2, NEON, generic).
//
// The task is the AMX engine's (a job's rows against a key range, chunks of 64 keys, online
// softmax), in fp32 throughout. A chunk's keys are widened to fp32 (FP8 tiles times their
// power-of-two scales: exact) and stored twice, as Kᵀ for the logits and as V for P·V, both in
// panels of NC columns; the job's Q rows are widened once per task. Both products run one
// register-blocked kernel, C[MR rows][NC columns] += A·B with A's elements broadcast and B's rows
// loaded as vectors, over K slabs of KB rows of B so that a slab stays in L1 while every row block
// passes over it. P stays fp32 (no bf16 rounding, unlike the AMX engine's two-term P).
#pragma once

#include "mla_common.h"
#include "simd_f32.h"

namespace pk_mla {
namespace fma {

using namespace pk_simd;  // VL, NV, MR and the vector primitives of this build
constexpr int NC = VL * NV;  // columns of one block; CK and DV are multiples of it
constexpr int64_t KB = 64;   // rows of B per slab (64 x NC fp32: 16 KiB with AVX-512)

// C[r][0..NC) += sum over k < kc of A[r * lda + k] * B[k * ldb + 0..NC), for r < R.
template <int R>
inline void block(const float* A, int64_t lda, const float* B, int64_t ldb, int64_t kc, float* C, int64_t ldc) {
  vec c[R][NV];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < NV; ++v) c[r][v] = vload(C + r * ldc + v * VL);
#pragma GCC unroll 4
  for (int64_t k = 0; k < kc; ++k) {
    vec b[NV];
    for (int v = 0; v < NV; ++v) b[v] = vload(B + k * ldb + v * VL);
    for (int r = 0; r < R; ++r) {
      const vec x = vbcast(A[r * lda + k]);
      for (int v = 0; v < NV; ++v) c[r][v] = vfma(x, b[v], c[r][v]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < NV; ++v) vstore(C + r * ldc + v * VL, c[r][v]);
}

// C[M][N] += A[M][kc] · B[kc][N] (N a multiple of NC), B stored as panels of NC columns, [N / NC][kc][NC],
// so that a slab of KB rows of one panel is contiguous (row-major B rows 2 KiB apart would fall into
// a few L1 sets and be evicted before the next row block reads them).
inline void gemm_acc(const float* A, int64_t lda, const float* B, int64_t kc, float* C, int64_t ldc, int64_t M,
                     int64_t N) {
  for (int64_t k0 = 0; k0 < kc; k0 += KB) {
    const int64_t kn = std::min(KB, kc - k0);
    for (int64_t n = 0; n < N; n += NC) {
      const float* b = B + (n / NC) * kc * NC + k0 * NC;
      int64_t m = 0;
      for (; m + MR <= M; m += MR) block<MR>(A + m * lda + k0, lda, b, NC, kn, C + m * ldc + n, ldc);
      const float* a = A + m * lda + k0;
      float* c = C + m * ldc + n;
      switch (M - m) {
        case 5: block<5>(a, lda, b, NC, kn, c, ldc); break;
        case 4: block<4>(a, lda, b, NC, kn, c, ldc); break;
        case 3: block<3>(a, lda, b, NC, kn, c, ldc); break;
        case 2: block<2>(a, lda, b, NC, kn, c, ldc); break;
        case 1: block<1>(a, lda, b, NC, kn, c, ldc); break;
        default: break;
      }
    }
  }
}

// y[k] = exp(x[k]) for k < CK.
inline void exp_chunk(const float* x, float* y) {
#if defined(__AVX512F__)
  for (int64_t k = 0; k < CK; k += 16) _mm512_storeu_ps(y + k, pk::exp16(_mm512_loadu_ps(x + k)));
#elif defined(__AVX2__)
  for (int64_t k = 0; k < CK; k += 8) _mm256_storeu_ps(y + k, pk::exp8(_mm256_loadu_ps(x + k)));
#else
  for (int64_t k = 0; k < CK; ++k) y[k] = std::exp(x[k]);
#endif
}

// n e4m3 values at e -> fp32 at o, times the power-of-two scale sf (exact), n a multiple of 16.
inline void fp8_times(const uint8_t* e, float sf, float* o, int n) {
#if defined(__AVX512F__)
  const __m512 vs = _mm512_set1_ps(sf);
  for (int k = 0; k < n; k += 16)
    _mm512_storeu_ps(o + k, _mm512_mul_ps(pk::fp8x16_to_f32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(e + k))), vs));
#elif defined(__AVX2__)
  const __m256 vs = _mm256_set1_ps(sf), v256 = _mm256_set1_ps(256.0f);
  for (int k = 0; k < n; k += 8) {
    const __m256 v = pk::fp8x8_to_f32_scaled(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(e + k)));
    _mm256_storeu_ps(o + k, _mm256_mul_ps(_mm256_mul_ps(v, v256), vs));
  }
#else
  for (int k = 0; k < n; ++k) o[k] = pk::fp8_to_f32(e[k]) * sf;
#endif
}

// A UE8M0 byte -> its scale 2^(e - 127) (0 gives the subnormal 2^-127; 0xff is NaN).
inline float ue8m0_to_f32(uint8_t e) { return e == 0xff ? NAN : std::ldexp(1.0f, static_cast<int>(e) - 127); }

// One MODEL1 token (value bytes p, scale bytes sc) -> 512 fp32: 7 tiles of 64 e4m3 times their
// UE8M0 scale (exact), then the 64 bf16 RoPE values.
inline void load_key_model1(const uint8_t* p, const uint8_t* sc, float* dst) {
  for (int t = 0; t < M1_TILES; ++t) fp8_times(p + M1_TILE * t, ue8m0_to_f32(sc[t]), dst + M1_TILE * t, M1_TILE);
  uint16_t h[DV - M1_NOPE];
  std::memcpy(h, p + M1_NOPE, sizeof(h));
  for (int64_t c = 0; c < DV - M1_NOPE; ++c) dst[M1_NOPE + c] = pk::bf16_to_f32(h[c]);
}

// One cache row -> d fp32 values: bf16 widened, or FP8: 4 tiles of 128 e4m3 times their
// power-of-two scale (exact) and the 64 bf16 RoPE values.
inline void load_key(const Args& a, const uint8_t* p, float* dst) {
  uint16_t h[DV + 64];
  const uint16_t* bf = h;
  int64_t first_bf16 = 0;
  if (a.fp8) {
    for (int t = 0; t < 4; ++t) {
      float sf;
      std::memcpy(&sf, p + DV + 4 * t, 4);
      fp8_times(p + 128 * t, sf, dst + 128 * t, 128);
    }
    std::memcpy(h + DV, p + DV + 16, static_cast<size_t>(a.d - DV) * 2);
    first_bf16 = DV;
  } else {
    bf = reinterpret_cast<const uint16_t*>(p);
  }
  for (int64_t c = first_bf16; c < a.d; ++c) dst[c] = pk::bf16_to_f32(bf[c]);
}

struct Work {
  std::vector<float> q, kt, v, s, e, o, m, l, key;
  std::vector<int64_t> limit;
};

// One task: rows of job j against keys [k0, k1). Leaves o (rows x 512, un-normalised), m, l.
void run_task(const Args& a, const Job& j, int64_t k0, int64_t k1, Work& w) {
  const int64_t R = j.rows, d = a.d;
  w.q.resize(static_cast<size_t>(R * d));
  if (w.kt.size() < static_cast<size_t>(d * CK)) w.kt.assign(static_cast<size_t>(d * CK), 0.0f);
  if (w.v.size() < static_cast<size_t>(CK * DV)) w.v.assign(static_cast<size_t>(CK * DV), 0.0f);
  w.s.resize(static_cast<size_t>(R * CK));
  w.e.resize(static_cast<size_t>(CK));
  w.key.resize(static_cast<size_t>(d));
  w.o.assign(static_cast<size_t>(R * DV), 0.0f);
  w.m.assign(static_cast<size_t>(R), -INFINITY);
  w.l.assign(static_cast<size_t>(R), 0.0f);
  w.limit.resize(static_cast<size_t>(R));
  for (int64_t r = 0; r < R; ++r) {
    int64_t i, head;
    row_of(a, j, r, &i, &head);
    const uint16_t* src = a.q + ((j.b * a.s_q + i) * a.h_q + head) * d;
    for (int64_t c = 0; c < d; ++c) w.q[r * d + c] = pk::bf16_to_f32(src[c]);
    w.limit[r] = (j.i < 0 && a.causal) ? std::max<int64_t>(0, j.keys - a.s_q + i + 1) : INT64_MAX / 2;
  }
  float* kt = w.kt.data();
  float* v = w.v.data();
  float* key = w.key.data();
  for (int64_t c0 = k0; c0 < k1; c0 += CK) {
    const int64_t cn = std::min(CK, k1 - c0);
    // gather: keys past cn keep old (finite or zero) values, their logits are never read and P·V
    // stops at cn; a key that is not stored is zero, so its P = 0 multiplies zeros
    bool present[CK];
    const int64_t row_bytes = a.model1 ? M1_VALUES : a.fp8 ? DV + 16 + (a.d - DV) * 2 : a.d * 2;
    for (int64_t k = 0; k < cn; ++k) {
      const uint8_t* sc = nullptr;
      const uint8_t* p = key_ptr(a, j, c0 + k, &sc);
      present[k] = p != nullptr;
      // the same key of the next chunk, into L2 while this chunk's products run
      const uint8_t* next = c0 + CK + k < k1 ? key_ptr(a, j, c0 + CK + k) : nullptr;
      if (next)
        for (int64_t off = 0; off < row_bytes; off += 64) __builtin_prefetch(next + off, 0, 2);
      if (p && a.model1) load_key_model1(p, sc, key);
      else if (p) load_key(a, p, key);
      else std::fill(key, key + d, 0.0f);
      // Kᵀ panels [CK / NC][d][NC]; V panels [DV / NC][cn][NC] (P·V runs over the first cn keys)
      float* ktp = kt + (k / NC) * d * NC + k % NC;
      for (int64_t c = 0; c < d; ++c) ktp[c * NC] = key[c];
      for (int64_t p = 0; p < DV / NC; ++p) std::memcpy(v + (p * cn + k) * NC, key + p * NC, NC * 4);
    }
    for (int64_t k = cn; k < CK; ++k) present[k] = false;
    std::fill(w.s.begin(), w.s.end(), 0.0f);
    gemm_acc(w.q.data(), d, kt, d, w.s.data(), CK, R, CK);
    // online softmax per row; P (fp32) replaces the logits in s
    for (int64_t r = 0; r < R; ++r) {
      float* srow = w.s.data() + r * CK;
      const int64_t seen = w.limit[r] - c0;  // keys of this chunk the row may see: [0, seen)
      float x[CK];
      float cmax = -INFINITY;
      for (int64_t k = 0; k < CK; ++k) {
        x[k] = present[k] && k < seen ? srow[k] * a.scale : -INFINITY;
        cmax = std::max(cmax, x[k]);
      }
      const float m_new = std::max(w.m[r], cmax);
      if (m_new == -INFINITY) {  // nothing visible yet
        std::fill(srow, srow + CK, 0.0f);
        continue;
      }
      const float alpha = w.m[r] == -INFINITY ? 0.0f : std::exp(w.m[r] - m_new);
      for (int64_t k = 0; k < CK; ++k) x[k] -= m_new;
      exp_chunk(x, w.e.data());
      float sum = 0.0f;
      for (int64_t k = 0; k < CK; ++k) {
        srow[k] = x[k] == -INFINITY ? 0.0f : w.e[k];
        sum += srow[k];
      }
      w.l[r] = w.l[r] * alpha + sum;
      w.m[r] = m_new;
      if (alpha != 1.0f) {
        float* orow = w.o.data() + r * DV;
        for (int64_t c = 0; c < DV; ++c) orow[c] *= alpha;
      }
    }
    gemm_acc(w.s.data(), CK, v, cn, w.o.data(), DV, R, DV);
  }
}

}  // namespace fma
}  // namespace pk_mla
