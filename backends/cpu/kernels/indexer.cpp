// indexer.cpp — the cpu backend's native lightning-indexer logits (DeepSeek-V3.2):
// logits[i, j] = sum_h relu(q[i, h, :] · K[j, :]) · w[i, h], K = fp8 keys times their fp32 scale, for
// fp8_mqa_logits (keys [N, D] and one scale each) and fp8_paged_mqa_logits (layouts.indexer_cache).
//
// Work: rows are grouped (prefill: QT consecutive rows; paged: one sequence's next_n rows), each
// group's key range (the union of its rows') is cut into chunks, and a task is one (group, chunk).
// A task widens its rows' queries to fp32 once, then walks its chunk in panels of JB keys: a panel is
// dequantized once, stored d-major (Kt[d][JB]: value · scale in fp32, as the reference dequantizes
// before its dot product) and used by every head of every row of the group. The vectors run over
// keys, not over D: each lane is one key whose dot product is a plain FMA chain over d in order and
// whose head sum is a plain chain over h in order, so no horizontal sum is needed and the AVX-512,
// AVX2 and NEON builds give bit-identical logits; the generic build multiplies then adds (baseline
// x86-64 has no FMA), which rounds differently within the contract's tolerance.
//
// FP4 (fp4 = 1, DeepGEMM's SM100 form): q rows and keys are packed E2M1 codes (two per byte, low
// nibble first; D/2 bytes a row) with one 32-bit word of UE8M0 exponents per row (one per 32
// channels): q_words per (row, head), the keys' words where the FP8 form keeps its fp32 scale. They
// are decoded to fp32 exactly (code value times a power of two) by scalar code on every build, then
// run the same FMA engine, so FP4 results are bit-identical across ISA builds as FP8 ones are.
//
// Only the valid entries are written (the op pre-fills -inf). A row whose range leaves the keys or the
// logits width is skipped and a cache block reference outside the table or the cache reads as a zero
// key; both are counted and the wrapper raises (the op's checks make them impossible).
#include "pk_native.h"
#include "pk_pool.h"

#include <vector>

#include "simd_f32.h"

