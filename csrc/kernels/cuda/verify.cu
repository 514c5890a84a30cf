// Lossless speculative verification on NVIDIA GPUs; kernels/cpu/verify.cpp is
// the oracle. Two kernels:
//  1. one block per (row, position): summarise the processed target
//     distribution p_i (max, kept set, softmax normaliser) and decide whether
//     the proposal there is accepted. Positions are independent, so all K + 1
//     of a row run in parallel.
//  2. one block per row: the first rejection fixes the accepted count; the
//     bonus is drawn by inverse CDF from the residual (or p_{n+1}), whose
//     entries are rebuilt from the summary on the fly.
// The processed distribution follows process_logits (temperature, top-k,
// top-p; ranks by value desc, id asc): every token gets a unique 64-bit rank
// key (float order in the high word, inverted id in the low word), the kept
// set is {rank key >= cut}, and each cut is found by a 4-bit-digit search over
// the float word followed by a search for the crossing token among equal
// floats. All reductions have a fixed shape, so results never depend on
// scheduling.
// Tolerance against the CPU: the kept set, normalisers and cumulative sums are
// computed in double like the CPU's but summed in another order, and CUDA's
// exp is within 1 ulp of glibc's. Results can differ only where the top-p mass
// or a uniform lands within ~1e-15 (relative) of a boundary.
#include "verify.h"
#include "mass_digits.cuh"

namespace ssd::kernels::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kDigitBits = kMassDigitBits;
constexpr int kBins = kMassBins;
constexpr unsigned kFullMask = 0xffffffffu;

struct PositionSummary {
  double total;    // softmax normaliser over the kept set
  uint64_t cut;    // a token is kept iff its rank key >= cut
  float max_z;
  int32_t argmax;  // temperature-0 rows only
  int32_t accept;  // the proposal at this position is accepted
};

