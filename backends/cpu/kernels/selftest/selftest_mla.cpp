// selftest_mla.cpp — flash_mla_with_kvcache's FMA engine (mla.cpp) against a double-precision
// softmax attention over the same cache values: bf16 and FP8 (656-byte) caches, dense causal over
// a shuffled block table with a split job, and sparse with -1 indices; and flash_mla_sparse_fwd
// (pk_mla_sparse_prefill) over bf16 kv rows two cache rows apart, with -1 and >= s_kv indices,
// topk_length (0 included), an attention sink and a split job.
#include "../mla.cpp"

#include "selftest.h"

namespace {

using selftest::Rng;

constexpr int64_t kD = 576, kBlock = 64, kFp8Row = 656;

struct Cache {
  bool fp8;
  int64_t blocks;
  std::vector<uint8_t> bytes;   // [blocks][64][1][row bytes]
  std::vector<double> values;   // [blocks * 64][576]: what each slot holds
  int64_t row_bytes() const { return fp8 ? kFp8Row : kD * 2; }
};

Cache make_cache(int64_t blocks, bool fp8, Rng& rng) {
  Cache c{fp8, blocks, std::vector<uint8_t>(size_t(blocks * kBlock * (fp8 ? kFp8Row : kD * 2))),
          std::vector<double>(static_cast<size_t>(blocks * kBlock * kD))};
  for (int64_t s = 0; s < blocks * kBlock; ++s) {
    uint8_t* row = c.bytes.data() + s * c.row_bytes();
    double* val = c.values.data() + s * kD;
    float x[kD];
    for (int64_t i = 0; i < kD; ++i) x[i] = float(rng.normal());
    if (!fp8) {
      for (int64_t i = 0; i < kD; ++i) {
        const uint16_t h = pk::f32_to_bf16(x[i]);
        std::memcpy(row + 2 * i, &h, 2);
        val[i] = pk::bf16_to_f32(h);
      }
      continue;
    }
    for (int t = 0; t < 4; ++t) {  // 4 tiles of 128 e4m3 with a power-of-two scale each
      float amax = 0;
      for (int i = 0; i < 128; ++i) amax = std::max(amax, std::fabs(x[128 * t + i]));
      const float sf = pk::ceil_to_ue8m0(std::max(amax, pk::kAmaxFloor) / pk::kFp8Max);
      std::memcpy(row + 512 + 4 * t, &sf, 4);
      for (int i = 0; i < 128; ++i) {
        const uint8_t q = pk::f32_to_fp8(std::min(pk::kFp8Max, std::max(-pk::kFp8Max, x[128 * t + i] / sf)));
        row[128 * t + i] = q;
        val[128 * t + i] = double(pk::fp8_to_f32(q)) * sf;
      }
    }
    for (int i = 0; i < 64; ++i) {
      const uint16_t h = pk::f32_to_bf16(x[512 + i]);
      std::memcpy(row + 528 + 2 * i, &h, 2);
      val[512 + i] = pk::bf16_to_f32(h);
    }
  }
  return c;
}

// softmax(scale · q·K) · V over the listed slots -> out[512], lse (+inf with no key); with `mx_out`,
// the largest logit (-inf with no key) too.
void attend(const Cache& c, const uint16_t* q, const std::vector<int64_t>& slots, double scale, double* out,
            double* lse, double* mx_out = nullptr) {
  std::vector<double> logit(slots.size());
  double mx = -INFINITY;
  for (size_t k = 0; k < slots.size(); ++k) {
    double s = 0;
    for (int64_t i = 0; i < kD; ++i) s += double(pk::bf16_to_f32(q[i])) * c.values[slots[k] * kD + i];
    logit[k] = s * scale;
    mx = std::max(mx, logit[k]);
  }
  double sum = 0;
  for (int64_t i = 0; i < 512; ++i) out[i] = 0;
  for (size_t k = 0; k < slots.size(); ++k) {
    const double p = std::exp(logit[k] - mx);
    sum += p;
    for (int64_t i = 0; i < 512; ++i) out[i] += p * c.values[slots[k] * kD + i];
  }
  for (int64_t i = 0; i < 512; ++i) out[i] = sum > 0 ? out[i] / sum : 0;
  *lse = sum > 0 ? mx + std::log(sum) : INFINITY;
  if (mx_out) *mx_out = mx;
}

// Runs one decode and compares every row with attend(); returns whether it matched.
bool run_case(int* failures, const char* name, const Cache& c, int64_t b, int64_t s_q, int64_t h_q,
              const std::vector<int32_t>& table, int64_t max_blocks, const std::vector<int32_t>& seqlens,
              const std::vector<int32_t>& indices, int64_t topk, bool causal, const std::vector<int64_t>& splits,
              Rng& rng) {
  std::vector<uint16_t> q(static_cast<size_t>(b * s_q * h_q * kD));
  for (auto& v : q) v = pk::f32_to_bf16(float(rng.normal() * 0.3));
  std::vector<uint16_t> out(size_t(b * s_q * h_q * 512), 0x7FC0);  // poisoned: NaN
  std::vector<float> lse(size_t(b * h_q * s_q), NAN);
  const int64_t nsplits = int64_t(splits.size() / 4);
  int64_t nslots = 0;
  for (int64_t t = 0; t < nsplits; ++t) nslots += splits[4 * t + 3] >= 0;
  const double scale = 1.0 / std::sqrt(double(kD));
  const int rc = pk_mla_decode(q.data(), b, s_q, h_q, kD, 1, c.bytes.data(), c.fp8, c.blocks, kBlock,
                               kBlock * c.row_bytes(), c.row_bytes(), c.row_bytes(), table.data(), max_blocks,
                               seqlens.data(), indices.empty() ? nullptr : indices.data(), topk, float(scale),
                               causal, splits.data(), nsplits, nslots, out.data(), lse.data(), 2, 1);
  std::vector<double> got, want;
  double lse_err = 0;
  bool finite = true;
  for (int64_t bi = 0; bi < b; ++bi)
    for (int64_t i = 0; i < s_q; ++i) {
      std::vector<int64_t> slots;
      if (topk) {
        for (int64_t k = 0; k < topk; ++k) {
          const int32_t s = indices[(bi * s_q + i) * topk + k];
          if (s >= 0) slots.push_back(s);
        }
      } else {
        const int64_t n = causal ? seqlens[bi] - s_q + i + 1 : seqlens[bi];
        for (int64_t k = 0; k < n; ++k) slots.push_back(int64_t(table[bi * max_blocks + k / kBlock]) * kBlock + k % kBlock);
      }
      for (int64_t h = 0; h < h_q; ++h) {
        double ref[512], ref_lse;
        attend(c, q.data() + ((bi * s_q + i) * h_q + h) * kD, slots, scale, ref, &ref_lse);
        const uint16_t* o = out.data() + ((bi * s_q + i) * h_q + h) * 512;
        for (int64_t x = 0; x < 512; ++x) {
          got.push_back(pk::bf16_to_f32(o[x]));
          want.push_back(ref[x]);
          finite = finite && std::isfinite(got.back());
        }
        const float l = lse[(bi * h_q + h) * s_q + i];
        lse_err = std::max(lse_err, std::isinf(ref_lse) ? (std::isinf(l) ? 0.0 : INFINITY) : std::fabs(l - ref_lse));
      }
    }
  const double diff = selftest::calc_diff(got, want);
  char detail[160];
  std::snprintf(detail, sizeof detail, "rc %d, calc_diff %.2e, max |lse error| %.2e", rc, diff, lse_err);
  return selftest::check(failures, name, rc == 0 && finite && diff < 1e-5 && lse_err < 1e-4, detail);
}

// flash_mla_sparse_fwd over the bf16 cache's rows, read every second row (kv row stride 2 rows):
// kv row r is cache slot 2r. Compares out (sink applied), lse and max_logits with attend().
bool run_prefill_case(int* failures, const Cache& c, Rng& rng) {
  constexpr int64_t s_q = 4, h_q = 16, topk = 150;
  const int64_t s_kv = c.blocks * kBlock / 2;
  std::vector<uint16_t> q(static_cast<size_t>(s_q * h_q * kD));
  for (auto& v : q) v = pk::f32_to_bf16(float(rng.normal() * 0.3));
  std::vector<int32_t> indices(static_cast<size_t>(s_q * topk));
  for (auto& x : indices) {
    const double u = rng.uniform();
    x = u < 0.1 ? -1 : u < 0.2 ? int32_t(s_kv + rng.below(50)) : int32_t(rng.below(s_kv));
  }
  const std::vector<int32_t> lengths = {150, 0, 70, 1000};  // 1000 > topk: clamped
  std::vector<float> sink(h_q);
  for (auto& x : sink) x = float(rng.normal() * 2);
  // token 0 split in three (one range past its keys), the others whole
  constexpr int64_t kOpen = int64_t(1) << 62;
  const std::vector<int64_t> splits = {0, 0, 64, 0, 0, 64, 128, 1, 0, 128, kOpen, 2, 1, 0, kOpen, -1,
                                       2, 0, kOpen, -1, 3, 0, kOpen, -1};
  std::vector<uint16_t> out(size_t(s_q * h_q * 512), 0x7FC0);  // poisoned: NaN
  std::vector<float> lse(size_t(s_q * h_q), NAN), mxl(size_t(s_q * h_q), NAN);
  const double scale = 1.0 / std::sqrt(double(kD));
  const int rc = pk_mla_sparse_prefill(q.data(), s_q, h_q, kD, c.bytes.data(), s_kv, 2 * c.row_bytes(), indices.data(),
                                       topk, lengths.data(), sink.data(), float(scale), splits.data(), 6, 3, out.data(),
                                       mxl.data(), lse.data(), 2, 1);
  std::vector<double> got, want;
  double err = 0;
  bool finite = true;
  for (int64_t i = 0; i < s_q; ++i) {
    std::vector<int64_t> slots;
    for (int64_t k = 0; k < std::min<int64_t>(lengths[i], topk); ++k) {
      const int32_t r = indices[i * topk + k];
      if (r >= 0 && r < s_kv) slots.push_back(2 * int64_t(r));
    }
    for (int64_t h = 0; h < h_q; ++h) {
      double ref[512], ref_lse, ref_mx;
      attend(c, q.data() + (i * h_q + h) * kD, slots, scale, ref, &ref_lse, &ref_mx);
      const double keep = std::isinf(ref_lse) ? 0.0 : 1.0 / (1.0 + std::exp(double(sink[h]) - ref_lse));
      const uint16_t* o = out.data() + (i * h_q + h) * 512;
      for (int64_t x = 0; x < 512; ++x) {
        got.push_back(pk::bf16_to_f32(o[x]));
        want.push_back(ref[x] * keep);
        finite = finite && std::isfinite(got.back());
      }
      const float l = lse[i * h_q + h], m = mxl[i * h_q + h];
      const bool none = slots.empty();
      const bool marks = none ? (std::isinf(l) && l > 0 && std::isinf(m) && m < 0) : true;
      err = std::max(err, !marks ? INFINITY : none ? 0.0 : std::max(std::fabs(l - ref_lse), std::fabs(m - ref_mx)));
    }
  }
  const double diff = selftest::calc_diff(got, want);
  char detail[160];
  std::snprintf(detail, sizeof detail, "rc %d, calc_diff %.2e, max |lse, max_logits error| %.2e", rc, diff, err);
  return selftest::check(failures, "mla sparse prefill, bf16 kv view", rc == 0 && finite && diff < 1e-5 && err < 1e-4,
                         detail);
}

}  // namespace

