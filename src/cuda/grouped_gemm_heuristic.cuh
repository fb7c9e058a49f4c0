// Tile choice of the portable grouped GEMM: a pure host function of the problem, printable
// and testable without a GPU (no device code in this header: the tests include it too).
#pragma once

#include <algorithm>
#include <cstdint>

namespace modmoe::cuda::gemm {

// The two CTA tiles the kernel is built for (rows x B rows, 128 bytes of K per stage).
//   k64x128: prefill. bf16/fp16: 4 warps as 2 x 2 (32 x 64 warp tiles); fp8: 8 warps as
//            2 x 4 (32 x 32, room for the block/MX partial accumulators); 4 stages of 24 KiB.
//   k16x64:  decode (a few rows per expert): a 64-row tile would spend most of its MMAs on
//            zero rows, and small tiles give more CTAs to stream the weights with. 4 warps
//            side by side along N (16 x 16 each); 4 stages of 10 KiB.
enum class GemmTile { k64x128, k16x64 };

inline const char* gemm_tile_name(GemmTile tile) {
  return tile == GemmTile::k64x128 ? "64x128" : "16x64";
}

// Rows a non-empty expert is expected to own: the rows spread over the experts that can
// receive any (at most one expert per row). In batched mode no expert owns more than
// batch_rows. Only an estimate (the counts live on the device); it picks the tile, never
// affects results.
inline int64_t expected_rows_per_expert(int64_t max_rows, int64_t E, bool batched,
                                        int64_t batch_rows) {
  if (batched && max_rows <= 0) return batch_rows;
  if (max_rows <= 0 || E <= 0) return 0;
  const int64_t busy_experts = std::min(E, max_rows);
  const int64_t rows = (max_rows + busy_experts - 1) / busy_experts;
  return batched ? std::min(rows, batch_rows) : rows;
}

// Up to 32 rows per expert the 16-row tile wastes at most half a 64-row tile's work on rows
// that do not exist, and decode-sized problems are bound by weight streaming, not MMAs.
inline GemmTile choose_gemm_tile(int64_t max_rows, int64_t E, bool batched, int64_t batch_rows) {
  return expected_rows_per_expert(max_rows, E, batched, batch_rows) <= 32 ? GemmTile::k16x64
                                                                          : GemmTile::k64x128;
}

}  // namespace modmoe::cuda::gemm
