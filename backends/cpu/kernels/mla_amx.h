// mla_amx.h — the AMX engine of the native MLA decode (Intel Sapphire Rapids and later).
//
// A task's chunk of 64 keys is gathered into L1 as bf16 (FP8 tokens dequantized per 128-channel
// tile, exactly: their scales are powers of two), logits = Q·Kᵀ in fp32 on AMX tiles, P = exp(logit
// - running max) held as two bf16 terms (hi + lo, ~16 significant bits), O = O·α + P·V on AMX with
// V the first 512 channels of the same rows.
#pragma once

#include "mla_common.h"

#if defined(__x86_64__) && defined(__AVX512F__) && defined(__AVX512BW__)
#define PK_MLA_AMX 1

namespace pk_mla {
namespace amx {

constexpr int64_t TILE = 512;  // bf16 elements per tile (16 x 32)

// One cache row -> d bf16 values (FP8: 4 tiles of 128 fp8 times their power-of-two scale, exact,
// then the 64 bf16 RoPE values).
inline void load_key(const Args& a, const uint8_t* p, uint16_t* dst) {
  if (!a.fp8) {
    std::memcpy(dst, p, static_cast<size_t>(a.d) * 2);
    return;
  }
  for (int t = 0; t < 4; ++t) {
    float sf;
    std::memcpy(&sf, p + 512 + 4 * t, 4);
    const __m512 vs = _mm512_set1_ps(sf);
    for (int k = 0; k < 128; k += 16) {
      const __m512 v = _mm512_mul_ps(pk::fp8x16_to_f32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 128 * t + k))), vs);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + 128 * t + k), pk::f32x16_to_bf16(v));
    }
  }
  std::memcpy(dst + 512, p + 528, 64 * 2);
}

#pragma GCC push_options
#pragma GCC target("amx-tile,amx-bf16")

inline void tile_config() { pk::load_tile_config(16); }

inline void tile_release() { _tile_release(); }

