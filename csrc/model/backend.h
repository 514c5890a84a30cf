// The device operations the model forward is written over. model.cpp holds the
// one forward (layer sequence, batching, positions, KV bookkeeping, logit
// rows); a Backend holds the weights in its own layout and runs each step on
// its device. Implementations:
//   cpu  — the kernels of kernels/cpu (the oracle every other backend is
//          tested against);
//   aten — a reference over ATen ops on any device, row by row so that it is
//          batch-invariant by construction (slow; proves the interface);
//   cuda — the aten backend with its hot steps (linear, rms_norm, paged
//          attention) replaced by the kernels of kernels/cuda (SSD_WITH_CUDA).
//
// Shapes: T tokens of the batch, h hidden size, d head dim, Hq / Hkv heads,
// W = (Hq + 2 Hkv) d the fused qkv width. Activations are fp32 tensors on the
// backend's device; `x` views may have any row stride with contiguous rows.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "../kernels/cpu/quant.h"
#include "../kernels/cpu/thread_pool.h"

namespace ssd::model {

class KvCache;
struct ForwardShape;  // forward_shape.h

/// Tokens of several sequences flattened into one batch (host memory).
struct ForwardInput {
  std::vector<int32_t> tokens;        ///< [T]
  std::vector<int32_t> positions;     ///< [T] position of each token in its sequence
  std::vector<int32_t> seq_of_token;  ///< [T] index into block_tables
  std::vector<int32_t> block_tables;  ///< [num_seqs, max_blocks], row-major; -1: no block (padding).
  ///< A token whose entry is -1 (slot -1) writes no K / V and attends to nothing (output 0).
  int64_t max_blocks = 0;
  std::vector<int32_t> logit_rows;    ///< rows of the batch whose logits are wanted
  /// Empty, or [T] each when the rows are speculation-tree branches: row t
  /// forks from the sequence of block_tables row prefix_seq[t] at position
  /// prefix_len[t] (0..positions[t]; 0: no fork). Its keys below the fork
  /// are that sequence's, the others its own (Backend::fork_attention), so
  /// its own table need not hold the sequence's values in the partial block
  /// at the fork.
  std::vector<int32_t> prefix_seq, prefix_len;
  bool forks() const { return !prefix_seq.empty(); }
  /// > 0: matrix products over at least this many rows may use a faster,
  /// not exact, path (the cpu backend's bf16 pair kernels: AVX512-BF16, 16
  /// rows cost little more than one). Only the draft uses it, for its tree;
  /// exactness never depends on the draft's numerics. Backends without such
  /// a path ignore it.
  int64_t matmul_min_rows = 0;
  /// > 0: every position of this forward, and of every forward a graph
  /// captured from it replays (forward_shape.h), is below key_bound: the
  /// cuda backend sizes its attention's key splits by it instead of by the
  /// positions. 0: by the positions.
  int64_t key_bound = 0;
};

/// A weight matrix [n, k] in the backend's layout: dense (fp32 or bf16
/// data), or kept in a quantized block format (`quant`; kernels/cpu/quant.h)
/// where the backend multiplies such blocks itself.
struct Matrix {
  at::Tensor data;
  int64_t n = 0, k = 0;
  kernels::QuantType quant = kernels::QuantType::none;
  /// Quantized: multiplied with int8 activations (kernels::linear_quant_i8)
  /// rather than fp32 ones (kernels::linear_quant, the dequantised product).
  bool int8_activations = false;
  /// Quantized parts whose tile formats differ (a fused q/k/v whose v is
  /// q6_k and q, k q4_k, as llama.cpp's mixes write them): each a quantized
  /// matrix of its own, multiplied into its columns in order; `data` is then
  /// undefined and `quant` none.
  std::vector<Matrix> segments;
};

/// One forward's index arrays on the device, uploaded once per forward.
struct DeviceBatch {
  const ForwardInput* host = nullptr;
  at::Tensor tokens, positions, seq_of_token, block_tables, logit_rows;  ///< int32 (see ForwardInput)
  at::Tensor prefix_seq, prefix_len;  ///< int32 [T], defined where host->forks()
  /// The same in every layer, so computed once per forward by the steps that
  /// need them (the aten-based ones): each token's cache slot [T] int64 and
  /// its rotary cos / sin [T, 1, d / 2].
  mutable at::Tensor slots, rope_cos, rope_sin;
};

/// What a step may use besides its tensors: the caller's CPU thread pool (the
/// cpu backend) and the forward's options.
/// The part a thread plays in driving a model (Backend::thread_scope): on a
/// GPU the target's stream runs at a higher priority than the draft's, so a
/// draft sharing the target's GPU fills the gaps of the target's verify rather
/// than delaying it. One loaded model may play both roles (a model drafting
/// for itself), so the priority belongs to the role, not to the model.
enum class StreamRole { target, draft };

struct StepContext {
  kernels::ThreadPool& pool;
  int64_t matmul_min_rows = 0;
};

/// One verify step's inputs (kernels/cpu/verify.h), tensors on the backend's
/// device (B rows, K proposal slots, V vocab).
struct VerifyBatch {
  at::Tensor target_logits;    ///< [B, K + 1, V] f32, contiguous
  at::Tensor proposals;        ///< [B, K] i64
  at::Tensor num_proposals;    ///< [B] i64, each in 0..K
  at::Tensor q_probs;          ///< [B, K, V] f32; undefined when no row reads it (one-hot or greedy)
  at::Tensor one_hot;          ///< [B] bool
  at::Tensor temperature;      ///< [B] f64
  at::Tensor top_k;            ///< [B] i64
  at::Tensor top_p;            ///< [B] f64
  at::Tensor accept_uniforms;  ///< [B, K] f64
  at::Tensor bonus_uniforms;   ///< [B] f64
};

/// Options of a backend, fixed at model construction.
struct BackendOptions {
  /// false: the fastest stock matrix products (cuBLAS), whose reduction order
  /// depends on the batch shape, so greedy sd is no longer token-identical to
  /// ar. The cpu and aten backends are always batch-invariant.
  bool batch_invariant = true;
  /// Quantized matrices kept in blocks (the cpu backend) multiply int8
  /// activations (kernels/cpu/quant.h; llama.cpp's way, 2-3x fewer
  /// instructions per weight); false: fp32 activations, which computes
  /// exactly the model of the dequantised weights. Rows are batch invariant
  /// either way.
  bool int8_activations = true;
  /// The cuda backend pads each forward of at most kMaxBucketTokens tokens
  /// to its bucket shape (forward_shape.h) and replays a CUDA graph captured
  /// per shape and stream role, so a step costs one launch rather than
  /// hundreds. With batch_invariant the logits are the same bits either way.
  /// Others ignore it.
  bool cuda_graphs = true;
  /// > 0 (below 1): the cuda backend runs its draft role's kernels on that
  /// share of the GPU's SMs only, on the stream of a CUDA green context
  /// (green_stream_cuda.h), instead of on every SM at the lower stream
  /// priority: the target keeps the rest whatever the draft launches. 0:
  /// stream priority only. Others ignore it.
  double draft_sm_share = 0;
};

/// What Backend::graphed has done so far (the cuda backend; zeros elsewhere).
struct GraphCounts {
  int64_t captured = 0;  ///< graphs captured (one per shape and role, again after an eviction)
  int64_t replayed = 0;  ///< forwards run as a graph's replay
  int64_t evicted = 0;   ///< graphs dropped to stay within the backend's limit
  int64_t failed = 0;    ///< captures that failed: their shapes are launched as they are from then on
};

class Backend {
 public:
  virtual ~Backend() = default;
  /// "cpu", "aten" or "cuda".
  virtual std::string name() const = 0;
  virtual at::Device device() const = 0;

