// mla_common.h — what both engines of the native MLA decode (mla.cpp) share: the call's arguments,
// a job (the query rows that attend the same keys) and where a job's key lives in the paged cache.
#pragma once

#include "pk_native.h"

#include <cstdlib>
#include <vector>

namespace pk_mla {

constexpr int64_t CK = 64;   // keys per chunk
constexpr int64_t DV = 512;  // V channels: the first 512 of every cache row

struct Args {
  const uint16_t* q;  // [b, s_q, h_q, d] contiguous
  int64_t b, s_q, h_q, d, h_kv;
  const uint8_t* cache;
  bool fp8;
  int64_t num_blocks, block_size, block_stride, token_stride, head_stride;  // strides in bytes
  const int32_t* block_table;
  int64_t max_blocks;
  const int32_t* seqlens;
  const int32_t* indices;  // [b, s_q, topk] or null
  int64_t topk;
  float scale;
  bool causal;
  uint16_t* out;  // [b, s_q, h_q, 512]
  float* lse;     // element (b, head, i) at b * h_q * s_q + head * lse_head + i * lse_token
  int64_t lse_head, lse_token;  // decode: [b, h_q, s_q] (s_q, 1); sparse prefill: [s_q, h_q] (1, h_q)
  float* max_logits;            // null, or laid out like lse: each row's largest scaled logit
  const float* sink;            // null, or [h_q] sink logits: out scaled by e^lse / (e^lse + e^sink)
  const int32_t* topk_length;   // null, or [b * s_q]: sparse rows read only their first topk_length keys
  // FlashMLA's MODEL1 pages (d = 512) instead of 656-byte rows: a page of block_size tokens holds
  // each token's 448 e4m3 + 64 bf16 at t * 576, then each token's 7 UE8M0 scales + 1 pad at
  // block_size * 576 + t * 8 (token_stride and head_stride are unused)
  bool model1 = false;
};

constexpr int64_t M1_NOPE = 448, M1_TILE = 64, M1_TILES = 7;  // MODEL1: NoPE values, per scale, scales
constexpr int64_t M1_VALUES = 576, M1_SCALES = 8;             // MODEL1: value bytes, scale bytes per token

struct Job {
  int64_t b, h, i;  // batch, kv head (dense) ; query token (sparse, else -1)
  int64_t rows, keys;
};

// Offset of row (b, head, query token i) in lse and max_logits.
inline int64_t lse_at(const Args& a, int64_t b, int64_t head, int64_t i) {
  return b * a.h_q * a.s_q + head * a.lse_head + i * a.lse_token;
}

inline int64_t group(const Args& a) { return a.h_q / a.h_kv; }

// query token and head of row r of a job
inline void row_of(const Args& a, const Job& j, int64_t r, int64_t* i, int64_t* head) {
  if (j.i >= 0) {
    *i = j.i;
    *head = r;
  } else {
    *i = r / group(a);
    *head = j.h * group(a) + r % group(a);
  }
}

// The cache bytes of key `k` of a job (null: the key is invisible to every row / not stored). For
// MODEL1 pages these are the token's 576 value bytes and `*scales` (when given) its 8 scale bytes.
inline const uint8_t* key_ptr(const Args& a, const Job& j, int64_t k, const uint8_t** scales = nullptr) {
  int64_t slot;
  if (j.i >= 0) {
    slot = a.indices[(j.b * a.s_q + j.i) * a.topk + k];
    if (slot < 0 || slot >= a.num_blocks * a.block_size) return nullptr;
  } else {
    const int64_t blk = a.block_table[j.b * a.max_blocks + k / a.block_size];
    if (blk < 0 || blk >= a.num_blocks) return nullptr;
    slot = blk * a.block_size + k % a.block_size;
  }
  if (a.model1) {
    const uint8_t* page = a.cache + (slot / a.block_size) * a.block_stride;
    const int64_t t = slot % a.block_size;
    if (scales) *scales = page + a.block_size * M1_VALUES + t * M1_SCALES;
    return page + t * M1_VALUES;
  }
  return a.cache + (slot / a.block_size) * a.block_stride + (slot % a.block_size) * a.token_stride +
         (j.i >= 0 ? 0 : j.h * a.head_stride);
}

}  // namespace pk_mla
