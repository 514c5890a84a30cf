// The cpu backend: the kernels of kernels/cpu, the oracle of every other
// backend. Matrices are packed for kernels::linear, quantized ones for
// kernels::linear_quant (kept in their blocks); the bf16 pair layout of the
// draft's many-row path is made on first use (dense matrices only).
#include <ATen/ATen.h>
#include <ATen/ops/from_blob.h>
#include <sys/mman.h>

#include <cerrno>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <unordered_map>

#include "../kernels/cpu/fork_attention.h"
#include "../kernels/cpu/kv_commit.h"
#include "../kernels/cpu/linear.h"
#include "../kernels/cpu/ops.h"
#include "../kernels/cpu/quant.h"
#include "../kernels/cpu/bf16.h"
#include "backend.h"
#include "kv_cache.h"

namespace ssd::model {

namespace {

// Anonymous memory reads as zeros and becomes resident only where it is
// written, so a large cache costs only the blocks sequences have used.
at::Tensor reserve_zeroed(const std::vector<int64_t>& sizes, at::ScalarType dtype) {
  size_t bytes = at::elementSize(dtype);
  for (int64_t s : sizes) bytes *= static_cast<size_t>(s);
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED)
    throw std::invalid_argument("KV cache: could not reserve " + std::to_string(bytes >> 20) +
                                " MiB (" + std::strerror(errno) + "); lower kv_cache_gib or kv_capacity_tokens");
  return at::from_blob(p, sizes, [bytes](void* q) { munmap(q, bytes); }, at::TensorOptions().dtype(dtype));
}

const uint16_t* bf16_data(const at::Tensor& t) { return reinterpret_cast<const uint16_t*>(t.data_ptr<at::BFloat16>()); }
const kernels::Fp16* fp16_data(const at::Tensor& t) {
  return reinterpret_cast<const kernels::Fp16*>(t.data_ptr<at::Half>());
}

class CpuBackend final : public Backend {
 public:
  std::string name() const override { return "cpu"; }
  bool multiplies_fp16() const override { return true; }
  at::Device device() const override { return at::Device(at::kCPU); }

  Matrix matrix(const at::Tensor& dense, at::ScalarType dtype) const override {
    Matrix m;
    m.n = dense.size(0);
    m.k = dense.size(1);
    const at::Tensor src = dense.to(at::kCPU, dtype).contiguous();
    m.data = at::empty({kernels::packed_size(m.n, m.k)}, dtype);
    if (dtype == at::kBFloat16)
      kernels::pack(bf16_data(src), m.n, m.k, reinterpret_cast<uint16_t*>(m.data.data_ptr<at::BFloat16>()));
    else if (dtype == at::kHalf)
      kernels::pack(fp16_data(src), m.n, m.k, reinterpret_cast<kernels::Fp16*>(m.data.data_ptr<at::Half>()));
    else
      kernels::pack(src.data_ptr<float>(), m.n, m.k, m.data.data_ptr<float>());
    return m;
  }

  Matrix quantized_matrix(const std::vector<at::Tensor>& parts, const std::vector<kernels::QuantType>& types,
                          int64_t n, int64_t k) const override {
    // Runs of parts sharing a tile format are packed together (q4_k beside
    // q4_1, say); a matrix of several runs multiplies them one by one.
    std::vector<Matrix> runs;
    for (size_t i = 0; i < parts.size();) {
      const kernels::QuantType tile = kernels::quant_tile_type(types[i]);
      size_t end = i;
      int64_t rows = 0;
      for (; end < parts.size() && kernels::quant_tile_type(types[end]) == tile; ++end) rows += parts[end].size(0);
      Matrix m;
      m.n = rows;
      m.k = k;
      m.quant = tile;
      m.data = at::zeros({kernels::quant_packed_bytes(tile, rows, k)}, at::kByte);
      for (int64_t first = 0; i < end; ++i) {
        const at::Tensor part = parts[i].to(at::kCPU).contiguous();
        kernels::quant_pack(types[i], part.data_ptr<uint8_t>(), part.size(0), k, first, m.data.data_ptr<uint8_t>());
        first += part.size(0);
      }
      runs.push_back(std::move(m));
    }
    if (runs.size() == 1) return runs[0];
    Matrix m;
    m.n = n;
    m.k = k;
    m.segments = std::move(runs);
    return m;
  }

  at::Tensor kv_storage(const std::vector<int64_t>& sizes, at::ScalarType dtype) const override {
    return reserve_zeroed(sizes, dtype);
  }

