// The exact layout's product (linear.h) and the quantized one (quant.h),
// compiled once per instruction set.
#include <algorithm>
#include <cstring>

#include "../isa.h"
#include "../quant_tile.h"
#include "tile_groups.h"
#include "vec.h"

namespace ssd::kernels::SSD_ISA {

static_assert(kLanes == kTileLanes, "a tile chunk is one Vec wide");

namespace {

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

constexpr int64_t kTileChunk = kTileRows * kLanes;  // elements per k-chunk of a tile
// Activation rows per register block: 6 with 16-lane registers, 3 where a
// Vec takes two (AVX2), so the accumulators stay in registers.
constexpr int64_t kMaxGroup = 6 / kVecRegs;
constexpr int64_t kAheadBytes = 8192;  // software prefetch distance

// Tile rows one pass of an MR-row block accumulates: all 4 where MR x 4
// accumulators fit the register budget, else 2 (AVX2 from 2 rows) in two
// passes over the tile.
template <int64_t MR>
constexpr int64_t kColBlock = MR * kTileRows * kVecRegs <= kAccRegs ? kTileRows : 2;

// Where a tile's weights come from, one 16-lane chunk of one tile row at a
// time: load(c, j) is chunk c of tile row j as fp32 lanes, prefetch<L>(c)
// pulls the stream ahead. DenseTile reads the exact layout (linear.h);
// QuantTile dequantises a quantized block in registers (quant.h).
template <typename WT>
struct DenseTile {
  const WT* p;  // the tile's first chunk
  Vec load(int64_t c, int64_t j) const { return vload(p + c * kTileChunk + j * kLanes); }
  template <int Locality>
  void prefetch(int64_t c, int64_t j0, int64_t rows) const {
    constexpr int64_t kLine = 64 / static_cast<int64_t>(sizeof(WT));
    const WT* w = p + c * kTileChunk + j0 * kLanes + kAheadBytes / static_cast<int64_t>(sizeof(WT));
    for (int64_t l = 0; l < rows * kLanes; l += kLine) __builtin_prefetch(w + l, 0, Locality);
  }
};

template <QuantType Type>
struct QuantTile {
  static constexpr int64_t kBlockBytes = quant_tile_block_bytes(Type);
  const uint8_t* p;  // the tile's first block
  Vec load(int64_t c, int64_t j) const {
    const uint8_t* block = p + (c >> 1) * kBlockBytes;
    const uint8_t* q = block + quant_tile_quants(Type) + j * quant_row_quant_bytes(Type);
    if constexpr (Type == QuantType::q8_0) {
      return vmul(vload_i8(q + (c & 1) * kLanes), vbroadcast(quant_f32_at(block + 4 * j)));
    } else if constexpr (Type == QuantType::q4_0 || Type == QuantType::q4_1) {
      const Vec nibbles = (c & 1) ? vload_nibbles<true>(q) : vload_nibbles<false>(q);
      const float d = quant_f32_at(block + 4 * j);
      return vfma(nibbles, vbroadcast(d), vbroadcast(offset(block, j, d)));
    } else {  // 5 or 6 bits: the nibble and the high bits of the chunk's 16 weights
      const int64_t h = c & 1;
      const uint8_t* high = block + quant_tile_high(Type) + j * quant_row_high_bytes(Type);
      uint8_t values[kLanes];
      if constexpr (Type == QuantType::q6_k) {
        for (int64_t i = 0; i < kLanes; ++i)
          values[i] = static_cast<uint8_t>(((h ? q[i] >> 4 : q[i] & 0x0f)) | (((high[i % 8] >> (4 * h + 2 * (i / 8))) & 3) << 4));
        const float d = quant_f32_at(block + 8 * j + 4 * h);
        return vfma(vload_u8(values), vbroadcast(d), vbroadcast(-32.0f * d));
      } else {
        uint32_t bits;
        std::memcpy(&bits, high, 4);
        for (int64_t i = 0; i < kLanes; ++i)
          values[i] = static_cast<uint8_t>((h ? q[i] >> 4 : q[i] & 0x0f) | (((bits >> (16 * h + i)) & 1u) << 4));
        const float d = quant_f32_at(block + 4 * j);
        return vfma(vload_u8(values), vbroadcast(d), vbroadcast(offset(block, j, d)));
      }
    }
  }
  // m of tile row j: stored (q4_1, q5_1), or -8 d / -16 d (q4_0, q5_0; exact)
  static float offset(const uint8_t* block, int64_t j, float d) {
    if constexpr (quant_tile_has_m(Type)) return quant_f32_at(block + 16 + 4 * j);
    else return (Type == QuantType::q4_0 ? -8.0f : -16.0f) * d;
  }
  template <int Locality>
  void prefetch(int64_t c, int64_t, int64_t) const {
    if (c & 1) return;  // once per block
    const uint8_t* ahead = p + (c >> 1) * kBlockBytes + kAheadBytes;
    for (int64_t l = 0; l < kBlockBytes; l += 64) __builtin_prefetch(ahead + l, 0, Locality);
  }
};

// Up to kMaxGroup activation rows against the 4 rows of one packed tile;
// writes `cols` (<= 4) outputs per row. Per output the operation sequence is
// dot()'s: fused multiply-adds over 16-lane chunks in index order, the tail
// chunk with zero lanes, then vsum; how the block is cut into passes, and
// whether the weights were stored as fp32 or dequantised on the way, does not
// change it.
template <int64_t MR, typename Tile>
inline void tile_block(const float* x, int64_t ldx, const Tile& tile, int64_t k, float* out, int64_t ldo,
                       int64_t cols) {
  constexpr int64_t J = kColBlock<MR>;
  const int64_t full = k / kLanes;
  for (int64_t j0 = 0; j0 < cols; j0 += J) {
    Vec acc[MR][J];
    for (int64_t i = 0; i < MR; ++i)
      for (int64_t j = 0; j < J; ++j) acc[i][j] = vzero();
    for (int64_t c = 0; c < full; ++c) {
      // One activation row is bound by memory latency: pull the stream into
      // L1. With more rows the loop is busier and L2 is close enough.
      tile.template prefetch<MR == 1 ? 3 : 2>(c, j0, J);
      // From 3 rows a 16-lane block is bound by multiply-adds, not memory:
      // operands stay in registers (vpin) so that each is loaded once per
      // chunk. On AVX2 the registers are the accumulators'.
      Vec wv[J];
      for (int64_t j = 0; j < J; ++j) {
        wv[j] = tile.load(c, j0 + j);
        if constexpr (MR >= 3 && kVecRegs == 1) vpin(wv[j]);
      }
      for (int64_t i = 0; i < MR; ++i) {
        Vec xv = vload(x + i * ldx + c * kLanes);
        if constexpr (MR >= 3 && kVecRegs == 1) vpin(xv);
        for (int64_t j = 0; j < J; ++j) acc[i][j] = vfma(xv, wv[j], acc[i][j]);
      }
    }
    if (const int64_t rest = k - full * kLanes; rest > 0) {
      Vec wv[J];  // padded lanes are zero, as vload_tail would give
      for (int64_t j = 0; j < J; ++j) wv[j] = tile.load(full, j0 + j);
      for (int64_t i = 0; i < MR; ++i) {
        const Vec xv = vload_tail(x + i * ldx + full * kLanes, rest);
        for (int64_t j = 0; j < J; ++j) acc[i][j] = vfma(xv, wv[j], acc[i][j]);
      }
    }
    for (int64_t i = 0; i < MR; ++i)
      for (int64_t j = 0; j < std::min(J, cols - j0); ++j) out[i * ldo + j0 + j] = vsum(acc[i][j]);
  }
}

template <typename Tile>
void group_block(int64_t rows, const float* x, int64_t ldx, const Tile& tile, int64_t k, float* out, int64_t ldo,
                 int64_t cols) {
  switch (rows) {
    case 1: tile_block<1>(x, ldx, tile, k, out, ldo, cols); break;
    case 2: tile_block<2>(x, ldx, tile, k, out, ldo, cols); break;
    case 3: tile_block<3>(x, ldx, tile, k, out, ldo, cols); break;
    case 4: tile_block<std::min<int64_t>(4, kMaxGroup)>(x, ldx, tile, k, out, ldo, cols); break;
    case 5: tile_block<std::min<int64_t>(5, kMaxGroup)>(x, ldx, tile, k, out, ldo, cols); break;
    default: tile_block<kMaxGroup>(x, ldx, tile, k, out, ldo, cols); break;
  }
}

// y = x @ w^T (+ bias) over tiles; tile(t) is tile t's weights.
template <typename TileAt>
void tiled_linear(const float* x, int64_t ldx, TileAt tile, const float* bias, float* y, int64_t ldy, int64_t m,
                  int64_t n, int64_t k, ThreadPool& pool) {
  for_each_group(m, n, kMaxGroup, bias, y, ldy, pool, [&](int64_t i, int64_t rows, int64_t t, int64_t cols) {
    group_block(rows, x + i * ldx, ldx, tile(t), k, y + i * ldy + t * kTileRows, ldy, cols);
  });
}

template <QuantType Type>
void quant_linear(const float* x, int64_t ldx, const uint8_t* wp, const float* bias, float* y, int64_t ldy,
                  int64_t m, int64_t n, int64_t k, ThreadPool& pool) {
  const int64_t tile_bytes = k / kQuantBlock * quant_tile_block_bytes(Type);
  tiled_linear(x, ldx, [&](int64_t t) { return QuantTile<Type>{wp + t * tile_bytes}; }, bias, y, ldy, m, n, k, pool);
}

}  // namespace

template <typename WT>
void linear(const float* x, int64_t ldx, const WT* wp, const float* bias, float* y, int64_t ldy,
            int64_t m, int64_t n, int64_t k, ThreadPool& pool) {
  const int64_t tile_elems = ceil_div(k, kLanes) * kTileChunk;
  tiled_linear(x, ldx, [&](int64_t t) { return DenseTile<WT>{wp + t * tile_elems}; }, bias, y, ldy, m, n, k, pool);
}

void linear_quant(QuantType type, const float* x, int64_t ldx, const uint8_t* wp, const float* bias, float* y,
                  int64_t ldy, int64_t m, int64_t n, int64_t k, ThreadPool& pool) {
  on_tile_type(type, [&](auto t) { quant_linear<decltype(t)::value>(x, ldx, wp, bias, y, ldy, m, n, k, pool); });
}

template void linear<float>(const float*, int64_t, const float*, const float*, float*, int64_t, int64_t, int64_t,
                            int64_t, ThreadPool&);
template void linear<uint16_t>(const float*, int64_t, const uint16_t*, const float*, float*, int64_t, int64_t,
                               int64_t, int64_t, ThreadPool&);
template void linear<Fp16>(const float*, int64_t, const Fp16*, const float*, float*, int64_t, int64_t, int64_t,
                           int64_t, ThreadPool&);

}  // namespace ssd::kernels::SSD_ISA
