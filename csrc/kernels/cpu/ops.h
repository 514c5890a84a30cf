// Row-wise CPU kernels of the model forward. None of them mixes rows, so a
// row's result never depends on which other rows are in the batch.
#pragma once

#include <cstdint>

#include "thread_pool.h"

namespace ssd::kernels {

/// out[r, :] = x[r, :] / sqrt(mean(x[r, :]^2) + eps) * weight, for rows of width n.
/// x, out: [rows, n] with row strides ldx / ldo (out may alias x).
void rms_norm(const float* x, int64_t ldx, const float* weight, float* out, int64_t ldo,
              int64_t rows, int64_t n, float eps);

/// Rotary embedding (rotate-half convention) applied in place to `heads`
/// vectors of size head_dim per token: x: [tokens, ld] with heads at
/// x + t * ld + h * head_dim. inv_freq: [head_dim / 2]; positions: [tokens].
void rope(float* x, int64_t ld, int64_t tokens, int64_t heads, int64_t head_dim,
          const float* inv_freq, const int32_t* positions);

/// out[r, i] = silu(gu[r, i]) * gu[r, n + i]; gu: [rows, 2n], out: [rows, n].
void silu_mul(const float* gu, float* out, int64_t rows, int64_t n);

/// sum_i exp(x[i] - shift) over n values (a softmax normalizer; shift is
/// usually the maximum, so no term overflows).
double sum_exp(const float* x, int64_t n, float shift);

/// Geometry and storage of one layer of a paged KV cache:
/// cache[block, slot, kv_head, head_dim] for K and V separately, in fp32
/// (k, v) or in bf16 (k_bf16, v_bf16: the bits; the other pair null).
struct PagedKv {
  float* k = nullptr;
  float* v = nullptr;
  int64_t block_size = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  uint16_t* k_bf16 = nullptr;
  uint16_t* v_bf16 = nullptr;

  bool bf16() const { return k_bf16 != nullptr; }
};

/// Writes the K and V rows of `tokens` tokens into their cache slots:
/// slot of token t = block_table(seq)[pos / block_size] * block_size + pos % block_size.
/// A token whose entry is -1 (padding, no block) is skipped. A bf16 cache
/// gets each value rounded to nearest even.
/// k, v: [tokens, ld] with kv heads contiguous; block_tables: [num_seqs, max_blocks].
void kv_write(const PagedKv& kv, const float* k, const float* v, int64_t ld, int64_t tokens,
              const int32_t* seq_of_token, const int32_t* positions, const int32_t* block_tables,
              int64_t max_blocks);

/// Causal attention of `tokens` queries over the paged cache: query t of
/// sequence s at position p attends to that sequence's keys 0..p, or with
/// window > 0 (sliding-window attention) to keys p - window + 1..p only.
/// A query whose own entry (block of p) is -1 (padding) attends to nothing:
/// its output is 0. Every other query's entries must be live blocks.
/// q: [tokens, ldq] (num_heads * head_dim used), out: [tokens, ldo].
/// Keys are visited in position order with a two-pass softmax, so the result
/// is independent of how queries are batched or chunked.
void paged_attention(const PagedKv& kv, const float* q, int64_t ldq, float* out, int64_t ldo,
                     int64_t tokens, int64_t num_heads, const int32_t* seq_of_token,
                     const int32_t* positions, const int32_t* block_tables, int64_t max_blocks,
                     float scale, int64_t window, ThreadPool& pool);

}  // namespace ssd::kernels