  // ---- weights (dense inputs are host or device tensors, any float dtype)
  /// dense [n, k] -> this backend's layout, stored in `dtype` (kFloat /
  /// kBFloat16; kHalf where multiplies_fp16()).
  virtual Matrix matrix(const at::Tensor& dense, at::ScalarType dtype) const = 0;
  /// Whether matrix() keeps kHalf storage (the cpu backend's products
  /// convert fp16 weights in registers); others are given fp16 matrices as
  /// float32.
  virtual bool multiplies_fp16() const { return false; }
  /// GGUF blocks of an [n, k] matrix -> this backend's layout: `parts` are
  /// its rows in order (fused q/k/v, gate/up), part i uint8 [rows_i,
  /// gguf_row_bytes(types[i], k)]. The cpu backend keeps the blocks
  /// (Matrix::quant, or segments where the parts' tile formats differ); the
  /// default dequantises them (dequantized()) into an fp32 matrix.
  virtual Matrix quantized_matrix(const std::vector<at::Tensor>& parts,
                                  const std::vector<kernels::QuantType>& types, int64_t n, int64_t k) const;
  /// Norm weights and biases: fp32, contiguous, on the device.
  virtual at::Tensor vector(const at::Tensor& v) const;
  /// The embedding table [vocab, h] in `dtype`, on the device.
  virtual at::Tensor embedding(const at::Tensor& table, at::ScalarType dtype) const;
  /// A zeroed KV store of `sizes` and `dtype` (kFloat or kBFloat16) on the device.
  virtual at::Tensor kv_storage(const std::vector<int64_t>& sizes, at::ScalarType dtype) const;

