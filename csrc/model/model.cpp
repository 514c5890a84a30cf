#include "model.h"

#include "forward_shape.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>


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
  return t;
}

// Rows `rows` and columns `cols` of a [n, k] weight, dense or GGUF rows of
// `type` (whose column share must hold whole blocks). The whole weight is
// returned as it is (a view of the file stays one).
at::Tensor slice_weight(const at::Tensor& t, const std::string& name, kernels::QuantType type, int64_t n, int64_t k,
                        Share rows, Share cols) {
  if (rows.begin == 0 && rows.count == n && cols.begin == 0 && cols.count == k) return t;
  at::Tensor part = t.narrow(0, rows.begin, rows.count);
  if (type == kernels::QuantType::none) return part.narrow(1, cols.begin, cols.count).contiguous();
  const int64_t block = kernels::gguf_block_weights(type), bytes = kernels::gguf_block_bytes(type);
  if (cols.begin % block != 0 || cols.count % block != 0)
    throw std::invalid_argument("weight '" + name + "' in " + kernels::quant_name(type) +
                                " cannot be split between tensor-parallel ranks at columns " +
                                std::to_string(cols.begin) + ".." + std::to_string(cols.begin + cols.count) +
                                ": its blocks hold " + std::to_string(block) + " weights");
  return part.narrow(1, cols.begin / block * bytes, cols.count / block * bytes).contiguous();
}

at::Tensor slice_vector(const at::Tensor& t, Share s) {
  return s.begin == 0 && s.count == t.size(0) ? t : t.narrow(0, s.begin, s.count);
}

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
    if (!c.rope_freq_factors.empty()) f /= c.rope_freq_factors[static_cast<size_t>(i)];
    inv[i] = static_cast<float>(f);
  }
  return inv;
}

Matrix Model::load_matrix(const WeightMap& w, const FormatMap& formats, const std::vector<Part>& parts, int64_t k,
                          Share cols, at::ScalarType dtype) const {
  const Backend& be = *backend_;
  std::vector<at::Tensor> tensors;
  std::vector<kernels::QuantType> types;
  int64_t n = 0;
  for (const auto& [name, rows, take] : parts) {
    const auto it = formats.find(name);
    const kernels::QuantType type = it == formats.end() ? kernels::QuantType::none : it->second;
    if (type == kernels::QuantType::none) {
      tensors.push_back(slice_weight(checked(w, name, {rows, k}), name, type, rows, k, take, cols));
    } else {
      const int64_t row_bytes = kernels::gguf_row_bytes(type, k);
      const at::Tensor& t = fetch(w, name);
      if (t.scalar_type() != at::kByte || t.sizes() != at::IntArrayRef{rows, row_bytes})
        throw std::invalid_argument("weight '" + name + "' in " + kernels::quant_name(type) +
                                    " must be uint8 GGUF rows [" + std::to_string(rows) + "," +
                                    std::to_string(row_bytes) + "]");
      tensors.push_back(slice_weight(t, name, type, rows, k, take, cols));
    }
    types.push_back(type);
    n += take.count;
  }
  k = cols.count;
  const bool all_quantized =
      std::none_of(types.begin(), types.end(), [](auto t) { return t == kernels::QuantType::none; });
  if (all_quantized) {
    Matrix m = be.quantized_matrix(tensors, types, n, k);
    m.int8_activations = (m.quant != kernels::QuantType::none || !m.segments.empty()) && int8_activations_;
    return m;
  }
  for (size_t i = 0; i < tensors.size(); ++i)
    if (types[i] != kernels::QuantType::none) tensors[i] = dequantized(tensors[i], types[i], k);
  // fp16 matrices (an F16 GGUF's) stay fp16 where the backend multiplies them
  const bool fp16 = std::all_of(tensors.begin(), tensors.end(), [](const at::Tensor& t) {
    return t.scalar_type() == at::kHalf;
  });
  return be.matrix(tensors.size() == 1 ? tensors[0] : at::cat(tensors),
                   fp16 && be.multiplies_fp16() ? at::kHalf : dtype);
}

