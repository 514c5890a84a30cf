// ssd._C.testing.RawForward: Model::forward over a ForwardInput built by hand,
// on a KV cache of its own, for tests that need index arrays no runner makes
// (block-table padding: entries of -1, tokens whose slot is -1; rows that
// fork from another row's table). Not a product API.
#include <torch/extension.h>

#include <pybind11/stl.h>

#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "../kernels/cpu/thread_pool.h"
#include "../model/kv_cache.h"
#include "../model/model.h"

namespace py = pybind11;

namespace ssd {

namespace {

class RawForward {
 public:
  RawForward(std::shared_ptr<model::Model> model, int64_t num_blocks, int64_t block_size)
      : model_(std::move(model)), cache_(model_->shard_config(), num_blocks, block_size, model_->backend()), pool_(1) {}

  /// One forward: tokens, positions, seq_of_token [T]; block_tables
  /// [num_seqs][max_blocks], every row the same length, written as given
  /// (no padding added); prefix_seq, prefix_len: empty or [T] (ForwardInput's
  /// forks). Returns logits [len(logit_rows), vocab].
  at::Tensor forward(const std::vector<int32_t>& tokens, const std::vector<int32_t>& positions,
                     const std::vector<int32_t>& seq_of_token, const std::vector<std::vector<int32_t>>& block_tables,
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
    return model_->forward(in, cache_, pool_);
  }

  /// [layers, 2, num_blocks, block_size, kv_heads, head_dim], shared with the cache.
  at::Tensor cache_storage() const { return cache_.storage(); }

 private:
  std::shared_ptr<model::Model> model_;
  model::KvCache cache_;
  kernels::ThreadPool pool_;
};

}  // namespace

void bind_testing_forward(py::module_& m) {
  py::class_<RawForward>(m, "RawForward",
                         "Model.forward over hand-built index arrays on a cache of its own (not a product API).")
      .def(py::init<std::shared_ptr<model::Model>, int64_t, int64_t>(), py::arg("model"), py::arg("num_blocks"),
           py::arg("block_size"))
      .def("forward", &RawForward::forward, py::arg("tokens"), py::arg("positions"), py::arg("seq_of_token"),
           py::arg("block_tables"), py::arg("logit_rows"), py::arg("prefix_seq") = std::vector<int32_t>{},
           py::arg("prefix_len") = std::vector<int32_t>{},
           "One forward of the batch as given; block_tables rows of one length (-1: no block); with "
           "prefix_seq and prefix_len, rows that fork. Logits [len(logit_rows), vocab].")
      .def("cache_storage", &RawForward::cache_storage);
}

}  // namespace ssd