  /// Ends construction: the weights (and any cache made so far) are written
  /// before the model's own stream first reads them (the cuda backend waits
  /// for the constructing thread's stream once).
  virtual void finish_loading() const {}

  // ---- one forward
  /// Held for the whole forward (the cuda backend: its device and the stream
  /// of the calling thread's role, ordered after the caller's stream on entry
  /// and before it on exit).
  virtual std::shared_ptr<void> forward_scope() const { return nullptr; }
  /// Held by a thread that drives this model for its whole life in `role`
  /// (the engine's loop: target; the ssd draft worker: draft): the model's
  /// stream of that role becomes the thread's current stream, so its forwards
  /// and rounds never join the legacy default stream or another model's
  /// stream. A thread holding none runs the model on its draft-role stream.
  /// Null where there are no streams.
  virtual std::shared_ptr<void> thread_scope(StreamRole role) const {
    (void)role;
    return nullptr;
  }
  /// Waits for the backend's queued work (tests of single steps).
  virtual void synchronize() const {}
  virtual DeviceBatch upload(const ForwardInput& in) const;
  /// Whether Model::forward_device pads its forwards and runs them through
  /// graphed(): the cuda backend with cuda_graphs, where every step of the
  /// forward is one of its kernels (head_dim 64 or 128; the aten fallbacks
  /// read the host). False elsewhere.
  virtual bool captures_forwards(int64_t head_dim) const {
    (void)head_dim;
    return false;
  }
  /// run(upload(in)) for `in` padded to `shape` (Model::forward_bucketed),
  /// inside forward_scope: the cuda backend replays a graph captured per
  /// shape, stream role and KV cache (KvCache::id; the graph holds its addresses) (its first forward of a shape runs as it is, as
  /// the warm-up), `in`'s index arrays copied into the graph's own device
  /// buffers; the logits returned (the first `rows` of run's, the real
  /// forward's) are the caller's own, not the graph's. Elsewhere the padded
  /// forward runs as it is.
  virtual at::Tensor graphed(int64_t cache_id, const ForwardShape& shape, const ForwardInput& in, int64_t rows,
                             const std::function<at::Tensor(const DeviceBatch&)>& run) const {
    (void)cache_id;
    (void)shape;
    return run(upload(in)).narrow(0, 0, rows);
  }
  virtual GraphCounts graph_counts() const { return {}; }
  /// [T, h] fp32 rows of the embedding table.
  virtual at::Tensor embed(const at::Tensor& table, const DeviceBatch& b) const = 0;
  /// [T, h] fp32 rows of an embedding table held as a quantized matrix (one
  /// copy serving both lookup and, when tied, the logits). Only backends whose
  /// quantized_matrix keeps blocks are asked; the default throws.
  virtual at::Tensor embed_rows(const Matrix& table, const DeviceBatch& b) const;
  /// out[r] = x[r] / sqrt(mean(x[r]^2) + eps) * w over the last dim; x, out:
  /// [rows, n] or [T, heads, n] (out may alias x).
  virtual void rms_norm(const at::Tensor& x, const at::Tensor& w, float eps, const at::Tensor& out,
                        StepContext& ctx) const = 0;
  /// y [m, n] = x [m, k] @ w^T + bias (bias may be undefined).
  virtual at::Tensor linear(const at::Tensor& x, const Matrix& w, const at::Tensor& bias,
                            StepContext& ctx) const = 0;
  /// Rotary embedding in place on q [T, Hq, d] and k [T, Hkv, d] (views of
  /// the qkv rows), then k and v [T, Hkv, d] written to their cache slots.
  virtual void rope_kv_write(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                             const at::Tensor& inv_freq, KvCache& cache, int64_t layer,
                             const DeviceBatch& b, StepContext& ctx) const = 0;
  /// Causal attention of q [T, Hq, d] over the layer's paged cache -> [T, Hq * d].
  /// window > 0: a query at position i attends keys i - window < j <= i only.
  virtual at::Tensor paged_attention(const at::Tensor& q, KvCache& cache, int64_t layer,
                                     const DeviceBatch& b, float scale, int64_t window,
                                     StepContext& ctx) const = 0;
  /// paged_attention for rows that fork (b.host->forks()): row t's keys below
  /// prefix_len[t] through block-table row prefix_seq[t], the others through
  /// its own (kernels/cpu/fork_attention.h): bitwise paged_attention's result
  /// over a table holding those keys, where the kernels are the same.
  virtual at::Tensor fork_attention(const at::Tensor& q, KvCache& cache, int64_t layer,
                                    const DeviceBatch& b, float scale, int64_t window,
                                    StepContext& ctx) const = 0;
  /// gu [T, 2f] -> silu(gu[:, :f]) * gu[:, f:], [T, f].
  virtual at::Tensor silu_mul(const at::Tensor& gu) const = 0;
  /// x += y (the residual stream).
  virtual void add(const at::Tensor& x, const at::Tensor& y) const = 0;
  /// x [T, h] -> rows b.logit_rows, [rows, h].
  virtual at::Tensor gather_rows(const at::Tensor& x, const DeviceBatch& b) const;
  /// The logits the runtime reads: fp32 on the host.
  virtual at::Tensor to_host(const at::Tensor& logits) const;

