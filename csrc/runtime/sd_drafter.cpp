#include "sd_drafter.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <stdexcept>

#include "draft_sampling.h"

namespace ssd::runtime {

SdDrafter::SdDrafter(std::shared_ptr<model::Model> model, int64_t num_blocks, int64_t block_size,
                     int64_t threads, int64_t matmul_min_rows, bool gumbel, const std::string& kv_dtype)
    : model_(std::move(model)),
      cache_(std::make_unique<model::KvCache>(model_->shard_config(), num_blocks, block_size, model_->backend(),
                                              kv_dtype)),
      pool_(std::make_unique<kernels::ThreadPool>(threads)),
      matmul_min_rows_(matmul_min_rows),
      gumbel_(gumbel) {}

model::ForwardInput SdDrafter::step_input(const std::vector<Sequence*>& seqs, const DraftBatch& batch,
                                        int64_t step, std::vector<int64_t>& rows) {
  model::ForwardInput in;
  in.matmul_min_rows = matmul_min_rows_;
  rows.clear();
  std::vector<const model::BlockTable*> tables;
  for (size_t b = 0; b < seqs.size(); ++b) {
    if (batch.counts[b] <= step) continue;
    Sequence* seq = seqs[b];
    DraftKv& kv = kv_[seq->id];
    const int64_t base = seq->len() - 1;  // position of the last real token
    // Step 0 feeds every token the draft has not seen; later steps the previous draft token.
    const int64_t begin = step == 0 ? kv.computed : base + step;
    const int64_t end = base + step + 1;
    if (!cache_->reserve(kv.table, end)) throw std::runtime_error("draft KV cache is full");
    for (int64_t pos = begin; pos < end; ++pos) {
      const int32_t token = pos <= base ? seq->tokens[pos]
                                        : static_cast<int32_t>(batch.tokens[b * batch.slots + (pos - base - 1)]);
      in.tokens.push_back(token);
      in.positions.push_back(static_cast<int32_t>(pos));
      in.seq_of_token.push_back(static_cast<int32_t>(tables.size()));
    }
    in.logit_rows.push_back(static_cast<int32_t>(in.tokens.size() - 1));
    kv.computed = end;
    tables.push_back(&kv.table);
    rows.push_back(static_cast<int64_t>(b));
  }
  for (const auto* t : tables) in.max_blocks = std::max<int64_t>(in.max_blocks, static_cast<int64_t>(t->blocks.size()));
  in.block_tables.assign(tables.size() * static_cast<size_t>(in.max_blocks), -1);  // -1: no block
  for (size_t s = 0; s < tables.size(); ++s)
    std::copy(tables[s]->blocks.begin(), tables[s]->blocks.end(),
              in.block_tables.begin() + static_cast<int64_t>(s) * in.max_blocks);
  return in;
}

void SdDrafter::sample(const std::vector<Sequence*>& seqs, const std::vector<int64_t>& rows,
                       const at::Tensor& logits, int64_t step, DraftBatch& batch) {
  const int64_t vocab = model_->config().vocab_size;
  const model::Backend& be = model_->backend();
  DraftRows draw(vocab, gumbel_);
  for (int64_t b : rows) draw.add(seqs[b]->params, seqs[b]->seed, seqs[b]->len() + step, 0, 1.0);
  const at::Tensor q = draw.sample_on(be, logits, reads_);  // [rows, vocab] on the device
  std::vector<int64_t> slots;
  for (size_t r = 0; r < rows.size(); ++r) {
    slots.push_back(rows[r] * batch.slots + step);
    batch.tokens[slots.back()] = draw.tokens[r];
  }
  copy_rows(be, q, batch.q.view({-1, vocab}), slots);
}

DraftBatch SdDrafter::draft(const std::vector<Sequence*>& seqs, const std::vector<int64_t>& counts) {
  DraftBatch batch;
  batch.counts = counts;
  batch.slots = counts.empty() ? 0 : *std::max_element(counts.begin(), counts.end());
  const int64_t vocab = model_->config().vocab_size;
  const model::Backend& be = model_->backend();
  // The draft's stream for the draws and the rows, as for its forwards.
  const auto scope = be.forward_scope();
  batch.tokens.assign(seqs.size() * static_cast<size_t>(batch.slots), 0);
  const auto b = static_cast<int64_t>(seqs.size());
  const at::TensorOptions f32 = at::TensorOptions().dtype(at::kFloat).device(be.device());
  if (be.device().is_cpu()) {
    batch.q = at::empty({b, batch.slots, vocab}, f32);
    std::fill_n(batch.q.data_ptr<float>(), batch.q.numel(), 0.0f);
  } else {
    batch.q = at::zeros({b, batch.slots, vocab}, f32);
  }
  std::vector<int64_t> drafted;
  for (int64_t step = 0; step < batch.slots; ++step) {
    const model::ForwardInput in = step_input(seqs, batch, step, drafted);
    const at::Tensor logits = model_->forward_device(in, *cache_, *pool_);
    sample(seqs, drafted, logits, step, batch);
  }
  return batch;
}

void SdDrafter::commit(RequestId id, int64_t keep_tokens) {
  auto it = kv_.find(id);
  if (it == kv_.end()) return;
  it->second.computed = std::min(it->second.computed, keep_tokens);
  cache_->truncate(it->second.table, it->second.computed);
}

void SdDrafter::release(RequestId id) {
  auto it = kv_.find(id);
  if (it == kv_.end()) return;
  cache_->truncate(it->second.table, 0);
  kv_.erase(it);
}

}  // namespace ssd::runtime
