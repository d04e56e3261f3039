// ep.cpp — the cpu backend's native row passes of the expert-parallel Buffer's normal mode (the
// transport itself is torch.distributed; these are the Buffer's own passes over the rows):
//   pk_ep_pack     the dispatch's send side: every token row copied once per destination rank, in
//                  (destination, token) order, and its metadata row (FP8 scales, top-k ids,
//                  weights, source index) written beside it — one pass, no index vector.
//   pk_ep_unpack   the received metadata rows back to recv_x_scales, recv_topk_idx (local ids,
//                  -1 elsewhere), recv_topk_weights (0 where not local), the per-local-expert
//                  counts and the source indices, padded rows filled, in one pass.
//   pk_ep_combine  each token's returned bf16 rows added in fp32 (this rank's own row first, then
//                  the other ranks' in rank order, starting from +0 like a zeroed accumulator),
//                  plus up to two biases, rounded once to bf16 — one pass over the rows, no fp32
//                  [T, H] buffer.
// The orders and roundings are those of the reference kernels of the internal ops
// ep_pack_dispatch_rows / ep_unpack_dispatch_meta / ep_combine_rows
// (portable_kernels/ops/ep/rows.py), so results are equal bit for bit. Shapes and dtypes were
// validated in Python; row counts that index memory are checked here again (a mismatch returns -1
// before anything is written), and every id read from data is range-checked before use.
#include "pk_native.h"
#include "pk_pool.h"

#include <vector>

namespace {

// start row of each destination's block and the rows each destination gets (in_rank bool [T, R])
void dest_blocks(const uint8_t* in_rank, int64_t T, int64_t R, std::vector<int64_t>& start) {
  start.assign(static_cast<size_t>(R) + 1, 0);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t d = 0; d < R; ++d) start[d + 1] += in_rank[t * R + d] ? 1 : 0;
  for (int64_t d = 0; d < R; ++d) start[d + 1] += start[d];
}

}  // namespace

// in_rank bool [T, R]; data: T rows of data_bytes, data_ld bytes apart; parts: nparts contiguous
// per-token tensors (pointer, bytes per row) packed side by side in each meta row, then (with_src)
// the int32 token index. block[d]: where destination d's rows go (uint8 [counts[d], data_bytes]), or
// 0 to leave them out; meta uint8 [S, meta_bytes] for every destination, destination-major, S =
// sum(counts) (null when meta_bytes is 0, or to leave it out). Returns 0, or -1 (nothing written)
// when in_rank's columns do not count counts[d] tokens.
PK_EXPORT int pk_ep_pack(const uint8_t* in_rank, int64_t T, int64_t R, const uint8_t* data, int64_t data_bytes,
                         int64_t data_ld, int nparts, const int64_t* part_ptrs, const int64_t* part_bytes,
                         int with_src, const int64_t* counts, const int64_t* block, uint8_t* meta, int64_t meta_bytes,
                         int nthreads) {
  std::vector<int64_t> start;
  dest_blocks(in_rank, T, R, start);
  for (int64_t d = 0; d < R; ++d)
    if (start[d + 1] - start[d] != counts[d]) return -1;
  const int threads = start[R] * (data_bytes + meta_bytes) < (1 << 20) ? 1 : pk::thread_count(nthreads);
  pk::parallel_for(R, threads, [&](int64_t d) {
    uint8_t* rows = reinterpret_cast<uint8_t*>(block[d]);
    if (!rows && !(meta && meta_bytes)) return;
    int64_t s = start[d];
    for (int64_t t = 0; t < T; ++t) {
      if (!in_rank[t * R + d]) continue;
      if (rows) std::memcpy(rows + (s - start[d]) * data_bytes, data + t * data_ld, static_cast<size_t>(data_bytes));
      if (meta && meta_bytes) {
        uint8_t* m = meta + s * meta_bytes;
        for (int p = 0; p < nparts; ++p) {
          const int64_t w = part_bytes[p];
          std::memcpy(m, reinterpret_cast<const uint8_t*>(part_ptrs[p]) + t * w, static_cast<size_t>(w));
          m += w;
        }
        if (with_src) {
          const int32_t src = static_cast<int32_t>(t);
          std::memcpy(m, &src, 4);
        }
      }
      ++s;
    }
  });
  return 0;
}

