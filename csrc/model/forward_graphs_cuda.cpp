#include "forward_graphs_cuda.h"

#ifdef SSD_WITH_CUDA

#include <algorithm>
#include <utility>

namespace ssd::model {

at::Tensor ForwardGraphs::run(int64_t cache_id, const ForwardShape& shape, const ForwardInput& in,
                              const std::function<at::Tensor(const DeviceBatch&)>& forward, at::Device device,
                              c10::cuda::CUDAStream stream) {
  // One caller at a time per role (a role is one thread's in the engine;
  // the lock makes a second one wait rather than interleave captures).
  std::lock_guard<std::mutex> lock(mutex_);
  const Key key{cache_id, shape};
  auto it = graphs_.find(key);
  if (it == graphs_.end()) {
    if (warmed_.count(key) == 0) {  // marked once it has run: a warm-up that throws is no warm-up
      const at::Tensor packed = packed_indices(in, /*pinned=*/true).to(device, at::kInt, /*non_blocking=*/true);
      at::Tensor logits = forward(batch_views(in, packed));
      warmed_.insert(key);
      return logits;
    }
    if (static_cast<int64_t>(graphs_.size()) >= max_graphs_) evict_one(stream);
    it = graphs_.emplace(key, capture(in, forward, device)).first;
    ++counts_.captured;
  } else {
    // The arrays of this forward into the graph's buffer, stream-ordered
    // before the replay (the pinned block is kept until the copy is done).
    it->second->indices.copy_(packed_indices(in, /*pinned=*/true), /*non_blocking=*/true);
  }
  Graph& g = *it->second;
  g.last_use = ++clock_;
  g.graph.replay();
  ++counts_.replayed;
  return g.logits.clone();
}

std::unique_ptr<ForwardGraphs::Graph> ForwardGraphs::capture(
    const ForwardInput& in, const std::function<at::Tensor(const DeviceBatch&)>& forward, at::Device device) {
  auto g = std::make_unique<Graph>();
  g->host = in;
  // Outside the capture: the buffer a replay reads, holding this forward's arrays.
  g->indices = packed_indices(in, /*pinned=*/true).to(device, at::kInt, /*non_blocking=*/true);
  g->batch = batch_views(g->host, g->indices);
  if (!have_pool_) {
    pool_ = at::cuda::graph_pool_handle();
    have_pool_ = true;
  }
  // Thread-local: the other role's thread keeps launching (and allocating)
  // on its own stream while this one captures.
  g->graph.capture_begin(pool_, cudaStreamCaptureModeThreadLocal);
  at::Tensor logits;
  try {
    logits = forward(g->batch);
  } catch (...) {
    try {
      g->graph.capture_end();  // ends the stream's capture; the graph is dropped with g
    } catch (...) {
    }
    throw;
  }
  g->graph.capture_end();
  // A view that does not own the output: its block goes back to the role's
  // pool, where a later capture may reuse it, as it reuses every block this
  // capture freed. That is safe because replays of the role's graphs run
  // one at a time on one stream, each followed at once by the copy of its
  // logits (run()); so the role's graphs together hold about the memory of
  // the largest one, not of all.
  g->logits = at::from_blob(logits.data_ptr(), logits.sizes(), logits.strides(), logits.options());
  return g;
}

void ForwardGraphs::evict_one(c10::cuda::CUDAStream stream) {
  const auto oldest = std::min_element(graphs_.begin(), graphs_.end(), [](const auto& a, const auto& b) {
    return a.second->last_use < b.second->last_use;
  });
  stream.synchronize();  // no replay of it still queued
  warmed_.erase(oldest->first);
  graphs_.erase(oldest);
  ++counts_.evicted;
}

}  // namespace ssd::model

#endif  // SSD_WITH_CUDA
