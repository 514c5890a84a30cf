#include "speculation_cache.h"

#include <algorithm>

#include "../model/backend.h"

namespace ssd::runtime {

void DraftSequence::propose(std::vector<int32_t> proposal, std::vector<RankedTokens> lists, int64_t K,
                            SpecSource from) {
  spec = std::move(proposal);
  ranked = std::move(lists);
  ranked.resize(static_cast<size_t>(K + 1));
  source = from;
}

Speculation DraftSequence::answer(SpecSource from, at::Tensor q, bool one_hot) const {
  Speculation r;
  r.id = id;
  r.epoch = epoch;
  r.source = from;
  r.tokens = spec;
  r.q = std::move(q);
  r.one_hot = one_hot;
  return r;
}

void copy_kv_slots(model::KvCache& kv, const model::BlockTable& from, const model::BlockTable& to, int64_t begin,
                   int64_t end) {
  if (end <= begin) return;
  const int64_t bs = kv.block_size();
  std::vector<int64_t> src, dst;
  src.reserve(static_cast<size_t>(end - begin));
  dst.reserve(static_cast<size_t>(end - begin));
  for (int64_t pos = begin; pos < end; ++pos) {
    src.push_back(static_cast<int64_t>(from.blocks[pos / bs]) * bs + pos % bs);
    dst.push_back(static_cast<int64_t>(to.blocks[pos / bs]) * bs + pos % bs);
  }
  kv.backend().copy_kv_slots(kv, src, dst);
}

DraftSequence& SpeculationCache::start(SpecMessage& m) {
  auto s = std::make_unique<DraftSequence>();
  s->id = m.id;
  s->epoch = m.epoch;
  s->params = m.params;
  s->seed = m.seed;
  s->tokens = std::move(m.tokens);
  DraftSequence& ref = *s;
  seqs_[m.id] = std::move(s);
  return ref;
}

DraftSequence* SpeculationCache::find(RequestId id) {
  auto it = seqs_.find(id);
  return it == seqs_.end() ? nullptr : it->second.get();
}

void SpeculationCache::drop(RequestId id) {
  auto it = seqs_.find(id);
  if (it == seqs_.end()) return;
  release(*it->second);
  seqs_.erase(it);
}

void SpeculationCache::clear() {
  for (auto& [id, s] : seqs_) release(*s);
  seqs_.clear();
}

void SpeculationCache::commit(DraftSequence& s, int64_t accepted, int32_t bonus) {
  const auto L = static_cast<int64_t>(s.tokens.size());
  for (int64_t i = 0; i < accepted; ++i) s.tokens.push_back(s.spec[i]);
  s.tokens.push_back(bonus);
  s.computed = std::min(s.computed, L + accepted);
  kv_.truncate(s.table, s.computed);
}

bool SpeculationCache::take_hit(DraftSequence& s, int64_t accepted, int32_t bonus, Speculation& out) {
  if (!s.treed) return false;
  auto entry = s.cache.find({accepted, bonus});
  if (entry == s.cache.end()) return false;
  // The branch already holds the KV of the bonus and the K - 1 tokens drafted after it.
  const int64_t P = static_cast<int64_t>(s.tokens.size()) - 1;
  if (!kv_.reserve(s.table, P + K_)) return false;
  copy_kv_slots(kv_, s.branches[entry->second.branch].table, s.table, P, P + K_);
  s.computed = P + K_;
  CachedSpeculation& hit = entry->second;
  s.propose(std::move(hit.tokens), std::move(hit.ranked), K_, SpecSource::kHit);
  out = s.answer(SpecSource::kHit, std::move(hit.q), false);
  return true;
}

void SpeculationCache::free_tree(DraftSequence& s) {
  for (auto& b : s.branches) kv_.truncate(b.table, b.shared * kv_.block_size());
  s.branches.clear();
  s.cache.clear();
  s.treed = false;
}

void SpeculationCache::release(DraftSequence& s) {
  free_tree(s);
  kv_.truncate(s.table, 0);
  s.computed = 0;
}

}  // namespace ssd::runtime