// meta uint8 [N, meta_bytes]: per row num_scales fp32, then (num_topk > 0) num_topk ids (int64 when
// idx64 else int32), then (has_weights) num_topk fp32 weights, then (has_src) an int32 source index.
// Outputs (each null when absent), `rows` >= N rows each: scales fp32 [rows, num_scales] (padding 0),
// idx [rows, num_topk] in the ids' dtype (id - rank * per_rank when in [0, per_rank), else -1;
// padding -1), weights fp32 [rows, num_topk] (the weight where the id is local, else +0; padding 0),
// counts int64 [per_rank] (local ids per local expert), src int32 [N].
PK_EXPORT void pk_ep_unpack(const uint8_t* meta, int64_t N, int64_t meta_bytes, int64_t rows, int64_t num_scales,
                            int64_t num_topk, int idx64, int has_weights, int has_src, int64_t rank,
                            int64_t per_rank, float* scales, void* idx, float* weights, int64_t* counts,
                            int32_t* src) {
  const int64_t id_bytes = idx64 ? 8 : 4;
  const int64_t lo = rank * per_rank;
  if (counts)
    for (int64_t e = 0; e < per_rank; ++e) counts[e] = 0;
  for (int64_t n = 0; n < N; ++n) {
    const uint8_t* m = meta + n * meta_bytes;
    if (num_scales) {
      std::memcpy(scales + n * num_scales, m, static_cast<size_t>(num_scales) * 4);
      m += num_scales * 4;
    }
    if (num_topk) {
      const uint8_t* ids = m;
      const uint8_t* ws = m + num_topk * id_bytes;
      for (int64_t j = 0; j < num_topk; ++j) {
        int64_t id;
        if (idx64) {
          std::memcpy(&id, ids + j * 8, 8);
        } else {
          int32_t v;
          std::memcpy(&v, ids + j * 4, 4);
          id = v;
        }
        const int64_t local = id - lo;
        const bool is_local = id >= lo && local < per_rank;  // id >= lo: no overflow for any int64 id
        const int64_t out = is_local ? local : -1;
        if (idx64) {
          static_cast<int64_t*>(idx)[n * num_topk + j] = out;
        } else {
          static_cast<int32_t*>(idx)[n * num_topk + j] = static_cast<int32_t>(out);
        }
        if (is_local && counts) ++counts[local];
        if (has_weights) {
          float w;
          std::memcpy(&w, ws + j * 4, 4);
          weights[n * num_topk + j] = is_local ? w : 0.0f;
        }
      }
      m += num_topk * (id_bytes + (has_weights ? 4 : 0));
    }
    if (has_src) std::memcpy(src + n, m, 4);
  }
  for (int64_t n = N; n < rows; ++n) {
    if (num_scales)
      for (int64_t s = 0; s < num_scales; ++s) scales[n * num_scales + s] = 0.0f;
    if (num_topk) {
      for (int64_t j = 0; j < num_topk; ++j) {
        if (idx64) {
          static_cast<int64_t*>(idx)[n * num_topk + j] = -1;
        } else {
          static_cast<int32_t*>(idx)[n * num_topk + j] = -1;
        }
        if (has_weights) weights[n * num_topk + j] = 0.0f;
      }
    }
  }
}

namespace {

// NaN as torch's CPU `.to(torch.bfloat16)` writes it: ATen's vectorised fp32 -> bf16 conversion
// (the path every tensor conversion takes on x86) gives 0xFFFF, not c10's scalar 0x7FC0 — the
// torch path this kernel must equal rounds its fp32 sums that way.
constexpr uint16_t kTorchNanBf16 = 0xFFFF;

inline uint16_t f32_to_bf16_torch(float f) { return std::isnan(f) ? kTorchNanBf16 : pk::f32_to_bf16(f); }

#if defined(__AVX512F__)
inline __m256i f32x16_to_bf16_torch(__m512 v) {
  const __m512i u = _mm512_castps_si512(v);
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7FFF)), odd), 16);
  r = _mm512_mask_mov_epi32(r, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), _mm512_set1_epi32(kTorchNanBf16));
  return _mm512_cvtepi32_epi16(r);
}
#elif defined(__AVX2__)
// Round to nearest even, NaN -> kTorchNanBf16, 8 lanes -> 8 bf16.
inline __m128i f32x8_to_bf16_torch(__m256 v) {
  const __m256i u = _mm256_castps_si256(v);
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  __m256i r = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7FFF)), odd), 16);
  const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
  r = _mm256_blendv_epi8(r, _mm256_set1_epi32(kTorchNanBf16), nan);
  // 32 -> 16 bits: packus works per 128-bit lane, so pack with itself and gather lanes 0 and 2
  const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);
  return _mm256_castsi256_si128(packed);
}
#endif

}  // namespace

