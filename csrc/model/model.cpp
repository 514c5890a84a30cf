#include "model.h"

#include <ATen/ATen.h>

#include <cmath>
#include <stdexcept>

#include "../kernels/cpu/linear.h"
#include "../kernels/cpu/ops.h"
#include "../kernels/cpu/vec.h"

namespace ssd::model {

namespace {

const at::Tensor& fetch(const WeightMap& w, const std::string& name) {
  auto it = w.find(name);
  if (it == w.end()) throw std::invalid_argument("missing weight tensor '" + name + "'");
  return it->second;
}

at::Tensor checked(const WeightMap& w, const std::string& name, at::IntArrayRef shape) {
  const at::Tensor& t = fetch(w, name);
  if (t.sizes() != shape) {
    std::string want, got;
    for (auto s : shape) want += std::to_string(s) + ",";
    for (auto s : t.sizes()) got += std::to_string(s) + ",";
    throw std::invalid_argument("weight '" + name + "' has shape [" + got + "] but the config implies [" + want + "]");
  }
  if (!t.device().is_cpu()) throw std::invalid_argument("weight '" + name + "' is not on the CPU");
  return t;
}

// Vectors (norms, biases) are always fp32.
at::Tensor vector(const at::Tensor& t) { return t.to(at::kFloat).contiguous(); }

}  // namespace

std::vector<float> rope_inv_freq(const ModelConfig& c) {
  const int64_t half = c.head_dim / 2;
  std::vector<float> inv(static_cast<size_t>(half));
  const auto& rs = c.rope_scaling;
  for (int64_t i = 0; i < half; ++i) {
    double f = 1.0 / std::pow(c.rope_theta, static_cast<double>(2 * i) / c.head_dim);
    if (rs.enabled) {
      const double old_len = static_cast<double>(rs.original_max_position_embeddings);
      const double low_wavelen = old_len / rs.low_freq_factor;
      const double high_wavelen = old_len / rs.high_freq_factor;
      const double wavelen = 2.0 * M_PI / f;
      if (wavelen > low_wavelen) {
        f = f / rs.factor;
      } else if (wavelen >= high_wavelen) {
        const double smooth =
            (old_len / wavelen - rs.low_freq_factor) / (rs.high_freq_factor - rs.low_freq_factor);
        f = (1.0 - smooth) * f / rs.factor + smooth * f;
      }
    }
    inv[i] = static_cast<float>(f);
  }
  return inv;
}

Model::Model(const ModelConfig& config, const WeightMap& w) : config_(config) {
  config_.validate();
  const auto& c = config_;
  const at::Tensor& embed = checked(w, "model.embed_tokens.weight", {c.vocab_size, c.hidden_size});
  bf16_ = embed.scalar_type() == at::kBFloat16;
  const auto dt = bf16_ ? at::kBFloat16 : at::kFloat;
  embed_ = embed.to(dt).contiguous();
  final_norm_ = vector(checked(w, "model.norm.weight", {c.hidden_size}));
  lm_head_ = pack(c.tie_word_embeddings ? embed_ : checked(w, "lm_head.weight", {c.vocab_size, c.hidden_size}));
  const int64_t h = c.hidden_size, d = c.head_dim;
  const int64_t q_out = c.num_heads * d, kv_out = c.num_kv_heads * d;
  for (int64_t i = 0; i < c.num_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    Layer l;
    l.attn_norm = vector(checked(w, p + "input_layernorm.weight", {h}));
    l.qkv = pack(at::cat({checked(w, p + "self_attn.q_proj.weight", {q_out, h}),
                          checked(w, p + "self_attn.k_proj.weight", {kv_out, h}),
                          checked(w, p + "self_attn.v_proj.weight", {kv_out, h})}));
    l.o = pack(checked(w, p + "self_attn.o_proj.weight", {h, q_out}));
    if (c.attention_bias) {
      l.qkv_bias = vector(at::cat({checked(w, p + "self_attn.q_proj.bias", {q_out}),
                                   checked(w, p + "self_attn.k_proj.bias", {kv_out}),
                                   checked(w, p + "self_attn.v_proj.bias", {kv_out})}));
      l.o_bias = vector(checked(w, p + "self_attn.o_proj.bias", {h}));
    }
    if (c.qk_norm) {
      l.q_norm = vector(checked(w, p + "self_attn.q_norm.weight", {d}));
      l.k_norm = vector(checked(w, p + "self_attn.k_norm.weight", {d}));
    }
    l.mlp_norm = vector(checked(w, p + "post_attention_layernorm.weight", {h}));
    const int64_t f = c.intermediate_size;
    l.gate_up = pack(at::cat({checked(w, p + "mlp.gate_proj.weight", {f, h}),
                              checked(w, p + "mlp.up_proj.weight", {f, h})}));
    l.down = pack(checked(w, p + "mlp.down_proj.weight", {h, f}));
    if (c.mlp_bias) {
      l.gate_up_bias = vector(at::cat({checked(w, p + "mlp.gate_proj.bias", {f}),
                                       checked(w, p + "mlp.up_proj.bias", {f})}));
      l.down_bias = vector(checked(w, p + "mlp.down_proj.bias", {h}));
    }
    layers_.push_back(std::move(l));
  }
  inv_freq_ = rope_inv_freq(c);
}

// Matrices keep the model dtype (that of the embedding), packed.
Model::Matrix Model::pack(const at::Tensor& dense) const {
  Matrix m;
  m.n = dense.size(0);
  m.k = dense.size(1);
  if (bf16_) {
    const at::Tensor src = dense.to(at::kBFloat16).contiguous();
    m.packed = at::empty({kernels::packed_size(m.n, m.k)}, at::kBFloat16);
    kernels::pack(reinterpret_cast<const uint16_t*>(src.data_ptr<at::BFloat16>()), m.n, m.k,
                  reinterpret_cast<uint16_t*>(m.packed.data_ptr<at::BFloat16>()));
  } else {
    const at::Tensor src = dense.to(at::kFloat).contiguous();
    m.packed = at::empty({kernels::packed_size(m.n, m.k)}, at::kFloat);
    kernels::pack(src.data_ptr<float>(), m.n, m.k, m.packed.data_ptr<float>());
  }
  return m;
}

const uint16_t* Model::pair_weight(const Matrix& w) const {
  std::lock_guard<std::mutex> lock(pair_mu_);
  auto it = pair_weights_.find(w.packed.data_ptr());
  if (it == pair_weights_.end()) {
    std::vector<uint16_t> pairs(static_cast<size_t>(kernels::pair_packed_size(w.n, w.k)));
    if (bf16_)
      kernels::pack_pairs(reinterpret_cast<const uint16_t*>(w.packed.data_ptr<at::BFloat16>()), w.n, w.k,
                          pairs.data());
    else
      kernels::pack_pairs(w.packed.data_ptr<float>(), w.n, w.k, pairs.data());
    it = pair_weights_.emplace(w.packed.data_ptr(), std::move(pairs)).first;
  }
  return it->second.data();
}

void Model::linear(const float* x, int64_t ldx, const Matrix& w, const at::Tensor& bias, float* y,
                   int64_t ldy, int64_t m, kernels::ThreadPool& pool, int64_t matmul_min_rows) const {
  const float* b = bias.defined() ? bias.data_ptr<float>() : nullptr;
  if (matmul_min_rows > 0 && m >= matmul_min_rows) {
    kernels::linear_pairs(x, ldx, pair_weight(w), b, y, ldy, m, w.n, w.k, pool);
  } else if (bf16_) {
    kernels::linear(x, ldx, reinterpret_cast<const uint16_t*>(w.packed.data_ptr<at::BFloat16>()), b, y, ldy, m,
                    w.n, w.k, pool);
  } else {
    kernels::linear(x, ldx, w.packed.data_ptr<float>(), b, y, ldy, m, w.n, w.k, pool);
  }
}

void Model::embed(const std::vector<int32_t>& tokens, float* out) const {
  const int64_t h = config_.hidden_size;
  for (size_t t = 0; t < tokens.size(); ++t) {
    const int64_t id = tokens[t];
    if (id < 0 || id >= config_.vocab_size)
      throw std::invalid_argument("token id " + std::to_string(id) + " is outside the vocabulary (size " +
                                  std::to_string(config_.vocab_size) + ")");
    float* o = out + static_cast<int64_t>(t) * h;
    if (bf16_) {
      const auto* row = reinterpret_cast<const uint16_t*>(embed_.data_ptr<at::BFloat16>()) + id * h;
      for (int64_t i = 0; i < h; ++i) o[i] = kernels::bf16_to_float(row[i]);
    } else {
      const float* row = embed_.data_ptr<float>() + id * h;
      std::copy(row, row + h, o);
    }
  }
}

void Model::attention_block(const Layer& l, int64_t index, const ForwardInput& in, KvCache& cache,
                            float* x, kernels::ThreadPool& pool) const {
  const auto& c = config_;
  const int64_t t = static_cast<int64_t>(in.tokens.size());
  const int64_t h = c.hidden_size, d = c.head_dim;
  const int64_t q_out = c.num_heads * d, kv_out = c.num_kv_heads * d;
  const int64_t width = q_out + 2 * kv_out;
  std::vector<float> normed(static_cast<size_t>(t * h)), qkv(static_cast<size_t>(t * width));
  std::vector<float> attn(static_cast<size_t>(t * q_out));
  kernels::rms_norm(x, h, l.attn_norm.data_ptr<float>(), normed.data(), h, t, h,
                    static_cast<float>(c.rms_norm_eps));
  linear(normed.data(), h, l.qkv, l.qkv_bias, qkv.data(), width, t, pool, in.matmul_min_rows);
  float* q = qkv.data();
  float* k = q + q_out;
  float* v = k + kv_out;
  if (c.qk_norm) {
    const float eps = static_cast<float>(c.rms_norm_eps);
    for (int64_t i = 0; i < t; ++i) {
      kernels::rms_norm(q + i * width, d, l.q_norm.data_ptr<float>(), q + i * width, d, c.num_heads, d, eps);
      kernels::rms_norm(k + i * width, d, l.k_norm.data_ptr<float>(), k + i * width, d, c.num_kv_heads, d, eps);
    }
  }
  kernels::rope(q, width, t, c.num_heads, d, inv_freq_.data(), in.positions.data());
  kernels::rope(k, width, t, c.num_kv_heads, d, inv_freq_.data(), in.positions.data());
  const kernels::PagedKv kv = cache.layer(index);
  kernels::kv_write(kv, k, v, width, t, in.seq_of_token.data(), in.positions.data(),
                    in.block_tables.data(), in.max_blocks);
  kernels::paged_attention(kv, q, width, attn.data(), q_out, t, c.num_heads, in.seq_of_token.data(),
                           in.positions.data(), in.block_tables.data(), in.max_blocks,
                           1.0f / std::sqrt(static_cast<float>(d)), pool);
  std::vector<float>& out = normed;  // reuse: [t, h]
  linear(attn.data(), q_out, l.o, l.o_bias, out.data(), h, t, pool, in.matmul_min_rows);
  for (int64_t i = 0; i < t * h; ++i) x[i] += out[i];
}

void Model::mlp_block(const Layer& l, int64_t t, float* x, kernels::ThreadPool& pool,
                      int64_t matmul_min_rows) const {
  const int64_t h = config_.hidden_size, f = config_.intermediate_size;
  std::vector<float> normed(static_cast<size_t>(t * h)), gu(static_cast<size_t>(t * 2 * f));
  std::vector<float> act(static_cast<size_t>(t * f));
  kernels::rms_norm(x, h, l.mlp_norm.data_ptr<float>(), normed.data(), h, t, h,
                    static_cast<float>(config_.rms_norm_eps));
  linear(normed.data(), h, l.gate_up, l.gate_up_bias, gu.data(), 2 * f, t, pool, matmul_min_rows);
  kernels::silu_mul(gu.data(), act.data(), t, f);
  linear(act.data(), f, l.down, l.down_bias, normed.data(), h, t, pool, matmul_min_rows);
  for (int64_t i = 0; i < t * h; ++i) x[i] += normed[i];
}

at::Tensor Model::forward(const ForwardInput& in, KvCache& cache, kernels::ThreadPool& pool) const {
  const auto& c = config_;
  const int64_t t = static_cast<int64_t>(in.tokens.size());
  const int64_t h = c.hidden_size;
  const int64_t rows = static_cast<int64_t>(in.logit_rows.size());
  at::Tensor logits = at::empty({rows, c.vocab_size}, at::kFloat);
  if (t == 0) return logits;
  std::vector<float> x(static_cast<size_t>(t * h));
  embed(in.tokens, x.data());
  for (int64_t i = 0; i < c.num_layers; ++i) {
    attention_block(layers_[i], i, in, cache, x.data(), pool);
    mlp_block(layers_[i], t, x.data(), pool, in.matmul_min_rows);
  }
  std::vector<float> last(static_cast<size_t>(rows * h));
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t row = in.logit_rows[r];
    if (row < 0 || row >= t) throw std::invalid_argument("logit row out of range");
    kernels::rms_norm(x.data() + row * h, h, final_norm_.data_ptr<float>(), last.data() + r * h, h, 1,
                      h, static_cast<float>(c.rms_norm_eps));
  }
  linear(last.data(), h, lm_head_, at::Tensor(), logits.data_ptr<float>(), c.vocab_size, rows, pool,
         in.matmul_min_rows);
  return logits;
}

}  // namespace ssd::model