Model::Model(const ModelConfig& config, const WeightMap& w, const ModelPlacement& placement,
             const FormatMap& formats)
    : config_(config),
      row_sum_(placement.tensor_parallel),
      row_bias_(placement.tensor_parallel.rank == 0),
      tp_(placement.tensor_parallel),
      int8_activations_(placement.options.int8_activations) {
  config_.validate();
  shard_ = shard_layout(config_, placement.tensor_parallel);
  shard_config_ = ssd::model::shard_config(config_, shard_);
  backend_ = make_backend(placement.device, placement.backend, placement.options);
  const Backend& be = *backend_;
  const auto& c = config_;
  const int64_t h = c.hidden_size, d = c.head_dim;
  const std::string embed_name = "model.embed_tokens.weight";
  const auto embed_format = formats.find(embed_name);
  if (embed_format == formats.end()) {
    const at::Tensor& embed = checked(w, embed_name, {c.vocab_size, h});
    bf16_ = embed.scalar_type() == at::kBFloat16;
  }
  // Dense matrices keep the model dtype (that of the embedding; fp32 beside a
  // quantized one); vectors are fp32.
  const auto dt = bf16_ ? at::kBFloat16 : at::kFloat;
  if (embed_format == formats.end()) {
    embed_ = be.embedding(fetch(w, embed_name), dt);
  } else {  // one quantized copy for the lookup and, when tied, the logits
    Matrix table = load_matrix(w, formats, embed_name, c.vocab_size, h, dt);
    if (table.quant != kernels::QuantType::none) embed_rows_ = table;
    else embed_ = be.embedding(dequantized(fetch(w, embed_name), embed_format->second, h), dt);
    if (c.tie_word_embeddings) lm_head_ = table;
  }
  final_norm_ = be.vector(checked(w, "model.norm.weight", {c.hidden_size}));
  if (!lm_head_.data.defined())
    lm_head_ = load_matrix(w, formats, c.tie_word_embeddings ? embed_name : "lm_head.weight", c.vocab_size, h, dt);
  const int64_t q_out = c.num_heads * d, kv_out = c.num_kv_heads * d, f = c.intermediate_size;
  // This rank's rows of q / k / v (columns of o) and of gate / up (columns of down).
  const Share q_take{shard_.q_heads.begin * d, shard_.q_heads.count * d};
  const Share kv_take{shard_.kv_heads.begin * d, shard_.kv_heads.count * d};
  const Share f_take = shard_.intermediate;
  for (int64_t i = 0; i < c.num_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    Layer l;
    l.attn_norm = be.vector(checked(w, p + "input_layernorm.weight", {h}));
    l.qkv = load_matrix(w, formats,
                        {{p + "self_attn.q_proj.weight", q_out, q_take},
                         {p + "self_attn.k_proj.weight", kv_out, kv_take},
                         {p + "self_attn.v_proj.weight", kv_out, kv_take}},
                        h, {0, h}, dt);
    l.o = load_matrix(w, formats, {{p + "self_attn.o_proj.weight", h, {0, h}}}, q_out, q_take, dt);
    if (c.attention_bias || c.qkv_bias)
      l.qkv_bias = be.vector(at::cat({slice_vector(checked(w, p + "self_attn.q_proj.bias", {q_out}), q_take),
                                      slice_vector(checked(w, p + "self_attn.k_proj.bias", {kv_out}), kv_take),
                                      slice_vector(checked(w, p + "self_attn.v_proj.bias", {kv_out}), kv_take)}));
    if (c.attention_bias) {
      const at::Tensor& bias = checked(w, p + "self_attn.o_proj.bias", {h});
      if (row_bias_) l.o_bias = be.vector(bias);
    }
    if (c.qk_norm) {
      l.q_norm = be.vector(checked(w, p + "self_attn.q_norm.weight", {d}));
      l.k_norm = be.vector(checked(w, p + "self_attn.k_norm.weight", {d}));
    }
    l.mlp_norm = be.vector(checked(w, p + "post_attention_layernorm.weight", {h}));
    l.gate_up = load_matrix(w, formats, {{p + "mlp.gate_proj.weight", f, f_take}, {p + "mlp.up_proj.weight", f, f_take}},
                            h, {0, h}, dt);
    l.down = load_matrix(w, formats, {{p + "mlp.down_proj.weight", h, {0, h}}}, f, f_take, dt);
    if (c.mlp_bias) {
      l.gate_up_bias = be.vector(at::cat({slice_vector(checked(w, p + "mlp.gate_proj.bias", {f}), f_take),
                                          slice_vector(checked(w, p + "mlp.up_proj.bias", {f}), f_take)}));
      const at::Tensor& bias = checked(w, p + "mlp.down_proj.bias", {h});
      if (row_bias_) l.down_bias = be.vector(bias);
    }
    layers_.push_back(std::move(l));
  }
  const std::vector<float> inv = rope_inv_freq(c);
  inv_freq_ = be.vector(at::tensor(inv, at::kFloat));
  be.finish_loading();
}

