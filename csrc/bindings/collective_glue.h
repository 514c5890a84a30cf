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
  explicit PythonCollective(py::function all_gather) : all_gather_(std::move(all_gather)) {}
  ~PythonCollective() override {
    py::gil_scoped_acquire gil;
    all_gather_ = py::function();
  }
  at::Tensor all_gather(const at::Tensor& part) override {
    py::gil_scoped_acquire gil;
    return all_gather_(part).cast<at::Tensor>();
  }

 private:
  py::function all_gather_;
};

/// None -> one rank; (rank, size, all_gather) -> that rank of a group whose
/// all_gather(part) returns every rank's part stacked in rank order.
inline model::TensorParallel tensor_parallel_from(const py::object& spec) {
  model::TensorParallel tp;
  if (spec.is_none()) return tp;
  const auto t = spec.cast<py::tuple>();
  if (t.size() != 3) throw std::invalid_argument("tensor_parallel must be (rank, size, all_gather)");
  tp.rank = t[0].cast<int64_t>();
  tp.size = t[1].cast<int64_t>();
  if (tp.size > 1) tp.collective = std::make_shared<PythonCollective>(t[2].cast<py::function>());
  return tp;
}

}  // namespace ssd::bindings
