// ssd._C.testing.RawForward: Model::forward over a ForwardInput built by hand,
// on a KV cache of its own, for tests that need index arrays no runner makes
// (block-table padding: entries of -1, tokens whose slot is -1; rows that
// fork from another row's table). Not a product API.
#include <torch/extension.h>

#include <pybind11/stl.h>

#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "../kernels/cpu/thread_pool.h"
#include "../model/dense_attention.h"
#include "../model/forward_shape.h"
#include "../model/kv_cache.h"
#include "../model/model.h"

namespace py = pybind11;

namespace ssd {

namespace {

// A ForwardInput of hand-built arrays (block_tables: rows of one length).
model::ForwardInput input_of(const std::vector<int32_t>& tokens, const std::vector<int32_t>& positions,
                             const std::vector<int32_t>& seq_of_token,
                             const std::vector<std::vector<int32_t>>& block_tables,
                             const std::vector<int32_t>& logit_rows, const std::vector<int32_t>& prefix_seq,
                             const std::vector<int32_t>& prefix_len) {
  model::ForwardInput in;
  in.prefix_seq = prefix_seq;
  in.prefix_len = prefix_len;
  in.tokens = tokens;
  in.positions = positions;
  in.seq_of_token = seq_of_token;
  in.logit_rows = logit_rows;
  in.max_blocks = block_tables.empty() ? 0 : static_cast<int64_t>(block_tables[0].size());
  for (const auto& row : block_tables) {
    if (static_cast<int64_t>(row.size()) != in.max_blocks)
      throw std::invalid_argument("block_tables: rows differ in length (write the padding entries, -1)");
    in.block_tables.insert(in.block_tables.end(), row.begin(), row.end());
  }
  return in;
}

class RawForward {
 public:
  RawForward(std::shared_ptr<model::Model> model, int64_t num_blocks, int64_t block_size)
      : model_(std::move(model)), cache_(model_->shard_config(), num_blocks, block_size, model_->backend()), pool_(1) {}

  /// One forward: tokens, positions, seq_of_token [T]; block_tables
  /// [num_seqs][max_blocks], every row the same length, written as given
  /// (no padding added); prefix_seq, prefix_len: empty or [T] (ForwardInput's
  /// forks); bucketed: Model::forward_bucketed instead of Model::forward.
  /// Returns logits [len(logit_rows), vocab].
  at::Tensor forward(const std::vector<int32_t>& tokens, const std::vector<int32_t>& positions,
                     const std::vector<int32_t>& seq_of_token, const std::vector<std::vector<int32_t>>& block_tables,
                     const std::vector<int32_t>& logit_rows, const std::vector<int32_t>& prefix_seq,
                     const std::vector<int32_t>& prefix_len, bool bucketed, int64_t key_bound) {
    model::ForwardInput in = input_of(tokens, positions, seq_of_token, block_tables, logit_rows, prefix_seq, prefix_len);
    in.key_bound = key_bound;
    return bucketed ? model_->backend().to_host(model_->forward_bucketed(in, cache_, pool_))
                    : model_->forward(in, cache_, pool_);
  }

  /// [layers, 2, num_blocks, block_size, kv_heads, head_dim], shared with the cache.
  at::Tensor cache_storage() const { return cache_.storage(); }