int64_t Model::weight_bytes() const {
  std::vector<const void*> seen;
  int64_t bytes = 0;
  const auto add = [&](const at::Tensor& t) {
    if (!t.defined() || std::find(seen.begin(), seen.end(), t.data_ptr()) != seen.end()) return;
    seen.push_back(t.data_ptr());
    bytes += static_cast<int64_t>(t.nbytes());
  };
  for (const at::Tensor* t : {&embed_, &final_norm_, &inv_freq_, &embed_rows_.data, &lm_head_.data}) add(*t);
  for (const Layer& l : layers_) {
    for (const at::Tensor* t : {&l.attn_norm, &l.qkv_bias, &l.q_norm, &l.k_norm, &l.o_bias, &l.mlp_norm,
                                &l.gate_up_bias, &l.down_bias, &l.qkv.data, &l.o.data, &l.gate_up.data, &l.down.data})
      add(*t);
    for (const Matrix* m : {&l.qkv, &l.o, &l.gate_up, &l.down})
      for (const Matrix& s : m->segments) add(s.data);
  }
  return bytes;
}

// The kernels (and ATen's indexing on a GPU) trust the index arrays; a bad
// one is a host-side error here, never a device fault. A token whose own
// block-table entry is -1 is padding (it writes no KV and reads none); every
// other token needs a cache block in each entry its attention reads.
void Model::check(const ForwardInput& in, const KvCache& cache) const {
  const auto t = static_cast<int64_t>(in.tokens.size());
  if (static_cast<int64_t>(in.positions.size()) != t || static_cast<int64_t>(in.seq_of_token.size()) != t)
    throw std::invalid_argument("forward: tokens, positions and seq_of_token differ in length");
  const auto per_token = [t](const std::vector<int32_t>& v) { return static_cast<int64_t>(v.size()) == t; };
  if ((in.forks() || !in.prefix_len.empty()) && (!per_token(in.prefix_seq) || !per_token(in.prefix_len)))
    throw std::invalid_argument("forward: prefix_seq and prefix_len must have one entry per token");
  const int64_t seqs = in.max_blocks > 0 ? static_cast<int64_t>(in.block_tables.size()) / in.max_blocks : 0;
  if (in.max_blocks < 0 || seqs * in.max_blocks != static_cast<int64_t>(in.block_tables.size()))
    throw std::invalid_argument("forward: block_tables is not [num_seqs, max_blocks]");
  const int64_t bs = cache.block_size(), num_blocks = cache.num_blocks();
  const auto is_block = [&](int32_t block) { return block >= 0 && block < num_blocks; };
  // last_bad[i]: the last index <= i of block_tables' flat row holding no
  // cache block (-1 or out of range), or -1; int32 like block_tables.
  std::vector<int32_t> last_bad(in.block_tables.size());
  for (int64_t s = 0; s < seqs; ++s)
    for (int64_t j = 0, bad = -1; j < in.max_blocks; ++j) {
      const int64_t i = s * in.max_blocks + j;
      if (!is_block(in.block_tables[i])) bad = i;
      last_bad[i] = static_cast<int32_t>(bad);
    }
  for (int64_t i = 0; i < t; ++i) {
    const int32_t id = in.tokens[i];
    if (id < 0 || id >= config_.vocab_size)
      throw std::invalid_argument("token id " + std::to_string(id) + " is outside the vocabulary (size " +
                                  std::to_string(config_.vocab_size) + ")");
    const int64_t seq = in.seq_of_token[i], pos = in.positions[i];
    const auto token = [&] {
      return "forward: token " + std::to_string(i) + " (sequence " + std::to_string(seq) + ", position " +
             std::to_string(pos) + ")";
    };
    if (seq < 0 || seq >= seqs || pos < 0 || pos / bs >= in.max_blocks)
      throw std::invalid_argument(token() + " has no block-table entry");
    if (in.key_bound > 0 && pos >= in.key_bound)
      throw std::invalid_argument(token() + " is past the forward's key_bound " + std::to_string(in.key_bound));
    const int64_t own = seq * in.max_blocks + pos / bs;
    const int32_t block = in.block_tables[own];
    if (block == -1) continue;  // padding
    if (!is_block(block))
      throw std::invalid_argument("forward: block id " + std::to_string(block) + " is outside the KV cache (" +
                                  std::to_string(num_blocks) + " blocks)");
    const int64_t window = config_.sliding_window;
    const int64_t first_key = window > 0 ? std::max<int64_t>(0, pos + 1 - window) : 0;
    // Keys [from, last] through block-table row `row` must all be cache blocks.
    const auto check_keys = [&](int64_t row, int64_t from, int64_t last) {
      const int64_t bad = last_bad[row * in.max_blocks + last / bs];
      if (bad >= row * in.max_blocks + from / bs)
        throw std::invalid_argument(token() + " attends to block-table row " + std::to_string(row) + " entry " +
                                    std::to_string(bad - row * in.max_blocks) + ", which holds " +
                                    std::to_string(in.block_tables[bad]) + ", not a block of the KV cache (" +
                                    std::to_string(num_blocks) + " blocks)");
    };
    const int64_t fork = in.forks() ? in.prefix_len[i] : 0;
    if (in.forks()) {
      const int64_t from = in.prefix_seq[i];
      if (from < 0 || from >= seqs || fork < 0 || fork > pos)
        throw std::invalid_argument(token() + " forks from block-table row " + std::to_string(from) +
                                    " at position " + std::to_string(fork) + ": not a row of " +
                                    std::to_string(seqs) + ", or not in 0.." + std::to_string(pos));
      if (fork > first_key) check_keys(from, first_key, fork - 1);
    }
    check_keys(seq, std::max(first_key, fork), pos);
  }
  for (const int32_t row : in.logit_rows)
    if (row < 0 || row >= t) throw std::invalid_argument("logit row out of range");
}

