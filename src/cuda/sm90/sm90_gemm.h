// The Hopper grouped GEMM (sm_90a): persistent, warp-specialized, TMA + wgmma.
//
//   D[rows of e] = epilogue(A[rows of e] · B[e]^T)      rows of e = [m_indptr[e], m_indptr[e+1])
//
// One CTA per SM. Warp roles (one if/else, registers rebalanced with setmaxnreg):
//   warpgroup 0: warp 0 = TMA producer (A and B tiles into a multi-stage mbarrier ring),
//                warp 1 = tile scheduler (finds the CTA's next (expert, row block, column
//                block) and hands it to the others through a shared-memory ring)
//   warpgroups 1..: wgmma consumers, 64 rows each; fp8 block scales promoted per 128-wide K
//                block in registers (MX-FP8: per 32-wide K step); the epilogue (act(gate)*up for
//                gated tiles, optional fp8 group-128 quantization) in registers, stores bounded by
//                the expert's rows (a 16-bit plain out of a 128-row tile leaves through TMA
//                stores where a warp's 16 rows all lie in the expert).
// Rows: TMA boxes have a fixed size, so the last row block of an expert also loads up to BM-1
// rows past the expert's end (the next expert's rows, or zeros past the tensor: never memory
// outside `a`); those rows' products are discarded: nothing past m_indptr[e+1] is written.
// The host never reads m_indptr. Gated tiles load B as two boxes, the gate rows of the tile's
// output columns then the matching up rows (one 4-D tensor map per layout); each consumer runs
// one wgmma per half, so a thread's accumulators hold matching gate and up columns.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <vector>

#include "modmoe/activation.h"
#include "modmoe/dtype.h"
#include "modmoe/moe_gemm.h"

namespace modmoe::cuda::sm90 {

// One work tile as the scheduler hands it out (also the precomputed list's element).
struct WorkTile {
  int32_t expert;     // -1: no more work
  int32_t row_begin;  // first row of the tile
  int32_t row_end;    // one past the expert's last row (stores stop there)
  int32_t n_block;    // column block: B rows [n_block * BN, ...) (gated: of each half)
};

struct GemmArgs {
  // a (total_rows, K) row-major; b (E, N_b, K) row-major ("K-major" both). bf16 or fp8_e4m3.
  const void* a = nullptr;
  int64_t total_rows = 0;
  const void* b = nullptr;
  int64_t E = 0, N_b = 0, K = 0;
  DType ab_dtype = DType::bf16;
  const int32_t* m_indptr = nullptr;  // (E + 1), device
  // Batched instead (internal callers): a is (E * batch_rows, K), expert e owns rows
  // e * batch_rows + [0, expert_num_tokens[e]) (device counts, clamped to batch_rows).
  const int32_t* expert_num_tokens = nullptr;
  int64_t batch_rows = 0;

  // fp8 block scales (1x128 for a, 128x128 for b), fp32, with kb = ceil(K/128) groups along K
  // (the last one partial when K % 128 != 0). K-major: a_scale (rows, kb), b_scale
  // (E, ceil(N_b/128), kb); MN-major: a_scale (kb, rows), b_scale (E, kb, ceil(N_b/128)).
  const float* a_scale = nullptr;
  const float* b_scale = nullptr;
  bool scales_mn_major = false;
  // MX-FP8 instead of block scales (fp8 a and b only): E8M0 scales (one byte: 2^(v - 127)) per 32
  // elements along K, K-major: a_scale_mx (rows, K/32), b_scale_mx (E, N_b, K/32). The kernel
  // promotes every 32-wide K step (one wgmma) with a per-row times per-column scale.
  bool mx = false;
  const uint8_t* a_scale_mx = nullptr;
  const uint8_t* b_scale_mx = nullptr;

  bool gated = false;
  GatedLayout gated_layout = GatedLayout::GateUp;
  Activation activation = Activation::silu;

  void* d = nullptr;            // (total_rows, N_out), ldd = N_out
  DType d_dtype = DType::bf16;  // bf16, fp16, fp32, or fp8_e4m3 (gated only, with d_scale)
  float* d_scale = nullptr;     // fp8 d: (total_rows, ceil(N_out/128)), last group partial