namespace {

using namespace pk_simd;  // VL, NV, MR and the vector primitives of this build
constexpr int JB = VL * NV;      // keys per panel (one register row of accumulators)
constexpr int64_t QT = 8;        // prefill rows per group
constexpr int64_t CHUNK_ALIGN = 64;  // chunks are whole panels on every build (64 = lcm of the JBs)
constexpr double SERIAL_WORK = 1.6e7;  // FMA lanes of a call run without a parallel region

// e4m3fn byte -> fp32 (exact; 0x7F / 0xFF NaN), built once
struct Fp8Table {
  float v[256];
  Fp8Table() { for (int b = 0; b < 256; ++b) v[b] = pk::fp8_to_f32(uint8_t(b)); }
};
const Fp8Table& fp8_table() {
  static const Fp8Table t;
  return t;
}

// One indexer call's arguments, packed by the Python wrapper (providers/indexer.py, `_CALL`: 28
// native 64-bit words, pointers as addresses). d is the head dim (FP4: D, the rows holding D/2 bytes). Prefill: kv/sf set, start/end per row, lens null.
// Paged: lens per row (b * next_n + t), cache/table set. Strides are in elements (bytes for the cache).
struct IndexerCall {
  const uint8_t* q;
  int64_t rows, heads, d;
  const void* weights;
  int64_t w_bf16, w_stride;
  const int32_t* start;
  const int32_t* end;
  int64_t compressed;
  const uint8_t* kv;
  const float* sf;
  int64_t n;  // prefill: keys; paged: cache blocks
  const int32_t* lens;
  int64_t next_n;
  const uint8_t* cache;
  const int32_t* table;
  int64_t table_stride, table_cols, block_kv, block_stride;
  void* out;
  int64_t out_bf16, out_stride, width, threads;
  const uint32_t* q_words;  // FP4: one exponent word per (row, head); null for FP8
  int64_t fp4;
};
static_assert(sizeof(void*) == 8 && sizeof(IndexerCall) == 28 * 8, "IndexerCall is 28 int64 words (indexer.py packs it)");

// bytes of one q-head or key row: D fp8 values, or D/2 bytes of FP4 codes
inline int64_t row_bytes(const IndexerCall& c) { return c.fp4 ? c.d / 2 : c.d; }

// E2M1 code -> value (the negative-zero code as +0, as the reference decodes it)
constexpr float E2M1[16] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f,
                            0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

// 2^(e - 127) of a UE8M0 exponent byte (e = 0: the fp32 subnormal 2^-127)
inline float ue8m0_value(uint32_t e) {
  const uint32_t bits = e == 0 ? 0x00400000u : (e << 23);
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// fp32 values of one FP4 row: D codes from D/2 bytes, exponent byte k of `word` for channels 32k..32k+31
inline void decode_fp4_row(const uint8_t* row, uint32_t word, int64_t D, float* out, int64_t stride) {
  for (int64_t d = 0; d < D; ++d) {
    const uint8_t byte = row[d >> 1];
    const float scale = ue8m0_value((word >> (8 * (d >> 5))) & 0xFFu);
    out[d * stride] = E2M1[(d & 1) ? (byte >> 4) : (byte & 0xF)] * scale;
  }
}

struct Group {
  int64_t r0, nr, seq, lo, hi;  // rows [r0, r0 + nr), sequence (paged) or -1, keys [lo, hi)
};
struct Task {
  int64_t group, k0, k1;
};

// Row r's keys [s, e) and the column of key j (j - off).
struct RowRange {
  int64_t s, e, off;
};

inline RowRange row_range(const IndexerCall& c, int64_t r, int64_t* bad) {
  RowRange rr{0, 0, 0};
  if (c.lens) {
    rr.e = c.lens[r];
    if (rr.e < 0 || rr.e > c.width) {
      ++*bad;
      rr.e = 0;
    }
    return rr;
  }
  rr.s = c.start[r];
  rr.e = c.end[r];
  if (rr.s < 0 || rr.e > c.n || (c.compressed && rr.e - rr.s > c.width) || (!c.compressed && rr.e > c.width)) {
    ++*bad;
    rr.s = rr.e = 0;
  }
  if (rr.e < rr.s) rr.e = rr.s;
  rr.off = c.compressed ? rr.s : 0;
  return rr;
}

// The fp8 row and scale of key j of a group (nullptr: a bad block reference, counted by the caller).
inline const uint8_t* key_row(const IndexerCall& c, int64_t seq, int64_t j, float* scale) {
  const int64_t rb = row_bytes(c);
  if (seq < 0) {
    *scale = c.sf[j];  // FP4: the key's exponent word, carried as 4 bytes
    return c.kv + j * rb;
  }
  const int64_t col = j / c.block_kv, slot = j - col * c.block_kv;
  if (col >= c.table_cols) return nullptr;
  const int64_t blk = c.table[seq * c.table_stride + col];
  if (blk < 0 || blk >= c.n) return nullptr;
  const uint8_t* base = c.cache + blk * c.block_stride;
  std::memcpy(scale, base + c.block_kv * rb + 4 * slot, 4);
  return base + slot * rb;
}

// Kt[d * JB + jj] = value · scale of key j0 + jj (lanes >= cnt zero). Full panels transpose in
// registers; every path computes fp8 value (exact) times scale, so all give the same bits.
int64_t decode_panel(const IndexerCall& c, int64_t seq, int64_t j0, int64_t cnt, float* kt) {
  const int64_t D = c.d;
  const uint8_t* rows[JB];
  float scales[JB];
  int64_t bad = 0;
  for (int64_t jj = 0; jj < JB; ++jj) {
    rows[jj] = jj < cnt ? key_row(c, seq, j0 + jj, &scales[jj]) : nullptr;
    if (jj < cnt && rows[jj] == nullptr) ++bad;
  }
  if (c.fp4) {
    for (int64_t jj = 0; jj < JB; ++jj) {
      if (rows[jj] == nullptr) {
        for (int64_t d = 0; d < D; ++d) kt[d * JB + jj] = 0.0f;
        continue;
      }
      uint32_t word;
      std::memcpy(&word, &scales[jj], 4);
      decode_fp4_row(rows[jj], word, D, kt + jj, JB);
    }
    return bad;
  }
  int64_t d0 = 0;
  if (cnt == JB && bad == 0) {
#if defined(__AVX512F__)
    for (; d0 + 16 <= D; d0 += 16)
      for (int g = 0; g < JB; g += 16) {
        __m512i r[16];
        for (int k = 0; k < 16; ++k) {
          const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(rows[g + k] + d0));
          r[k] = _mm512_castps_si512(_mm512_mul_ps(pk::fp8x16_to_f32(bytes), _mm512_set1_ps(scales[g + k])));
        }
        pk::transpose16(r);
        for (int e = 0; e < 16; ++e) _mm512_storeu_si512(kt + (d0 + e) * JB + g, r[e]);
      }
#elif defined(__AVX2__)
    for (; d0 + 8 <= D; d0 += 8)
      for (int g = 0; g < JB; g += 8) {
        __m256 r[8];
        for (int k = 0; k < 8; ++k) {
          const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(rows[g + k] + d0));
          const __m256 v = _mm256_mul_ps(pk::fp8x8_to_f32_scaled(bytes), _mm256_set1_ps(256.0f));
          r[k] = _mm256_mul_ps(v, _mm256_set1_ps(scales[g + k]));
        }
        const __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
        const __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
        const __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
        const __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
        const __m256 s0 = _mm256_shuffle_ps(t0, t2, 0x44), s1 = _mm256_shuffle_ps(t0, t2, 0xEE);
        const __m256 s2 = _mm256_shuffle_ps(t1, t3, 0x44), s3 = _mm256_shuffle_ps(t1, t3, 0xEE);
        const __m256 s4 = _mm256_shuffle_ps(t4, t6, 0x44), s5 = _mm256_shuffle_ps(t4, t6, 0xEE);
        const __m256 s6 = _mm256_shuffle_ps(t5, t7, 0x44), s7 = _mm256_shuffle_ps(t5, t7, 0xEE);
        const __m256 o[8] = {_mm256_permute2f128_ps(s0, s4, 0x20), _mm256_permute2f128_ps(s1, s5, 0x20),
                             _mm256_permute2f128_ps(s2, s6, 0x20), _mm256_permute2f128_ps(s3, s7, 0x20),
                             _mm256_permute2f128_ps(s0, s4, 0x31), _mm256_permute2f128_ps(s1, s5, 0x31),
                             _mm256_permute2f128_ps(s2, s6, 0x31), _mm256_permute2f128_ps(s3, s7, 0x31)};
        for (int e = 0; e < 8; ++e) _mm256_storeu_ps(kt + (d0 + e) * JB + g, o[e]);
      }
#endif
  }
  const float* table = fp8_table().v;
  for (int64_t jj = 0; jj < JB; ++jj) {
    const uint8_t* row = rows[jj];
    if (row == nullptr) {
      for (int64_t d = d0; d < D; ++d) kt[d * JB + jj] = 0.0f;
      continue;
    }
    const float s = scales[jj];
    for (int64_t d = d0; d < D; ++d) kt[d * JB + jj] = table[row[d]] * s;
  }
  return bad;
}

