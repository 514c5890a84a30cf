// SAGUARO sampling on NVIDIA GPUs: one block per row, no sort. Every cut is
// a threshold on the unique rank key (z = logit / T desc, id asc):
//  - top-k and top_F: radix select on counts (exact);
//  - top-p: a radix select on the mass, 4-bit digits over the float word (8
//    passes, per-digit masses summed in a fixed order), for the value at which
//    the rank-ordered mass reaches top_p * total, then one counting pass for
//    the crossing token among the tokens tied at that value.
// The kept sets are the CPU's; masses are the CPU's per token, exp(double(z)
// - double(max_z)), but summed in a fixed parallel order rather than the
// CPU's sequential one, so sums differ in the last bits only (a top-p cut can
// differ only where the cumulative mass is within that rounding of
// top_p * total). NaN logits rank below every number (rank_select.cuh).
#include <climits>

#include "rank_select.cuh"
#include "mass_digits.cuh"
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
  // process_logits' std::exp(static_cast<double>(z) - max_z), max_z a double holding a float.
  __device__ static double mass(float z, float max_z) {
    return exp(static_cast<double>(z) - static_cast<double>(max_z));
  }
  __device__ double weight(int64_t i, float max_z) const { return mass(z(i), max_z); }
};

// Every token is a candidate (one type, so rank_threshold's shared memory is
// allocated once per kernel).
struct AnyKey {
  const Row* row;
  __device__ bool operator()(int64_t i, uint64_t& key) const {
    key = row->key(i);
    return true;
  }
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

// Exclusive prefix sum over threads in a fixed order; *total gets the sum.
template <typename T>
__device__ T block_exclusive_scan(T v, T* total) {
  __shared__ T warp_sums[32];
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  T inclusive = v;
  for (int offset = 1; offset < 32; offset <<= 1) {
    const T up = __shfl_up_sync(0xffffffffu, inclusive, offset);
    if (lane >= offset) inclusive += up;
  }
  T exclusive = __shfl_up_sync(0xffffffffu, inclusive, 1);
  if (lane == 0) exclusive = T(0);
  if (lane == 31) warp_sums[warp] = inclusive;
  __syncthreads();
  T before = T(0);
  for (int w = 0; w < warp; ++w) before += warp_sums[w];
  T all = T(0);
  for (int w = 0; w < static_cast<int>(blockDim.x >> 5); ++w) all += warp_sums[w];
  *total = all;
  __syncthreads();
  return before + exclusive;
}

// Contiguous id segment of this thread, so that segments in thread order are
// id order.
struct Segment {
  int64_t begin;
  int64_t end;
  __device__ explicit Segment(int64_t n) {
    const int64_t len = (n + blockDim.x - 1) / blockDim.x;
    begin = min(n, len * threadIdx.x);
    end = min(n, begin + len);
  }
};

// Id of the m-th (m >= 1) token in id order with float word `value` and key >=
// kept, or of the last such token if there are fewer; -1 if there is none.
__device__ int64_t nth_tie(const Row& row, uint32_t value, uint64_t kept, int64_t m) {
  __shared__ int64_t found;
  const Segment seg(row.vocab);
  auto tied = [&](int64_t i) {
    const uint64_t key = row.key(i);
    return (key >> 32) == value && key >= kept;
  };
  int64_t count = 0;
  for (int64_t i = seg.begin; i < seg.end; ++i) count += tied(i) ? 1 : 0;
  if (threadIdx.x == 0) found = -1;
  int64_t all;
  const int64_t before = block_exclusive_scan(count, &all);
  const int64_t wanted = min(m, all);
  if (before < wanted && wanted <= before + count) {
    int64_t seen = before;
    for (int64_t i = seg.begin; i < seg.end; ++i)
      if (tied(i) && ++seen == wanted) {
        found = i;
        break;
      }
  }
  __syncthreads();
  const int64_t id = found;
  __syncthreads();
  return id;
}

constexpr int kDigitBits = kMassDigitBits;
constexpr int kBins = kMassBins;

// Threshold of the shortest rank prefix of {key >= kept} whose mass reaches
// top_p of the mass of {key >= kept}: 8 digit passes over the float word, each
// summing the bucket's masses per digit in a fixed order (per-thread
// registers, warp butterflies, warps in order), then the crossing token among
// the tokens tied at the chosen value, which all have the same mass.
__device__ uint64_t top_p_cut(const Row& row, uint64_t kept, float max_z, double top_p) {
  __shared__ double partial[32][kBins];
  const int warps = static_cast<int>(blockDim.x >> 5);
  const double target = top_p * block_sum(row.vocab, [&](int64_t i) {
    return row.key(i) >= kept ? row.weight(i, max_z) : 0.0;
  });
  uint32_t value = 0;
  double above = 0.0;
  for (int shift = 32 - kDigitBits; shift >= 0; shift -= kDigitBits) {
    const uint64_t high = static_cast<uint64_t>(value) >> (shift + kDigitBits);
    double acc[kBins] = {};
    for (int64_t i = threadIdx.x; i < row.vocab; i += blockDim.x) {
      const float z = row.z(i);
      const uint64_t key = rank_key(z, i);
      if (((key >> 32) >> (shift + kDigitBits)) != high || key < kept) continue;
      const double w = Row::mass(z, max_z);
      const uint32_t digit = static_cast<uint32_t>(key >> (32 + shift)) & (kBins - 1);
      // Unrolled with a select so acc stays in registers.
#pragma unroll
      for (int d = 0; d < kBins; ++d) acc[d] += digit == static_cast<uint32_t>(d) ? w : 0.0;
    }
    double bins[kBins];
    sum_digit_masses(acc, partial, warps, bins);
    value |= static_cast<uint32_t>(choose_digit(bins, above, target)) << shift;
  }
  // The tied tokens rank by id; m of them close the prefix.
  const double m = ceil((target - above) / Row::mass(key_float(value), max_z));
  const int64_t nth = !(m >= 1.0) ? 1 : (m > 0x1p62 ? int64_t{1} << 62 : static_cast<int64_t>(m));
  const int64_t id = nth_tie(row, value, kept, nth);
  if (id < 0) return kept;
  return max(cut_key(value, id), kept);
}

// probs <- the processed distribution (temperature > 0): temperature, top-k,
// top-p, softmax over the kept set.
__device__ void process_row(const Row& row, int64_t top_k, double top_p) {
  float local_max = -INFINITY;
  for (int64_t i = threadIdx.x; i < row.vocab; i += blockDim.x) local_max = fmaxf(local_max, row.z(i));
  const float max_z = block_reduce(local_max, -INFINITY, Max{});
  uint64_t kept = 0;
  if (top_k > 0 && top_k < row.vocab) kept = rank_threshold(row.vocab, top_k - 1, AnyKey{&row});
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
  // The support is a rank prefix (p is monotone in z, NaN never has p > 0),
  // so its F best are the row's F best.
  const uint64_t top = rank_threshold(row.vocab, fanout - 1, AnyKey{&row});
  const double top_mass = block_sum(row.vocab, [&](int64_t i) { return row.key(i) >= top ? row.probs[i] : 0.0; });
  const double rest_mass = block_sum(row.vocab, [&](int64_t i) { return row.key(i) < top ? row.probs[i] : 0.0; });
  const double norm = c * top_mass + rest_mass;
  for (int64_t i = threadIdx.x; i < row.vocab; i += blockDim.x) {
    const double mass = row.key(i) >= top ? c * row.probs[i] : static_cast<double>(row.probs[i]);
    row.probs[i] = static_cast<float>(mass / norm);
  }
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
  // Like sample_from_probs: the last token with mass, else token 0.
  if (owner == INT_MAX) return max(block_reduce(last_nonzero, int64_t{-1}, Max{}), int64_t{0});
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

// Temperature 0: one-hot at kernels::argmax: the lowest id of the largest
// value, NaN never taken, except that its scan (x[i] > x[best] from best = 0)
// stays at 0 when logits[0] is NaN.
__device__ int64_t greedy_row(const float* logits, float* probs, int64_t vocab) {
  uint64_t best = 0;
  for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x) best = max(best, rank_key(logits[i], i));
  const uint64_t top = block_reduce(best, uint64_t{0}, Max{});
  const int64_t token = isnan(logits[0]) ? 0 : id_of_key(top);
  for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x) probs[i] = i == token ? 1.0f : 0.0f;
  return token;
}

__global__ void __launch_bounds__(kThreads) saguaro_sample_kernel(SaguaroSampleParams p) {
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
