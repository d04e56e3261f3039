// layout_encoders.cpp — native encoders of the per-chip byte formats that prepare_inputs writes:
// exponent packing (SM100 four per int32 and Ascend MX two per int16, MN-major; Ascend K-major
// pairs), the SM90 MN-major TMA-aligned fp32 transpose, and FRACTAL_NZ data tiles.
//
// Rule: the bytes are exactly those of the torch encoders in portable_kernels.layouts (which stay
// the definition; tests compare both on every shape class). Inputs are validated in Python; a
// scale that is not a positive normal power of two is only counted here, and the caller then runs
// the torch encoder, which raises its own error.
#include "pk_native.h"

#include <vector>

namespace {

inline bool pow2_exponent(uint32_t bits, uint32_t* e) {
  *e = bits >> 23;
  return (bits & 0x807FFFFFu) == 0 && *e >= 1 && *e <= 254;
}

inline int threads_for(int nthreads, double bytes) { return bytes < 1048576.0 ? 1 : std::max(1, nthreads); }


#if defined(__AVX512F__) && defined(__AVX512BW__)

inline __mmask16 lanes(int64_t n) { return n >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << n) - 1); }

// 16 fp32 scales -> their exponents (32-bit lanes); `wrong` collects lanes that are not positive
// normal powers of two.
inline __m512i exponents16(const float* p, __mmask16 m, __mmask16* wrong) {
  const __m512i v = _mm512_maskz_loadu_epi32(m, p);
  const __m512i ex = _mm512_srli_epi32(v, 23);
  *wrong |= m & (_mm512_test_epi32_mask(v, _mm512_set1_epi32(int(0x807FFFFFu))) |
                 _mm512_cmpeq_epi32_mask(ex, _mm512_setzero_si512()) |
                 _mm512_cmpgt_epi32_mask(ex, _mm512_set1_epi32(254)));
  return ex;
}

// Per-row scales [G, MN, KB] -> SM100 words (four exponents per int32) MN-major, in one pass:
// 16 rows at a time, each row's exponent bytes form 16 words of a register, transposed to 16 n.
int64_t sm100_rows_fast(const float* sf, int64_t G, int64_t MN, int64_t KB, int64_t mn_stride, uint32_t* out) {
  const int64_t words = (KB + 3) / 4;
  __mmask16 wrong = 0;
  for (int64_t g = 0; g < G; ++g)
    for (int64_t n0 = 0; n0 < MN; n0 += 16) {
      const int64_t rows = std::min<int64_t>(16, MN - n0);
      for (int64_t w0 = 0; w0 < words; w0 += 16) {  // 16 words = 64 exponents of a row
        __m512i r[16];
        for (int i = 0; i < 16; ++i) {
          if (i >= rows) {
            r[i] = _mm512_setzero_si512();
            continue;
          }
          const float* row = sf + (g * MN + n0 + i) * KB;
          alignas(64) uint8_t bytes[64];
          for (int q = 0; q < 4; ++q) {
            const int64_t k0 = 4 * w0 + 16 * q;
            const __mmask16 m = lanes(std::max<int64_t>(0, KB - k0));
            _mm_store_si128(reinterpret_cast<__m128i*>(bytes + 16 * q),
                            _mm512_cvtepi32_epi8(exponents16(row + k0, m, &wrong)));
          }
          r[i] = _mm512_load_si512(bytes);
        }
        pk::transpose16(r);
        for (int64_t p = w0; p < std::min(words, w0 + 16); ++p)
          _mm512_mask_storeu_epi32(out + (g * words + p) * mn_stride + n0, lanes(rows), r[p - w0]);
      }
    }
  if (wrong) return 1;
  for (int64_t g = 0; g < G; ++g)
    for (int64_t p = 0; p < words; ++p)
      for (int64_t n = MN; n < mn_stride; ++n) out[(g * words + p) * mn_stride + n] = 0;
  return 0;
}

