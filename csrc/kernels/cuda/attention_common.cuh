// The attention loop shared by the paged and fork attention kernels.
//
// One thread block per (query row, kv head, chunk of up to kMaxGroup query
// heads of that kv head's GQA group, split of kSplitKeys keys), so each K/V
// row is read once for the heads that share it, and a long context is spread
// over many blocks (splits at fixed key indices, merged in split order by
// combine_splits_kernel: kernels/key_splits.h). The keys of a row are cut into tiles of 32 (one key per
// lane); tile i goes to warp i % kWarps, each warp runs an online softmax over
// its tiles in order, and the warps are merged in warp order at the end. That
// schedule depends only on the row's own key count, so a row's result never
// depends on which other rows are in the launch (batch invariance), though it
// differs in rounding from the CPU kernel's two-pass order.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "../key_splits.h"

namespace ssd::kernels::cuda::attention {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kTile = 32;
constexpr int kMaxGroup = 8;
constexpr unsigned kFullMask = 0xffffffffu;

inline bool head_dim_supported(int64_t d) { return d == 64 || d == 128; }

inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

__device__ __forceinline__ float warp_max(float x) {
#pragma unroll
  for (int w = 16; w > 0; w /= 2) x = fmaxf(x, __shfl_xor_sync(kFullMask, x, w));
  return x;
}

__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int w = 16; w > 0; w /= 2) x += __shfl_xor_sync(kFullMask, x, w);
  return x;
}

__device__ __forceinline__ float bf16_bits_to_float(uint32_t bits) { return __uint_as_float(bits << 16); }

// Four consecutive values of a K / V row (fp32, or bf16 bits) as fp32.
__device__ __forceinline__ float4 load4(const float* p) { return __ldg(reinterpret_cast<const float4*>(p)); }
__device__ __forceinline__ float4 load4(const uint16_t* p) {
  const uint2 v = __ldg(reinterpret_cast<const uint2*>(p));
  return make_float4(bf16_bits_to_float(v.x & 0xffffu), bf16_bits_to_float(v.x >> 16),
                     bf16_bits_to_float(v.y & 0xffffu), bf16_bits_to_float(v.y >> 16));
}

// Lane `lane`'s D / 32 consecutive elements of a row.
template <int D>
__device__ __forceinline__ void load_slice(const uint16_t* row, int lane, float (&x)[D / 32]) {
  if constexpr (D / 32 == 4) {
    const float4 v = load4(row + 4 * lane);
    x[0] = v.x, x[1] = v.y, x[2] = v.z, x[3] = v.w;
  } else {
    static_assert(D / 32 == 2, "head_dim must be 64 or 128");
    const uint32_t v = __ldg(reinterpret_cast<const unsigned int*>(row) + lane);
    x[0] = bf16_bits_to_float(v & 0xffffu), x[1] = bf16_bits_to_float(v >> 16);
  }
}

template <int D>
__device__ __forceinline__ void load_slice(const float* row, int lane, float (&x)[D / 32]) {
  if constexpr (D / 32 == 4) {
    const float4 v = __ldg(reinterpret_cast<const float4*>(row) + lane);
    x[0] = v.x, x[1] = v.y, x[2] = v.z, x[3] = v.w;
  } else {
    static_assert(D / 32 == 2, "head_dim must be 64 or 128");
    const float2 v = __ldg(reinterpret_cast<const float2*>(row) + lane);
    x[0] = v.x, x[1] = v.y;
  }
}

// s[h] += q_h . key for the first `heads` heads; q_s holds them row after row.
template <int D, typename T>
__device__ __forceinline__ void score_key(const T* key, const float (*q_s)[D], int heads, float (&s)[kMaxGroup]) {
  for (int i = 0; i < D; i += 4) {
    const float4 k = load4(key + i);
#pragma unroll
    for (int h = 0; h < kMaxGroup; ++h) {
      if (h < heads) {
        const float4 q = *reinterpret_cast<const float4*>(&q_s[h][i]);
        s[h] = fmaf(q.x, k.x, s[h]);
        s[h] = fmaf(q.y, k.y, s[h]);
        s[h] = fmaf(q.z, k.z, s[h]);
        s[h] = fmaf(q.w, k.w, s[h]);
      }
    }
  }
}

// Per-warp online-softmax state of up to kMaxGroup heads: running max, sum of
// exponentials and unnormalised output slice (this lane's D / 32 elements).
template <int D>
struct WarpState {
  float m[kMaxGroup];
  float l[kMaxGroup];
  float acc[kMaxGroup][D / 32];
};