  // ---- a round's sampling steps (runtime/target_round.h): device tensors in
  //      and out, the kernels of kernels/cpu on CPU tensors and their twins in
  //      kernels/cuda on the cuda backend, queued on the model's stream.
  /// Lossless verification of each row's proposals -> accepted, bonus [B] i64.
  virtual std::pair<at::Tensor, at::Tensor> verify(const VerifyBatch& v) const;
  /// SAGUARO sampling (kernels::saguaro_sample) of each row of logits [N, V]
  /// -> probs [N, V] f32 (sigma, the row each token was drawn from) and
  /// tokens [N] i64. temperature, top_p, downweight, uniforms [N] f64;
  /// top_k, fanout [N] i64.
  virtual std::pair<at::Tensor, at::Tensor> saguaro_sample(const at::Tensor& logits, const at::Tensor& temperature,
                                                           const at::Tensor& top_k, const at::Tensor& top_p,
                                                           const at::Tensor& fanout, const at::Tensor& downweight,
                                                           const at::Tensor& uniforms) const;
  /// probs [N, V] f32: the processed distribution of each row of logits
  /// [N, V] (temperature, top-k, top-p; kernels::process_logits), through
  /// saguaro_sample with no downweighted set. temperature, top_p [N] f64,
  /// top_k [N] i64.
  at::Tensor process_logits(const at::Tensor& logits, const at::Tensor& temperature, const at::Tensor& top_k,
                            const at::Tensor& top_p) const;
  /// tokens [N] i64: the Gumbel-max draw of each row of probs [N, V] keyed by
  /// seeds [N] (a u64's bits in i64) and positions [N] i64.
  virtual at::Tensor gumbel_sample(const at::Tensor& probs, const at::Tensor& seeds,
                                   const at::Tensor& positions) const;

