// KV commit on NVIDIA GPUs, the same semantics as kernels/cpu/kv_commit.cpp:
// one block validates every index (first bad index wins, as on the CPU),
// then one block per (slot, layer, K/V) copies a row with the widest aligned
// vector unit; the copy blocks do nothing when validation failed. When tree
// and cache overlap, all rows go through a staging buffer first (the GPU
// caching allocator makes that buffer cheap, unlike fresh pages on a CPU).
#include <cuda_runtime.h>

#include <cstdint>

#include "kv_commit.h"

namespace ssd::kernels::cuda {
namespace {

using ::ssd::kernels::KvCommitError;
using ::ssd::kernels::KvRows;

constexpr int kValidateThreads = 256;
constexpr int kCopyThreads = 128;
constexpr unsigned long long kNoError = ~0ull;

__device__ KvCommitError check_index(const ::ssd::kernels::KvCommitParams& p, int64_t i, int64_t* value,
                                     int64_t* detail) {
  const int64_t src = p.src_slots[i];
  const int64_t dst = p.dst_slots[i];
  if (src < 0 || src >= p.tree_rows.num_slots) {
    *value = src;
    *detail = p.tree_rows.num_slots;
    return KvCommitError::kSrcOutOfRange;
  }
  *value = dst;
  if (dst < 0 || dst >= p.cache_rows.num_slots) {
    *detail = p.cache_rows.num_slots;
    return KvCommitError::kDstOutOfRange;
  }
  // Quadratic, but n is a handful of accepted tokens per sequence per round.
  for (int64_t j = 0; j < i; ++j) {
    if (p.dst_slots[j] == dst) {
      *detail = j;
      return KvCommitError::kDuplicateDst;
    }
  }
  return KvCommitError::kNone;
}

__global__ void __launch_bounds__(kValidateThreads) validate_kernel(KvCommitParams p) {
  __shared__ unsigned long long first_bad;
  if (threadIdx.x == 0) first_bad = kNoError;
  __syncthreads();
  int64_t value = 0, detail = 0;
  for (int64_t i = threadIdx.x; i < p.copy.n; i += blockDim.x)
    if (check_index(p.copy, i, &value, &detail) != KvCommitError::kNone)
      atomicMin(&first_bad, static_cast<unsigned long long>(i));
  __syncthreads();
  if (threadIdx.x != 0) return;
  KvCommitError error = KvCommitError::kNone;
  int64_t item = -1;
  value = detail = 0;
  if (first_bad != kNoError) {
    item = static_cast<int64_t>(first_bad);
    error = check_index(p.copy, item, &value, &detail);
  }
  p.status[0] = static_cast<int64_t>(error);
  p.status[1] = item;
  p.status[2] = value;
  p.status[3] = detail;
}

// Rows of a [layers, 2, slots, row] view picked by `slots` (null: slot i is row i).
template <typename Byte>
struct RowSet {
  Byte* base;
  KvRows rows;
  const int64_t* slots;

  __device__ Byte* row(int64_t layer, int64_t kind, int64_t i) const {
    const int64_t slot = slots ? slots[i] : i;
    return base + layer * rows.layer_stride + kind * rows.kind_stride + slot * rows.slot_stride;
  }
};

// grid: (n, layers * 2).
template <typename Unit>
__global__ void __launch_bounds__(kCopyThreads)
    copy_rows_kernel(RowSet<char> to, RowSet<const char> from, int64_t units_per_row, const int64_t* status) {
  if (status[0] != static_cast<int64_t>(KvCommitError::kNone)) return;
  const int64_t i = blockIdx.x;
  const int64_t layer = blockIdx.y / 2;
  const int64_t kind = blockIdx.y % 2;
  Unit* out = reinterpret_cast<Unit*>(to.row(layer, kind, i));
  const Unit* in = reinterpret_cast<const Unit*>(from.row(layer, kind, i));
  for (int64_t u = threadIdx.x; u < units_per_row; u += blockDim.x) out[u] = in[u];
}

// The widest power-of-two byte count (<= 16) dividing every address offset.
uint64_t offset_bits(const void* base, const KvRows& rows) {
  return reinterpret_cast<uintptr_t>(base) | static_cast<uint64_t>(rows.layer_stride) |
         static_cast<uint64_t>(rows.kind_stride) | static_cast<uint64_t>(rows.slot_stride);
}

int unit_bytes(const RowSet<char>& to, const RowSet<const char>& from, int64_t row_bytes) {
  const uint64_t bits = static_cast<uint64_t>(row_bytes) | 16u | offset_bits(to.base, to.rows) |
                        offset_bits(from.base, from.rows);
  return static_cast<int>(bits & (~bits + 1));
}

cudaError_t copy_rows(const RowSet<char>& to, const RowSet<const char>& from, const KvCommitParams& p,
                      cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(p.copy.n), static_cast<unsigned>(p.copy.num_layers * 2));
  const int64_t row_bytes = p.copy.row_bytes;
  switch (unit_bytes(to, from, row_bytes)) {
    case 16:
      copy_rows_kernel<uint4><<<grid, kCopyThreads, 0, stream>>>(to, from, row_bytes / 16, p.status);
      break;
    case 8:
      copy_rows_kernel<uint2><<<grid, kCopyThreads, 0, stream>>>(to, from, row_bytes / 8, p.status);
      break;
    case 4:
      copy_rows_kernel<uint32_t><<<grid, kCopyThreads, 0, stream>>>(to, from, row_bytes / 4, p.status);
      break;
    case 2:
      copy_rows_kernel<uint16_t><<<grid, kCopyThreads, 0, stream>>>(to, from, row_bytes / 2, p.status);
      break;
    default:
      copy_rows_kernel<uint8_t><<<grid, kCopyThreads, 0, stream>>>(to, from, row_bytes, p.status);
  }
  return cudaGetLastError();
}

}  // namespace

cudaError_t kv_commit(const KvCommitParams& params, cudaStream_t stream) {
  const ::ssd::kernels::KvCommitParams& p = params.copy;
  validate_kernel<<<1, kValidateThreads, 0, stream>>>(params);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess || p.n == 0 || p.num_layers == 0 || p.row_bytes == 0) return err;
  if (p.tree_in_cache && params.staging == nullptr) return cudaErrorInvalidValue;
  const RowSet<char> cache{static_cast<char*>(p.cache), p.cache_rows, p.dst_slots};
  RowSet<const char> tree{static_cast<const char*>(p.tree), p.tree_rows, p.src_slots};
  if (p.tree_in_cache) {
    // Stream order makes the whole gather finish before the scatter starts.
    const KvRows dense{2 * p.n * p.row_bytes, p.n * p.row_bytes, p.row_bytes, p.n};
    const RowSet<char> staging{static_cast<char*>(params.staging), dense, nullptr};
    err = copy_rows(staging, tree, params, stream);
    if (err != cudaSuccess) return err;
    tree = RowSet<const char>{staging.base, dense, nullptr};
  }
  return copy_rows(cache, tree, params, stream);
}

}  // namespace ssd::kernels::cuda