int selftest_mla() {
  int failures = 0;
  Rng rng(11);
  constexpr int64_t kOpen = int64_t(1) << 62;
  for (const bool fp8 : {false, true}) {
    const Cache c = make_cache(12, fp8, rng);
    // dense: 3 sequences over a shuffled table (one empty), 2 query tokens x 16 heads, causal; the
    // long sequence's job split in three
    const int64_t max_blocks = 6;
    std::vector<int32_t> table = {7, 2, 9, 0, 11, 4, 5, 1, -1, -1, -1, -1, 3, 8, 6, 10, -1, -1};
    std::vector<int32_t> seqlens = {330, 0, 200};
    std::vector<int64_t> splits = {0, 0, 64, 0, 0, 64, 200, 1, 0, 200, kOpen, 2, 1, 0, kOpen, -1, 2, 0, kOpen, -1};
    run_case(&failures, fp8 ? "mla dense causal, fp8 cache" : "mla dense causal, bf16 cache", c, 3, 2, 16, table,
             max_blocks, seqlens, {}, 0, true, splits, rng);
    // 128 heads (blocks of rows leave a remainder), one query token, not causal
    std::vector<int64_t> one = {0, 0, kOpen, -1, 1, 0, kOpen, -1, 2, 0, kOpen, -1};
    run_case(&failures, fp8 ? "mla dense 128 heads, fp8 cache" : "mla dense 128 heads, bf16 cache", c, 3, 1, 128,
             table, max_blocks, seqlens, {}, 0, false, one, rng);
    // sparse: 2 x 2 query tokens choosing 100 slots each, some -1
    const int64_t topk = 100;
    std::vector<int32_t> indices(static_cast<size_t>(2 * 2 * topk));
    for (auto& s : indices) s = rng.uniform() < 0.15 ? -1 : int32_t(rng.below(12 * kBlock));
    std::vector<int64_t> sparse = {0, 0, kOpen, -1, 1, 0, kOpen, -1, 2, 0, kOpen, -1, 3, 0, kOpen, -1};
    run_case(&failures, fp8 ? "mla sparse, fp8 cache" : "mla sparse, bf16 cache", c, 2, 2, 16, table, max_blocks,
             seqlens, indices, topk, false, sparse, rng);
    if (!fp8) run_prefill_case(&failures, c, rng);
  }
  return failures;
}