// fp32 copy of one fp8 query row [H][D] (exact; vector decode where the build has one).
void decode_query(const uint8_t* q, int64_t count, float* out) {
  int64_t i = 0;
#if defined(__AVX512F__)
  for (; i + 16 <= count; i += 16)
    _mm512_storeu_ps(out + i, pk::fp8x16_to_f32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q + i))));
#elif defined(__AVX2__)
  for (; i + 16 <= count; i += 16) {
    __m256 lo, hi;
    pk::fp8x16_to_f32x2_scaled(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q + i)), &lo, &hi);
    _mm256_storeu_ps(out + i, _mm256_mul_ps(lo, _mm256_set1_ps(256.0f)));
    _mm256_storeu_ps(out + i + 8, _mm256_mul_ps(hi, _mm256_set1_ps(256.0f)));
  }
#endif
  const float* table = fp8_table().v;
  for (; i < count; ++i) out[i] = table[q[i]];
}

// acc[JB] += sum over R heads of relu(qf[r] · Kt) · w[r], heads in order.
template <int R>
inline void heads_block(const float* qf, int64_t D, const float* kt, const float* w, vec acc[NV]) {
  vec c[R][NV];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < NV; ++v) c[r][v] = vzero();
#pragma GCC unroll 4
  for (int64_t d = 0; d < D; ++d) {
    vec b[NV];
    for (int v = 0; v < NV; ++v) b[v] = vload(kt + d * JB + v * VL);
    for (int r = 0; r < R; ++r) {
      const vec x = vbcast(qf[r * D + d]);
      for (int v = 0; v < NV; ++v) c[r][v] = vfma(x, b[v], c[r][v]);
    }
  }
  for (int r = 0; r < R; ++r) {
    const vec wr = vbcast(w[r]);
    for (int v = 0; v < NV; ++v) acc[v] = vadd(acc[v], vmul(vrelu(c[r][v]), wr));
  }
}

