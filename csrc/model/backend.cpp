// What every backend shares (the default steps, written over ATen so that they
// run on any device) and the one place that maps a device string to a backend.
#include "backend.h"

#include <ATen/ATen.h>
#include <ATen/Context.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <stdexcept>
#include <string>
#include <unordered_map>

#include "../bindings/gumbel_top_args.h"
#include "../kernels/cpu/fork_select.h"
#include "../kernels/cpu/ops.h"
#include "backend_aten.h"
#include "round_params.h"

namespace ssd::model {

std::unique_ptr<Backend> make_cpu_backend();
// backend_cuda.cpp: the CUDA backend when the build has CUDA (nullptr and
// false otherwise).
std::unique_ptr<Backend> make_cuda_backend(at::Device device, const BackendOptions& options);
bool cuda_backend_built();

at::Tensor Backend::vector(const at::Tensor& v) const {
  return v.to(device(), at::kFloat).contiguous();
}

Matrix Backend::quantized_matrix(const std::vector<at::Tensor>& parts, const std::vector<kernels::QuantType>& types,
                                 int64_t, int64_t k) const {
  std::vector<at::Tensor> dense;
  for (size_t i = 0; i < parts.size(); ++i) dense.push_back(dequantized(parts[i], types[i], k));
  return matrix(dense.size() == 1 ? dense[0] : at::cat(dense), at::kFloat);
}

at::Tensor Backend::embed_rows(const Matrix&, const DeviceBatch&) const {
  throw std::logic_error(name() + " backend: no quantized embedding tables");
}

at::Tensor dequantized(const at::Tensor& blocks, kernels::QuantType type, int64_t k) {
  const at::Tensor rows = blocks.to(at::kCPU).contiguous();
  at::Tensor dense = at::empty({rows.size(0), k}, at::kFloat);
  kernels::quant_dequantize(type, rows.data_ptr<uint8_t>(), rows.size(0), k, dense.data_ptr<float>());
  return dense;
}

at::Tensor Backend::embedding(const at::Tensor& table, at::ScalarType dtype) const {
  return table.to(device(), dtype).contiguous();
}

at::Tensor Backend::kv_storage(const std::vector<int64_t>& sizes, at::ScalarType dtype) const {
  return at::zeros(sizes, at::TensorOptions().dtype(dtype).device(device()));
}

// One host buffer, one copy to the device, then views: the index arrays cross
// once per forward.
namespace {

std::vector<const std::vector<int32_t>*> index_arrays(const ForwardInput& in) {
  return {&in.tokens, &in.positions, &in.seq_of_token, &in.block_tables, &in.logit_rows, &in.prefix_seq,
          &in.prefix_len};
}

}  // namespace

at::Tensor packed_indices(const ForwardInput& in, bool pinned) {
  int64_t total = 0;
  for (const auto* p : index_arrays(in)) total += static_cast<int64_t>(p->size());
  at::Tensor host = at::empty({total}, at::TensorOptions().dtype(at::kInt).pinned_memory(pinned));
  int32_t* dst = host.data_ptr<int32_t>();
  for (const auto* p : index_arrays(in)) dst = std::copy(p->begin(), p->end(), dst);
  return host;
}

DeviceBatch batch_views(const ForwardInput& in, const at::Tensor& packed) {
  std::vector<at::Tensor> views;
  int64_t offset = 0;
  for (const auto* p : index_arrays(in)) {
    const auto n = static_cast<int64_t>(p->size());
    views.push_back(packed.narrow(0, offset, n));
    offset += n;
  }
  DeviceBatch b;
  b.host = &in;
  b.tokens = views[0];
  b.positions = views[1];
  b.seq_of_token = views[2];
  b.block_tables = views[3];
  b.logit_rows = views[4];
  if (in.forks()) {
    b.prefix_seq = views[5];
    b.prefix_len = views[6];
  }
  return b;
}

DeviceBatch Backend::upload(const ForwardInput& in) const {
  // Pinned on a GPU backend, so the copy is asynchronous (no sync in a forward).
  const bool cpu = device().is_cpu();
  const at::Tensor host = packed_indices(in, !cpu);
  return batch_views(in, cpu ? host : host.to(device(), at::kInt, /*non_blocking=*/true));
}

at::Tensor Backend::gather_rows(const at::Tensor& x, const DeviceBatch& b) const {
  return x.index_select(0, b.logit_rows);
}

at::Tensor Backend::to_host(const at::Tensor& logits) const {
  return logits.to(at::kCPU, at::kFloat).contiguous();
}

namespace {

// The default round steps run the CPU kernels; a backend on another device
// without its own (the aten backend on a GPU) goes through host copies.
at::Tensor on_host(const at::Tensor& t) { return t.defined() ? t.to(at::kCPU).contiguous() : t; }

}  // namespace

std::pair<at::Tensor, at::Tensor> Backend::verify(const VerifyBatch& v) const {
  const VerifyBatch h{on_host(v.target_logits), on_host(v.proposals),      on_host(v.num_proposals),
                      on_host(v.q_probs),       on_host(v.one_hot),        on_host(v.temperature),
                      on_host(v.top_k),         on_host(v.top_p),          on_host(v.accept_uniforms),
                      on_host(v.bonus_uniforms)};
  const int64_t batch = h.target_logits.size(0);
  at::Tensor accepted = at::empty({batch}, at::kLong), bonus = at::empty({batch}, at::kLong);
  kernels::verify(verify_params(h, accepted, bonus), 0, batch);
  return {accepted.to(device()), bonus.to(device())};
}

std::pair<at::Tensor, at::Tensor> Backend::saguaro_sample(const at::Tensor& logits, const at::Tensor& temperature,
                                                          const at::Tensor& top_k, const at::Tensor& top_p,
                                                          const at::Tensor& fanout, const at::Tensor& downweight,
                                                          const at::Tensor& uniforms) const {
  SaguaroSampleCall call(on_host(logits), on_host(temperature), on_host(top_k), on_host(top_p), on_host(fanout),
                         on_host(downweight), on_host(uniforms));
  kernels::saguaro_sample(call.params());
  return {call.probs.to(device()), call.tokens.to(device())};
}

at::Tensor Backend::process_logits(const at::Tensor& logits, const at::Tensor& temperature, const at::Tensor& top_k,
                                   const at::Tensor& top_p) const {
  // No downweighted set (F = 0): sigma is the processed distribution; the
  // token drawn with u = 0 is not used.
  const int64_t rows = logits.size(0);
  return saguaro_sample(logits, temperature, top_k, top_p, at::zeros({rows}, top_k.options()),
                        at::ones({rows}, temperature.options()), at::zeros({rows}, temperature.options()))
      .first;
}

at::Tensor Backend::gumbel_sample(const at::Tensor& probs, const at::Tensor& seeds, const at::Tensor& positions) const {
  const at::Tensor x = on_host(probs), s = on_host(seeds), pos = on_host(positions);
  at::Tensor tokens = at::empty({x.size(0)}, at::kLong);
  kernels::gumbel_sample(bindings::gumbel_sample_params(x, s, pos, tokens));
  return tokens.to(device());
}

std::pair<at::Tensor, at::Tensor> Backend::top_tokens(const at::Tensor& logits, int64_t depth,
                                                      bool with_probs) const {
  const at::Tensor x = on_host(logits);
  const int64_t rows = x.size(0), vocab = x.size(1);
  at::Tensor ids = at::empty({rows, depth}, at::kLong);
  at::Tensor probs = with_probs ? at::zeros({rows, depth}, at::kFloat) : at::Tensor();
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = x.data_ptr<float>() + r * vocab;
    int64_t* best = ids.data_ptr<int64_t>() + r * depth;
    const int64_t count = kernels::top_of_row(row, vocab, depth, best);
    std::fill(best + count, best + depth, int64_t{-1});
    if (!with_probs || count == 0) continue;
    const float top = row[best[0]];
    const double total = kernels::sum_exp(row, vocab, top);
    for (int64_t i = 0; i < count; ++i)
      probs.data_ptr<float>()[r * depth + i] = static_cast<float>(std::exp(row[best[i]] - top) / total);
  }
  return {ids.to(device()), with_probs ? probs.to(device()) : probs};
}

