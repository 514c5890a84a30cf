// Direct access to the paged forward without the engine: sequences are added,
// extended by any number of tokens (prefill, decode or multi-token scoring in
// one call) and truncated. Used by LoadedModel.logits and the parity tests.
#pragma once

#include <ATen/core/Tensor.h>

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "../kernels/cpu/thread_pool.h"
#include "kv_cache.h"
#include "model.h"

namespace ssd::model {

class SequenceRunner {
 public:
  /// kv_dtype: the cache's, "float32" or "bfloat16" (KvCache).
  SequenceRunner(std::shared_ptr<Model> model, int64_t num_blocks, int64_t block_size,
                 int64_t num_threads, const std::string& kv_dtype = "float32");

  int64_t add_sequence();
  /// Appends tokens to several sequences in ONE forward; returns logits
  /// [total new tokens, vocab] in input order (only each sequence's last row
  /// when all_logits is false). Throws std::invalid_argument on unknown ids
  /// or when the cache is full (nothing is changed then). matmul_min_rows:
  /// see ForwardInput (0: the batch-invariant kernels only).
  at::Tensor extend(const std::vector<std::pair<int64_t, std::vector<int32_t>>>& batch,
                    bool all_logits, int64_t matmul_min_rows = 0);
  /// Drops positions >= length (their blocks return to the free list).
  void truncate(int64_t seq, int64_t length);
  void free(int64_t seq);
  int64_t length(int64_t seq) const;
  int64_t num_free_blocks() const { return cache_.num_free_blocks(); }
  /// The KV storage [layers, 2, num_blocks, block_size, kv_heads, head_dim],
  /// shared (writes through it reach the cache), for KV-movement tests.
  at::Tensor cache_storage() const { return cache_.storage(); }
  /// Block ids of a sequence, in position order.
  std::vector<int32_t> block_table(int64_t seq) const;

 private:
  struct State {
    BlockTable table;
    int64_t len = 0;
  };
  State& state(int64_t seq);

  std::shared_ptr<Model> model_;
  KvCache cache_;
  kernels::ThreadPool pool_;
  std::map<int64_t, State> seqs_;
  int64_t next_id_ = 0;
};

}  // namespace ssd::model