void Model::attention_block(const Layer& l, int64_t index, const DeviceBatch& b, KvCache& cache,
                            const at::Tensor& x, StepContext& ctx) const {
  const Backend& be = *backend_;
  const auto& c = shard_config_;  // this rank's heads
  const int64_t t = x.size(0), d = c.head_dim;
  const int64_t q_out = c.num_heads * d, kv_out = c.num_kv_heads * d;
  const float eps = static_cast<float>(c.rms_norm_eps);
  const at::Tensor normed = at::empty_like(x);
  be.rms_norm(x, l.attn_norm, eps, normed, ctx);
  const at::Tensor qkv = be.linear(normed, l.qkv, l.qkv_bias, ctx);  // [T, W]
  const at::Tensor q = qkv.narrow(1, 0, q_out).view({t, c.num_heads, d});
  const at::Tensor k = qkv.narrow(1, q_out, kv_out).view({t, c.num_kv_heads, d});
  const at::Tensor v = qkv.narrow(1, q_out + kv_out, kv_out).view({t, c.num_kv_heads, d});
  if (c.qk_norm) {
    be.rms_norm(q, l.q_norm, eps, q, ctx);
    be.rms_norm(k, l.k_norm, eps, k, ctx);
  }
  be.rope_kv_write(q, k, v, inv_freq_, cache, index, b, ctx);
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  const at::Tensor attn = b.host->forks() ? be.fork_attention(q, cache, index, b, scale, c.sliding_window, ctx)
                                          : be.paged_attention(q, cache, index, b, scale, c.sliding_window, ctx);
  be.add(x, row_sum_(be.linear(attn, l.o, l.o_bias, ctx)));
}

void Model::mlp_block(const Layer& l, const at::Tensor& x, StepContext& ctx) const {
  const Backend& be = *backend_;
  const at::Tensor normed = at::empty_like(x);
  be.rms_norm(x, l.mlp_norm, static_cast<float>(config_.rms_norm_eps), normed, ctx);
  const at::Tensor act = be.silu_mul(be.linear(normed, l.gate_up, l.gate_up_bias, ctx));
  be.add(x, row_sum_(be.linear(act, l.down, l.down_bias, ctx)));
}

at::Tensor Model::forward(const ForwardInput& in, KvCache& cache, kernels::ThreadPool& pool) const {
  return backend_->to_host(forward_device(in, cache, pool));
}

at::Tensor Model::forward_device(const ForwardInput& in, KvCache& cache, kernels::ThreadPool& pool) const {
  if (tp_.size == 1 && backend_->captures_forwards(config_.head_dim)) return forward_bucketed(in, cache, pool);
  check(in, cache);
  if (leading_) {
    ForwardMessage message{ForwardMessage::Kind::kForward, cache.id(),         cache.num_blocks(),
                           cache.block_size(),           cache.dtype() == "bfloat16", in};
    broadcast_forward(*tp_.collective, 0, message);
    last_message_ = std::chrono::steady_clock::now();
  }
  return unpadded(in, cache, pool);
}