// out[JB] = one row's logits for the panel's keys.
void row_panel(const float* qf, const float* w, int64_t H, int64_t D, const float* kt, float* out) {
  vec acc[NV];
  for (int v = 0; v < NV; ++v) acc[v] = vzero();
  int64_t h = 0;
  for (; h + MR <= H; h += MR) heads_block<MR>(qf + h * D, D, kt, w + h, acc);
  switch (H - h) {
    case 1: heads_block<1>(qf + h * D, D, kt, w + h, acc); break;
    case 2: heads_block<2>(qf + h * D, D, kt, w + h, acc); break;
    case 3: heads_block<3>(qf + h * D, D, kt, w + h, acc); break;
    case 4: heads_block<4>(qf + h * D, D, kt, w + h, acc); break;
    case 5: heads_block<5>(qf + h * D, D, kt, w + h, acc); break;
    default: break;
  }
  for (int v = 0; v < NV; ++v) vstore(out + v * VL, acc[v]);
}

struct Scratch {
  std::vector<float> qf, wf, kt;
  float tmp[JB];
};

int64_t run_task(const IndexerCall& c, const Group& g, int64_t k0, int64_t k1, Scratch& s) {
  const int64_t H = c.heads, D = c.d;
  s.qf.resize(size_t(g.nr * H * D));
  s.wf.resize(size_t(g.nr * H));
  s.kt.resize(size_t(D * JB));
  int64_t bad = 0;
  RowRange ranges[QT];
  for (int64_t k = 0; k < g.nr; ++k) {
    const int64_t r = g.r0 + k;
    int64_t ignored = 0;  // bad rows are counted once, by the planner
    ranges[k] = row_range(c, r, &ignored);
    if (c.fp4)
      for (int64_t h = 0; h < H; ++h)
        decode_fp4_row(c.q + (r * H + h) * (D / 2), c.q_words[r * H + h], D, s.qf.data() + (k * H + h) * D, 1);
    else
      decode_query(c.q + r * H * D, H * D, s.qf.data() + k * H * D);
    for (int64_t h = 0; h < H; ++h)
      s.wf[k * H + h] = c.w_bf16 ? pk::bf16_to_f32(static_cast<const uint16_t*>(c.weights)[r * c.w_stride + h])
                                 : static_cast<const float*>(c.weights)[r * c.w_stride + h];
  }
  for (int64_t j0 = k0; j0 < k1; j0 += JB) {
    const int64_t cnt = std::min<int64_t>(JB, k1 - j0);
    bool any = false;
    for (int64_t k = 0; k < g.nr; ++k) any = any || (ranges[k].s < j0 + cnt && ranges[k].e > j0);
    if (!any) continue;
    bad += decode_panel(c, g.seq, j0, cnt, s.kt.data());
    for (int64_t k = 0; k < g.nr; ++k) {
      const RowRange& rr = ranges[k];
      const int64_t lo = std::max(rr.s, j0), hi = std::min(rr.e, j0 + cnt);
      if (lo >= hi) continue;
      row_panel(s.qf.data() + k * H * D, s.wf.data() + k * H, H, D, s.kt.data(), s.tmp);
      const int64_t r = g.r0 + k;
      if (c.out_bf16) {
        uint16_t* o = static_cast<uint16_t*>(c.out) + r * c.out_stride - rr.off;
        for (int64_t j = lo; j < hi; ++j) o[j] = pk::f32_to_bf16(s.tmp[j - j0]);
      } else {
        float* o = static_cast<float*>(c.out) + r * c.out_stride - rr.off;
        for (int64_t j = lo; j < hi; ++j) o[j] = s.tmp[j - j0];
      }
    }
  }
  return bad;
}

}  // namespace

