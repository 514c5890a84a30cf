// The cuda backend: the aten backend's elementwise steps over the whole batch,
// and own kernels where the reduction order decides batch invariance
// (kernels/cuda: linear, rms_norm, paged and fork attention) or where one kernel
// replaces a dozen small launches (rope_kv_write); the draft's KV copies
// between slots run kv_commit's kernel. Weights and the KV cache
// live on the device; each model runs on its own streams (one per StreamRole); a forward crosses to
// the host only for its index arrays (one copy in) and its logit rows (one
// copy out). Forwards of up to kMaxBucketTokens tokens replay CUDA graphs
// (forward_graphs_cuda.h) unless BackendOptions::cuda_graphs is off. With
// batch_invariant=False the products are cuBLAS's and a prefill's attention
// the stock dense kernels' (dense_attention.h).
#include <memory>

#include "backend.h"

#ifdef SSD_WITH_CUDA

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

#include "../bindings/attention_glue.h"
#include "../bindings/fork_select_args.h"
#include "../bindings/gumbel_top_args.h"
#include "../kernels/cuda/fork_attention.h"
#include "../kernels/cuda/fork_select.h"
#include "../kernels/cuda/gumbel_sample.h"
#include "../kernels/cuda/gumbel_top.h"
#include "../kernels/cuda/kv_commit.h"
#include "../kernels/cuda/linear.h"
#include "../kernels/cuda/paged_attention.h"
#include "../kernels/cuda/rms_norm.h"
#include "../kernels/cuda/rope_kv_write.h"
#include "../kernels/cuda/saguaro_sample.h"
#include "../kernels/cuda/verify.h"
#include "../kernels/key_splits.h"
#include "backend_aten.h"
#include "dense_attention.h"
#include "forward_graphs_cuda.h"
#include "forward_shape.h"
#include "green_stream_cuda.h"
#include "kv_cache.h"
#include "round_params.h"

namespace ssd::model {

namespace {

// Graphs kept per stream role: a model's steady state uses a few shapes
// (decode or verify at its batch buckets, the draft's tree and fallback);
// each graph keeps its logits and index buffers.
constexpr int64_t kMaxGraphsPerRole = 32;

// batch_invariant=False: a forward whose every sequence extends by at least
// this many tokens (a prefill, or a prefill chunk) takes the stock dense
// kernels' attention (dense_attention.h), which reads each key tile once per
// tile of queries.
constexpr int64_t kDenseMinRunTokens = 32;

// The draft role's stream: from the pool at the default priority, or with
// share > 0 the stream of a green context on that share of the SMs.
c10::cuda::CUDAStream draft_role_stream(at::Device device, double share) {
  if (share <= 0) return c10::cuda::getStreamFromPool(/*isHighPriority=*/false, device.index());
  c10::cuda::CUDAGuard guard(device);
  const GreenStream green = green_stream(device.index(), share, /*priority=*/0);
  return c10::cuda::getStreamFromExternal(green.stream, device.index());
}

void check_launch(cudaError_t err, const char* step) {
  if (err != cudaSuccess) throw std::runtime_error(std::string("cuda backend: ") + step + ": " + cudaGetErrorString(err));
}

class CudaBackend final : public AtenBackend {
 public:
  // Two streams per model, one per role (StreamRole): the target's at the
  // device's highest priority, the draft's at the default one, and with
  // draft_sm_share on a share of the SMs only (a green context's stream).
  CudaBackend(at::Device device, const BackendOptions& options)
      : AtenBackend(device),
        options_(options),
        target_stream_(c10::cuda::getStreamFromPool(/*isHighPriority=*/true, device.index())),
        draft_stream_(draft_role_stream(device, options.draft_sm_share)) {}

  std::string name() const override { return "cuda"; }

  Matrix matrix(const at::Tensor& dense, at::ScalarType dtype) const override {
    Matrix m;
    m.n = dense.size(0);
    m.k = dense.size(1);
    m.data = dense.to(device_, dtype).contiguous();
    return m;
  }