  // Top-k weight and reduce folded into the epilogue (plain, fp32 d only; non-deterministic:
  // fp32 atomics): instead of storing row r, add pair_weight[p] * row into d[p / topk] with
  // p = row_pair[r] (weight 1 when pair_weight is null). d is then (tokens, N_out) fp32 and the
  // caller zeroes it first.
  const int32_t* row_pair = nullptr;
  const float* pair_weight = nullptr;
  int64_t topk = 1;

  MoeGemmScheduler scheduler = MoeGemmScheduler::cooperative;
  // Precomputed scheduler: the tile list (built by build_tile_list for the same arguments and
  // tile). When null, launch() builds one in `scratch`.
  const WorkTile* tile_list = nullptr;
  // A programmatic dependent launch of the stream's previous kernel (programmatic_launch.cuh;
  // sm_90, and not with MODMOE_PDL=0): the kernel may start while that kernel finishes. Before
  // it waits for it, it reads m_indptr or expert_num_tokens (or tile_list), b and b_scale, and
  // requests its first tile's weight stages; a, a_scale, row_pair, pair_weight and d only
  // after. So the former must have been written before the previous kernel began (Sm90Experts:
  // the permute runs before the gather, and so before GEMM1). Ignored (a normal launch) when
  // launch() builds a tile list itself.
  bool programmatic = false;
  std::string tile;  // "" = choose_tile()
  int sm_count = 0;  // CTAs of the persistent grid (0: the device's SM count)

  int64_t n_out() const { return gated ? N_b / 2 : N_b; }
};

// "BMxBN" names of the compiled tiles.
std::vector<std::string> tile_names();
// Whether tile `name` is built for `ab_dtype` and runs gated (else plain) GEMMs: every tile but
// 144x256, the bf16 swapped-operands tile, which runs plain bf16 GEMMs only. (A tile that runs
// them may still refuse a call: fp8 block-scale or MX fits, an fp8 out, a folded reduce.)
bool tile_runs(const std::string& name, DType ab_dtype, bool gated);

// The heuristic: a pure function of the sizes (m_indptr is never read).
std::string choose_tile(int64_t total_rows, int64_t N_out, int64_t K, int64_t E, bool gated,
                        DType dtype, bool fp8_out, int sm_count);

// The tile launch() runs: args.tile when given, else choose_tile()'s pick (its pick among the
// other tiles when that is 144x256 and the call has a folded reduce), stepped down (in
// the order 128x256, 128x128, 64x256, 64x128, 64x64; an fp8 out keeps a 256-wide tile) to the
// first tile that takes the call: not the 256-wide tiles (128x256, 64x256) for MX-FP8, and for
// fp8 block scales a tile whose weight-scale parts (B rows that share one scale in the kernel)
// each lie in one 128-row weight-scale block (gated GateUp/UpGate: N % s == 0, with s = 64 for
// the 256-wide tiles (their 128-row halves read a scale per 64 rows) and 128x128, 32 for 64x128,
// 16 for 64x64; Interleaved: every tile). When none does, the last one tried, which
// can_implement then refuses with what it needs.
std::string resolve_tile(const GemmArgs& args);

// Why the kernel cannot run these arguments ("" when it can): alignment, dtypes, tile, ...
std::string can_implement(const GemmArgs& args);

// Whether this build has the kernels and `device` is compute capability 9.0.
bool available(int device);

// Elements a precomputed tile list needs for these arguments (an upper bound + the end marker).
int64_t tile_list_capacity(const GemmArgs& args);
// Writes the tile list (in the order the persistent CTAs take tiles) into `list`.
void build_tile_list(const GemmArgs& args, WorkTile* list, cudaStream_t stream);

// Launches on `stream` (checks can_implement first and throws modmoe::Error with its reason).
// `scratch` (tile_list_capacity * sizeof(WorkTile) bytes) is needed only for the precomputed
// scheduler without a given list.
void launch(const GemmArgs& args, cudaStream_t stream, void* scratch = nullptr);

}  // namespace modmoe::cuda::sm90
