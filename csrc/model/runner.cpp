#include "runner.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace ssd::model {

SequenceRunner::SequenceRunner(std::shared_ptr<Model> model, int64_t num_blocks, int64_t block_size,
                               int64_t num_threads, const std::string& kv_dtype)
    : model_(std::move(model)),
      cache_(model_->shard_config(), num_blocks, block_size, model_->backend(), kv_dtype),
      pool_(num_threads) {}

int64_t SequenceRunner::add_sequence() {
  seqs_[next_id_] = State{};
  return next_id_++;
}

SequenceRunner::State& SequenceRunner::state(int64_t seq) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) throw std::invalid_argument("unknown sequence id " + std::to_string(seq));
  return it->second;
}

int64_t SequenceRunner::length(int64_t seq) const {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) throw std::invalid_argument("unknown sequence id " + std::to_string(seq));
  return it->second.len;
}

std::vector<int32_t> SequenceRunner::block_table(int64_t seq) const {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) throw std::invalid_argument("unknown sequence id " + std::to_string(seq));
  return it->second.table.blocks;
}

at::Tensor SequenceRunner::extend(const std::vector<std::pair<int64_t, std::vector<int32_t>>>& batch,
                                  bool all_logits, int64_t matmul_min_rows) {
  ForwardInput in;
  in.matmul_min_rows = matmul_min_rows;
  std::vector<State*> states;
  for (const auto& [id, tokens] : batch) {
    State& s = state(id);
    if (std::find(states.begin(), states.end(), &s) != states.end())
      throw std::invalid_argument("sequence " + std::to_string(id) + " appears twice in one batch");
    states.push_back(&s);
  }
  for (size_t i = 0; i < batch.size(); ++i) {
    if (!cache_.reserve(states[i]->table, states[i]->len + static_cast<int64_t>(batch[i].second.size()))) {
      for (size_t j = 0; j <= i; ++j) cache_.truncate(states[j]->table, states[j]->len);
      throw std::invalid_argument("KV cache is full");
    }
    in.max_blocks = std::max<int64_t>(in.max_blocks, static_cast<int64_t>(states[i]->table.blocks.size()));
  }
  in.block_tables.assign(batch.size() * static_cast<size_t>(in.max_blocks), -1);  // -1: no block
  for (size_t i = 0; i < batch.size(); ++i) {
    State& s = *states[i];
    std::copy(s.table.blocks.begin(), s.table.blocks.end(),
              in.block_tables.begin() + static_cast<int64_t>(i) * in.max_blocks);
    const auto& tokens = batch[i].second;
    for (size_t j = 0; j < tokens.size(); ++j) {
      in.tokens.push_back(tokens[j]);
      in.positions.push_back(static_cast<int32_t>(s.len + static_cast<int64_t>(j)));
      in.seq_of_token.push_back(static_cast<int32_t>(i));
      if (all_logits || j + 1 == tokens.size())
        in.logit_rows.push_back(static_cast<int32_t>(in.tokens.size() - 1));
    }
  }
  at::Tensor logits;
  try {
    logits = model_->forward(in, cache_, pool_);
  } catch (...) {
    for (State* s : states) cache_.truncate(s->table, s->len);
    throw;
  }
  for (size_t i = 0; i < batch.size(); ++i) states[i]->len += static_cast<int64_t>(batch[i].second.size());
  return logits;
}

void SequenceRunner::truncate(int64_t seq, int64_t length) {
  State& s = state(seq);
  if (length < 0 || length > s.len)
    throw std::invalid_argument("truncate: length " + std::to_string(length) + " outside [0, " +
                                std::to_string(s.len) + "]");
  cache_.truncate(s.table, length);
  s.len = length;
}

void SequenceRunner::free(int64_t seq) {
  State& s = state(seq);
  cache_.truncate(s.table, 0);
  seqs_.erase(seq);
}

}  // namespace ssd::model