at::Tensor Model::forward_bucketed(const ForwardInput& in, KvCache& cache, kernels::ThreadPool& pool) const {
  if (tp_.size > 1)
    throw std::logic_error("forward_bucketed: not with tensor parallelism (its ranks take the forward as it is)");
  check(in, cache);
  const std::optional<ForwardShape> shape = forward_shape(in);
  if (!shape) return unpadded(in, cache, pool);  // no tokens, or a prefill past the largest bucket
  // The keys every forward of this shape can address: the table's width in blocks.
  const int64_t key_bound = shape->max_blocks * cache.block_size();
  const Backend& be = *backend_;
  const bool captures = be.captures_forwards(config_.head_dim);
  // A prompt chunk, or a graph whose split workspace would hold too much: launched as it is.
  if (captures && !graph_worthy(in, *shape, key_bound, config_.num_heads, config_.head_dim))
    return unpadded(in, cache, pool);
  const ForwardInput padded = padded_input(in, *shape, key_bound);
  const auto scope = be.forward_scope();
  StepContext ctx{pool, padded.matmul_min_rows};
  const auto rows = static_cast<int64_t>(in.logit_rows.size());
  // Where the backend captures none, the padded forward runs as it is.
  return captures ? be.graphed(cache.id(), *shape, padded, rows,
                               [&](const DeviceBatch& b) { return layers(b, cache, ctx); })
                  : layers(be.upload(padded), cache, ctx).narrow(0, 0, rows);
}

at::Tensor Model::unpadded(const ForwardInput& in, KvCache& cache, kernels::ThreadPool& pool) const {
  const Backend& be = *backend_;
  if (in.tokens.empty())
    return at::empty({static_cast<int64_t>(in.logit_rows.size()), config_.vocab_size},
                     at::TensorOptions().dtype(at::kFloat).device(be.device()));
  const auto scope = be.forward_scope();
  StepContext ctx{pool, in.matmul_min_rows};
  return layers(be.upload(in), cache, ctx);
}

at::Tensor Model::layers(const DeviceBatch& b, KvCache& cache, StepContext& ctx) const {
  const auto& c = config_;
  const Backend& be = *backend_;
  // [T, h], the residual stream
  const at::Tensor x = embed_.defined() ? be.embed(embed_, b) : be.embed_rows(embed_rows_, b);
  for (int64_t i = 0; i < c.num_layers; ++i) {
    attention_block(layers_[i], i, b, cache, x, ctx);
    mlp_block(layers_[i], x, ctx);
  }
  const at::Tensor last = be.gather_rows(x, b);
  be.rms_norm(last, final_norm_, static_cast<float>(c.rms_norm_eps), last, ctx);
  return be.linear(last, lm_head_, at::Tensor(), ctx);
}

void Model::lead(bool on) {
  if (on && (tp_.size == 1 || tp_.rank != 0))
    throw std::logic_error("only rank 0 of a tensor-parallel group leads (this is rank " + std::to_string(tp_.rank) +
                           " of " + std::to_string(tp_.size) + ")");
  leading_ = on;
  // The followers have heard nothing yet: the first ping_followers sends at once.
  if (on) last_message_ = std::chrono::steady_clock::now() - std::chrono::hours(1);
}

void Model::follow(int64_t num_threads) {
  if (tp_.size == 1 || tp_.rank == 0)
    throw std::logic_error("follow() runs on ranks 1.. of a tensor-parallel group (this is rank " +
                           std::to_string(tp_.rank) + " of " + std::to_string(tp_.size) + ")");
  kernels::ThreadPool pool(num_threads);
  std::unordered_map<int64_t, std::unique_ptr<KvCache>> caches;  // by the leader's cache id
  for (;;) {
    ForwardMessage message;
    broadcast_forward(*tp_.collective, tp_.rank, message);
    if (message.kind == ForwardMessage::Kind::kStop) return;
    if (message.kind == ForwardMessage::Kind::kPing) continue;
    auto& cache = caches[message.cache_id];
    if (!cache)
      cache = std::make_unique<KvCache>(shard_config_, message.num_blocks, message.block_size, *backend_,
                                        message.kv_bf16 ? "bfloat16" : "float32");
    forward_device(message.input, *cache, pool);
  }
}

void Model::stop_followers() {
  if (!leading_) return;
  ForwardMessage message;
  message.kind = ForwardMessage::Kind::kStop;
  broadcast_forward(*tp_.collective, 0, message);
}

bool Model::ping_followers(double quiet_s) {
  if (!leading_) return false;
  const auto now = std::chrono::steady_clock::now();
  if (std::chrono::duration<double>(now - last_message_).count() < quiet_s) return false;
  ForwardMessage message;
  message.kind = ForwardMessage::Kind::kPing;
  broadcast_forward(*tp_.collective, 0, message);
  last_message_ = now;
  return true;
}

}  // namespace ssd::model