// Tiles 0-3 (a 32 x 32 fp32 block) += A (2 row tiles, a_step apart, steps 1 KiB apart) · B (2 column
// tiles, b_step apart) over `steps` K steps.
inline void accumulate_2x2(const uint16_t* a, int64_t a_step, const uint16_t* b, int64_t b_step, int64_t steps) {
  for (int64_t s = 0; s < steps; ++s) {
    _tile_loadd(4, a + s * TILE, 64);
    _tile_loadd(5, a + a_step + s * TILE, 64);
    _tile_loadd(6, b + s * TILE, 64);
    _tile_loadd(7, b + b_step + s * TILE, 64);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
}

inline void zero_2x2() {
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
}

// Tiles 0-3 stored to c (32 x 32 fp32, ld floats).
inline void store_2x2(float* c, int64_t ld) {
  _tile_stored(0, c, ld * 4);
  _tile_stored(1, c + 16, ld * 4);
  _tile_stored(2, c + 16 * ld, ld * 4);
  _tile_stored(3, c + 16 * ld + 16, ld * 4);
}

// C (32 x 32 fp32 at c, ld floats) = A · B (see accumulate_2x2).
inline void mm_2x2(const uint16_t* a, int64_t a_step, const uint16_t* b, int64_t b_step, int64_t steps, float* c,
                   int64_t ld) {
  zero_2x2();
  accumulate_2x2(a, a_step, b, b_step, steps);
  store_2x2(c, ld);
}

// O block (32 x 32) of P·V with P = P_hi + P_lo (two bf16 terms, so P keeps ~16 significant bits):
// the same V tiles multiply both terms.
inline void pv_2x2(const uint16_t* hi, const uint16_t* lo, int64_t a_step, const uint16_t* b, int64_t b_step,
                   int64_t steps, float* c, int64_t ld) {
  zero_2x2();
  accumulate_2x2(hi, a_step, b, b_step, steps);
  accumulate_2x2(lo, a_step, b, b_step, steps);
  store_2x2(c, ld);
}

#pragma GCC pop_options

struct Work {
  std::vector<uint16_t> qt, kbuf, kt, vt, pt, pt_lo;
  std::vector<float> s, pv, o, m, l, alpha;
  std::vector<int64_t> limit;
};

// One task: rows of job j against keys [k0, k1). Leaves o (rows32 x 512, un-normalised), m, l.
void run_task(const Args& a, const Job& j, int64_t k0, int64_t k1, Work& w) {
  const int64_t R = j.rows, R32 = (R + 31) / 32 * 32, qsteps = (a.d + 31) / 32;
  const int64_t vtiles = DV / 16;
  w.qt.assign(static_cast<size_t>(R32 / 16 * qsteps * TILE), 0);
  w.kbuf.resize(static_cast<size_t>(CK * qsteps * 32));
  w.kt.resize(static_cast<size_t>(CK / 16 * qsteps * TILE));
  w.vt.resize(static_cast<size_t>(vtiles * (CK / 32) * TILE));
  w.pt.resize(static_cast<size_t>(R32 / 16 * (CK / 32) * TILE));
  w.pt_lo.resize(w.pt.size());
  w.s.resize(static_cast<size_t>(R32 * CK));
  w.pv.resize(static_cast<size_t>(32 * 32));
  w.o.assign(static_cast<size_t>(R32 * DV), 0.0f);
  w.m.assign(static_cast<size_t>(R32), -INFINITY);
  w.l.assign(static_cast<size_t>(R32), 0.0f);
  w.alpha.resize(static_cast<size_t>(R32));
  w.limit.assign(static_cast<size_t>(R32), 0);
  // Q rows in tile order [R32/16][qsteps][16][32]; each row's visible key limit (dense causal)
  const int64_t s_k = j.keys;
  for (int64_t r = 0; r < R; ++r) {
    int64_t i, head;
    row_of(a, j, r, &i, &head);
    const uint16_t* src = a.q + ((j.b * a.s_q + i) * a.h_q + head) * a.d;
    uint16_t* dst = w.qt.data() + (r / 16) * qsteps * TILE + (r % 16) * 32;
    for (int64_t s = 0; s < qsteps; ++s) {
      const int64_t n = std::min<int64_t>(32, a.d - 32 * s);
      std::memcpy(dst + s * TILE, src + 32 * s, static_cast<size_t>(n) * 2);
    }
    // keys [0, limit) are visible to the row (causal: query i sees keys <= s_k - s_q + i); sparse rows
    // see every listed key (a -1 index is simply not present)
    w.limit[r] = (j.i < 0 && a.causal) ? std::max<int64_t>(0, s_k - a.s_q + i + 1) : INT64_MAX / 2;
  }
  const __m512 vscale = _mm512_set1_ps(a.scale);
  for (int64_t c0 = k0; c0 < k1; c0 += CK) {
    const int64_t cn = std::min(CK, k1 - c0);
    // gather the chunk's keys (zero rows for keys past the chunk or not stored)
    __mmask16 present[CK / 16] = {};
    for (int64_t k = 0; k < CK; ++k) {
      uint16_t* dst = w.kbuf.data() + k * qsteps * 32;
      const uint8_t* p = k < cn ? key_ptr(a, j, c0 + k) : nullptr;
      if (p) {
        present[k / 16] |= __mmask16(1u << (k % 16));
        load_key(a, p, dst);
        if (a.d < qsteps * 32) std::memset(dst + a.d, 0, static_cast<size_t>(qsteps * 32 - a.d) * 2);
      } else {
        std::memset(dst, 0, static_cast<size_t>(qsteps * 32) * 2);
      }
    }
    // K tiles (VNNI along d): [CK/16][qsteps][16 pairs][16 keys][2]
    for (int64_t kt = 0; kt < CK / 16; ++kt)
      for (int64_t s = 0; s < qsteps; ++s) {
        __m512i r[16];
        for (int i = 0; i < 16; ++i)
          r[i] = _mm512_loadu_si512(w.kbuf.data() + (kt * 16 + i) * qsteps * 32 + 32 * s);
        pk::transpose16(r);
        uint16_t* dst = w.kt.data() + (kt * qsteps + s) * TILE;
        for (int p = 0; p < 16; ++p) _mm512_storeu_si512(dst + 32 * p, r[p]);
      }
    // V tiles (VNNI along keys): [512/16 channel tiles][CK/32][16 key pairs][16 ch][2]
    for (int64_t ct = 0; ct < vtiles; ++ct)
      for (int64_t s = 0; s < CK / 32; ++s) {
        uint16_t* dst = w.vt.data() + (ct * (CK / 32) + s) * TILE;
        for (int p = 0; p < 16; ++p) {
          const uint16_t* k0p = w.kbuf.data() + (32 * s + 2 * p) * qsteps * 32 + 16 * ct;
          const __m512i lo = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(k0p)));
          const __m512i hi = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(k0p + qsteps * 32)));
          _mm512_storeu_si512(dst + 32 * p, _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16)));
        }
      }
    // logits S [R32][CK]
    for (int64_t mb = 0; mb < R32; mb += 32)
      for (int64_t nb = 0; nb < CK; nb += 32)
        mm_2x2(w.qt.data() + (mb / 16) * qsteps * TILE, qsteps * TILE, w.kt.data() + (nb / 16) * qsteps * TILE,
               qsteps * TILE, qsteps, w.s.data() + mb * CK + nb, CK);
    // online softmax per row; P (bf16) in tile order [R32/16][CK/32][16][32]
    for (int64_t r = 0; r < R32; ++r) {
      const int64_t poff = (r / 16) * (CK / 32) * TILE + (r % 16) * 32;
      uint16_t* prow = w.pt.data() + poff;
      uint16_t* plow = w.pt_lo.data() + poff;
      if (r >= R) {
        for (int64_t s = 0; s < CK / 32; ++s) {
          std::memset(prow + s * TILE, 0, 64);
          std::memset(plow + s * TILE, 0, 64);
        }
        w.alpha[r] = 1.0f;
        continue;
      }
      __mmask16 vis[CK / 16];
      __m512 x[CK / 16];
      __m512 vmax = _mm512_set1_ps(-INFINITY);
      const int64_t seen = w.limit[r] - c0;  // keys of this chunk the row may see: [0, seen)
      for (int64_t t = 0; t < CK / 16; ++t) {
        const int64_t n = std::min<int64_t>(16, std::max<int64_t>(0, seen - 16 * t));
        const __mmask16 m = present[t] & (n >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << n) - 1));
        vis[t] = m;
        x[t] = _mm512_mask_blend_ps(m, _mm512_set1_ps(-INFINITY), _mm512_mul_ps(_mm512_loadu_ps(w.s.data() + r * CK + 16 * t), vscale));
        vmax = _mm512_max_ps(vmax, x[t]);
      }
      const float cmax = _mm512_reduce_max_ps(vmax);
      const float m_new = std::max(w.m[r], cmax);
      if (m_new == -INFINITY) {  // nothing visible yet
        for (int64_t s = 0; s < CK / 32; ++s) {
          std::memset(prow + s * TILE, 0, 64);
          std::memset(plow + s * TILE, 0, 64);
        }
        w.alpha[r] = 1.0f;
        continue;
      }
      const float alpha = w.m[r] == -INFINITY ? 0.0f : std::exp(w.m[r] - m_new);
      __m512 vsum = _mm512_setzero_ps();
      for (int64_t t = 0; t < CK / 16; ++t) {
        const __m512 p = _mm512_maskz_mov_ps(vis[t], pk::exp16(_mm512_sub_ps(x[t], _mm512_set1_ps(m_new))));
        const __m256i hi = pk::f32x16_to_bf16(p);
        const __m256i lo = pk::f32x16_to_bf16(_mm512_sub_ps(p, pk::bf16x16_to_f32(hi)));
        vsum = _mm512_add_ps(vsum, p);
        const int64_t at = ((16 * t) / 32) * TILE + (16 * t) % 32;
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(prow + at), hi);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(plow + at), lo);
      }
      w.l[r] = w.l[r] * alpha + _mm512_reduce_add_ps(vsum);
      w.m[r] = m_new;
      w.alpha[r] = alpha;
    }
    // O = O·α + P·V, 32 x 32 blocks
    for (int64_t mb = 0; mb < R32; mb += 32)
      for (int64_t nb = 0; nb < DV; nb += 32) {
        pv_2x2(w.pt.data() + (mb / 16) * (CK / 32) * TILE, w.pt_lo.data() + (mb / 16) * (CK / 32) * TILE,
               (CK / 32) * TILE, w.vt.data() + (nb / 16) * (CK / 32) * TILE, (CK / 32) * TILE, CK / 32, w.pv.data(),
               32);
        for (int64_t r = 0; r < 32; ++r) {
          float* orow = w.o.data() + (mb + r) * DV + nb;
          const __m512 va = _mm512_set1_ps(w.alpha[mb + r]);
          for (int h = 0; h < 32; h += 16)
            _mm512_storeu_ps(orow + h, _mm512_fmadd_ps(_mm512_loadu_ps(orow + h), va,
                                                        _mm512_loadu_ps(w.pv.data() + r * 32 + h)));
        }
      }
  }
}


}  // namespace amx
}  // namespace pk_mla
#endif
