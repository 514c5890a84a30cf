// SAGUARO sampling on NVIDIA GPUs: one block per row, no sort. Every cut is
// a threshold on the unique rank key (z = logit / T desc, id asc):
//  - top-k and top_F: radix select on counts (exact);
//  - top-p: bisection over the key for the shortest rank prefix whose mass
//    reaches top_p * total, first over the value, then over ids inside a
//    tied value.
// The kept sets are the CPU's; masses are fixed-order double sums, so they
// differ from the CPU's sequential sums in the last bits only (a top-p cut
// can differ only where the cumulative mass is within that rounding of
// top_p * total).
#include <climits>

#include "rank_select.cuh"
#include "saguaro_sample.h"

namespace ssd::kernels::cuda {

namespace {

constexpr int kThreads = 512;

struct Row {
  const float* logits;
  float* probs;
  int64_t vocab;
  float temperature;
  // The CPU divides by float(temperature) too; __fdiv_rn keeps IEEE division.
  __device__ float z(int64_t i) const { return __fdiv_rn(logits[i], temperature); }
  __device__ uint64_t key(int64_t i) const { return rank_key(z(i), i); }
  // exp in double of the float difference, as process_logits computes it.
  __device__ double weight(int64_t i, float max_z) const { return exp(static_cast<double>(z(i) - max_z)); }
};

template <typename F>
__device__ double block_sum(int64_t n, F term) {
  double acc = 0.0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) acc += term(i);
  return block_reduce(acc, 0.0, Sum{});
}

template <typename Pred>
__device__ int64_t block_count(int64_t n, Pred pred) {
  int64_t count = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) count += pred(i) ? 1 : 0;
  return block_reduce(count, int64_t{0}, Sum{});
}

// Mass of the tokens whose key is >= theta.
__device__ double mass_from(const Row& row, uint64_t theta, float max_z) {
  return block_sum(row.vocab, [&](int64_t i) { return row.key(i) >= theta ? row.weight(i, max_z) : 0.0; });
}

// Threshold of the shortest rank prefix of {key >= kept} with mass >= target.
__device__ uint64_t top_p_cut(const Row& row, uint64_t kept, float max_z, double top_p) {
  const double target = top_p * mass_from(row, kept, max_z);
  auto reaches = [&](uint64_t theta) { return mass_from(row, max(theta, kept), max_z) >= target; };
  uint32_t value = 0;
  for (int bit = 31; bit >= 0; --bit) {
    const uint32_t candidate = value | (1u << bit);
    if (reaches(static_cast<uint64_t>(candidate) << 32)) value = candidate;
  }
  const uint64_t whole_value = static_cast<uint64_t>(value) << 32;
  const int64_t tied = block_count(row.vocab, [&](int64_t i) {
    const uint64_t key = row.key(i);
    return key >= kept && (key >> 32) == value;
  });
  if (tied <= 1) return max(whole_value, kept);
  int64_t lo = 0;
  int64_t hi = row.vocab - 1;
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (reaches(cut_key(value, mid))) hi = mid;
    else lo = mid + 1;
  }
  return max(cut_key(value, lo), kept);
}

// probs <- the processed distribution (temperature > 0): temperature, top-k,
// top-p, softmax over the kept set.
__device__ void process_row(const Row& row, int64_t top_k, double top_p) {
  float local_max = -INFINITY;
  for (int64_t i = threadIdx.x; i < row.vocab; i += blockDim.x) local_max = fmaxf(local_max, row.z(i));
  const float max_z = block_reduce(local_max, -INFINITY, Max{});
  auto any_key = [&](int64_t i, uint64_t& key) {
    key = row.key(i);
    return true;
  };
  uint64_t kept = 0;
  if (top_k > 0 && top_k < row.vocab) kept = rank_threshold(row.vocab, top_k - 1, any_key);
  if (top_p < 1.0) kept = top_p_cut(row, kept, max_z, top_p);
  const double total = mass_from(row, kept, max_z);
  for (int64_t i = threadIdx.x; i < row.vocab; i += blockDim.x)
    row.probs[i] = row.key(i) >= kept ? static_cast<float>(row.weight(i, max_z) / total) : 0.0f;
}