// Keys: k_row(i) / v_row(i) give the D-float K / V rows of key i (0 <= i < n).
template <int D, typename Keys>
__device__ __forceinline__ void attend_tile(const Keys& keys, int n, int tile, const float (*q_s)[D], int heads,
                                            float scale, float (*p_s)[kTile], WarpState<D>& st) {
  const int lane = threadIdx.x % 32;
  const int key = tile * kTile + lane;
  const bool valid = key < n;
  float s[kMaxGroup] = {};
  if (valid) score_key<D>(keys.k_row(key), q_s, heads, s);
  using Value = std::remove_cv_t<std::remove_pointer_t<decltype(keys.v_row(0))>>;  // float or bf16 bits
  const Value* my_value = valid ? keys.v_row(key) : nullptr;
#pragma unroll
  for (int h = 0; h < kMaxGroup; ++h) {
    if (h < heads) {
      const float x = valid ? s[h] * scale : -INFINITY;
      const float m_new = fmaxf(st.m[h], warp_max(x));
      const float alpha = expf(st.m[h] - m_new);
      const float p = valid ? expf(x - m_new) : 0.0f;
      st.l[h] = st.l[h] * alpha + warp_sum(p);
      st.m[h] = m_new;
#pragma unroll
      for (int e = 0; e < D / 32; ++e) st.acc[h][e] *= alpha;
      p_s[h][lane] = p;
    }
  }
  __syncwarp();
  const int count = min(kTile, n - tile * kTile);
  for (int j = 0; j < count; ++j) {
    const auto* row = reinterpret_cast<const Value*>(
        __shfl_sync(kFullMask, reinterpret_cast<unsigned long long>(my_value), j));
    float v[D / 32];
    load_slice<D>(row, lane, v);
#pragma unroll
    for (int h = 0; h < kMaxGroup; ++h) {
      if (h < heads) {
        const float w = p_s[h][j];
#pragma unroll
        for (int e = 0; e < D / 32; ++e) st.acc[h][e] = fmaf(w, v[e], st.acc[h][e]);
      }
    }
  }
  __syncwarp();
}

/// Attention of `heads` (<= kMaxGroup) query heads sharing one kv head over
/// n >= 1 keys. q, out: heads rows of D floats, one after another. Called by
/// all kThreads threads of the block. With part_max non-null (one split of a
/// query's keys): out gets the unnormalised value sums, part_max[h] /
/// part_denom[h] head h's score max and sum of exponentials.
template <int D, typename Keys>
__device__ __forceinline__ void attend_block(const Keys& keys, int n, const float* q, float* out, int heads,
                                             float scale, float* part_max = nullptr, float* part_denom = nullptr) {
  __shared__ __align__(16) float q_s[kMaxGroup][D];
  __shared__ float p_s[kWarps][kMaxGroup][kTile];
  __shared__ float m_s[kWarps][kMaxGroup];
  __shared__ float l_s[kWarps][kMaxGroup];
  __shared__ float o_s[kWarps][kMaxGroup][D];
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  for (int i = threadIdx.x; i < heads * D; i += kThreads) q_s[i / D][i % D] = q[i];
  __syncthreads();

  WarpState<D> st;
#pragma unroll
  for (int h = 0; h < kMaxGroup; ++h) {
    st.m[h] = -INFINITY;
    st.l[h] = 0.0f;
#pragma unroll
    for (int e = 0; e < D / 32; ++e) st.acc[h][e] = 0.0f;
  }
  for (int tile = warp; tile * kTile < n; tile += kWarps)
    attend_tile<D>(keys, n, tile, q_s, heads, scale, p_s[warp], st);

#pragma unroll
  for (int h = 0; h < kMaxGroup; ++h) {
    if (h < heads) {
      if (lane == 0) m_s[warp][h] = st.m[h], l_s[warp][h] = st.l[h];
#pragma unroll
      for (int e = 0; e < D / 32; ++e) o_s[warp][h][lane * (D / 32) + e] = st.acc[h][e];
    }
  }
  __syncthreads();
  for (int i = threadIdx.x; i < heads * D; i += kThreads) {
    const int h = i / D;
    float m = -INFINITY;
    for (int w = 0; w < kWarps; ++w) m = fmaxf(m, m_s[w][h]);
    float l = 0.0f, o = 0.0f;
    for (int w = 0; w < kWarps; ++w) {
      // A warp that got no tile has m = -inf and contributes nothing.
      const float c = m_s[w][h] == -INFINITY ? 0.0f : expf(m_s[w][h] - m);
      l = fmaf(l_s[w][h], c, l);
      o = fmaf(o_s[w][h][i % D], c, o);
    }
    if (part_max == nullptr) {
      out[i] = o / l;
    } else {
      out[i] = o;
      if (i % D == 0) part_max[h] = m, part_denom[h] = l;
    }
  }
}