// in_rank bool [T, R]: where this rank's tokens went; block[d]: the first of the bf16 rows [*, H]
// (row stride H) rank d returned, in this rank's token order (block[me]: its own rows), splits[d]
// of them; biases: nbias (0..2) [T, H] tensors, bf16 when bias_bf16[i] else fp32; out bf16 [T, H].
// Per element: ((+0 + row_me) + row_0 + ... + row_{R-1}) (me skipped) + bias0 + bias1, fp32, then
// RNE to bf16 (NaN as torch writes it). Returns 0, or -1 (nothing written) when in_rank's columns do not count splits rows.
PK_EXPORT int pk_ep_combine(const uint8_t* in_rank, int64_t T, int64_t R, int64_t me, const int64_t* block,
                            const int64_t* splits, int64_t H, int nbias, const int64_t* bias_ptrs,
                            const int32_t* bias_bf16, uint16_t* out, int nthreads) {
  // the row of each (token, rank) pair within its rank's block (-1: not sent there)
  std::vector<int32_t> pos(static_cast<size_t>(T * R));
  std::vector<int64_t> seen(static_cast<size_t>(R), 0);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t d = 0; d < R; ++d)
      pos[t * R + d] = in_rank[t * R + d] ? static_cast<int32_t>(seen[d]++) : -1;
  for (int64_t d = 0; d < R; ++d)
    if (seen[d] != splits[d]) return -1;
  const int threads = double(T) * double(H) * double(R) < 262144.0 ? 1 : pk::thread_count(nthreads);
  pk::parallel_blocks(T, threads, [&](int64_t t0, int64_t t1) {
    std::vector<const uint16_t*> src(static_cast<size_t>(R));
    for (int64_t t = t0; t < t1; ++t) {
      int n = 0;
      // this rank's own row first, then the others in rank order
      if (pos[t * R + me] >= 0) src[n++] = reinterpret_cast<const uint16_t*>(block[me]) + pos[t * R + me] * H;
      for (int64_t d = 0; d < R; ++d)
        if (d != me && pos[t * R + d] >= 0) src[n++] = reinterpret_cast<const uint16_t*>(block[d]) + pos[t * R + d] * H;
      uint16_t* o = out + t * H;
      int64_t h = 0;
#if defined(__AVX512F__)
      for (; h + 64 <= H; h += 64) {
        __m512 a[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
        for (int i = 0; i < n; ++i) {
          const uint16_t* r = src[i] + h;
          for (int q = 0; q < 4; ++q)
            a[q] = _mm512_add_ps(a[q], pk::bf16x16_to_f32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(r + 16 * q))));
        }
        for (int b = 0; b < nbias; ++b) {
          const int64_t at = t * H + h;
          for (int q = 0; q < 4; ++q)
            a[q] = _mm512_add_ps(a[q], bias_bf16[b] ? pk::bf16x16_to_f32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(
                                                         reinterpret_cast<const uint16_t*>(bias_ptrs[b]) + at + 16 * q)))
                                                   : _mm512_loadu_ps(reinterpret_cast<const float*>(bias_ptrs[b]) + at + 16 * q));
        }
        for (int q = 0; q < 4; ++q)
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(o + h + 16 * q), f32x16_to_bf16_torch(a[q]));
      }
#elif defined(__AVX2__)
      for (; h + 32 <= H; h += 32) {
        __m256 a[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
        for (int i = 0; i < n; ++i) {
          const uint16_t* r = src[i] + h;
          for (int q = 0; q < 4; ++q)
            a[q] = _mm256_add_ps(a[q], pk::bf16x8_to_f32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(r + 8 * q))));
        }
        for (int b = 0; b < nbias; ++b) {
          const int64_t at = t * H + h;
          for (int q = 0; q < 4; ++q)
            a[q] = _mm256_add_ps(a[q], bias_bf16[b] ? pk::bf16x8_to_f32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(
                                                         reinterpret_cast<const uint16_t*>(bias_ptrs[b]) + at + 8 * q)))
                                                   : _mm256_loadu_ps(reinterpret_cast<const float*>(bias_ptrs[b]) + at + 8 * q));
        }
        for (int q = 0; q < 4; ++q)
          _mm_storeu_si128(reinterpret_cast<__m128i*>(o + h + 8 * q), f32x8_to_bf16_torch(a[q]));
      }
#endif
      // the rest (every element on neon / generic builds, which the compiler vectorises): a strip
      // of fp32 sums at a time, the same additions in the same order
      constexpr int64_t kStrip = 256;
      float acc[kStrip];
      for (; h < H; h += kStrip) {
        const int64_t w = std::min(kStrip, H - h);
        for (int64_t j = 0; j < w; ++j) acc[j] = 0.0f;
        for (int i = 0; i < n; ++i) {
          const uint16_t* r = src[i] + h;
          for (int64_t j = 0; j < w; ++j) acc[j] += pk::bf16_to_f32(r[j]);
        }
        for (int b = 0; b < nbias; ++b) {
          const int64_t at = t * H + h;
          if (bias_bf16[b]) {
            const uint16_t* bb = reinterpret_cast<const uint16_t*>(bias_ptrs[b]) + at;
            for (int64_t j = 0; j < w; ++j) acc[j] += pk::bf16_to_f32(bb[j]);
          } else {
            const float* bb = reinterpret_cast<const float*>(bias_ptrs[b]) + at;
            for (int64_t j = 0; j < w; ++j) acc[j] += bb[j];
          }
        }
        for (int64_t j = 0; j < w; ++j) o[h + j] = f32_to_bf16_torch(acc[j]);
      }
    }
  });
  return 0;
}