  // The stream of the calling thread's role, after whatever the caller's
  // stream has queued (the weights and the KV cache were written there); on
  // leaving, the caller's stream waits for the role's.
  std::shared_ptr<void> forward_scope() const override {
    class Scope {
     public:
      Scope(at::Device device, c10::cuda::CUDAStream stream, c10::cuda::CUDAStream caller)
          : guard_(device), stream_(stream), caller_(caller) {
        if (caller_ != stream_) {
          at::cuda::CUDAEvent queued;
          queued.record(caller_);
          queued.block(stream_);
          c10::cuda::setCurrentCUDAStream(stream_);
        }
      }
      // Runs while a CUDA error unwinds the forward, so it must not throw:
      // the raw calls, their errors left to the exception already in flight.
      ~Scope() {
        if (caller_ == stream_) return;
        cudaEvent_t done = nullptr;
        if (cudaEventCreateWithFlags(&done, cudaEventDisableTiming) == cudaSuccess) {
          (void)cudaEventRecord(done, stream_.stream());
          (void)cudaStreamWaitEvent(caller_.stream(), done, 0);
          (void)cudaEventDestroy(done);
        }
        c10::cuda::setCurrentCUDAStream(caller_);
      }

     private:
      c10::cuda::CUDAGuard guard_;
      c10::cuda::CUDAStream stream_, caller_;
    };
    const c10::cuda::CUDAStream caller = c10::cuda::getCurrentCUDAStream(device_.index());
    return std::make_shared<Scope>(device_, role_stream(caller), caller);
  }

  void synchronize() const override {
    target_stream_.synchronize();
    draft_stream_.synchronize();
  }

  // The weights were written on the constructing thread's stream: both role
  // streams wait for them once (an event, no host wait).
  void finish_loading() const override { after_current_stream(); }

  std::shared_ptr<void> thread_scope(StreamRole role) const override {
    return std::make_shared<c10::cuda::CUDAStreamGuard>(role == StreamRole::target ? target_stream_ : draft_stream_);
  }

  // Zeroed on the caller's stream, which both role streams then wait for, so
  // a forward in either role is ordered after the memset.
  at::Tensor kv_storage(const std::vector<int64_t>& sizes, at::ScalarType dtype) const override {
    c10::cuda::CUDAGuard guard(device_);
    at::Tensor storage = at::zeros(sizes, at::TensorOptions().dtype(dtype).device(device_));
    after_current_stream();
    return storage;
  }

  bool captures_forwards(int64_t head_dim) const override {
    return options_.cuda_graphs && (head_dim == 64 || head_dim == 128);
  }

  // The graphs of the calling thread's role (forward_scope made its stream current).
  at::Tensor graphed(int64_t cache_id, const ForwardShape& shape, const ForwardInput& in, int64_t rows,
                     const std::function<at::Tensor(const DeviceBatch&)>& run) const override {
    const c10::cuda::CUDAStream current = role_stream(c10::cuda::getCurrentCUDAStream(device_.index()));
    ForwardGraphs& graphs = current == target_stream_ ? *target_graphs_ : *draft_graphs_;
    return graphs.run(cache_id, shape, in, rows, run, device_, current);
  }

  GraphCounts graph_counts() const override {
    const GraphCounts t = target_graphs_->counts(), d = draft_graphs_->counts();
    return {t.captured + d.captured, t.replayed + d.replayed, t.evicted + d.evicted, t.failed + d.failed};
  }

  // ---- the round's steps: the kernels/cuda twins, on the model's stream.
  std::pair<at::Tensor, at::Tensor> verify(const VerifyBatch& v) const override {
    c10::cuda::CUDAGuard guard(device_);
    const int64_t batch = v.target_logits.size(0), k = v.proposals.size(1);
    at::Tensor accepted = at::empty({batch}, v.proposals.options());
    at::Tensor bonus = at::empty({batch}, v.proposals.options());
    const at::Tensor workspace = at::empty({static_cast<int64_t>(kernels::cuda::verify_workspace_bytes(batch, k))},
                                           v.proposals.options().dtype(at::kByte));
    const kernels::VerifyParams p = verify_params(v, accepted, bonus);
    check_launch(kernels::cuda::verify(p, workspace.data_ptr(), stream()), "verify");
    return {accepted, bonus};
  }

  std::pair<at::Tensor, at::Tensor> saguaro_sample(const at::Tensor& logits, const at::Tensor& temperature,
                                                   const at::Tensor& top_k, const at::Tensor& top_p,
                                                   const at::Tensor& fanout, const at::Tensor& downweight,
                                                   const at::Tensor& uniforms) const override {
    c10::cuda::CUDAGuard guard(device_);
    SaguaroSampleCall call(logits.contiguous(), temperature, top_k, top_p, fanout, downweight, uniforms);
    check_launch(kernels::cuda::saguaro_sample(call.params(), stream()), "saguaro_sample");
    return {call.probs, call.tokens};
  }