// Per-row (1, 32 * ratio) scales [G, MN, KB] -> Ascend K-major pairs [G, MN, row_len] bytes, each
// exponent repeated `ratio` times (ratio 4: one 32-bit store per exponent), in one pass.
int64_t ascend_kmajor_rows_fast(const float* sf, int64_t G, int64_t MN, int64_t KB, int64_t KBo, int64_t row_len,
                                uint8_t* out) {
  __mmask16 wrong = 0;
  for (int64_t r = 0; r < G * MN; ++r) {
    const float* row = sf + r * KB;
    uint8_t* dst = out + r * row_len;
    for (int64_t k0 = 0; k0 < KB; k0 += 16) {
      const __mmask16 m = lanes(KB - k0);
      const __m512i rep = _mm512_mullo_epi32(exponents16(row + k0, m, &wrong), _mm512_set1_epi32(0x01010101));
      // bytes [4 * k0, 4 * k0 + 64) of the row, cut at KBo (a partial last block) and padded with 0
      const int64_t have = std::min<int64_t>(64, std::max<int64_t>(0, KBo - 4 * k0));
      const __mmask64 keep = have >= 64 ? ~__mmask64(0) : ((__mmask64(1) << have) - 1);
      const int64_t room = std::min<int64_t>(64, row_len - 4 * k0);
      const __mmask64 store = room >= 64 ? ~__mmask64(0) : ((__mmask64(1) << room) - 1);
      _mm512_mask_storeu_epi8(dst + 4 * k0, store, _mm512_maskz_mov_epi8(keep, rep));
    }
    for (int64_t j = 4 * KB; j < row_len; ++j) dst[j] = 0;
  }
  return wrong ? 1 : 0;
}
#endif

}  // namespace

// sf: fp32 [G, R, KB] contiguous, R = ceil(mn / block_mn). Refined block j (of KBo) takes input block
// j / ratio; row n takes input row n / block_mn. kmajor == 0: words of per_word exponent bytes,
// MN-major, word (g, n, p) at element (g * words + p) * mn_stride + n, pad rows zero; kmajor == 1:
// bytes [G, mn, words * per_word]. Missing trailing bytes are zero. Returns the number of scales
// that are not positive normal powers of two (then nothing is guaranteed about out).
PK_EXPORT int64_t pk_pack_exponents(const float* sf, int64_t G, int64_t R, int64_t KB, int64_t mn, int64_t block_mn,
                                    int64_t ratio, int64_t KBo, int64_t per_word, int kmajor, int64_t mn_stride,
                                    void* out, int nthreads) {
#if defined(__AVX512F__) && defined(__AVX512BW__)
  // one-pass forms of the two encoders prepare_inputs runs on activation-sized scales
  if (!kmajor && per_word == 4 && ratio == 1 && block_mn == 1 && KBo == KB)
    return sm100_rows_fast(sf, G, mn, KB, mn_stride, static_cast<uint32_t*>(out));
  if (kmajor && ratio == 4 && block_mn == 1 && per_word == 2)
    return ascend_kmajor_rows_fast(sf, G, mn, KB, KBo, (KBo + 1) / 2 * 2, static_cast<uint8_t*>(out));
#endif
  const int64_t n_in = G * R * KB;
  const uint32_t* bits = reinterpret_cast<const uint32_t*>(sf);
  // 1. every scale a positive normal power of two; its exponent byte into e [G, R, KB]
  std::vector<uint8_t> e(static_cast<size_t>(n_in));
  int64_t bad = 0, i = 0;
#if defined(__AVX512F__)
  __mmask16 wrong = 0;
  for (; i + 16 <= n_in; i += 16) {
    const __m512i v = _mm512_loadu_si512(bits + i);
    const __m512i ex = _mm512_srli_epi32(v, 23);
    wrong |= _mm512_test_epi32_mask(v, _mm512_set1_epi32(int(0x807FFFFFu))) |
             _mm512_cmpeq_epi32_mask(ex, _mm512_setzero_si512()) | _mm512_cmpgt_epi32_mask(ex, _mm512_set1_epi32(254));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(e.data() + i), _mm512_cvtepi32_epi8(ex));
  }
  bad += wrong != 0;
