#include "forward_graphs_cuda.h"

#ifdef SSD_WITH_CUDA

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <utility>

namespace ssd::model {

at::Tensor ForwardGraphs::run(int64_t cache_id, const ForwardShape& shape, const ForwardInput& in, int64_t rows,
                              const std::function<at::Tensor(const DeviceBatch&)>& forward, at::Device device,
                              c10::cuda::CUDAStream stream) {
  // One caller at a time per role (a role is one thread's in the engine;
  // the lock makes a second one wait rather than interleave captures).
  std::lock_guard<std::mutex> lock(mutex_);
  const Key key{cache_id, shape};
  const auto launched = [&] {
    const at::Tensor packed = packed_indices(in, /*pinned=*/true).to(device, at::kInt, /*non_blocking=*/true);
    return forward(batch_views(in, packed)).narrow(0, 0, rows);
  };
  auto it = graphs_.find(key);
  if (it == graphs_.end()) {
    if (failed_.count(key) != 0) return launched();
    if (warmed_.count(key) == 0) {  // marked once it has run: a warm-up that throws is no warm-up
      at::Tensor logits = launched();
      warmed_.insert(key);
      return logits;
    }
    if (static_cast<int64_t>(graphs_.size()) >= max_graphs_) evict_one(stream);
    std::unique_ptr<Graph> g;
    try {
      g = capture(in, forward, device);
    } catch (const std::exception& e) {
      failed_.insert(key);
      ++counts_.failed;
      TORCH_WARN("CUDA graph capture of a ", shape.tokens, "-token forward failed; its shape runs without a graph: ",
                 e.what());
      return launched();
    }
    it = graphs_.emplace(key, std::move(g)).first;
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
  return g.logits.narrow(0, 0, rows).clone();
}

std::unique_ptr<ForwardGraphs::Graph> ForwardGraphs::capture(
    const ForwardInput& in, const std::function<at::Tensor(const DeviceBatch&)>& forward, at::Device device) {
  auto g = std::make_unique<Graph>();
  g->host = in;
  // Outside the capture: the buffer a replay reads, holding this forward's arrays.
  g->indices = packed_indices(in, /*pinned=*/true).to(device, at::kInt, /*non_blocking=*/true);
  g->batch = batch_views(g->host, g->indices);
  // A new pool where no graph holds the last one (torch may have released
  // it with its last graph, or with a failed capture's).
  if (graphs_.empty()) pool_ = at::cuda::graph_pool_handle();
  // cuBLAS's handles and this stream's workspace, made outside the capture
  // (a thread's first product would otherwise create them inside it).
  at::cuda::getCurrentCUDABlasHandle();
  at::cuda::getCurrentCUDABlasLtHandle();
  // Thread-local: the other role's thread keeps launching (and allocating)
  // on its own stream while this one captures.
  g->graph.capture_begin(pool_, cudaStreamCaptureModeThreadLocal);
  at::Tensor logits;
  try {
    logits = forward(g->batch);
    g->graph.capture_end();
  } catch (...) {
    // End the capture if the forward left it open (the graph is dropped with
    // g). A failed cudaStreamEndCapture leaves the allocator routing this
    // stream's blocks to the pool, and the runtime's last error set: both undone.
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(c10::cuda::getCurrentCUDAStream(device.index()), &status) == cudaSuccess &&
        status != cudaStreamCaptureStatusNone) {
      try {
        g->graph.capture_end();
      } catch (...) {
      }
    }
    try {
      c10::cuda::CUDACachingAllocator::endAllocateToPool(device.index(), pool_);
    } catch (...) {  // capture_end got as far as that
    }
    (void)cudaGetLastError();
    throw;
  }
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
