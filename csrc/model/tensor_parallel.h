// Tensor parallelism: one model's matrices split over the ranks of a group,
// each rank a process holding its share (Megatron's split):
//   q/k/v      column-parallel by KV-head group: a rank holds whole KV heads
//              and the query heads that read them (rows of q_proj, k_proj,
//              v_proj), so its attention is its heads' alone;
//   o_proj     row-parallel: the columns of the rank's query heads;
//   gate/up    column-parallel: a share of the intermediate rows of each;
//   down_proj  row-parallel: the same share of its columns;
//   embedding, norms and lm_head: replicated (every rank holds them whole and
//              computes every logit).
// After o_proj and down_proj each rank holds a partial sum [T, hidden]; they
// are all-gathered and added in rank order, (p_0 + p_1) + p_2 ..., the same
// elementwise sum on every rank whatever the batch, so every rank's residual
// stream is bitwise the same and a row's result does not depend on the
// batch. The bias of a row-parallel product is rank 0's alone (added into
// its partial). Shares are balanced: the first (total % size) ranks take one
// unit more, so a group that does not divide the heads still runs (SmolLM2's
// 3 KV heads over 2 ranks: 2 and 1).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>

#include "backend.h"
#include "ssd/config.h"

namespace ssd::model {

/// The one collective a tensor-parallel forward needs, over the ranks of its
/// group (torch.distributed's gloo or NCCL, or another transport).
class Collective {
 public:
  virtual ~Collective() = default;
  /// Every rank's `part` (one shape and dtype on all ranks), stacked in rank
  /// order: [size, *part.sizes()]. Every rank calls it, in the same order.
  virtual at::Tensor all_gather(const at::Tensor& part) = 0;
  /// Rank 0's `t` into every other rank's `t` (one shape and dtype on all
  /// ranks), in place.
  virtual void broadcast(at::Tensor& t) = 0;
};

struct TensorParallel {
  int64_t rank = 0;
  int64_t size = 1;
  std::shared_ptr<Collective> collective;  ///< required when size > 1
};

/// Units [begin, begin + count) of `total` that `rank` of `size` holds.
struct Share {
  int64_t begin = 0, count = 0;
};
Share share_of(int64_t total, int64_t size, int64_t rank);

/// What one rank of a tensor-parallel model holds, in weight rows / columns.
struct ShardLayout {
  Share kv_heads;      ///< its KV heads
  Share q_heads;       ///< the query heads that read them
  Share intermediate;  ///< its rows of gate_proj and up_proj (columns of down_proj)
};

/// The rank's layout of `config`. Throws std::invalid_argument when the
/// group is larger than the model's KV heads (naming both numbers), for a
/// rank outside the group, or for a size > 1 without a collective.
ShardLayout shard_layout(const ModelConfig& config, const TensorParallel& tp);

/// `config` as one rank sees it: its query and KV heads and intermediate
/// size (hidden size, vocabulary and layers unchanged). The KV cache of a
/// rank holds this config's KV heads.
ModelConfig shard_config(const ModelConfig& config, const ShardLayout& layout);

/// The leader's side of a forward (model.h's lead / follow): what every
/// follower needs to run the same forward on its shard. A message is a
/// header of kHeaderFields int64 then, for a forward, its int32 arrays.
struct ForwardMessage {
  static constexpr int64_t kHeaderFields = 10;
  /// A forward; the end of following (stop_followers); or nothing but a sign
  /// that rank 0 is alive (ping_followers: a follower waits for rank 0 no
  /// longer than the group's timeout, so an idle leader pings).
  enum class Kind : int64_t { kForward = 0, kStop = 1, kPing = 2 };
  Kind kind = Kind::kForward;
  int64_t cache_id = 0, num_blocks = 0, block_size = 0;
  bool kv_bf16 = false;  ///< the cache's dtype: bfloat16, else float32
  ForwardInput input;  ///< logit_rows empty on a follower (only the leader reads logits)
};
/// Rank 0: sends `message` to every other rank. Others: receives it.
void broadcast_forward(Collective& collective, int64_t rank, ForwardMessage& message);

/// The rank-order sum of every rank's partial (see the file comment), and
/// the collective's calls and time, counted.
class RowParallelSum {
 public:
  explicit RowParallelSum(TensorParallel tp) : tp_(std::move(tp)) {}
  /// partial [T, h] -> the sum over ranks [T, h] (partial itself when size 1).
  at::Tensor operator()(const at::Tensor& partial) const;
  int64_t calls() const { return calls_; }
  double seconds() const { return seconds_; }

 private:
  TensorParallel tp_;
  mutable int64_t calls_ = 0;
  mutable double seconds_ = 0;
};

}  // namespace ssd::model