#endif
  for (; i < n_in; ++i) {
    uint32_t x;
    bad += !pow2_exponent(bits[i], &x);
    e[i] = uint8_t(x);
  }
  if (bad) return bad;
  const int64_t words = (KBo + per_word - 1) / per_word, row_len = words * per_word;
  // 2. one refined, zero-padded byte row per source row: rows [G, R, row_len]
  std::vector<uint8_t> rows(static_cast<size_t>(G * R * row_len));
  for (int64_t r = 0; r < G * R; ++r) {
    const uint8_t* src = e.data() + r * KB;
    uint8_t* dst = rows.data() + r * row_len;
    if (ratio == 1) {
      std::memcpy(dst, src, static_cast<size_t>(KBo));
    } else {  // block b covers refined blocks [b * ratio, (b + 1) * ratio) (no division per byte)
      for (int64_t b = 0, j = 0; b < KB && j < KBo; ++b)
        for (int64_t t = 0; t < ratio && j < KBo; ++t) dst[j++] = src[b];
    }
    std::memset(dst + KBo, 0, static_cast<size_t>(row_len - KBo));
  }
  uint8_t* o = static_cast<uint8_t*>(out);
  const int threads = threads_for(nthreads, double(G) * double(mn_stride) * double(row_len));
  if (kmajor) {  // 3a. each output row is its source row's bytes
#pragma omp parallel for num_threads(threads) if (threads > 1) schedule(static) collapse(2)
    for (int64_t g = 0; g < G; ++g)
      for (int64_t r = 0; r < R; ++r) {
        const int64_t n1 = std::min(mn, (r + 1) * block_mn);
        for (int64_t n = r * block_mn; n < n1; ++n)
          std::memcpy(o + (g * mn + n) * row_len, rows.data() + (g * R + r) * row_len, static_cast<size_t>(row_len));
      }
    return 0;
  }
  // 3b. MN-major words: word (g, n, p) at (g * words + p) * mn_stride + n; pad rows zero
#pragma omp parallel for num_threads(threads) if (threads > 1) schedule(static) collapse(2)
  for (int64_t g = 0; g < G; ++g)
    for (int64_t p = 0; p < words; ++p) {
      uint8_t* dst = o + (g * words + p) * mn_stride * per_word;
      const uint8_t* col = rows.data() + g * R * row_len + p * per_word;
      if (per_word == 4) {
        uint32_t* d32 = reinterpret_cast<uint32_t*>(dst);
        for (int64_t r = 0; r < R; ++r) {
          uint32_t w;
          std::memcpy(&w, col + r * row_len, 4);
          const int64_t n1 = std::min(mn, (r + 1) * block_mn);
          for (int64_t n = r * block_mn; n < n1; ++n) d32[n] = w;
        }
        for (int64_t n = mn; n < mn_stride; ++n) d32[n] = 0;
      } else {
        uint16_t* d16 = reinterpret_cast<uint16_t*>(dst);
        for (int64_t r = 0; r < R; ++r) {
          uint16_t w;
          std::memcpy(&w, col + r * row_len, 2);
          const int64_t n1 = std::min(mn, (r + 1) * block_mn);
          for (int64_t n = r * block_mn; n < n1; ++n) d16[n] = w;
        }
        for (int64_t n = mn; n < mn_stride; ++n) d16[n] = 0;
      }
    }
  return 0;
}