/// Keys offset, offset + 1, ... of `keys`.
template <typename Keys>
struct OffsetKeys {
  Keys keys;
  int offset;
  __device__ auto k_row(int i) const { return keys.k_row(offset + i); }
  __device__ auto v_row(int i) const { return keys.v_row(offset + i); }
};

/// Where the queries spanning several splits of kSplitKeys keys put their
/// partial results (device memory; unused when max_splits is 1), and how
/// many splits each query spans. Row (t * max_splits + s) * num_heads + h:
/// split s (counted from the query's first) of query t, head h.
struct SplitWorkspace {
  int max_splits = 1;
  float* partial = nullptr;        // [rows, D]
  float* partial_max = nullptr;    // [rows]
  float* partial_denom = nullptr;  // [rows]
  int32_t* splits = nullptr;       // [num_tokens]
};

/// The block's share of query t over its keys [first_key, end_key): split
/// `s` of them (counted from the first the query spans). A query in one
/// split writes its output; the others write partial rows for
/// combine_splits_kernel. blockIdx.z's chunk 0 of split 0 records the count.
template <int D, typename Keys>
__device__ __forceinline__ void attend_split(const Keys& keys, int first_key, int end_key, int s, int chunk,
                                             const float* q, float* out, int heads, float scale,
                                             const SplitWorkspace& ws, int64_t t, int64_t head0, int64_t num_heads) {
  const int splits = static_cast<int>(key_splits(first_key, end_key));
  if (s == 0 && chunk == 0 && threadIdx.x == 0 && ws.splits != nullptr) ws.splits[t] = splits;
  if (s >= splits) return;  // the whole block: no __syncthreads is skipped by part of it
  if (splits == 1) {
    attend_block<D>(OffsetKeys<Keys>{keys, first_key}, end_key - first_key, q, out, heads, scale);
    return;
  }
  const int split = static_cast<int>(first_key / kSplitKeys) + s;
  const int lo = max(first_key, split * static_cast<int>(kSplitKeys));
  const int hi = min(end_key, (split + 1) * static_cast<int>(kSplitKeys));
  const int64_t row = (t * ws.max_splits + s) * num_heads + head0;
  attend_block<D>(OffsetKeys<Keys>{keys, lo}, hi - lo, q, ws.partial + row * D, heads, scale, ws.partial_max + row,
                  ws.partial_denom + row);
}

/// After the attention kernel: each query t spanning several splits (grid
/// [num_tokens, num_heads], D threads) merges them in split order, the CPU
/// kernels' order (kernels/cpu/attention_splits.cpp).
template <int D>
__global__ void __launch_bounds__(D) combine_splits_kernel(float* out, int64_t ldo, int64_t num_heads,
                                                           SplitWorkspace ws) {
  const int64_t t = blockIdx.x, h = blockIdx.y;
  const int splits = ws.splits[t];
  if (splits <= 1) return;
  const int64_t row0 = t * ws.max_splits * num_heads + h;
  float m = -INFINITY;
  for (int j = 0; j < splits; ++j) m = fmaxf(m, ws.partial_max[row0 + j * num_heads]);
  float l = 0.0f, o = 0.0f;
  for (int j = 0; j < splits; ++j) {
    const int64_t row = row0 + j * num_heads;
    const float c = expf(ws.partial_max[row] - m);
    l = fmaf(ws.partial_denom[row], c, l);
    o = fmaf(ws.partial[row * D + threadIdx.x], c, o);
  }
  out[t * ldo + h * D + threadIdx.x] = o * (1.0f / l);
}

/// Enqueues combine_splits_kernel where the workspace is in use.
template <int D>
inline cudaError_t combine_splits(float* out, int64_t ldo, int64_t num_tokens, int64_t num_heads,
                                  const SplitWorkspace& ws, cudaStream_t stream) {
  if (ws.max_splits <= 1) return cudaSuccess;
  const dim3 grid(static_cast<unsigned>(num_tokens), static_cast<unsigned>(num_heads));
  combine_splits_kernel<D><<<grid, D, 0, stream>>>(out, ldo, num_heads, ws);
  return cudaGetLastError();
}

}  // namespace ssd::kernels::cuda::attention