  at::Tensor gumbel_sample(const at::Tensor& probs, const at::Tensor& seeds, const at::Tensor& positions) const override {
    c10::cuda::CUDAGuard guard(device_);
    const at::Tensor x = probs.contiguous();
    at::Tensor tokens = at::empty({x.size(0)}, positions.options());
    const kernels::GumbelSampleParams p = bindings::gumbel_sample_params(x, seeds, positions, tokens);
    check_launch(kernels::cuda::gumbel_sample(p, stream()), "gumbel_sample");
    return tokens;
  }

  // fork_select's kernel over rows with nothing drafted; the probabilities
  // from a softmax of the rows (the planner's calibration reads them).
  std::pair<at::Tensor, at::Tensor> top_tokens(const at::Tensor& logits, int64_t depth,
                                               bool with_probs) const override {
    c10::cuda::CUDAGuard guard(device_);
    const at::Tensor x = logits.contiguous().unsqueeze(1);  // [N, 1, V]: one fork point per row
    const at::Tensor drafted = at::empty({x.size(0), 0}, x.options().dtype(at::kLong));
    const at::Tensor fanout = at::full({1}, depth, x.options().dtype(at::kLong));
    auto [ids, counts] = bindings::fork_select_outputs(x, depth);
    const kernels::ForkSelectParams p = bindings::fork_select_params(x, drafted, fanout, depth, ids, counts);
    check_launch(kernels::cuda::fork_select(p, stream()), "top_tokens");
    ids = ids.squeeze(1);
    if (!with_probs) return {ids, at::Tensor()};
    const at::Tensor probs = at::softmax(x.squeeze(1), 1).gather(1, ids.clamp_min(0));
    return {ids, probs.masked_fill(ids.lt(0), 0.0f)};
  }

  std::pair<at::Tensor, at::Tensor> gumbel_top(const at::Tensor& probs, const at::Tensor& seeds,
                                               const at::Tensor& positions, int64_t depth) const override {
    c10::cuda::CUDAGuard guard(device_);
    const at::Tensor x = probs.contiguous();
    auto [ids, scores] = bindings::gumbel_top_outputs(x, depth);
    const kernels::GumbelTopParams p = bindings::gumbel_top_params(x, seeds, positions, depth, ids, scores);
    check_launch(kernels::cuda::gumbel_top(p, stream()), "gumbel_top");
    return {ids, scores};
  }

  void rms_norm(const at::Tensor& x, const at::Tensor& w, float eps, const at::Tensor& out,
                StepContext&) const override {
    // The kernel takes rows with one stride; a [T, heads, d] view of the qkv
    // rows goes through a contiguous copy.
    const bool flat = x.dim() == 2;
    const at::Tensor src = flat ? x : x.reshape({-1, x.size(-1)});
    const at::Tensor dst = flat ? out : at::empty_like(src, at::MemoryFormat::Contiguous);
    kernels::cuda::RmsNormParams p;
    p.x = src.data_ptr<float>();
    p.weight = w.data_ptr<float>();
    p.out = dst.data_ptr<float>();
    p.rows = src.size(0);
    p.n = src.size(1);
    p.ldx = src.stride(0);
    p.ldo = dst.stride(0);
    p.eps = eps;
    check_launch(kernels::cuda::rms_norm(p, stream()), "rms_norm");
    if (!flat) out.copy_(dst.view(out.sizes()));
  }

  at::Tensor linear(const at::Tensor& x, const Matrix& w, const at::Tensor& bias, StepContext&) const override {
    if (!options_.batch_invariant) {
      // cuBLAS in the weights' dtype: fastest, but its kernel (and split-K)
      // depends on the number of rows.
      const bool bf16 = w.data.scalar_type() == at::kBFloat16;
      at::Tensor y = at::matmul(bf16 ? x.to(at::kBFloat16) : x, w.data.t()).to(at::kFloat);
      if (bias.defined()) y.add_(bias);
      return y;
    }
    at::Tensor y = at::empty({x.size(0), w.n}, x.options());
    kernels::cuda::LinearParams p;
    p.x = x.data_ptr<float>();
    p.ldx = x.stride(0);
    p.weight = w.data.data_ptr();
    p.weight_bf16 = w.data.scalar_type() == at::kBFloat16;
    p.bias = bias.defined() ? bias.data_ptr<float>() : nullptr;
    p.y = y.data_ptr<float>();
    p.ldy = y.stride(0);
    p.m = x.size(0);
    p.n = w.n;
    p.k = w.k;
    check_launch(kernels::cuda::linear(p, stream()), "linear");
    return y;
  }

