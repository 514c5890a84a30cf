// CUDA graphs of one model's forwards in one stream role: one graph per
// ForwardShape (forward_shape.h) and KV cache (its kernels hold the cache's
// addresses), captured on the role's stream into a memory pool the role's
// graphs share (they replay one at a time, in the role's stream order, and
// hold no memory of their own between replays: not even their logits, which
// each replay's caller copies out at once), each with its own device buffer
// of index arrays that a replay overwrites from pinned host memory. The cuda backend's graphed()
// (backend.h). Only built with SSD_WITH_CUDA.
#pragma once

#ifdef SSD_WITH_CUDA

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAStream.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <unordered_set>

#include "backend.h"
#include "forward_shape.h"

namespace ssd::model {

class ForwardGraphs {
 public:
  /// At most max_graphs graphs are kept; past that the least recently
  /// replayed one is dropped (after the stream has finished with it).
  explicit ForwardGraphs(int64_t max_graphs) : max_graphs_(max_graphs) {}

  /// Backend::graphed on `stream` (the calling thread's current stream, the
  /// role's): the first forward of a shape runs as it is (the warm-up that
  /// initialises cuBLAS and the kernels' modules), the second is captured
  /// and replayed, later ones replayed. Returns a copy of the first `rows`
  /// of the graph's logits. A capture that fails (a warning says why) is
  /// counted, its forward and every later one of its key run as they are.
  at::Tensor run(int64_t cache_id, const ForwardShape& shape, const ForwardInput& in, int64_t rows,
                 const std::function<at::Tensor(const DeviceBatch&)>& forward, at::Device device,
                 c10::cuda::CUDAStream stream);

  GraphCounts counts() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return counts_;
  }

 private:
  struct Graph {
    ForwardInput host;      ///< the captured forward's arrays: batch.host (its shape decisions)
    at::Tensor indices;     ///< int32 on the device, packed_indices' layout: what a replay rewrites
    DeviceBatch batch;      ///< views of indices
    at::Tensor logits;      ///< the graph's output (a view not owning its pool block), rewritten by each replay
    at::cuda::CUDAGraph graph;
    uint64_t last_use = 0;
  };

  std::unique_ptr<Graph> capture(const ForwardInput& in, const std::function<at::Tensor(const DeviceBatch&)>& forward,
                                 at::Device device);
  void evict_one(c10::cuda::CUDAStream stream);

  const int64_t max_graphs_;
  mutable std::mutex mutex_;
  struct Key {
    int64_t cache_id;
    ForwardShape shape;
    bool operator==(const Key& o) const { return cache_id == o.cache_id && shape == o.shape; }
  };
  struct KeyHash {
    size_t operator()(const Key& k) const { return ForwardShapeHash{}(k.shape) * 31u ^ std::hash<int64_t>{}(k.cache_id); }
  };
  std::unordered_map<Key, std::unique_ptr<Graph>, KeyHash> graphs_;
  std::unordered_set<Key, KeyHash> warmed_;  ///< keys whose first forward ran as it is
  std::unordered_set<Key, KeyHash> failed_;  ///< keys whose capture failed: never captured again
  at::cuda::MempoolId_t pool_{0, 0};  ///< the graphs' pool; a new one while graphs_ is empty
  uint64_t clock_ = 0;
  GraphCounts counts_;
};

}  // namespace ssd::model

#endif  // SSD_WITH_CUDA
