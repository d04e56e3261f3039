// routing.cpp — the cpu backend's native MoE routing: the grouped top-k gate (after the scores),
// expand_to_fused (rows and their scales copied bit for bit into the expert-major layout, every
// other row zeroed, in one pass over the output) and reduce_fused (the weighted fp32 sum of each
// token's expert rows, in one pass over the token's rows). Indices were validated in Python; they
// are still bounds-checked here, so no value can make these read or write out of bounds.
#include "pk_native.h"
#include "pk_pool.h"

#include <vector>

namespace {

// Indices of the k largest of v[0..n) best first, equal values to the smaller index (a stable
// descending order), written to out; -inf entries can be chosen like any value.
void stable_top(const float* v, int64_t n, int64_t k, int64_t* out, std::vector<int64_t>& order) {
  order.resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) order[i] = i;
  std::partial_sort(order.begin(), order.begin() + k, order.end(),
                    [&](int64_t a, int64_t b) { return v[a] > v[b] || (v[a] == v[b] && a < b); });
  for (int64_t j = 0; j < k; ++j) out[j] = order[j];
}

}  // namespace

// ranked fp32 [T, E]: what experts are ranked by (scores or logits, plus the bias), and scores fp32
// [T, E] (the weights' source) — both computed by torch, so they match the reference bit for bit;
// mask uint8 [T] or null. Writes idx int64 [T, k] and weights fp32 [T, k].
PK_EXPORT void pk_top2_sum_gate(const float* ranked, const float* scores, int64_t T, int64_t E, int64_t k,
                                int64_t topk_groups, int64_t groups, float scaling, int normalize, const uint8_t* mask,
                                int64_t* idx, float* weights, int nthreads) {
  const bool grouped = groups > 0 && topk_groups < groups;
  const int64_t per_group = grouped ? E / groups : E;
  const int threads = T * E < 65536 ? 1 : std::max(1, nthreads);
  pk::parallel_blocks(T, threads, [&](int64_t t0, int64_t t1) {
    std::vector<float> biased(static_cast<size_t>(E)), gscore(static_cast<size_t>(groups > 0 ? groups : 1));
    std::vector<int64_t> order, keep(static_cast<size_t>(groups > 0 ? groups : 1)), best(static_cast<size_t>(k));
    for (int64_t t = t0; t < t1; ++t) {
      const float* s = scores + t * E;
      std::memcpy(biased.data(), ranked + t * E, static_cast<size_t>(E) * 4);
      if (grouped) {
        const int64_t top = std::min<int64_t>(2, per_group);
        for (int64_t g = 0; g < groups; ++g) {
          // sum of the group's `top` largest biased scores, largest first (as topk(...).values.sum())
          float v0 = -INFINITY, v1 = -INFINITY;
          for (int64_t e = g * per_group; e < (g + 1) * per_group; ++e) {
            const float v = biased[e];
            if (v > v0) {
              v1 = v0;
              v0 = v;
            } else if (v > v1) {
              v1 = v;
            }
          }
          gscore[g] = top == 2 ? v0 + v1 : v0;
        }
        stable_top(gscore.data(), groups, topk_groups, keep.data(), order);
        std::vector<bool> kept(static_cast<size_t>(groups), false);
        for (int64_t j = 0; j < topk_groups; ++j) kept[keep[j]] = true;
        for (int64_t g = 0; g < groups; ++g)
          if (!kept[g])
            for (int64_t e = g * per_group; e < (g + 1) * per_group; ++e) biased[e] = -INFINITY;
      }
      stable_top(biased.data(), E, k, best.data(), order);
      float sum = 0.0f;
      for (int64_t j = 0; j < k; ++j) sum += s[best[j]];
      const float denom = sum + 1e-20f;
      for (int64_t j = 0; j < k; ++j) {
        float w = s[best[j]];
        if (normalize) w = w / denom;
        w = w * scaling;
        const bool off = mask && !mask[t];
        idx[t * k + j] = off ? -1 : best[j];
        weights[t * k + j] = off ? 0.0f : w;
      }
    }
  });
}

// x: T rows of row_bytes (src_ld bytes apart); ttp: [T, k] int32/int64 positions (negative: none);
// out: P rows of row_bytes (out_ld bytes apart): row p gets the token mapped to it, else zeros.
// The same for the 4-byte scales (S per row, any strides in bytes) when x_sf is given.
PK_EXPORT void pk_expand(const void* x, int64_t T, int64_t row_bytes, int64_t src_ld, const void* x_sf, int64_t S,
                         int64_t sf_row, int64_t sf_col, const void* ttp, int idx64, int64_t k, void* out, int64_t P,
                         int64_t out_ld, void* out_sf, int64_t out_sf_row, int64_t out_sf_col, int nthreads) {
  std::vector<int64_t> token(static_cast<size_t>(P), -1);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < k; ++j) {
      const int64_t p = idx64 ? static_cast<const int64_t*>(ttp)[t * k + j] : static_cast<const int32_t*>(ttp)[t * k + j];
      if (p >= 0 && p < P) token[p] = t;
    }
  const int threads = double(P) * double(row_bytes) < 262144.0 ? 1 : std::max(1, nthreads);
  pk::parallel_blocks(P, threads, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) {
      uint8_t* o = static_cast<uint8_t*>(out) + p * out_ld;
      const int64_t t = token[p];
      if (t >= 0)
        std::memcpy(o, static_cast<const uint8_t*>(x) + t * src_ld, static_cast<size_t>(row_bytes));
      else
        std::memset(o, 0, static_cast<size_t>(row_bytes));
      if (out_sf) {
        uint8_t* os = static_cast<uint8_t*>(out_sf) + p * out_sf_row;
        const uint8_t* is = t >= 0 ? static_cast<const uint8_t*>(x_sf) + t * sf_row : nullptr;
        for (int64_t j = 0; j < S; ++j) {
          uint32_t v = 0;
          if (is) std::memcpy(&v, is + j * sf_col, 4);
          std::memcpy(os + j * out_sf_col, &v, 4);
        }
      }
    }
  });
}

