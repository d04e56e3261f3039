// quant_extra.cpp — the cpu backend's native TileKernels recasts beyond casts.cpp: the lossless
// E2M1 -> E4M3 recast (per_block_cast_lossless; ops/quant/lossless.py has the contract).
//
// Numerics are exact, hence bitwise the reference's: per output block E = max(input scale exponent)
// - 6, and each code becomes the E4M3 byte of code · 2^(e - E), e - E in [-5, 6] — a table lookup of
// (shift, code), every product being an E4M3 normal (or ±0); with SSSE3, 32 codes per pair of byte
// shuffles. Scales are validated here (positive finite powers of two, within 2^11 per output block,
// the largest >= 2^-120): a refusal returns a nonzero code before anything is written, and the
// Python side raises the contract's error.
#include "pk_native.h"
#include "pk_pool.h"

#include <atomic>
#include <vector>
#if defined(__SSSE3__)
#include <immintrin.h>
#endif

namespace {

constexpr int kShift = 6;        // output scale = largest input scale / 2^6
constexpr int kSpan = 11;        // input scales within 2^11 of their block's largest
constexpr int kMinTop = kShift + 1;
constexpr int kMinDelta = kShift - kSpan;  // -5
constexpr int kDeltas = kShift - kMinDelta + 1;  // 12

// E4M3 byte of E2M1 code c (0..15) times 2^d, d in [-5, 6]; magnitudes (1 + f/8) · 2^p
struct Table {
  uint8_t byte[kDeltas][16];
  Table() {
    // E2M1 magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6 as (p, f); code 0 is zero
    const int p[8] = {0, -1, 0, 0, 1, 1, 2, 2};
    const int f[8] = {0, 0, 0, 4, 0, 4, 0, 4};
    for (int d = kMinDelta; d <= kShift; ++d)
      for (int c = 0; c < 16; ++c) {
        const int m = c & 7;
        const uint8_t mag = m == 0 ? 0 : uint8_t(((p[m] + d + 7) << 3) | f[m]);
        byte[d - kMinDelta][c] = uint8_t(mag | (c & 8 ? 0x80 : 0));
      }
  }
};

const Table& table() {
  static const Table t;
  return t;
}

inline int pick(int nthreads, double bytes, int64_t tasks) {
  if (bytes < 262144.0) return 1;
  return std::max<int>(1, int(std::min<int64_t>(nthreads, tasks)));
}

}  // namespace

// data uint8 [M, K/2] (low nibble first), sf fp32 [gmi, gki] row-major, blocks (ibm, ibk) and
// (obm, obk) with obm % ibm == obk % ibk == 0 -> out uint8 (E4M3) [M, K], out_sf fp32 [gmo, gko].
// Returns 0, or 1 (a scale not a positive finite power of two), 2 (a block's largest scale below
// 2^-120), 3 (scales more than 2^11 apart in an output block); nothing is written then.
PK_EXPORT int64_t pk_lossless_cast(const uint8_t* data, const float* sf, int64_t M, int64_t K, int64_t ibm,
                                   int64_t ibk, int64_t obm, int64_t obk, uint8_t* out, float* out_sf,
                                   int nthreads) {
  const int64_t gmi = (M + ibm - 1) / ibm, gki = (K + ibk - 1) / ibk;
  const int64_t gmo = (M + obm - 1) / obm, gko = (K + obk - 1) / obk;
  const int64_t rm = obm / ibm, rk = obk / ibk;
  const int threads = pick(pk::thread_count(nthreads), double(M) * double(K) * 1.5, gmo);
  std::vector<int32_t> big(size_t(gmo * gko));
  std::atomic<int64_t> bad{0};
  // pass 1: per output block, the largest exponent E + 6, checked
  pk::parallel_blocks(gmo, threads, [&](int64_t b0, int64_t b1) {
    int64_t mine = 0;
    for (int64_t bi = b0; bi < b1 && !mine; ++bi)
      for (int64_t bj = 0; bj < gko && !mine; ++bj) {
        int lo = 255, hi = 0;
        for (int64_t i = bi * rm; i < std::min(gmi, (bi + 1) * rm) && !mine; ++i)
          for (int64_t j = bj * rk; j < std::min(gki, (bj + 1) * rk); ++j) {
            const uint32_t bits = pk::f32_bits(sf[i * gki + j]);
            const int e = int(bits >> 23);
            if ((bits & 0x807FFFFFu) != 0 || e == 0 || e == 255) {
              mine = 1;
              break;
            }
            lo = std::min(lo, e);
            hi = std::max(hi, e);
          }
        if (!mine && hi < kMinTop) mine = 2;
        if (!mine && lo < hi - kSpan) mine = 3;
        big[size_t(bi * gko + bj)] = hi - kShift;
      }
    if (mine) {
      int64_t none = 0;
      bad.compare_exchange_strong(none, mine);
    }
  });
  if (bad.load()) return bad.load();
  for (int64_t b = 0; b < gmo * gko; ++b) out_sf[b] = pk::bits_f32(uint32_t(big[size_t(b)]) << 23);
  // pass 2: each row, one table per input block
  const Table& t = table();
  pk::parallel_blocks(M, threads, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const uint8_t* src = data + r * (K / 2);
      uint8_t* dst = out + r * K;
      const float* srow = sf + (r / ibm) * gki;
      const int32_t* brow = big.data() + (r / obm) * gko;
      for (int64_t j = 0; j < gki; ++j) {
        const int d = int(pk::f32_bits(srow[j]) >> 23) - brow[j / rk];
        const uint8_t* lut = t.byte[d - kMinDelta];
        const int64_t c1 = std::min(K, (j + 1) * ibk);
        int64_t c = j * ibk;
        if (c & 1) { dst[c] = lut[src[c >> 1] >> 4]; ++c; }
#if defined(__SSSE3__)
        // 32 codes (16 bytes) at a time: both nibbles looked up with one byte shuffle each, interleaved
        if (c + 32 <= c1) {
          const __m128i table16 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(lut));
          const __m128i low4 = _mm_set1_epi8(0x0F);
          for (; c + 32 <= c1; c += 32) {
            const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + (c >> 1)));
            const __m128i lo = _mm_shuffle_epi8(table16, _mm_and_si128(b, low4));
            const __m128i hi = _mm_shuffle_epi8(table16, _mm_and_si128(_mm_srli_epi16(b, 4), low4));
            _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + c), _mm_unpacklo_epi8(lo, hi));
            _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + c + 16), _mm_unpackhi_epi8(lo, hi));
          }
        }
#endif
        for (; c + 1 < c1; c += 2) {
          const uint8_t b = src[c >> 1];
          dst[c] = lut[b & 0xF];
          dst[c + 1] = lut[b >> 4];
        }
        if (c < c1) dst[c] = lut[src[c >> 1] & 0xF];
      }
    }
  });
  return 0;
}
