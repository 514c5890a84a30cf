// A tensor-parallel collective (model/tensor_parallel.h) that calls a Python
// function: how ssd.distributed hands torch.distributed's all-gather (gloo or
// NCCL) to the C++ forward.
#pragma once

#include <torch/extension.h>

#include <memory>
#include <string>

#include "../model/tensor_parallel.h"

namespace ssd::bindings {

class PythonCollective : public model::Collective {
 public:
  PythonCollective(py::function all_gather, py::function broadcast)
      : all_gather_(std::move(all_gather)), broadcast_(std::move(broadcast)) {}
  ~PythonCollective() override {
    py::gil_scoped_acquire gil;
    all_gather_ = py::function();
    broadcast_ = py::function();
  }
  at::Tensor all_gather(const at::Tensor& part) override {
    py::gil_scoped_acquire gil;
    return all_gather_(part).cast<at::Tensor>();
  }
  void broadcast(at::Tensor& t) override {
    py::gil_scoped_acquire gil;
    broadcast_(t);
  }

 private:
  py::function all_gather_, broadcast_;
};

/// None -> one rank; (rank, size, all_gather, broadcast) -> that rank of a
/// group whose all_gather(part) returns every rank's part stacked in rank
/// order and broadcast(t) copies rank 0's t into every other rank's, in place.
inline model::TensorParallel tensor_parallel_from(const py::object& spec) {
  model::TensorParallel tp;
  if (spec.is_none()) return tp;
  const auto t = spec.cast<py::tuple>();
  if (t.size() != 4) throw std::invalid_argument("tensor_parallel must be (rank, size, all_gather, broadcast)");
  tp.rank = t[0].cast<int64_t>();
  tp.size = t[1].cast<int64_t>();
  if (tp.size > 1)
    tp.collective = std::make_shared<PythonCollective>(t[2].cast<py::function>(), t[3].cast<py::function>());
  return tp;
}

}  // namespace ssd::bindings
