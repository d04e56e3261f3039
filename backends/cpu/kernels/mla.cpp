// mla.cpp — the cpu backend's native MLA decode (FlashMLA's flash_mla_with_kvcache), on every CPU.
//
// A job is one group of query rows that attend the same keys: for dense decode (b, kv head) with
// rows (query token i, head of the group), for sparse decode (b, query token i) with the h_q heads.
// A task is a job's split: a range of its keys, processed in chunks of 64 keys with an online
// softmax by one of two engines: AMX (mla_amx.h: bf16 tiles, where the CPU has AMX-BF16) or FMA
// (mla_fma.h: fp32 vectors, AVX-512 / AVX2 / NEON / generic). Keys a row may not see (past its
// causal limit, -1 indices) get P = 0 and their cache slots are never read. Splits of one job are
// merged with their log-sum-exps.
// FlashMLA's sparse prefill (flash_mla_sparse_fwd) is the sparse decode of one batch over a
// [s_kv, 1, d] key array (a page of one token per row): the same jobs, plus each row's max logit,
// an attention sink and per-row topk_length (pk_mla_sparse_prefill).
// Every index was validated in Python (reject_bad_cache_references); they are clamped here anyway.
#include "pk_pool.h"
#include "mla_amx.h"
#include "mla_fma.h"