// sf: fp32 [G, MN, KB] contiguous -> out [G, KB, mn_stride]: out[g][k][n] = sf[g][n][k], pad zero.
PK_EXPORT void pk_sm90_sfa(const float* sf, int64_t G, int64_t MN, int64_t KB, int64_t mn_stride, float* out,
                           int nthreads) {
  const int threads = threads_for(nthreads, double(G) * double(MN) * double(KB) * 8.0);
#if defined(__AVX512F__) && defined(__AVX512BW__)
  // 16 x 16 blocks through registers: 16 rows loaded, transposed, stored as 16 columns
#pragma omp parallel for num_threads(threads) if (threads > 1) schedule(static) collapse(2)
  for (int64_t g = 0; g < G; ++g)
    for (int64_t n0 = 0; n0 < MN; n0 += 16) {
      const int64_t rows = std::min<int64_t>(16, MN - n0);
      for (int64_t k0 = 0; k0 < KB; k0 += 16) {
        __m512i r[16];
        const __mmask16 m = lanes(KB - k0);
        for (int i = 0; i < 16; ++i)
          r[i] = i < rows ? _mm512_maskz_loadu_epi32(m, sf + (g * MN + n0 + i) * KB + k0) : _mm512_setzero_si512();
        pk::transpose16(r);
        for (int64_t k = k0; k < std::min(KB, k0 + 16); ++k)
          _mm512_mask_storeu_epi32(out + (g * KB + k) * mn_stride + n0, lanes(rows), r[k - k0]);
      }
    }
#else
  const int64_t nblocks = (MN + 15) / 16;
  // blocks of 16 rows: their source lines stay in L1 while each k writes 16 consecutive floats
#pragma omp parallel for num_threads(threads) if (threads > 1) schedule(static) collapse(2)
  for (int64_t g = 0; g < G; ++g)
    for (int64_t b = 0; b < nblocks; ++b) {
      const int64_t n0 = 16 * b, n1 = std::min(MN, n0 + 16);
      const float* src = sf + g * MN * KB;
      for (int64_t k = 0; k < KB; ++k) {
        float* dst = out + (g * KB + k) * mn_stride;
        for (int64_t n = n0; n < n1; ++n) dst[n] = src[n * KB + k];
      }
    }
#endif
#pragma omp parallel for num_threads(threads) if (threads > 1) schedule(static) collapse(2)
  for (int64_t g = 0; g < G; ++g)
    for (int64_t k = 0; k < KB; ++k)
      for (int64_t n = MN; n < mn_stride; ++n) out[(g * KB + k) * mn_stride + n] = 0.0f;
}

// x: L matrices of M rows (row_stride bytes apart, batch_stride bytes apart), row_bytes bytes each ->
// out [L, n1, m1 * 16, 32] bytes (FRACTAL_NZ with 32-byte tile rows), zero padded. Blocks of 16
// rows are read whole and scattered to their n1 tiles, so both sides stream.
PK_EXPORT void pk_nd_to_nz(const void* x, int64_t L, int64_t M, int64_t row_bytes, int64_t row_stride,
                           int64_t batch_stride, int64_t n1, int64_t m1, void* out, int nthreads) {
  const uint8_t* src = static_cast<const uint8_t*>(x);
  uint8_t* dst = static_cast<uint8_t*>(out);
  const int threads = threads_for(nthreads, double(L) * double(m1) * 16.0 * double(n1) * 32.0);
#pragma omp parallel for num_threads(threads) if (threads > 1) schedule(static) collapse(2)
  for (int64_t l = 0; l < L; ++l)
    for (int64_t ib = 0; ib < m1; ++ib)
      for (int64_t j = 0; j < n1; ++j) {
        uint8_t* tile = dst + ((l * n1 + j) * m1 + ib) * 16 * 32;
        const int64_t c0 = 32 * j, cn = std::min<int64_t>(32, row_bytes - c0);
        for (int64_t r = 0; r < 16; ++r) {
          const int64_t i = ib * 16 + r;
          uint8_t* t = tile + r * 32;
          if (i < M) {
            std::memcpy(t, src + l * batch_stride + i * row_stride + c0, static_cast<size_t>(cn));
            if (cn < 32) std::memset(t + cn, 0, static_cast<size_t>(32 - cn));
          } else {
            std::memset(t, 0, 32);
          }
        }
      }
}
