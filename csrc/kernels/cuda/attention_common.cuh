// The attention loop shared by the paged and fork attention kernels.
//
// One thread block per (query row, kv head, chunk of up to kMaxGroup query
// heads of that kv head's GQA group), so each K/V row is read once for the
// heads that share it. The keys of a row are cut into tiles of 32 (one key per
// lane); tile i goes to warp i % kWarps, each warp runs an online softmax over
// its tiles in order, and the warps are merged in warp order at the end. That
// schedule depends only on the row's own key count, so a row's result never
// depends on which other rows are in the launch (batch invariance), though it
// differs in rounding from the CPU kernel's two-pass order.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

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

// Lane `lane`'s D / 32 consecutive elements of a row.
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
template <int D>
__device__ __forceinline__ void score_key(const float* key, const float (*q_s)[D], int heads,
                                          float (&s)[kMaxGroup]) {
  for (int i = 0; i < D; i += 4) {
    const float4 k = __ldg(reinterpret_cast<const float4*>(key + i));
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
  const float* my_value = valid ? keys.v_row(key) : nullptr;
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
    const auto* row = reinterpret_cast<const float*>(
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
/// all kThreads threads of the block.
template <int D, typename Keys>
__device__ __forceinline__ void attend_block(const Keys& keys, int n, const float* q, float* out, int heads,
                                             float scale) {
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
    out[i] = o / l;
  }
}

}  // namespace ssd::kernels::cuda::attention
