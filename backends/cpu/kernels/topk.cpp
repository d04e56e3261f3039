// topk.cpp — the cpu backend's native top-k (DeepSelect semantics): per row, a radix select finds
// the key of the k-th largest valid element, then one scan in index order emits every element
// above it and the first ties, so indices come out ascending (the "sorted_index" order, also a
// valid unordered result); `sorted` then orders the k selections by value. Rows run in parallel.
//
// Keys: an fp32 (or bf16, widened) value maps to an unsigned key whose order is the value order
// (-0 is mapped to +0, so the two zeros tie as the contract says). NaN never reaches here: the
// contract refuses NaN inside a valid range before any provider runs. Lengths are clamped to the
// row, so no value of `end` can make this read out of bounds.
#include "pk_native.h"
#include "pk_pool.h"

#include <vector>

namespace {

inline uint32_t key_of_bits(uint32_t u) {
  if (u == 0x80000000u) u = 0;  // -0 ties with +0
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// bf16 keys keep their 16 significant bits on top and zeros below (so 2 radix digits decide them)
inline uint32_t key_of_bf16(uint16_t h) {
  if (h == 0x8000u) h = 0;
  const uint32_t k = (h & 0x8000u) ? uint32_t(uint16_t(~h)) : uint32_t(h | 0x8000u);
  return k << 16;
}

struct Row {
  const void* data;
  bool bf16;
  inline uint32_t key(int64_t i) const {
    return bf16 ? key_of_bf16(static_cast<const uint16_t*>(data)[i])
                : key_of_bits(static_cast<const uint32_t*>(data)[i]);
  }
};

// Key of the cnt-th largest of the first len keys (1 <= cnt < len) and how many elements equal to
// it belong to the selection. Digits of 8 bits from the top; after the first pass only the keys of
// the chosen bucket are kept (compacted), so later passes touch few elements.
void radix_select(const Row& row, int64_t len, int64_t cnt, std::vector<uint32_t>& cand, uint32_t* out_key,
                  int64_t* out_ties) {
  const int digits = row.bf16 ? 2 : 4;  // bf16 keys carry 16 significant bits
  uint32_t prefix = 0, prefix_mask = 0;
  int64_t need = cnt;  // how many of the remaining candidates (matching the prefix) to take
  bool compacted = false;
  int64_t ncand = len;
  for (int d = 0; d < digits; ++d) {
    const int shift = 24 - 8 * d;
    // two interleaved histograms: consecutive equal digits do not wait on each other's increments
    uint32_t h2[2][256] = {};
    if (!compacted) {
      int64_t i = 0;
      for (; i + 1 < len; i += 2) {
        const uint32_t k0 = row.key(i), k1 = row.key(i + 1);
        h2[0][(k0 >> shift) & 0xFF] += (k0 & prefix_mask) == prefix;
        h2[1][(k1 >> shift) & 0xFF] += (k1 & prefix_mask) == prefix;
      }
      for (; i < len; ++i) {
        const uint32_t k = row.key(i);
        h2[0][(k >> shift) & 0xFF] += (k & prefix_mask) == prefix;
      }
    } else {
      for (int64_t i = 0; i < ncand; ++i) ++h2[i & 1][(cand[i] >> shift) & 0xFF];
    }
    int64_t hist[256];
    for (int j = 0; j < 256; ++j) hist[j] = int64_t(h2[0][j]) + h2[1][j];
    int b = 255;
    int64_t above = 0;
    for (; b > 0 && above + hist[b] < need; --b) above += hist[b];
    need -= above;
    prefix |= uint32_t(b) << shift;
    prefix_mask |= 0xFFu << shift;
    if (d + 1 < digits) {
      // keep the chosen bucket's keys for the next digit
      const int64_t keep = hist[b];
      if (!compacted) {
        cand.resize(static_cast<size_t>(keep));
        int64_t j = 0;
        for (int64_t i = 0; i < len && j < keep; ++i) {
          const uint32_t k = row.key(i);
          if ((k & prefix_mask) == prefix) cand[j++] = k;
        }
        compacted = true;
      } else {
        int64_t j = 0;
        for (int64_t i = 0; i < ncand; ++i)
          if ((cand[i] & prefix_mask) == prefix) cand[j++] = cand[i];
      }
      ncand = keep;
    }
  }
  *out_key = prefix;
  *out_ties = need;
}

// Small k: one pass in index order keeps the k best (value, index) pairs sorted by value; an element
// enters only when strictly larger than the current k-th best, so among equal values the earlier
// index stays (ties to the smaller index). Most elements are rejected 16 at a time by one compare.
constexpr int64_t SMALL_K = 32;

inline float value_at(const Row& row, int64_t i) {
  return row.bf16 ? pk::bf16_to_f32(static_cast<const uint16_t*>(row.data)[i])
                  : static_cast<const float*>(row.data)[i];
}

int64_t small_select(const Row& row, int64_t len, int64_t cnt, int64_t* sel) {
  float best[SMALL_K];
  int64_t where[SMALL_K];
  int64_t have = 0;
  auto offer = [&](float v, int64_t i) {
    if (have == cnt && !(v > best[cnt - 1])) return;
    int64_t j = have < cnt ? have++ : cnt - 1;
    while (j > 0 && v > best[j - 1]) {  // strictly greater: equal values keep their earlier index first
      best[j] = best[j - 1];
      where[j] = where[j - 1];
      --j;
    }
    best[j] = v;
    where[j] = i;
  };
  int64_t i = 0;
  for (; i < len && have < cnt; ++i) offer(value_at(row, i), i);
#if defined(__AVX512F__)
  if (!row.bf16) {
    const float* x = static_cast<const float*>(row.data);
    for (; i + 16 <= len; i += 16) {
      __mmask16 m = _mm512_cmp_ps_mask(_mm512_loadu_ps(x + i), _mm512_set1_ps(best[cnt - 1]), _CMP_GT_OQ);
      while (m) {
        const int l = __builtin_ctz(m);
        m &= m - 1;
        offer(x[i + l], i + l);
      }
    }
  }
#endif
  for (; i < len; ++i) offer(value_at(row, i), i);
  // -0 and +0 compare equal above, so the k best are a valid selection; emit in index order
  for (int64_t j = 0; j < have; ++j) sel[j] = where[j];
  std::sort(sel, sel + have);
  return have;
}

// Whether the first len values hold a NaN (the contract refuses NaN inside a row's valid range).
bool has_nan(const Row& row, int64_t len) {
  int64_t i = 0;
  if (row.bf16) {
    const uint16_t* x = static_cast<const uint16_t*>(row.data);
#if defined(__AVX512BW__)
    for (; i + 32 <= len; i += 32) {
      const __m512i v = _mm512_and_si512(_mm512_loadu_si512(x + i), _mm512_set1_epi16(0x7FFF));
      if (_mm512_cmpgt_epu16_mask(v, _mm512_set1_epi16(0x7F80))) return true;
    }
#endif
    for (; i < len; ++i)
      if ((x[i] & 0x7FFF) > 0x7F80) return true;
    return false;
  }
  const float* x = static_cast<const float*>(row.data);
#if defined(__AVX512F__)
  for (; i + 16 <= len; i += 16) {
    const __m512 v = _mm512_loadu_ps(x + i);
    if (_mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q)) return true;
  }
#endif
  for (; i < len; ++i)
    if (std::isnan(x[i])) return true;
  return false;
}

template <typename Idx>
void topk_row(const Row& row, int64_t len, int64_t topk, bool sorted, Idx* idx, Idx idx_fill, void* values,
              uint32_t value_fill, std::vector<uint32_t>& cand, std::vector<int64_t>& sel) {
  const int64_t cnt = std::min(topk, len);
  int64_t emitted = 0;
  sel.resize(static_cast<size_t>(cnt));
  if (cnt == len) {
    for (int64_t i = 0; i < len; ++i) sel[i] = i;
    emitted = len;
  } else if (cnt <= SMALL_K) {
    emitted = small_select(row, len, cnt, sel.data());
  } else {
    uint32_t t;
    int64_t ties;
    radix_select(row, len, cnt, cand, &t, &ties);
    for (int64_t i = 0; i < len && emitted < cnt; ++i) {
      const uint32_t k = row.key(i);
      if (k > t || (k == t && ties-- > 0)) sel[emitted++] = i;
    }
  }
  if (sorted && emitted > 1) {
    std::sort(sel.begin(), sel.begin() + emitted, [&](int64_t x, int64_t y) {
      const uint32_t kx = row.key(x), ky = row.key(y);
      return kx != ky ? kx > ky : x < y;
    });
  }
  for (int64_t j = 0; j < emitted; ++j) idx[j] = Idx(sel[j]);
  for (int64_t j = emitted; j < topk; ++j) idx[j] = idx_fill;
  if (values) {
    if (row.bf16) {
      uint16_t* v = static_cast<uint16_t*>(values);
      const uint16_t* src = static_cast<const uint16_t*>(row.data);
      for (int64_t j = 0; j < emitted; ++j) v[j] = src[sel[j]];
      for (int64_t j = emitted; j < topk; ++j) v[j] = uint16_t(value_fill);
    } else {
      uint32_t* v = static_cast<uint32_t*>(values);
      const uint32_t* src = static_cast<const uint32_t*>(row.data);
      for (int64_t j = 0; j < emitted; ++j) v[j] = src[sel[j]];
      for (int64_t j = emitted; j < topk; ++j) v[j] = value_fill;
    }
  }
}

template <typename Idx>
int64_t topk_all(const void* input, bool bf16, int64_t b, int64_t n, int64_t row_stride, const int32_t* end,
              int64_t topk, bool sorted, Idx* indices, Idx idx_fill, void* values, uint32_t value_fill,
              int nthreads) {
  const int64_t elem = bf16 ? 2 : 4;
  const double work = double(b) * double(n);
  const int threads = (b < 2 || work < 65536.0) ? 1 : std::max<int>(1, std::min<int64_t>(nthreads, b));
  // one row into its outputs; false (outputs untouched) when the row holds NaN in its valid range
  auto run_row = [&](int64_t r, std::vector<uint32_t>& cand, std::vector<int64_t>& sel) {
    int64_t len = end ? int64_t(end[r]) : n;
    len = std::min<int64_t>(std::max<int64_t>(len, 0), n);
    Row row{static_cast<const uint8_t*>(input) + r * row_stride * elem, bf16};
    if (has_nan(row, len)) return false;
    void* vrow = values ? static_cast<uint8_t*>(values) + r * topk * elem : nullptr;
    topk_row<Idx>(row, len, topk, sorted, indices + r * topk, idx_fill, vrow, value_fill, cand, sel);
    return true;
  };
  // (one thread: one block on the calling thread, no worker woken)
  return pk::parallel_blocks_sum(b, threads, [&](int64_t r0, int64_t r1) {
    std::vector<uint32_t> cand;
    std::vector<int64_t> sel;
    int64_t nan_rows = 0;
    for (int64_t r = r0; r < r1; ++r) nan_rows += run_row(r, cand, sel) ? 0 : 1;
    return nan_rows;
  });
}

}  // namespace