// probs <- sigma_{F,C}: C * p on the F best-ranked tokens, p elsewhere,
// renormalised; untouched when those F tokens hold the whole support.
__device__ void downweight_row(const Row& row, int64_t fanout, double c) {
  const int64_t support = block_count(row.vocab, [&](int64_t i) { return row.probs[i] > 0.0f; });
  if (support <= fanout) return;
  auto any_key = [&](int64_t i, uint64_t& key) {
    key = row.key(i);
    return true;
  };
  const uint64_t top = rank_threshold(row.vocab, fanout - 1, any_key);
  const double top_mass = block_sum(row.vocab, [&](int64_t i) { return row.key(i) >= top ? row.probs[i] : 0.0; });
  const double rest_mass = block_sum(row.vocab, [&](int64_t i) { return row.key(i) < top ? row.probs[i] : 0.0; });
  const double norm = c * top_mass + rest_mass;
  for (int64_t i = threadIdx.x; i < row.vocab; i += blockDim.x) {
    const double mass = row.key(i) >= top ? c * row.probs[i] : static_cast<double>(row.probs[i]);
    row.probs[i] = static_cast<float>(mass / norm);
  }
}

// Exclusive prefix sum over threads in a fixed order; *total gets the sum.
__device__ double block_exclusive_scan(double v, double* total) {
  __shared__ double warp_sums[32];
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  double inclusive = v;
  for (int offset = 1; offset < 32; offset <<= 1) {
    const double up = __shfl_up_sync(0xffffffffu, inclusive, offset);
    if (lane >= offset) inclusive += up;
  }
  double exclusive = __shfl_up_sync(0xffffffffu, inclusive, 1);
  if (lane == 0) exclusive = 0.0;
  if (lane == 31) warp_sums[warp] = inclusive;
  __syncthreads();
  double before = 0.0;
  for (int w = 0; w < warp; ++w) before += warp_sums[w];
  double all = 0.0;
  for (int w = 0; w < static_cast<int>(blockDim.x >> 5); ++w) all += warp_sums[w];
  *total = all;
  __syncthreads();
  return before + exclusive;
}

// Inverse-CDF draw in token-id order. Each thread owns a contiguous segment:
// the first segment whose own sum passes what is left of u * total holds the
// token, and its owner walks it with the same sequence of additions.
__device__ int64_t inverse_cdf(const float* probs, int64_t vocab, double u) {
  const int64_t seg = (vocab + blockDim.x - 1) / blockDim.x;
  const int64_t begin = min(vocab, seg * threadIdx.x);
  const int64_t end = min(vocab, begin + seg);
  double seg_mass = 0.0;
  int64_t last_nonzero = -1;
  for (int64_t i = begin; i < end; ++i) {
    if (probs[i] <= 0.0f) continue;
    seg_mass += probs[i];
    last_nonzero = i;
  }
  double total;
  const double before = block_exclusive_scan(seg_mass, &total);
  const double left = u * total - before;
  const bool holds = last_nonzero >= 0 && seg_mass > left;
  const int owner = block_reduce(holds ? static_cast<int>(threadIdx.x) : INT_MAX, INT_MAX, Min{});
  if (owner == INT_MAX) return block_reduce(last_nonzero, int64_t{-1}, Max{});
  __shared__ int64_t token;
  if (static_cast<int>(threadIdx.x) == owner) {
    double cum = 0.0;
    for (int64_t i = begin; i < end; ++i) {
      if (probs[i] <= 0.0f) continue;
      cum += probs[i];
      if (left < cum) {
        token = i;
        break;
      }
    }
  }
  __syncthreads();
  return token;
}

// Temperature 0: one-hot at the argmax, ties to the lowest id.
__device__ int64_t greedy_row(const float* logits, float* probs, int64_t vocab) {
  uint64_t best = 0;
  for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x) best = max(best, rank_key(logits[i], i));
  const int64_t token = id_of_key(block_reduce(best, uint64_t{0}, Max{}));
  for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x) probs[i] = i == token ? 1.0f : 0.0f;
  return token;
}

__global__ void saguaro_sample_kernel(SaguaroSampleParams p) {
  const int64_t r = blockIdx.x;
  const float* logits = p.logits + r * p.vocab;
  float* probs = p.probs + r * p.vocab;
  int64_t token;
  if (p.temperature[r] == 0.0) {
    token = greedy_row(logits, probs, p.vocab);
  } else {
    const Row row{logits, probs, p.vocab, static_cast<float>(p.temperature[r])};
    process_row(row, p.top_k[r], p.top_p[r]);
    if (p.fanout[r] > 0 && p.downweight[r] < 1.0) downweight_row(row, p.fanout[r], p.downweight[r]);
    __syncthreads();
    token = inverse_cdf(probs, p.vocab, p.uniforms[r]);
  }
  if (threadIdx.x == 0) p.tokens[r] = token;
}

}  // namespace

cudaError_t saguaro_sample(const SaguaroSampleParams& params, cudaStream_t stream) {
  if (params.rows <= 0) return cudaSuccess;
  if (params.vocab >= (int64_t{1} << 31)) return cudaErrorInvalidValue;
  saguaro_sample_kernel<<<static_cast<unsigned>(params.rows), kThreads, 0, stream>>>(params);
  return cudaGetLastError();
}

}  // namespace ssd::kernels::cuda
