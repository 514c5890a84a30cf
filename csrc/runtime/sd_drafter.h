// The draft of mode "sd": its own model, KV cache and threads, run on the
// engine thread before each verify. For each sequence it catches up on the
// tokens it has not seen and drafts up to K tokens, keeping the exact rows it
// sampled from (the verifier uses them as q; they are never recomputed). The
// draws run on the draft's device (backend.h's saguaro_sample and
// gumbel_sample) and the rows stay there; only the tokens come to the host,
// where the next step's input is built. The draft's KV state of each
// sequence lives here, not in the Sequence.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "../kernels/cpu/thread_pool.h"
#include "../model/kv_cache.h"
#include "../model/model.h"
#include "device_io.h"
#include "scheduler.h"

namespace ssd::runtime {

struct DraftBatch {
  int64_t slots = 0;            ///< proposal slots per row (the largest count)
  std::vector<int64_t> counts;  ///< [B] proposals actually drafted per row
  std::vector<int64_t> tokens;  ///< [B, slots], on the host
  at::Tensor q;                 ///< [B, slots, vocab] f32 on the draft's device (a row per drafted slot)
};

class SdDrafter {
 public:
  /// Forwards over at least matmul_min_rows tokens use the draft's bf16 pair
  /// kernels (model::ForwardInput::matmul_min_rows; 0: never). gumbel: the
  /// coupling "gumbel" (draft tokens are Gumbel-max draws, draft_sampling.h).
  /// kv_dtype: the draft cache's (model::KvCache).
  SdDrafter(std::shared_ptr<model::Model> model, int64_t num_blocks, int64_t block_size, int64_t threads,
            int64_t matmul_min_rows = 0, bool gumbel = false, const std::string& kv_dtype = "float32");

  /// Drafts counts[b] tokens after the last token of seqs[b]. Each sequence's
  /// last token sits at position len - 1; draft token i (1-based) is drawn at
  /// position len - 1 + i (its keyed kDraft uniform, or its Gumbel noise).
  DraftBatch draft(const std::vector<Sequence*>& seqs, const std::vector<int64_t>& counts);

  /// After verification: keeps the draft KV of the first keep_tokens positions.
  void commit(RequestId id, int64_t keep_tokens);
  /// Frees the sequence's draft KV (it finished or was preempted).
  void release(RequestId id);

  /// Bytes the draws have read from the draft's device to the host so far.
  int64_t host_bytes() const { return reads_.bytes(); }

 private:
  struct DraftKv {
    model::BlockTable table;
    int64_t computed = 0;  ///< positions whose draft KV is in the cache
  };

  model::ForwardInput step_input(const std::vector<Sequence*>& seqs, const DraftBatch& batch,
                                 int64_t step, std::vector<int64_t>& rows);
  void sample(const std::vector<Sequence*>& seqs, const std::vector<int64_t>& rows,
              const at::Tensor& logits, int64_t step, DraftBatch& batch);

  std::shared_ptr<model::Model> model_;
  std::map<RequestId, DraftKv> kv_;
  std::unique_ptr<model::KvCache> cache_;
  std::unique_ptr<kernels::ThreadPool> pool_;
  int64_t matmul_min_rows_;
  bool gumbel_;
  HostReads reads_;
};

}  // namespace ssd::runtime