namespace {

using namespace pk_mla;

constexpr int kFma = 1, kAmx = 2;  // engine bits of pk_mla_engines

// out row = o / l (bf16), lse = m + log l, max_logits = m; with a sink, out = o / (l + e^(sink - m))
// (lse stays the keys' own); rows that saw nothing: out 0, lse +inf, max_logits -inf.
void finish_row(const Args& a, const Job& j, int64_t r, const float* o, float m, float l) {
  int64_t i, head;
  row_of(a, j, r, &i, &head);
  uint16_t* dst = a.out + ((j.b * a.s_q + i) * a.h_q + head) * DV;
  const int64_t at = lse_at(a, j.b, head, i);
  float* lse = a.lse + at;
  if (a.max_logits) a.max_logits[at] = l > 0.0f ? m : -INFINITY;
  if (!(l > 0.0f)) {
    std::memset(dst, 0, DV * 2);
    *lse = INFINITY;
    return;
  }
  const float inv = 1.0f / (a.sink ? l + std::exp(a.sink[head] - m) : l);
  for (int64_t c = 0; c < DV; ++c) dst[c] = pk::f32_to_bf16(o[c] * inv);
  *lse = m + std::log(l);
}

// The engines a thread can run: begin/end bracket each task (AMX: the tile configuration).
struct FmaEngine {
  using Work = fma::Work;
  static void begin() {}
  static void end() {}
  static void run(const Args& a, const Job& j, int64_t k0, int64_t k1, Work& w) { fma::run_task(a, j, k0, k1, w); }
};
#ifdef PK_MLA_AMX
struct AmxEngine {
  using Work = amx::Work;
  static void begin() { amx::tile_config(); }
  static void end() { amx::tile_release(); }
  static void run(const Args& a, const Job& j, int64_t k0, int64_t k1, Work& w) { amx::run_task(a, j, k0, k1, w); }
};
#endif

// Runs every split of the plan on `threads` threads (see pk_mla_decode), then merges split jobs.
template <class Engine>
void decode(const Args& a, const int64_t* splits, int64_t nsplits, int64_t nslots, int nthreads) {
  const bool sparse = a.indices != nullptr;
  auto job_of = [&](int64_t id) {
    Job j{};
    if (sparse) {
      j = Job{id / a.s_q, 0, id % a.s_q, a.h_q, a.topk};
      if (a.topk_length) j.keys = std::min<int64_t>(std::max<int64_t>(a.topk_length[id], 0), a.topk);
    } else {
      j = Job{id / a.h_kv, id % a.h_kv, -1, a.s_q * (a.h_q / a.h_kv), 0};
      j.keys = std::min<int64_t>(std::max<int64_t>(a.seqlens[j.b], 0), a.max_blocks * a.block_size);
    }
    return j;
  };
  const int64_t rows = sparse ? a.h_q : a.s_q * (a.h_q / a.h_kv);
  std::vector<float> part_o(static_cast<size_t>(nslots * rows * DV)), part_m(static_cast<size_t>(nslots * rows)),
      part_l(static_cast<size_t>(nslots * rows));
  const int threads = std::max<int>(1, std::min<int64_t>(nthreads, nsplits));
  // the library's own workers (pk_pool.h), not an OpenMP region: every split a task, then every
  // merge a task (the first call returns only when all splits are done)
  pk::parallel_for(nsplits, threads, [&](int64_t t) {
    static thread_local typename Engine::Work w;  // each thread's buffers, kept between calls
    Engine::begin();
    {
      const int64_t* sp = splits + 4 * t;
      const Job j = job_of(sp[0]);
      const int64_t k0 = std::min(sp[1], j.keys), k1 = std::min(sp[2], j.keys);
      Engine::run(a, j, k0, std::max(k0, k1), w);
      if (sp[3] < 0) {
        for (int64_t r = 0; r < j.rows; ++r) finish_row(a, j, r, w.o.data() + r * DV, w.m[r], w.l[r]);
      } else {
        std::memcpy(part_o.data() + sp[3] * rows * DV, w.o.data(), static_cast<size_t>(j.rows * DV) * 4);
        std::memcpy(part_m.data() + sp[3] * rows, w.m.data(), static_cast<size_t>(j.rows) * 4);
        std::memcpy(part_l.data() + sp[3] * rows, w.l.data(), static_cast<size_t>(j.rows) * 4);
      }
    }
    Engine::end();
  });
  // merge the split jobs; a job's splits are consecutive
  if (nslots > 0) pk::parallel_for(nsplits, threads, [&](int64_t t) {
    const int64_t* sp = splits + 4 * t;
    if (sp[3] < 0 || (t > 0 && splits[4 * (t - 1)] == sp[0])) return;  // first split of a split job only
    std::vector<float> o(DV);
    {
      int64_t last = t;
      while (last + 1 < nsplits && splits[4 * (last + 1)] == sp[0]) ++last;
      const Job j = job_of(sp[0]);
      for (int64_t r = 0; r < j.rows; ++r) {
        float m = -INFINITY;
        for (int64_t u = t; u <= last; ++u) m = std::max(m, part_m[splits[4 * u + 3] * rows + r]);
        float l = 0.0f;
        std::fill(o.begin(), o.end(), 0.0f);
        if (m != -INFINITY)
          for (int64_t u = t; u <= last; ++u) {
            const int64_t slot = splits[4 * u + 3];
            const float mu = part_m[slot * rows + r];
            if (mu == -INFINITY) continue;
            const float f = std::exp(mu - m);
            l += part_l[slot * rows + r] * f;
            const float* po = part_o.data() + (slot * rows + r) * DV;
            for (int64_t c = 0; c < DV; ++c) o[c] += po[c] * f;
          }
        finish_row(a, j, r, o.data(), m, l);
      }
    }
  });
}

int engines() {
#ifdef PK_MLA_AMX
  if (pk::amx_permitted()) return kFma | kAmx;
#endif
  return kFma;
}

// Runs the plan on `engine` (0: the best available); -1 when that engine cannot run here.
int run(const Args& a, const int64_t* splits, int64_t nsplits, int64_t nslots, int nthreads, int engine) {
  const int have = engines();
  if (engine == 0) engine = (have & kAmx) && !a.model1 ? kAmx : kFma;  // AMX reads 656-byte rows only
  if (a.model1 && engine != kFma) return -2;
  if (!(have & engine) || (engine != kFma && engine != kAmx)) return -1;  // never a tile instruction unpermitted
#ifdef PK_MLA_AMX
  if (engine == kAmx) {
    decode<AmxEngine>(a, splits, nsplits, nslots, nthreads);
    return 0;
  }
#endif
  decode<FmaEngine>(a, splits, nsplits, nslots, nthreads);
  return 0;
}

}  // namespace