  // ---- the ssd draft's ranking of a row's candidates (runtime/path_decoder.h)
  /// The `depth` best tokens of each row of logits [N, V] by (value desc, id
  /// asc; kernels::fork_select) -> ids [N, depth] i64 (-1 past the vocabulary)
  /// and, with with_probs, their probabilities under softmax(row) [N, depth]
  /// f32 (undefined without).
  virtual std::pair<at::Tensor, at::Tensor> top_tokens(const at::Tensor& logits, int64_t depth,
                                                       bool with_probs) const;
  /// The `depth` best tokens of each row of probs [N, V] by p_t / E_t, keyed
  /// as gumbel_sample's draw (kernels::gumbel_top) -> ids [N, depth] i64 (-1
  /// past the row's support) and their scores [N, depth] f64.
  virtual std::pair<at::Tensor, at::Tensor> gumbel_top(const at::Tensor& probs, const at::Tensor& seeds,
                                                       const at::Tensor& positions, int64_t depth) const;

  // ---- between forwards
  /// K and V rows of every layer from cache slot src_slots[i] to dst_slots[i]
  /// (slot = block * block_size + offset), as if every row were read before
  /// any is written (the draft's tree branches and cache hits). The indices
  /// are checked on the host first: std::invalid_argument naming the first
  /// bad one (outside the cache, a repeated dst slot), nothing copied. Queued
  /// on the backend's stream, not waited for.
  virtual void copy_kv_slots(KvCache& cache, const std::vector<int64_t>& src_slots,
                             const std::vector<int64_t>& dst_slots) const = 0;
};

/// A forward's index arrays (ForwardInput: tokens, positions, seq_of_token,
/// block_tables, logit_rows, prefix_seq, prefix_len) one after another in one
/// int32 host tensor, pinned or not: what one copy moves to a device.
at::Tensor packed_indices(const ForwardInput& in, bool pinned);
/// The DeviceBatch whose arrays are views of `packed` (packed_indices' layout,
/// on any device); its host is `in`.
DeviceBatch batch_views(const ForwardInput& in, const at::Tensor& packed);

/// copy_kv_slots' host check of its indices against a cache of num_slots
/// slots: throws std::invalid_argument naming the first bad one.
void check_kv_slots(const std::vector<int64_t>& src_slots, const std::vector<int64_t>& dst_slots, int64_t num_slots);

/// GGUF blocks [n, gguf_row_bytes(type, k)] uint8 (host) -> fp32 [n, k] on
/// the host: gguf's dequantisation, bit for bit.
at::Tensor dequantized(const at::Tensor& blocks, kernels::QuantType type, int64_t k);

/// The backend for a device ("cpu", "cuda", "cuda:N") and a backend name
/// ("auto": the native one of that device, or "aten"). Throws
/// std::invalid_argument naming the device when it is unknown, or when this
/// build or this machine cannot run it.
std::unique_ptr<Backend> make_backend(const std::string& device, const std::string& backend,
                                      const BackendOptions& options);

/// "cpu" or "cuda:N" for a valid device string (throws std::invalid_argument
/// otherwise): the form Model::device() reports.
std::string canonical_device(const std::string& device);

/// Checks a device string without building anything: "" when the device is
/// usable, else why not (the message names the device).
std::string device_problem(const std::string& device);

/// The backend names this build can run on this machine.
std::vector<std::string> available_backends();

}  // namespace ssd::model
