// KV truncate on NVIDIA GPUs, the same semantics as kernels/cpu/kv_truncate.cpp.
// One block does everything, because "validate all, then mutate, or change
// nothing" needs a barrier between the phases and a round touches only a few
// table entries per sequence. Phases, each reporting the first bad item as on
// the CPU: sequence checks; block-id checks; tentative refcount decrements;
// underflow check (undone on failure); table and length updates.
#include <cuda_runtime.h>

#include <cstdint>

#include "kv_truncate.h"

namespace ssd::kernels::cuda {
namespace {

using ::ssd::kernels::KvTruncateError;
using Table = ::ssd::kernels::KvTruncateParams;

constexpr int kThreads = 512;
constexpr unsigned long long kNoError = ~0ull;

__device__ KvTruncateError check_sequence(const Table& p, int64_t i, int64_t* value, int64_t* detail) {
  const int64_t seq = p.seq_ids[i];
  *value = seq;
  if (seq < 0 || seq >= p.num_seqs) {
    *detail = p.num_seqs;
    return KvTruncateError::kSeqOutOfRange;
  }
  for (int64_t j = 0; j < i; ++j) {
    if (p.seq_ids[j] == seq) {
      *detail = j;
      return KvTruncateError::kDuplicateSeq;
    }
  }
  *value = p.new_lens[i];
  *detail = p.seq_lens[seq];
  if (p.new_lens[i] < 0 || p.new_lens[i] > p.seq_lens[seq]) return KvTruncateError::kLengthOutOfRange;
  return KvTruncateError::kNone;
}

// Entry k = i * max_blocks + j when item i releases it, else null.
__device__ int32_t* released_entry(const Table& p, int64_t k) {
  const int64_t i = k / p.max_blocks;
  const int64_t j = k % p.max_blocks;
  if (j < (p.new_lens[i] + p.block_size - 1) / p.block_size) return nullptr;
  int32_t* entry = p.block_tables + p.seq_ids[i] * p.max_blocks + j;
  return *entry == -1 ? nullptr : entry;
}

__device__ void write_status(int64_t* status, KvTruncateError error, int64_t item, int64_t value,
                             int64_t detail) {
  status[0] = static_cast<int64_t>(error);
  status[1] = item;
  status[2] = value;
  status[3] = detail;
}

__device__ void add_to_released(const Table& p, int64_t entries, int32_t delta) {
  for (int64_t k = threadIdx.x; k < entries; k += blockDim.x)
    if (const int32_t* e = released_entry(p, k)) atomicAdd(p.block_refcount + *e, delta);
}

// Every thread's verdict of a phase. first_bad is read, then a barrier, before
// any thread can start the next phase's atomicMin on it.
__device__ unsigned long long phase_verdict(const unsigned long long& first_bad) {
  __syncthreads();
  const unsigned long long bad = first_bad;
  __syncthreads();
  return bad;
}

__global__ void __launch_bounds__(kThreads) kv_truncate_kernel(KvTruncateParams params) {
  __shared__ unsigned long long first_bad;
  const Table& p = params.table;
  const int64_t entries = p.n * p.max_blocks;
  int64_t value = 0, detail = 0;
  if (threadIdx.x == 0) first_bad = kNoError;
  __syncthreads();
  for (int64_t i = threadIdx.x; i < p.n; i += blockDim.x)
    if (check_sequence(p, i, &value, &detail) != KvTruncateError::kNone)
      atomicMin(&first_bad, static_cast<unsigned long long>(i));
  if (const unsigned long long bad = phase_verdict(first_bad); bad != kNoError) {
    if (threadIdx.x == 0) {
      const auto i = static_cast<int64_t>(bad);
      const KvTruncateError error = check_sequence(p, i, &value, &detail);
      write_status(params.status, error, i, value, detail);
    }
    return;
  }
  for (int64_t k = threadIdx.x; k < entries; k += blockDim.x)
    if (const int32_t* e = released_entry(p, k); e && (*e < 0 || *e >= p.num_blocks))
      atomicMin(&first_bad, static_cast<unsigned long long>(k));
  if (const unsigned long long bad = phase_verdict(first_bad); bad != kNoError) {
    if (threadIdx.x == 0) {
      const auto k = static_cast<int64_t>(bad);
      write_status(params.status, KvTruncateError::kBadBlock, k / p.max_blocks, *released_entry(p, k),
                   p.num_blocks);
    }
    return;
  }
  add_to_released(p, entries, -1);
  __syncthreads();
  // Atomic reads: the decrements above went through atomics, not this SM's L1.
  for (int64_t k = threadIdx.x; k < entries; k += blockDim.x)
    if (const int32_t* e = released_entry(p, k); e && atomicAdd(p.block_refcount + *e, 0) < 0)
      atomicMin(&first_bad, static_cast<unsigned long long>(k));
  if (const unsigned long long bad = phase_verdict(first_bad); bad != kNoError) {
    add_to_released(p, entries, +1);
    if (threadIdx.x == 0) {
      const auto k = static_cast<int64_t>(bad);
      write_status(params.status, KvTruncateError::kRefcountUnderflow, k / p.max_blocks,
                   *released_entry(p, k), 0);
    }
    return;
  }
  for (int64_t k = threadIdx.x; k < entries; k += blockDim.x)
    if (int32_t* e = released_entry(p, k)) *e = -1;
  for (int64_t i = threadIdx.x; i < p.n; i += blockDim.x)
    p.seq_lens[p.seq_ids[i]] = static_cast<int32_t>(p.new_lens[i]);
  if (threadIdx.x == 0) write_status(params.status, KvTruncateError::kNone, -1, 0, 0);
}

}  // namespace

cudaError_t kv_truncate(const KvTruncateParams& params, cudaStream_t stream) {
  kv_truncate_kernel<<<1, kThreads, 0, stream>>>(params);
  return cudaGetLastError();
}

}  // namespace ssd::kernels::cuda