// Bits of the engines this build and CPU can run: 1 = FMA (always), 2 = AMX (AMX-BF16 tiles the
// kernel lets this process use).
PK_EXPORT int pk_mla_engines() { return engines(); }

// splits: int64 [nsplits, 4] = (job, first key, end key, output slot) over the jobs in job order
// (dense: job = b * h_kv + h; sparse: job = b * s_q + i); a job with one split writes out/lse
// directly (slot -1), others write partial results to slot and are merged here. engine: 0 = the
// best available (AMX where permitted, else FMA), 1 = FMA, 2 = AMX. fp8: 0 = bf16 cache, 1 = the
// 656-byte V3.2 rows, 2 = FlashMLA's MODEL1 pages (d = 512; block_stride the page stride in bytes;
// the FMA engine only). Returns 0, -1 when the engine asked for cannot run here, -2 when it cannot
// read MODEL1 pages (nothing was run either way).
PK_EXPORT int pk_mla_decode(const void* q, int64_t b, int64_t s_q, int64_t h_q, int64_t d, int64_t h_kv,
                             const void* cache, int fp8, int64_t num_blocks, int64_t block_size, int64_t block_stride,
                             int64_t token_stride, int64_t head_stride, const int32_t* block_table, int64_t max_blocks,
                             const int32_t* seqlens, const int32_t* indices, int64_t topk, float scale, int causal,
                             const int64_t* splits, int64_t nsplits, int64_t nslots, void* out, float* lse,
                             int nthreads, int engine) {
  Args a{static_cast<const uint16_t*>(q), b, s_q, h_q, d, h_kv, static_cast<const uint8_t*>(cache), fp8 != 0,
         num_blocks, block_size, block_stride, token_stride, head_stride, block_table, max_blocks, seqlens,
         indices, topk, scale, causal != 0, static_cast<uint16_t*>(out), lse, s_q, 1, nullptr, nullptr,
         nullptr};
  a.model1 = fp8 == 2;
  return run(a, splits, nsplits, nslots, nthreads, engine);
}

// FlashMLA's sparse prefill: q bf16 [s_q, h_q, d], kv bf16 rows of d channels kv_row_bytes apart
// (s_kv of them), indices int32 [s_q, topk] (-1 or >= s_kv: no key), topk_length null or int32
// [s_q] (clamped to [0, topk]), sink null or fp32 [h_q]; writes out bf16 [s_q, h_q, 512] and
// max_logits, lse fp32 [s_q, h_q]. splits as pk_mla_decode's with job = query token i. Returns 0,
// or -1 when the engine asked for cannot run here (nothing was run).
PK_EXPORT int pk_mla_sparse_prefill(const void* q, int64_t s_q, int64_t h_q, int64_t d, const void* kv, int64_t s_kv,
                                     int64_t kv_row_bytes, const int32_t* indices, int64_t topk,
                                     const int32_t* topk_length, const float* sink, float scale,
                                     const int64_t* splits, int64_t nsplits, int64_t nslots, void* out,
                                     float* max_logits, float* lse, int nthreads, int engine) {
  // one sequence; the keys a block of one token each, so a slot is a row of kv
  const Args a{static_cast<const uint16_t*>(q), 1, s_q, h_q, d, 1, static_cast<const uint8_t*>(kv), false,
               s_kv, 1, kv_row_bytes, 0, 0, nullptr, 0, nullptr, indices, topk, scale, false,
               static_cast<uint16_t*>(out), lse, 1, h_q, max_logits, sink, topk_length};
  return run(a, splits, nsplits, nslots, nthreads, engine);
}