// Size of IndexerCall in bytes (the wrapper checks it matches what it packs).
PK_EXPORT int64_t pk_indexer_call_size() { return sizeof(IndexerCall); }

// Lanes of this build's vectors (16 AVX-512, 8 AVX2, 4 NEON / generic): which ISA path was compiled.
PK_EXPORT int64_t pk_indexer_lanes() { return VL; }

// Writes the valid logits of every row. Returns the number of rows with a range outside the keys or
// the logits width plus the number of keys whose cache block reference is outside the table or the
// cache (none of them read or written); 0 for a call the op validated.
PK_EXPORT int64_t pk_indexer_logits(const IndexerCall* p) {
  const IndexerCall& c = *p;
  if (c.rows <= 0 || c.heads <= 0 || c.d <= 0) return 0;
  int64_t bad = 0;
  std::vector<Group> groups;
  const int64_t per = c.lens ? std::max<int64_t>(c.next_n, 1) : QT;
  for (int64_t r0 = 0; r0 < c.rows; r0 += per) {
    const int64_t span = std::min(per, c.rows - r0);
    // a sequence's rows share its key panels; more than QT of them are split (the panels are decoded again)
    for (int64_t k0 = 0; k0 < span; k0 += QT) {
      Group g{r0 + k0, std::min(QT, span - k0), c.lens ? r0 / per : -1, INT64_MAX, 0};
      for (int64_t k = 0; k < g.nr; ++k) {
        const RowRange rr = row_range(c, g.r0 + k, &bad);
        if (rr.e > rr.s) {
          g.lo = std::min(g.lo, rr.s);
          g.hi = std::max(g.hi, rr.e);
        }
      }
      if (g.hi > g.lo) groups.push_back(g);
    }
  }
  int64_t total = 0;
  double work = 0.0;  // FMA lanes: keys x rows x heads x D
  for (const Group& g : groups) {
    total += g.hi - g.lo;
    work += double(g.hi - g.lo) * double(g.nr) * double(c.heads) * double(c.d);
  }
  const int nthreads = pk::thread_count(int(c.threads));
  // chunks of whole 64-key panels sized so every thread gets about four tasks
  int64_t chunk = (total + 4 * nthreads - 1) / (4 * nthreads);
  chunk = std::min<int64_t>(std::max<int64_t>((chunk + CHUNK_ALIGN - 1) / CHUNK_ALIGN * CHUNK_ALIGN, CHUNK_ALIGN), 2048);
  std::vector<Task> tasks;
  for (int64_t gi = 0; gi < int64_t(groups.size()); ++gi)
    for (int64_t k0 = groups[gi].lo; k0 < groups[gi].hi; k0 += chunk)
      tasks.push_back(Task{gi, k0, std::min(groups[gi].hi, k0 + chunk)});
  const int64_t ntasks = int64_t(tasks.size());
  // below SERIAL_WORK (about 0.2 ms on one core) a parallel region costs more than it saves, and far
  // more on a machine whose cores are busy with other processes
  const int threads = (ntasks < 2 || work < SERIAL_WORK) ? 1 : int(std::min<int64_t>(nthreads, ntasks));
  if (threads == 1) {  // no parallel region for small calls: it costs more than they do
    Scratch s;
    for (const Task& t : tasks) bad += run_task(c, groups[t.group], t.k0, t.k1, s);
    return bad;
  }
  std::atomic<int64_t> bad_tasks{0};
  pk::parallel_for(ntasks, threads, [&](int64_t t) {
    static thread_local Scratch s;  // each worker's, kept between tasks and calls
    const int64_t r = run_task(c, groups[tasks[t].group], tasks[t].k0, tasks[t].k1, s);
    if (r) bad_tasks += r;
  });
  return bad + bad_tasks.load();
}