  // One kernel when q, k and v are the three parts of fused qkv rows (the
  // forward's layout); otherwise the aten steps.
  void rope_kv_write(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& inv_freq,
                     KvCache& cache, int64_t layer, const DeviceBatch& b, StepContext& ctx) const override {
    const int64_t d = q.size(2), ld = q.stride(0);
    float* base = q.data_ptr<float>();
    const bool fused = k.stride(0) == ld && v.stride(0) == ld && q.stride(1) == d && k.stride(1) == d &&
                       v.stride(1) == d && k.data_ptr<float>() == base + q.size(1) * d &&
                       v.data_ptr<float>() == k.data_ptr<float>() + k.size(1) * d;
    if (!fused) return AtenBackend::rope_kv_write(q, k, v, inv_freq, cache, layer, b, ctx);
    const kernels::PagedKv kv = cache.layer(layer);
    kernels::cuda::RopeKvWriteParams p;
    p.qkv = base;
    p.ld = ld;
    p.num_tokens = q.size(0);
    p.num_heads = q.size(1);
    p.num_kv_heads = k.size(1);
    p.head_dim = d;
    p.inv_freq = inv_freq.data_ptr<float>();
    p.positions = b.positions.data_ptr<int32_t>();
    p.seq_of_token = b.seq_of_token.data_ptr<int32_t>();
    p.block_tables = b.block_tables.data_ptr<int32_t>();
    p.max_blocks = b.host->max_blocks;
    p.block_size = kv.block_size;
    p.k_cache = kv.k;
    p.v_cache = kv.v;
    p.k_cache_bf16 = kv.k_bf16;
    p.v_cache_bf16 = kv.v_bf16;
    check_launch(kernels::cuda::rope_kv_write(p, stream()), "rope_kv_write");
  }

  at::Tensor paged_attention(const at::Tensor& q, KvCache& cache, int64_t layer, const DeviceBatch& b, float scale,
                             int64_t window, StepContext& ctx) const override {
    if (!options_.batch_invariant && b.host->key_bound == 0) {  // not inside a graph: the runs are the host's
      const std::vector<PrefillRun> runs = prefill_runs(*b.host, cache.block_size(), kDenseMinRunTokens);
      if (!runs.empty()) {
        const at::Tensor kv = cache.storage()[layer];
        return dense_attention(q, kv[0], kv[1], runs, *b.host, scale, window, at::kBFloat16);
      }
    }
    if (q.size(2) != 64 && q.size(2) != 128)
      return AtenBackend::paged_attention(q, cache, layer, b, scale, window, ctx);
    at::Tensor out;
    kernels::cuda::PagedAttentionParams p;
    const std::vector<at::Tensor> workspace = attention_params(p, q, cache, layer, b, scale, window, out);
    check_launch(kernels::cuda::paged_attention(p, stream()), "paged_attention");
    return out;
  }

  at::Tensor fork_attention(const at::Tensor& q, KvCache& cache, int64_t layer, const DeviceBatch& b, float scale,
                            int64_t window, StepContext& ctx) const override {
    if (q.size(2) != 64 && q.size(2) != 128)
      return AtenBackend::fork_attention(q, cache, layer, b, scale, window, ctx);
    at::Tensor out;
    kernels::cuda::ForkAttentionParams p;
    const std::vector<at::Tensor> workspace = attention_params(p.paged, q, cache, layer, b, scale, window, out);
    p.prefix_seq = b.prefix_seq.data_ptr<int32_t>();
    p.prefix_len = b.prefix_len.data_ptr<int32_t>();
    check_launch(kernels::cuda::fork_attention(p, stream()), "fork_attention");
    return out;
  }

  // The kv_commit kernel on the model's stream, the cache as its own tree
  // (every source row staged before any is written). The indices are checked
  // here, so the kernel's status is never read back: no sync.
  void copy_kv_slots(KvCache& cache, const std::vector<int64_t>& src_slots,
                     const std::vector<int64_t>& dst_slots) const override {
    check_kv_slots(src_slots, dst_slots, cache.num_slots());
    if (src_slots.empty()) return;
    const auto scope = forward_scope();  // device, stream, and the order with the caller's stream
    const auto n = static_cast<int64_t>(src_slots.size());
    at::Tensor host = at::empty({2, n}, at::TensorOptions().dtype(at::kLong).pinned_memory(true));
    std::copy(src_slots.begin(), src_slots.end(), host.data_ptr<int64_t>());
    std::copy(dst_slots.begin(), dst_slots.end(), host.data_ptr<int64_t>() + n);
    const at::Tensor slots = host.to(device_, at::kLong, /*non_blocking=*/true);
    const at::Tensor& storage = cache.storage();
    const kernels::KvRows rows = cache.rows();
    const at::Tensor staging = at::empty({storage.size(0), 2, n, storage.size(4) * storage.size(5)}, storage.options());
    const at::Tensor status = at::empty({4}, storage.options().dtype(at::kLong));
    kernels::cuda::KvCommitParams p;
    p.copy.cache = storage.data_ptr();
    p.copy.cache_rows = rows;
    p.copy.tree = p.copy.cache;
    p.copy.tree_rows = rows;
    p.copy.num_layers = storage.size(0);
    p.copy.row_bytes = rows.slot_stride;
    p.copy.src_slots = slots.data_ptr<int64_t>();
    p.copy.dst_slots = slots.data_ptr<int64_t>() + n;
    p.copy.n = n;
    p.copy.tree_in_cache = true;
    p.copy.tree_slot_offset = 0;
    p.staging = staging.data_ptr();
    p.status = status.data_ptr<int64_t>();
    check_launch(kernels::cuda::kv_commit(p, stream()), "copy_kv_slots");
  }