// Unsigned word ordered like the float; -0 maps like +0 since they compare
// equal. NaN maps to 0, below -inf, as in rank_select.cuh's float_key.
__device__ __forceinline__ uint32_t float_order(float f) {
  if (f != f) return 0u;
  const uint32_t u = __float_as_uint(f == 0.0f ? 0.0f : f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__device__ __forceinline__ float order_float(uint32_t key) {
  return __uint_as_float((key & 0x80000000u) ? (key & 0x7fffffffu) : ~key);
}

// Larger key = ranks earlier under (value desc, id asc).
__device__ __forceinline__ uint64_t rank_key(uint32_t order, int64_t id) {
  return (static_cast<uint64_t>(order) << 32) | static_cast<uint32_t>(~static_cast<uint32_t>(id));
}

// One row of target logits at one position, scaled by its temperature.
struct Row {
  const float* logits;
  int64_t vocab;
  float temperature;
  float max_z;

  __device__ float z(int64_t v) const { return logits[v] / temperature; }
  // process_logits' std::exp(static_cast<double>(z) - max_z), max_z a double holding a float.
  __device__ double mass(float z) const { return exp(static_cast<double>(z) - static_cast<double>(max_z)); }
};

// p_v of the processed distribution, rounded to float as process_logits stores it.
struct TargetProbs {
  Row row;
  PositionSummary s;

  __device__ float operator()(int64_t v) const {
    const float z = row.z(v);
    if (rank_key(float_order(z), v) < s.cut) return 0.0f;
    return static_cast<float>(row.mass(z) / s.total);
  }
};

// std::max(p_v - q_v, 0.0f) in float (a NaN stays NaN, as there); q_row ==
// nullptr is the point mass on x.
struct ResidualProbs {
  TargetProbs p;
  const float* q_row;
  int64_t x;

  __device__ float operator()(int64_t v) const {
    const float q = q_row != nullptr ? q_row[v] : (v == x ? 1.0f : 0.0f);
    const float r = p(v) - q;
    return r < 0.0f ? 0.0f : r;
  }
};

template <typename T, typename Op>
__device__ __forceinline__ T warp_reduce(T v, Op op) {
  // Butterfly: every lane ends with the same bits because op is commutative.
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(kFullMask, v, o));
  return v;
}

// Every thread gets the result; the combination order depends on kThreads only.
template <typename T, typename Op>
__device__ T block_reduce(T v, Op op) {
  __shared__ T partial[kWarps];
  v = warp_reduce(v, op);
  if ((threadIdx.x & 31) == 0) partial[threadIdx.x >> 5] = v;
  __syncthreads();
  T r = partial[0];
  for (int w = 1; w < kWarps; ++w) r = op(r, partial[w]);
  __syncthreads();
  return r;
}

struct Add {
  template <typename T>
  __device__ T operator()(T a, T b) const { return a + b; }
};

struct MaxF {
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

struct MaxI64 {
  __device__ int64_t operator()(int64_t a, int64_t b) const { return a > b ? a : b; }
};

// Lowest id among the largest logits, like kernels::argmax.
__device__ int32_t block_argmax(const float* x, int64_t n) {
  float best = x[0];
  int64_t best_id = 0;
  const auto take = [&](float value, int64_t id) {
    if (value > best || (value == best && id < best_id)) {
      best = value;
      best_id = id;
    }
  };
  for (int64_t v = threadIdx.x; v < n; v += kThreads) take(x[v], v);
  for (int o = 16; o > 0; o >>= 1) {
    const float value = __shfl_xor_sync(kFullMask, best, o);
    take(value, __shfl_xor_sync(kFullMask, best_id, o));
  }
  __shared__ float warp_best[kWarps];
  __shared__ int64_t warp_best_id[kWarps];
  if ((threadIdx.x & 31) == 0) {
    warp_best[threadIdx.x >> 5] = best;
    warp_best_id[threadIdx.x >> 5] = best_id;
  }
  __syncthreads();
  for (int w = 0; w < kWarps; ++w) take(warp_best[w], warp_best_id[w]);
  __syncthreads();
  return static_cast<int32_t>(best_id);
}

// Each thread owns a contiguous id segment, so per-segment totals scanned in
// segment order give cumulative sums in token-id order.
struct Segment {
  int64_t begin;
  int64_t end;

  __device__ explicit Segment(int64_t vocab) {
    const int64_t len = (vocab + kThreads - 1) / kThreads;
    begin = min(vocab, static_cast<int64_t>(threadIdx.x) * len);
    end = min(vocab, begin + len);
  }
};

// bounds[t] = sum of the values of threads < t (bounds[kThreads] = total),
// summed sequentially so that the bounds never decrease.
template <typename T>
__device__ void segment_bounds(T value, T* bounds) {
  bounds[threadIdx.x + 1] = value;
  __syncthreads();
  if (threadIdx.x == 0) {
    bounds[0] = T(0);
    for (int t = 1; t <= kThreads; ++t) bounds[t] += bounds[t - 1];
  }
  __syncthreads();
}

// Token drawn by inverse CDF in id order over probs(v) with u in [0, 1), like
// kernels::sample_from_probs: entries <= 0 are skipped (a NaN is not, and
// makes every comparison fail), and when no token is hit it is the last one
// not skipped, else 0. With need_positive, -1 when no entry is > 0 (residual_draw's
// has_mass test).
template <typename Probs>
__device__ int64_t inverse_cdf(const Probs& probs, int64_t vocab, double u, bool need_positive) {
  __shared__ double bounds[kThreads + 1];
  __shared__ int64_t found;
  const Segment seg(vocab);
  double sum = 0.0;
  int64_t last = -1;
  int64_t positive = 0;
  for (int64_t v = seg.begin; v < seg.end; ++v) {
    const float pv = probs(v);
    if (pv <= 0.0f) continue;
    sum += pv;
    last = v;
    positive |= pv > 0.0f ? 1 : 0;
  }
  if (threadIdx.x == 0) found = -1;
  segment_bounds(sum, bounds);
  const double total = bounds[kThreads];
  const double lo = bounds[threadIdx.x];
  const double hi = bounds[threadIdx.x + 1];
  __syncthreads();
  if (need_positive && block_reduce(positive, MaxI64{}) == 0) return -1;
  const double target = u * total;
  if (lo <= target && target < hi) {
    // The walk re-sums in its own order, so it may end just short: keep the segment's last token.
    int64_t hit = last;
    double cum = lo;
    for (int64_t v = seg.begin; v < seg.end; ++v) {
      const float pv = probs(v);
      if (pv <= 0.0f) continue;
      cum += pv;
      if (target < cum) {
        hit = v;
        break;
      }
    }
    found = hit;
  }
  __syncthreads();
  const int64_t hit = found;
  __syncthreads();
  // Only rounding (or a NaN) can push u * total to the total itself: take the
  // last token with mass.
  return hit >= 0 ? hit : max(block_reduce(last, MaxI64{}), int64_t{0});
}

// Id of the m-th token (in id order) whose float word is `order` and whose rank
// key is >= prev; the last such token if there are fewer than m, and -1 (which
// keeps every tie) if there is none.
__device__ int64_t nth_tie(const Row& row, uint32_t order, uint64_t prev, int64_t m) {
  __shared__ int64_t bounds[kThreads + 1];
  __shared__ int64_t found;
  const Segment seg(row.vocab);
  int64_t count = 0;
  if (threadIdx.x == 0) found = -1;
  for (int64_t v = seg.begin; v < seg.end; ++v) {
    const uint32_t o = float_order(row.z(v));
    count += (o == order && rank_key(o, v) >= prev) ? 1 : 0;
  }
  segment_bounds(count, bounds);
  const int64_t wanted = min(m, bounds[kThreads]);
  const int64_t lo = bounds[threadIdx.x];
  const int64_t hi = bounds[threadIdx.x + 1];
  __syncthreads();
  if (lo < wanted && wanted <= hi) {
    int64_t seen = lo;
    for (int64_t v = seg.begin; v < seg.end; ++v) {
      const uint32_t o = float_order(row.z(v));
      if (o == order && rank_key(o, v) >= prev && ++seen == wanted) {
        found = v;
        break;
      }
    }
  }
  __syncthreads();
  const int64_t id = found;
  __syncthreads();
  return id;
}

// Among candidates (rank key >= prev), the rank key of the first token in rank
// order at which the running weight reaches target: 1 per token (top-k, target
// k) or its unnormalised mass (top-p, target top_p * kept mass).
template <bool kMass>
__device__ uint64_t select_cut(const Row& row, uint64_t prev, double target) {
  __shared__ double partial[kWarps][kBins];
  uint32_t prefix = 0;
  double above = 0.0;
  for (int shift = 32 - kDigitBits; shift >= 0; shift -= kDigitBits) {
    const uint64_t high = static_cast<uint64_t>(prefix) >> (shift + kDigitBits);
    double acc[kBins] = {};
    for (int64_t v = threadIdx.x; v < row.vocab; v += kThreads) {
      const float z = row.z(v);
      const uint32_t o = float_order(z);
      if ((static_cast<uint64_t>(o) >> (shift + kDigitBits)) != high || rank_key(o, v) < prev) continue;
      const double w = kMass ? row.mass(z) : 1.0;
      const uint32_t digit = (o >> shift) & (kBins - 1);
      // Unrolled with a select so acc stays in registers.
#pragma unroll
      for (int d = 0; d < kBins; ++d) acc[d] += digit == static_cast<uint32_t>(d) ? w : 0.0;
    }
    double bins[kBins];
    sum_digit_masses(acc, partial, kWarps, bins);
    prefix |= static_cast<uint32_t>(choose_digit(bins, above, target)) << shift;
  }
  // Tokens sharing the crossing float have equal weight; they rank by id.
  const double w = kMass ? row.mass(order_float(prefix)) : 1.0;
  const double m = ceil((target - above) / w);
  const int64_t nth = !(m >= 1.0) ? 1 : (m > 0x1p62 ? int64_t{1} << 62 : static_cast<int64_t>(m));
  return rank_key(prefix, nth_tie(row, prefix, prev, nth));
}

__device__ double kept_mass(const Row& row, uint64_t cut) {
  double sum = 0.0;
  for (int64_t v = threadIdx.x; v < row.vocab; v += kThreads) {
    const float z = row.z(v);
    if (rank_key(float_order(z), v) >= cut) sum += row.mass(z);
  }
  return block_reduce(sum, Add{});
}

__device__ int64_t num_proposals_of(const VerifyParams& p, int64_t b) {
  return min(max(p.num_proposals[b], int64_t{0}), p.k);
}

// Summary of p for one (row, position); the accept decision where a proposal sits.
__global__ void __launch_bounds__(kThreads) summarise_kernel(VerifyParams p, PositionSummary* summaries) {
  const int64_t slot = blockIdx.x;
  const int64_t b = slot / (p.k + 1);
  const int64_t i = slot % (p.k + 1);
  const int64_t n = num_proposals_of(p, b);
  if (i > n) return;
  const float* logits = p.target_logits + slot * p.vocab;
  const int64_t x = i < n ? p.proposals[b * p.k + i] : -1;
  const bool proposed = x >= 0 && x < p.vocab;
  PositionSummary s{};
  if (p.temperature[b] == 0.0) {
    s.argmax = block_argmax(logits, p.vocab);
    s.accept = proposed && x == s.argmax;
  } else {
    Row row{logits, p.vocab, static_cast<float>(p.temperature[b]), 0.0f};
    float max_z = -INFINITY;
    for (int64_t v = threadIdx.x; v < p.vocab; v += kThreads) max_z = fmaxf(max_z, row.z(v));
    row.max_z = block_reduce(max_z, MaxF{});
    const int64_t top_k = p.top_k[b];
    if (top_k > 0 && top_k < p.vocab) s.cut = select_cut<false>(row, s.cut, static_cast<double>(top_k));
    if (p.top_p[b] < 1.0) s.cut = select_cut<true>(row, s.cut, p.top_p[b] * kept_mass(row, s.cut));
    s.total = kept_mass(row, s.cut);
    s.max_z = row.max_z;
    if (proposed) {
      const double q_x = p.one_hot[b] ? 1.0 : p.q_probs[(b * p.k + i) * p.vocab + x];
      const float p_x = TargetProbs{row, s}(x);
      s.accept = p.accept_uniforms[b * p.k + i] * q_x < static_cast<double>(p_x);
    }
  }
  if (threadIdx.x == 0) summaries[slot] = s;
}

// Accepted count and bonus token of one row.
__global__ void __launch_bounds__(kThreads) bonus_kernel(VerifyParams p, const PositionSummary* summaries) {
  const int64_t b = blockIdx.x;
  const int64_t n = num_proposals_of(p, b);
  const PositionSummary* s = summaries + b * (p.k + 1);
  int64_t j = n;
  for (int64_t i = 0; i < n; ++i)
    if (!s[i].accept) {
      j = i;
      break;
    }
  int64_t token;
  if (p.temperature[b] == 0.0) {
    token = s[j].argmax;
  } else {
    const Row row{p.target_logits + (b * (p.k + 1) + j) * p.vocab, p.vocab,
                  static_cast<float>(p.temperature[b]), s[j].max_z};
    const TargetProbs target{row, s[j]};
    token = -1;
    if (j < n) {
      const float* q_row = p.one_hot[b] ? nullptr : p.q_probs + (b * p.k + j) * p.vocab;
      token = inverse_cdf(ResidualProbs{target, q_row, p.proposals[b * p.k + j]}, p.vocab,
                          p.bonus_uniforms[b], true);
    }
    // No residual mass is only reachable through rounding (p == q wherever p > 0): draw from p.
    if (token < 0) token = inverse_cdf(target, p.vocab, p.bonus_uniforms[b], false);
  }
  if (threadIdx.x == 0) {
    p.accepted[b] = j;
    p.bonus[b] = token;
  }
}

}  // namespace

size_t verify_workspace_bytes(int64_t batch, int64_t k) {
  return static_cast<size_t>(batch * (k + 1)) * sizeof(PositionSummary);
}

cudaError_t verify(const VerifyParams& params, void* workspace, cudaStream_t stream) {
  if (params.batch <= 0) return cudaSuccess;
  auto* summaries = static_cast<PositionSummary*>(workspace);
  const auto slots = static_cast<unsigned>(params.batch * (params.k + 1));
  summarise_kernel<<<slots, kThreads, 0, stream>>>(params, summaries);
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  bonus_kernel<<<static_cast<unsigned>(params.batch), kThreads, 0, stream>>>(params, summaries);
  return cudaGetLastError();
}

}  // namespace ssd::kernels::cuda