 private:
  std::shared_ptr<model::Model> model_;
  model::KvCache cache_;
  kernels::ThreadPool pool_;
};

// The bucket shape of a batch and the batch padded to it (forward_shape.h),
// as a dict of the padded arrays (block_tables as rows), or None.
py::object padded_forward(const std::vector<int32_t>& tokens, const std::vector<int32_t>& positions,
                          const std::vector<int32_t>& seq_of_token, const std::vector<std::vector<int32_t>>& block_tables,
                          const std::vector<int32_t>& logit_rows, const std::vector<int32_t>& prefix_seq,
                          const std::vector<int32_t>& prefix_len, int64_t key_bound) {
  const model::ForwardInput in =
      input_of(tokens, positions, seq_of_token, block_tables, logit_rows, prefix_seq, prefix_len);
  const std::optional<model::ForwardShape> shape = model::forward_shape(in);
  if (!shape) return py::none();
  const model::ForwardInput p = model::padded_input(in, *shape, key_bound);
  std::vector<std::vector<int32_t>> tables;
  for (int64_t s = 0; s < shape->seqs; ++s)
    tables.emplace_back(p.block_tables.begin() + s * p.max_blocks, p.block_tables.begin() + (s + 1) * p.max_blocks);
  return py::dict(py::arg("tokens") = p.tokens, py::arg("positions") = p.positions,
                  py::arg("seq_of_token") = p.seq_of_token, py::arg("block_tables") = tables,
                  py::arg("logit_rows") = p.logit_rows, py::arg("prefix_seq") = p.prefix_seq,
                  py::arg("prefix_len") = p.prefix_len, py::arg("key_bound") = p.key_bound);
}

// graph_worthy (forward_shape.h) of a batch at its bucket shape, or None
// where it has none.
py::object graph_worthy(const std::vector<int32_t>& tokens, const std::vector<int32_t>& positions,
                        const std::vector<int32_t>& seq_of_token, const std::vector<std::vector<int32_t>>& block_tables,
                        const std::vector<int32_t>& logit_rows, int64_t key_bound, int64_t num_heads, int64_t head_dim) {
  const model::ForwardInput in = input_of(tokens, positions, seq_of_token, block_tables, logit_rows, {}, {});
  const std::optional<model::ForwardShape> shape = model::forward_shape(in);
  if (!shape) return py::none();
  return py::bool_(model::graph_worthy(in, *shape, key_bound, num_heads, head_dim));
}

// dense_attention over hand-built tensors (int32 block_tables [seqs, width],
// seq_of_token and positions [T] on the host), or None where prefill_runs
// does not take the batch.
py::object dense_attention(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                           const at::Tensor& block_tables, const at::Tensor& seq_of_token, const at::Tensor& positions,
                           double scale, int64_t window, int64_t min_run_tokens, bool bf16) {
  model::ForwardInput in;
  const auto ints = [](const at::Tensor& t) {
    const at::Tensor c = t.to(at::kInt).contiguous();
    return std::vector<int32_t>(c.data_ptr<int32_t>(), c.data_ptr<int32_t>() + c.numel());
  };
  in.positions = ints(positions);
  in.seq_of_token = ints(seq_of_token);
  in.tokens.assign(in.positions.size(), 0);
  in.block_tables = ints(block_tables);
  in.max_blocks = block_tables.size(1);
  const std::vector<model::PrefillRun> runs = model::prefill_runs(in, k_cache.size(1), min_run_tokens);
  if (runs.empty()) return py::none();
  return py::cast(model::dense_attention(q, k_cache, v_cache, runs, in, static_cast<float>(scale), window,
                                               bf16 ? at::kBFloat16 : at::kFloat));
}

}  // namespace

void bind_testing_forward(py::module_& m) {
  py::class_<RawForward>(m, "RawForward",
                         "Model.forward over hand-built index arrays on a cache of its own (not a product API).")
      .def(py::init<std::shared_ptr<model::Model>, int64_t, int64_t>(), py::arg("model"), py::arg("num_blocks"),
           py::arg("block_size"))
      .def("forward", &RawForward::forward, py::arg("tokens"), py::arg("positions"), py::arg("seq_of_token"),
           py::arg("block_tables"), py::arg("logit_rows"), py::arg("prefix_seq") = std::vector<int32_t>{},
           py::arg("prefix_len") = std::vector<int32_t>{}, py::arg("bucketed") = false, py::arg("key_bound") = 0,
           "One forward of the batch as given; block_tables rows of one length (-1: no block); with "
           "prefix_seq and prefix_len, rows that fork; bucketed: through Model::forward_bucketed (padded to "
           "its bucket shape; on cuda a graph's replay); key_bound: ForwardInput::key_bound. Logits "
           "[len(logit_rows), vocab].")
      .def("cache_storage", &RawForward::cache_storage);
  m.def("dense_attention", &dense_attention, py::arg("q"), py::arg("k_cache"), py::arg("v_cache"),
        py::arg("block_tables"), py::arg("seq_of_token"), py::arg("positions"), py::arg("scale"),
        py::arg("window") = 0, py::arg("min_run_tokens") = 1, py::arg("bf16") = false,
        "model/dense_attention.h's attention of q [T, Hq, d] -> [T, Hq * d] (computed in bf16, or fp32), or None where prefill_runs does not "
        "take the batch (not a product API).");
  m.def("padded_forward", &padded_forward, py::arg("tokens"), py::arg("positions"), py::arg("seq_of_token"),
        py::arg("block_tables"), py::arg("logit_rows"), py::arg("prefix_seq") = std::vector<int32_t>{},
        py::arg("prefix_len") = std::vector<int32_t>{}, py::arg("key_bound") = 0,
        "The batch padded to its bucket shape (model/forward_shape.h): a dict of its arrays (block_tables as "
        "rows), or None past the largest bucket.");
  m.def("graph_worthy", &graph_worthy, py::arg("tokens"), py::arg("positions"), py::arg("seq_of_token"),
        py::arg("block_tables"), py::arg("logit_rows"), py::arg("key_bound"), py::arg("num_heads"),
        py::arg("head_dim"),
        "Whether the cuda backend captures the batch at its bucket shape (model/forward_shape.h graph_worthy), or "
        "None past the largest bucket.");
}

}  // namespace ssd