 private:
  // The kernels' params for q [T, Hq, d] over the layer's cache and the
  // batch's tables; out gets [T, Hq * d]. Returns the split workspace (kept
  // until the launch is queued; freed stream-ordered).
  std::vector<at::Tensor> attention_params(kernels::cuda::PagedAttentionParams& p, const at::Tensor& q, KvCache& cache,
                                           int64_t layer, const DeviceBatch& b, float scale, int64_t window,
                                           at::Tensor& out) const {
    const int64_t d = q.size(2);
    const kernels::PagedKv kv = cache.layer(layer);
    out = at::empty({q.size(0), q.size(1) * d}, q.options());
    p.q = q.data_ptr<float>();
    p.ldq = q.stride(0);
    p.out = out.data_ptr<float>();
    p.ldo = out.stride(0);
    p.kv_bf16 = kv.bf16();
    p.k_cache = kv.bf16() ? static_cast<const void*>(kv.k_bf16) : kv.k;
    p.v_cache = kv.bf16() ? static_cast<const void*>(kv.v_bf16) : kv.v;
    p.num_tokens = q.size(0);
    p.num_heads = q.size(1);
    p.num_kv_heads = kv.num_kv_heads;
    p.head_dim = d;
    p.block_size = kv.block_size;
    p.block_tables = b.block_tables.data_ptr<int32_t>();
    p.max_blocks = b.host->max_blocks;
    p.seq_of_token = b.seq_of_token.data_ptr<int32_t>();
    p.positions = b.positions.data_ptr<int32_t>();
    p.scale = scale;
    p.window = window;
    const int64_t splits = b.host->key_bound > 0
                               ? kernels::max_key_splits_below(b.host->key_bound, window)
                               : kernels::max_key_splits(b.host->positions.data(), p.num_tokens, window);
    return attention::split_workspace(p, p.num_tokens, splits, q.options());
  }

  // Called inside forward_scope (or a step's own guard): the role stream the
  // scope made current, or the draft's for a step called outside any scope.
  cudaStream_t stream() const {
    return role_stream(c10::cuda::getCurrentCUDAStream(device_.index())).stream();
  }

  // `current` when it is one of this model's role streams (a thread_scope or
  // forward_scope holds it), else the draft role's.
  c10::cuda::CUDAStream role_stream(c10::cuda::CUDAStream current) const {
    return current == target_stream_ ? target_stream_ : draft_stream_;
  }

  // Both role streams wait for what the current stream has queued.
  void after_current_stream() const {
    c10::cuda::CUDAGuard guard(device_);
    at::cuda::CUDAEvent queued;
    queued.record(c10::cuda::getCurrentCUDAStream(device_.index()));
    queued.block(target_stream_);
    queued.block(draft_stream_);
  }

  BackendOptions options_;
  c10::cuda::CUDAStream target_stream_, draft_stream_;
  // Per role: the graphs replay in their own stream's order.
  std::unique_ptr<ForwardGraphs> target_graphs_ = std::make_unique<ForwardGraphs>(kMaxGraphsPerRole);
  std::unique_ptr<ForwardGraphs> draft_graphs_ = std::make_unique<ForwardGraphs>(kMaxGraphsPerRole);
};

}  // namespace

std::unique_ptr<Backend> make_cuda_backend(at::Device device, const BackendOptions& options) {
  return std::make_unique<CudaBackend>(device, options);
}
bool cuda_backend_built() { return true; }

}  // namespace ssd::model

#else  // no CUDA in this build

namespace ssd::model {
std::unique_ptr<Backend> make_cuda_backend(at::Device, const BackendOptions&) { return nullptr; }
bool cuda_backend_built() { return false; }
}  // namespace ssd::model

#endif