  at::Tensor embed(const at::Tensor& table, const DeviceBatch& b) const override {
    const auto& tokens = b.host->tokens;
    const int64_t h = table.size(1);
    at::Tensor out = at::empty({static_cast<int64_t>(tokens.size()), h}, at::kFloat);
    float* o = out.data_ptr<float>();
    for (size_t t = 0; t < tokens.size(); ++t, o += h) {
      const int64_t id = tokens[t];
      if (table.scalar_type() == at::kBFloat16) {
        const uint16_t* row = bf16_data(table) + id * h;
        for (int64_t i = 0; i < h; ++i) o[i] = kernels::bf16_to_float(row[i]);
      } else {
        const float* row = table.data_ptr<float>() + id * h;
        std::copy(row, row + h, o);
      }
    }
    return out;
  }

  at::Tensor embed_rows(const Matrix& table, const DeviceBatch& b) const override {
    const auto& tokens = b.host->tokens;
    at::Tensor out = at::empty({static_cast<int64_t>(tokens.size()), table.k}, at::kFloat);
    for (size_t t = 0; t < tokens.size(); ++t)
      kernels::quant_row(table.quant, table.data.data_ptr<uint8_t>(), table.n, table.k, tokens[t],
                         out.data_ptr<float>() + static_cast<int64_t>(t) * table.k);
    return out;
  }

  void rms_norm(const at::Tensor& x, const at::Tensor& w, float eps, const at::Tensor& out,
                StepContext&) const override {
    const int64_t n = x.size(-1);
    if (x.dim() == 2) {
      kernels::rms_norm(x.data_ptr<float>(), x.stride(0), w.data_ptr<float>(), out.data_ptr<float>(), out.stride(0),
                        x.size(0), n, eps);
      return;
    }
    for (int64_t t = 0; t < x.size(0); ++t)
      kernels::rms_norm(x.data_ptr<float>() + t * x.stride(0), x.stride(1), w.data_ptr<float>(),
                        out.data_ptr<float>() + t * out.stride(0), out.stride(1), x.size(1), n, eps);
  }

  at::Tensor linear(const at::Tensor& x, const Matrix& w, const at::Tensor& bias, StepContext& ctx) const override {
    const int64_t m = x.size(0);
    at::Tensor y = at::empty({m, w.n}, at::kFloat);
    const float* b = bias.defined() ? bias.data_ptr<float>() : nullptr;
    const float* xp = x.data_ptr<float>();
    if (!w.segments.empty()) {  // quantized runs of differing formats, each into its columns
      int64_t first = 0;
      for (const Matrix& s : w.segments) {
        (w.int8_activations ? kernels::linear_quant_i8 : kernels::linear_quant)(
            s.quant, xp, x.stride(0), s.data.data_ptr<uint8_t>(), b ? b + first : nullptr,
            y.data_ptr<float>() + first, w.n, m, s.n, w.k, ctx.pool);
        first += s.n;
      }
    } else if (w.quant != kernels::QuantType::none) {  // one product whatever the rows (no pair layout of blocks)
      (w.int8_activations ? kernels::linear_quant_i8 : kernels::linear_quant)(
          w.quant, xp, x.stride(0), w.data.data_ptr<uint8_t>(), b, y.data_ptr<float>(), w.n, m, w.n, w.k, ctx.pool);
    }
    // The pair kernels only where the CPU has AVX512-BF16: their lane-by-lane
    // emulation (kept for the kernel tests) is many times slower than linear.
    else if (ctx.matmul_min_rows > 0 && m >= ctx.matmul_min_rows && kernels::pairs_native() &&
             w.data.scalar_type() != at::kHalf)
      kernels::linear_pairs(xp, x.stride(0), pair_weight(w), b, y.data_ptr<float>(), w.n, m, w.n, w.k, ctx.pool);
    else if (w.data.scalar_type() == at::kHalf)
      kernels::linear(xp, x.stride(0), fp16_data(w.data), b, y.data_ptr<float>(), w.n, m, w.n, w.k, ctx.pool);
    else if (w.data.scalar_type() == at::kBFloat16)
      kernels::linear(xp, x.stride(0), bf16_data(w.data), b, y.data_ptr<float>(), w.n, m, w.n, w.k, ctx.pool);
    else
      kernels::linear(xp, x.stride(0), w.data.data_ptr<float>(), b, y.data_ptr<float>(), w.n, m, w.n, w.k, ctx.pool);
    return y;
  }

