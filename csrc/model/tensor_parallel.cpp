#include "tensor_parallel.h"

#include <ATen/ATen.h>

#include <chrono>
#include <stdexcept>
#include <string>

namespace ssd::model {

Share share_of(int64_t total, int64_t size, int64_t rank) {
  const int64_t base = total / size, extra = total % size;
  return {rank * base + std::min(rank, extra), base + (rank < extra ? 1 : 0)};
}

ShardLayout shard_layout(const ModelConfig& c, const TensorParallel& tp) {
  if (tp.size < 1) throw std::invalid_argument("tensor_parallel_size must be >= 1, got " + std::to_string(tp.size));
  if (tp.rank < 0 || tp.rank >= tp.size)
    throw std::invalid_argument("tensor-parallel rank " + std::to_string(tp.rank) + " is outside a group of " +
                                std::to_string(tp.size));
  if (tp.size > 1 && !tp.collective)
    throw std::invalid_argument("a tensor-parallel group of " + std::to_string(tp.size) + " needs a collective");
  if (c.num_kv_heads < tp.size)
    throw std::invalid_argument("tensor_parallel_size " + std::to_string(tp.size) + " is larger than the model's " +
                                std::to_string(c.num_kv_heads) + " KV heads (each rank needs at least one)");
  ShardLayout s;
  s.kv_heads = share_of(c.num_kv_heads, tp.size, tp.rank);
  const int64_t group = c.num_heads / c.num_kv_heads;
  s.q_heads = {s.kv_heads.begin * group, s.kv_heads.count * group};
  // In units of 256 columns of down_proj where they divide the size (so a
  // k-quant's 256-weight blocks are not cut), else 32, else single rows.
  const int64_t f = c.intermediate_size;
  const int64_t unit = f % 256 == 0 && f / 256 >= tp.size ? 256 : f % 32 == 0 && f / 32 >= tp.size ? 32 : 1;
  const Share units = share_of(f / unit, tp.size, tp.rank);
  s.intermediate = {units.begin * unit, units.count * unit};
  if (s.intermediate.count == 0)
    throw std::invalid_argument("tensor_parallel_size " + std::to_string(tp.size) + " is larger than the model's " +
                                "intermediate_size " + std::to_string(f));
  return s;
}

ModelConfig shard_config(const ModelConfig& config, const ShardLayout& layout) {
  ModelConfig c = config;
  c.num_heads = layout.q_heads.count;
  c.num_kv_heads = layout.kv_heads.count;
  c.intermediate_size = layout.intermediate.count;
  return c;
}

void broadcast_forward(Collective& collective, int64_t rank, ForwardMessage& m) {
  ForwardInput& in = m.input;
  at::Tensor header = at::zeros({ForwardMessage::kHeaderFields}, at::kLong);
  auto* h = header.data_ptr<int64_t>();
  if (rank == 0) {
    const int64_t fields[ForwardMessage::kHeaderFields] = {
        static_cast<int64_t>(m.kind), m.cache_id, m.num_blocks, m.block_size, static_cast<int64_t>(in.tokens.size()),
        static_cast<int64_t>(in.block_tables.size()), in.max_blocks, in.matmul_min_rows, m.kv_bf16 ? 1 : 0,
        in.forks() ? 1 : 0};
    std::copy(fields, fields + ForwardMessage::kHeaderFields, h);
  }
  collective.broadcast(header);
  if (h[0] < 0 || h[0] > static_cast<int64_t>(ForwardMessage::Kind::kPing))
    throw std::runtime_error("tensor parallelism: a message of unknown kind " + std::to_string(h[0]) +
                             " from rank 0 (the ranks run different versions?)");
  m.kind = static_cast<ForwardMessage::Kind>(h[0]);
  if (m.kind != ForwardMessage::Kind::kForward) return;
  m.cache_id = h[1];
  m.num_blocks = h[2];
  m.block_size = h[3];
  const int64_t t = h[4], tables = h[5];
  in.max_blocks = h[6];
  in.matmul_min_rows = h[7];
  m.kv_bf16 = h[8] != 0;
  const bool forks = h[9] != 0;
  // tokens, positions and seq_of_token [T] each, then the block tables, then
  // with forks prefix_seq and prefix_len [T] each
  std::vector<std::vector<int32_t>*> arrays = {&in.tokens, &in.positions, &in.seq_of_token, &in.block_tables};
  if (forks) arrays.insert(arrays.end(), {&in.prefix_seq, &in.prefix_len});
  at::Tensor data = at::empty({(static_cast<int64_t>(arrays.size()) - 1) * t + tables}, at::kInt);
  auto* d = data.data_ptr<int32_t>();
  if (rank == 0) {
    for (auto* a : arrays) d = std::copy(a->begin(), a->end(), d);
    d = data.data_ptr<int32_t>();
  }
  collective.broadcast(data);
  if (rank != 0) {
    if (!forks) {
      in.prefix_seq.clear();
      in.prefix_len.clear();
    }
    for (auto* a : arrays) {
      const int64_t n = a == &in.block_tables ? tables : t;
      a->assign(d, d + n);
      d += n;
    }
    in.logit_rows.clear();
  }
}

at::Tensor RowParallelSum::operator()(const at::Tensor& partial) const {
  if (tp_.size == 1) return partial;
  const auto start = std::chrono::steady_clock::now();
  const at::Tensor parts = tp_.collective->all_gather(partial);
  if (parts.dim() != partial.dim() + 1 || parts.size(0) != tp_.size || parts.sizes().slice(1) != partial.sizes())
    throw std::runtime_error("tensor-parallel all_gather returned the wrong shape");
  at::Tensor sum = parts[0].to(partial.device(), partial.scalar_type(), /*non_blocking=*/false, /*copy=*/true);
  for (int64_t r = 1; r < tp_.size; ++r) sum.add_(parts[r].to(partial.device(), partial.scalar_type()));
  ++calls_;
  seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return sum;
}

}  // namespace ssd::model