std::pair<at::Tensor, at::Tensor> Backend::gumbel_top(const at::Tensor& probs, const at::Tensor& seeds,
                                                      const at::Tensor& positions, int64_t depth) const {
  const at::Tensor x = on_host(probs), s = on_host(seeds), pos = on_host(positions);
  auto [ids, scores] = bindings::gumbel_top_outputs(x, depth);
  kernels::gumbel_top(bindings::gumbel_top_params(x, s, pos, depth, ids, scores));
  return {ids.to(device()), scores.to(device())};
}

void check_kv_slots(const std::vector<int64_t>& src_slots, const std::vector<int64_t>& dst_slots, int64_t num_slots) {
  auto bad = [](const char* name, size_t i, int64_t slot, const std::string& why) {
    return std::invalid_argument("copy_kv_slots: " + std::string(name) + "[" + std::to_string(i) +
                                 "] = " + std::to_string(slot) + why);
  };
  if (src_slots.size() != dst_slots.size())
    throw std::invalid_argument("copy_kv_slots: " + std::to_string(src_slots.size()) + " src_slots but " +
                                std::to_string(dst_slots.size()) + " dst_slots");
  const std::string outside = " is outside the cache's slots [0, " + std::to_string(num_slots) + ")";
  std::unordered_map<int64_t, size_t> first_use;  // dst slot -> its first index
  first_use.reserve(dst_slots.size());
  for (size_t i = 0; i < src_slots.size(); ++i) {
    if (src_slots[i] < 0 || src_slots[i] >= num_slots) throw bad("src_slots", i, src_slots[i], outside);
    if (dst_slots[i] < 0 || dst_slots[i] >= num_slots) throw bad("dst_slots", i, dst_slots[i], outside);
    const auto [it, fresh] = first_use.emplace(dst_slots[i], i);
    if (!fresh)
      throw bad("dst_slots", i, dst_slots[i],
                " repeats dst_slots[" + std::to_string(it->second) + "]: two rows cannot be copied to one slot");
  }
}