  void rope_kv_write(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& inv_freq,
                     KvCache& cache, int64_t layer, const DeviceBatch& b, StepContext&) const override {
    const ForwardInput& in = *b.host;
    const int64_t t = q.size(0), d = q.size(2);
    kernels::rope(q.data_ptr<float>(), q.stride(0), t, q.size(1), d, inv_freq.data_ptr<float>(), in.positions.data());
    kernels::rope(k.data_ptr<float>(), k.stride(0), t, k.size(1), d, inv_freq.data_ptr<float>(), in.positions.data());
    if (k.stride(0) != v.stride(0)) throw std::logic_error("rope_kv_write: k and v rows differ in stride");
    kernels::kv_write(cache.layer(layer), k.data_ptr<float>(), v.data_ptr<float>(), k.stride(0), t,
                      in.seq_of_token.data(), in.positions.data(), in.block_tables.data(), in.max_blocks);
  }

  at::Tensor paged_attention(const at::Tensor& q, KvCache& cache, int64_t layer, const DeviceBatch& b, float scale,
                             int64_t window, StepContext& ctx) const override {
    const ForwardInput& in = *b.host;
    const int64_t t = q.size(0), width = q.size(1) * q.size(2);
    at::Tensor out = at::empty({t, width}, at::kFloat);
    kernels::paged_attention(cache.layer(layer), q.data_ptr<float>(), q.stride(0), out.data_ptr<float>(), width, t,
                             q.size(1), in.seq_of_token.data(), in.positions.data(), in.block_tables.data(),
                             in.max_blocks, scale, window, ctx.pool);
    return out;
  }

  at::Tensor fork_attention(const at::Tensor& q, KvCache& cache, int64_t layer, const DeviceBatch& b, float scale,
                            int64_t window, StepContext& ctx) const override {
    const ForwardInput& in = *b.host;
    const int64_t t = q.size(0), width = q.size(1) * q.size(2);
    at::Tensor out = at::empty({t, width}, at::kFloat);
    const kernels::ForkAttentionParams params{
        {cache.layer(layer), q.data_ptr<float>(), q.stride(0), out.data_ptr<float>(), width, t, q.size(1),
         in.seq_of_token.data(), in.positions.data(), in.block_tables.data(), in.max_blocks, scale, window},
        in.prefix_seq.data(),
        in.prefix_len.data()};
    kernels::fork_attention(params, ctx.pool);
    return out;
  }

  at::Tensor silu_mul(const at::Tensor& gu) const override {
    const int64_t rows = gu.size(0), f = gu.size(1) / 2;
    at::Tensor out = at::empty({rows, f}, at::kFloat);
    kernels::silu_mul(gu.data_ptr<float>(), out.data_ptr<float>(), rows, f);
    return out;
  }

  void add(const at::Tensor& x, const at::Tensor& y) const override {
    float* xp = x.data_ptr<float>();
    const float* yp = y.data_ptr<float>();
    for (int64_t i = 0, n = x.numel(); i < n; ++i) xp[i] += yp[i];
  }

  // kv_commit with the cache as its own tree: rows staged where a source is
  // also an earlier destination.
  void copy_kv_slots(KvCache& cache, const std::vector<int64_t>& src_slots,
                     const std::vector<int64_t>& dst_slots) const override {
    check_kv_slots(src_slots, dst_slots, cache.num_slots());
    kernels::KvCommitParams p;
    p.cache = cache.storage().data_ptr();
    p.cache_rows = cache.rows();
    p.tree = p.cache;
    p.tree_rows = p.cache_rows;
    p.num_layers = cache.storage().size(0);
    p.row_bytes = p.cache_rows.slot_stride;
    p.src_slots = src_slots.data();
    p.dst_slots = dst_slots.data();
    p.n = static_cast<int64_t>(src_slots.size());
    p.tree_in_cache = true;
    p.tree_slot_offset = 0;
    const kernels::KvCommitStatus status = kernels::kv_commit(p);
    if (status.error != kernels::KvCommitError::kNone)  // the indices were checked above
      throw std::logic_error("copy_kv_slots: " + kernels::describe(status));
  }

 private:
  const uint16_t* pair_weight(const Matrix& w) const {
    std::lock_guard<std::mutex> lock(pair_mu_);
    auto it = pair_weights_.find(w.data.data_ptr());
    if (it == pair_weights_.end()) {
      std::vector<uint16_t> pairs(static_cast<size_t>(kernels::pair_packed_size(w.n, w.k)));
      if (w.data.scalar_type() == at::kBFloat16)
        kernels::pack_pairs(bf16_data(w.data), w.n, w.k, pairs.data());
      else
        kernels::pack_pairs(w.data.data_ptr<float>(), w.n, w.k, pairs.data());
      it = pair_weights_.emplace(w.data.data_ptr(), std::move(pairs)).first;
    }
    return it->second.data();
  }

  mutable std::mutex pair_mu_;
  mutable std::unordered_map<const void*, std::vector<uint16_t>> pair_weights_;
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend() { return std::make_unique<CpuBackend>(); }

}  // namespace ssd::model