// x: bf16/fp32 [P, H] contiguous (x_bf16); x_sf fp32 [P] or null; weights fp32 [T, k] or null;
// ttp [T, k]; out [T, H]: fp32, bf16 or (fp8) e4m3 = clamp(sum * sf, +-448).
PK_EXPORT void pk_reduce(const void* x, int x_bf16, int64_t P, int64_t H, const float* x_sf, const float* weights,
                         const void* ttp, int idx64, int64_t T, int64_t k, const float* sf, int out_kind, void* out,
                         int nthreads) {
  // out_kind: 0 fp32, 1 bf16, 2 fp8 e4m3
  const int threads = double(T) * double(k) * double(H) < 65536.0 ? 1 : std::max(1, nthreads);
  pk::parallel_blocks(T, threads, [&](int64_t t0, int64_t t1) {
    std::vector<float> acc(static_cast<size_t>(H));
    for (int64_t t = t0; t < t1; ++t) {
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int64_t j = 0; j < k; ++j) {
        const int64_t p = idx64 ? static_cast<const int64_t*>(ttp)[t * k + j] : static_cast<const int32_t*>(ttp)[t * k + j];
        if (p < 0 || p >= P) continue;
        float scale = weights ? weights[t * k + j] : 1.0f;
        if (x_sf) scale = scale * x_sf[p];
        int64_t h = 0;
        if (x_bf16) {
          const uint16_t* row = static_cast<const uint16_t*>(x) + p * H;
#if defined(__AVX512F__)
          const __m512 vs = _mm512_set1_ps(scale);
          for (; h + 16 <= H; h += 16) {
            const __m512 v = pk::bf16x16_to_f32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + h)));
            // one rounding per term, as TileKernels' kernel (an fma, not a multiply then an add)
            _mm512_storeu_ps(acc.data() + h, _mm512_fmadd_ps(v, vs, _mm512_loadu_ps(acc.data() + h)));
          }
#endif
          for (; h < H; ++h) acc[h] = std::fma(pk::bf16_to_f32(row[h]), scale, acc[h]);
        } else {
          const float* row = static_cast<const float*>(x) + p * H;
          for (; h < H; ++h) acc[h] = std::fma(row[h], scale, acc[h]);
        }
      }
      const float osf = sf ? sf[0] : 1.0f;
      if (out_kind == 0) {
        std::memcpy(static_cast<float*>(out) + t * H, acc.data(), static_cast<size_t>(H) * 4);
      } else if (out_kind == 1) {
        uint16_t* o = static_cast<uint16_t*>(out) + t * H;
        for (int64_t h = 0; h < H; ++h) o[h] = pk::f32_to_bf16(acc[h]);
      } else {
        uint8_t* o = static_cast<uint8_t*>(out) + t * H;
        for (int64_t h = 0; h < H; ++h) {
          float v = sf ? acc[h] * osf : acc[h];
          if (!std::isnan(v)) v = std::min(pk::kFp8Max, std::max(-pk::kFp8Max, v));
          o[h] = pk::f32_to_fp8(v);
        }
      }
    }
  });
}

// get_fused_mapping as one counting sort: idx [T, k] (int32, or int64 when idx64) of experts < E,
// negative = padding; P rows of the buffer; segments aligned to `align` rows. Rows of one expert
// follow (token, slot) order, as the reference's stable sort leaves them. Writes the seven int32
// outputs (see mapping.py). Returns 0, -1 when an index is >= E, -2 when the segments need more
// than P rows (nothing is written past any output in either case).
PK_EXPORT int pk_fused_mapping(const void* idx, int idx64, int64_t T, int64_t k, int64_t E, int64_t P, int64_t align,
                               int32_t* pos_to_expert, int32_t* pos_to_token, int32_t* pos_to_token_topk,
                               int32_t* token_topk_to_pos, int32_t* start, int32_t* end, int32_t* aligned) {
  const int64_t n = T * k;
  auto expert = [&](int64_t i) -> int64_t {
    return idx64 ? static_cast<const int64_t*>(idx)[i] : static_cast<const int32_t*>(idx)[i];
  };
  std::vector<int64_t> count(static_cast<size_t>(E), 0);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t e = expert(i);
    if (e >= E) return -1;
    if (e >= 0) ++count[e];
  }
  int64_t rows = 0;
  for (int64_t e = 0; e < E; ++e) {
    const int64_t a = (count[e] + align - 1) / align * align;
    start[e] = static_cast<int32_t>(rows);
    aligned[e] = static_cast<int32_t>(a);
    rows += a;
    end[e] = static_cast<int32_t>(rows);
  }
  if (rows > P) return -2;
  std::fill(pos_to_expert, pos_to_expert + P, -1);
  std::fill(pos_to_token, pos_to_token + P, -1);
  std::fill(pos_to_token_topk, pos_to_token_topk + P, -1);
  for (int64_t e = 0; e < E; ++e) std::fill(pos_to_expert + start[e], pos_to_expert + start[e] + count[e], int32_t(e));
  std::vector<int64_t> next(start, start + E);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t e = expert(i);
    if (e < 0) {
      token_topk_to_pos[i] = -1;
      continue;
    }
    const int64_t pos = next[e]++;
    token_topk_to_pos[i] = static_cast<int32_t>(pos);
    pos_to_token_topk[pos] = static_cast<int32_t>(i);
    pos_to_token[pos] = static_cast<int32_t>(i / k);
  }
  return 0;
}