// One top-k call's arguments, packed by the Python wrapper (topk.py, `_CALL`: 14 native int64 words,
// pointers as addresses) into a per-thread buffer, so a call crosses ctypes with one pointer.
// input: fp32 or bf16 [b, n] with rows row_stride elements apart (unit stride inside a row);
// end: int32 [b] or null; indices: int32/int64 [b, topk]; values: input's dtype [b, topk] or null;
// value_fill: the fill's bits in input's dtype.
struct TopkCall {
  const void* input;
  int64_t bf16, b, n, row_stride;
  const int32_t* end;
  int64_t topk, sorted;
  void* indices;
  int64_t idx64, idx_fill;
  void* values;
  int64_t value_fill, threads;
};
static_assert(sizeof(void*) == 8 && sizeof(TopkCall) == 14 * 8, "TopkCall is 14 int64 words (topk.py packs it)");

// Size of TopkCall in bytes (the wrapper checks it matches what it packs).
PK_EXPORT int64_t pk_topk_call_size() { return sizeof(TopkCall); }

// Returns the number of rows holding NaN in their valid range (their outputs are not written; the
// caller raises the contract's error).
PK_EXPORT int64_t pk_topk(const TopkCall* p) {
  const bool bf16 = p->bf16 != 0, sorted = p->sorted != 0;
  const uint32_t value_fill = uint32_t(p->value_fill);
  const int threads = pk::thread_count(int(p->threads));
  if (p->idx64)
    return topk_all<int64_t>(p->input, bf16, p->b, p->n, p->row_stride, p->end, p->topk, sorted,
                             static_cast<int64_t*>(p->indices), p->idx_fill, p->values, value_fill, threads);
  return topk_all<int32_t>(p->input, bf16, p->b, p->n, p->row_stride, p->end, p->topk, sorted,
                           static_cast<int32_t*>(p->indices), int32_t(p->idx_fill), p->values, value_fill, threads);
}