namespace {

struct ParsedDevice {
  bool cuda = false;
  int index = 0;
};

ParsedDevice parse_device(const std::string& device) {
  if (device == "cpu") return {};
  if (device == "cuda") return {true, 0};
  const std::string prefix = "cuda:";
  if (device.rfind(prefix, 0) == 0 && device.size() > prefix.size() && device.size() <= prefix.size() + 3) {
    int index = 0;
    for (size_t i = prefix.size(); i < device.size(); ++i) {
      if (!std::isdigit(static_cast<unsigned char>(device[i]))) goto bad;
      index = index * 10 + (device[i] - '0');
    }
    return {true, index};
  }
bad:
  throw std::invalid_argument("device '" + device + "': expected 'cpu', 'cuda' or 'cuda:N'");
}

}  // namespace

std::string canonical_device(const std::string& device) {
  const ParsedDevice d = parse_device(device);
  return d.cuda ? "cuda:" + std::to_string(d.index) : "cpu";
}

std::string device_problem(const std::string& device) {
  ParsedDevice d;
  try {
    d = parse_device(device);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  if (!d.cuda) return "";
  if (!at::hasCUDA())
    return "device '" + device + "': no CUDA device is available (this torch build or this machine has no "
           "NVIDIA GPU); use 'cpu'";
  const auto count = static_cast<int>(at::getNumGPUs());
  if (d.index >= count)
    return "device '" + device + "': this machine has " + std::to_string(count) + " CUDA device" +
           (count == 1 ? "" : "s") + " (cuda:0..cuda:" + std::to_string(count - 1) + ")";
  return "";
}

std::unique_ptr<Backend> make_backend(const std::string& device, const std::string& backend,
                                      const BackendOptions& options) {
  const ParsedDevice d = parse_device(device);
  if (backend != "auto" && backend != "aten" && backend != (d.cuda ? "cuda" : "cpu"))
    throw std::invalid_argument("backend '" + backend + "': expected 'auto', 'aten' or '" +
                                (d.cuda ? "cuda" : "cpu") + "' for device '" + device + "'");
  if (!d.cuda) return backend == "aten" ? make_aten_backend(at::Device(at::kCPU)) : make_cpu_backend();
  if (const std::string why = device_problem(device); !why.empty()) throw std::invalid_argument(why);
  const at::Device dev(at::kCUDA, static_cast<at::DeviceIndex>(d.index));
  if (backend == "aten") return make_aten_backend(dev);
  auto cuda = make_cuda_backend(dev, options);
  if (!cuda)
    throw std::invalid_argument("device '" + device + "': this build of ssd has no CUDA backend (it was built "
                                "without CUDA: reinstall with a CUDA torch and nvcc, SSD_CUDA=on)");
  return cuda;
}

std::vector<std::string> available_backends() {
  std::vector<std::string> names = {"cpu", "aten"};
  if (cuda_backend_built()) names.push_back("cuda");
  return names;
}

}  // namespace ssd::model
