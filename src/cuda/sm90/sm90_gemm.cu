// Host side of the Hopper grouped GEMM (sm90_gemm.h): argument checks, the tile heuristic,
// tensor maps, the precomputed tile list, and the launch.
#include <cuda.h>
#include <cudaTypedefs.h>  // PFN_cuTensorMapEncodeTiled
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <mutex>
#include <sstream>

#include "cuda/cuda_check.h"
#include "cuda/programmatic_launch.cuh"
#include "cuda/sm90/sm90_gemm.h"
#include "cuda/sm90/sm90_gemm_kernel.cuh"
#include "modmoe/error.h"

namespace modmoe::cuda::sm90 {

namespace {

// The compiled tiles. fp8 keeps two accumulator sets per thread (the running sum and one K
// block's product): the 256-wide fp8 tiles (a consumer of 64 rows x 256 columns: 128x256 split
// M, 64x256 ping-pong) promote one half of their accumulators at a time and take no MX scales.
// With block scales a tile must also keep each accumulator half inside one 128-row
// weight-scale block (fp8_block_misfit). The consumer shapes follow from bm and bn
// (consumer_holds_whole_rows, sm90_gemm_kernel.cuh). The last, 144x256, swaps the operands
// (is_swapped_tile): bf16 plain GEMMs only (swapped_misfit), and only the heuristic's own pick or
// a caller's: no other tile steps down to it (resolve_tile).
struct TileEntry {
  const char* name;
  int bm, bn;
  bool bf16, fp8;
};
constexpr TileEntry kTiles[] = {
    {"128x256", 128, 256, true, true}, {"128x128", 128, 128, true, true},
    {"64x256", 64, 256, true, true},   {"64x128", 64, 128, true, true},
    {"64x64", 64, 64, true, true},     {"144x256", 144, 256, true, false},
};

const TileEntry* find_tile(const std::string& name) {
  for (const TileEntry& t : kTiles)
    if (name == t.name) return &t;
  return nullptr;
}

std::string known_tiles(DType dtype) {
  std::string s;
  for (const TileEntry& t : kTiles) {
    if (dtype == DType::fp8_e4m3 ? !t.fp8 : !t.bf16) continue;
    s += s.empty() ? "" : ", ";
    s += t.name;
  }
  return s;
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// ---- tensor maps ------------------------------------------------------------------------------

PFN_cuTensorMapEncodeTiled_v12000 encode_function() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = nullptr;
  static std::once_flag once;
  std::call_once(once, [] {
    void* ptr = nullptr;
    cudaDriverEntryPointQueryResult status;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &ptr, 12000, cudaEnableDefault,
                                         &status) == cudaSuccess &&
        status == cudaDriverEntryPointSuccess)
      fn = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(ptr);
  });
  MODMOE_CHECK(fn != nullptr) << "moe_gemm (sm90): the driver has no cuTensorMapEncodeTiled";
  return fn;
}

// A tiled map over `rank` dims (dims[0] contiguous), 128-byte swizzle, zeros out of bounds.
CUtensorMap make_map(const void* base, DType dtype, int rank, const cuuint64_t* dims,
                     const cuuint64_t* strides_bytes, const cuuint32_t* box, const char* what) {
  CUtensorMap map;
  cuuint32_t element_strides[5] = {1, 1, 1, 1, 1};
  const CUtensorMapDataType type = dtype == DType::bf16   ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                   : dtype == DType::fp16 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16
                                                          : CU_TENSOR_MAP_DATA_TYPE_UINT8;
  const CUresult r =
      encode_function()(&map, type, rank, const_cast<void*>(base), dims, strides_bytes, box,
                        element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                        CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  MODMOE_CHECK(r == CUDA_SUCCESS) << "moe_gemm (sm90): cuTensorMapEncodeTiled failed for " << what
                                  << " (CUresult " << static_cast<int>(r) << ")";
  return map;
}

struct Maps {
  CUtensorMap a, b, d;  // d: only for TMA stores (else a copy of b, never read)
};

// Whether the epilogue stores through TMA (KernelParams::tma_store): a plain 16-bit out on a
// tile with the staging (stages_tma_stores, sm90_gemm_kernel.cuh), rows a multiple of 16 bytes
// (TMA's pitch), no folded reduce.
bool uses_tma_store(const GemmArgs& g, const TileEntry& tile) {
  return !g.gated && g.row_pair == nullptr &&
         (g.d_dtype == DType::bf16 || g.d_dtype == DType::fp16) && g.n_out() % 8 == 0 &&
         stages_tma_stores(tile.bm);
}

Maps make_maps(const GemmArgs& g, const TileEntry& tile) {
  const int64_t es = dtype_size(g.ab_dtype);
  const cuuint32_t bk = static_cast<cuuint32_t>(128 / es);  // 128 bytes of K per stage
  Maps m;
  {
    const cuuint64_t dims[2] = {cuuint64_t(g.K), cuuint64_t(g.total_rows)};
    const cuuint64_t strides[1] = {cuuint64_t(g.K * es)};
    const cuuint32_t box[2] = {bk, cuuint32_t(tile.bm)};
    m.a = make_map(g.a, g.ab_dtype, 2, dims, strides, box, "a");
  }
  const cuuint64_t row = g.K * es;
  if (!g.gated) {
    const cuuint64_t dims[3] = {cuuint64_t(g.K), cuuint64_t(g.N_b), cuuint64_t(g.E)};
    const cuuint64_t strides[2] = {row, row * g.N_b};
    const cuuint32_t box[3] = {bk, cuuint32_t(tile.bn), 1};
    m.b = make_map(g.b, g.ab_dtype, 3, dims, strides, box, "b");
  } else {
    // (K, half, N, E): one box is BN/2 rows of one half (gate or up) for the tile's output
    // columns; the kernel loads the gate box, then the up box. The layouts differ in strides.
    const int64_t N = g.N_b / 2;
    const bool interleaved = g.gated_layout == GatedLayout::Interleaved;
    const cuuint64_t dims[4] = {cuuint64_t(g.K), 2, cuuint64_t(N), cuuint64_t(g.E)};
    const cuuint64_t strides[3] = {interleaved ? row : row * N, interleaved ? 2 * row : row,
                                   row * g.N_b};
    const cuuint32_t box[4] = {bk, 1, cuuint32_t(tile.bn / 2), 1};
    m.b = make_map(g.b, g.ab_dtype, 4, dims, strides, box, "b (gated)");
  }
  m.d = m.b;
  if (uses_tma_store(g, tile)) {
    // One 16-row x 64-column piece per store (a consumer warp's rows), 128-byte swizzle.
    const cuuint64_t dims[2] = {cuuint64_t(g.n_out()), cuuint64_t(g.total_rows)};
    const cuuint64_t strides[1] = {cuuint64_t(g.n_out() * dtype_size(g.d_dtype))};
    const cuuint32_t box[2] = {64, 16};
    m.d = make_map(g.d, g.d_dtype, 2, dims, strides, box, "out");
  }
  return m;
}

// ---- the tile list ------------------------------------------------------------------------

__global__ void build_tile_list_kernel(ScheduleParams p, int32_t bm, WorkTile* list) {
  const int32_t E = p.E, n_blocks = p.n_blocks;
  __shared__ int32_t warp_sums[32];
  __shared__ int32_t running;
  if (threadIdx.x == 0) running = 0;
  __syncthreads();
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  for (int32_t base = 0; base < E; base += blockDim.x) {
    const int32_t e = base + threadIdx.x;
    int32_t begin = 0, end = 0;
    if (e < E) expert_rows(p, e, begin, end);
    const int32_t m_blocks = end > begin ? (end - begin + bm - 1) / bm : 0;
    const int32_t tiles = m_blocks * n_blocks;
    // Block-wide exclusive scan of `tiles`: within warps, then over the warp sums.
    int32_t inclusive = tiles;
    for (int offset = 1; offset < 32; offset *= 2) {
      const int32_t below = __shfl_up_sync(0xffffffffu, inclusive, offset);
      if (lane >= offset) inclusive += below;
    }
    if (lane == 31) warp_sums[warp] = inclusive;
    __syncthreads();
    if (warp == 0) {
      const int32_t v = lane < blockDim.x / 32 ? warp_sums[lane] : 0;
      int32_t incl = v;
      for (int offset = 1; offset < 32; offset *= 2) {
        const int32_t below = __shfl_up_sync(0xffffffffu, incl, offset);
        if (lane >= offset) incl += below;
      }
      warp_sums[lane] = incl - v;  // exclusive prefix of the warp sums
    }
    __syncthreads();
    const int32_t first = running + warp_sums[warp] + inclusive - tiles;
    for (int32_t i = 0; i < tiles; ++i)
      list[1 + first + i] = WorkTile{e, begin + (i % m_blocks) * bm, end, i / m_blocks};
    __syncthreads();
    if (threadIdx.x == blockDim.x - 1) running = first + tiles;
    __syncthreads();
  }
  if (threadIdx.x == 0) list[0] = WorkTile{running, 0, 0, 0};
}

// ---- launch -------------------------------------------------------------------------------

// The persistent grid and how it is launched.
struct LaunchShape {
  int grid;           // CTAs (one per SM)
  bool programmatic;  // a programmatic dependent of the stream's previous kernel
  cudaStream_t stream;
};

template <int BM, int BN, bool kFp8, bool kSplitScales = false>
void launch_config(const Maps& maps, const KernelParams& params, const LaunchShape& shape) {
  using C = TileConfig<BM, BN, kFp8, kSplitScales>;
  auto* kernel = &grouped_gemm_kernel<C>;
  // The opt-in shared-memory size is a per-function attribute (once per process is enough,
  // but it is cheap and stays correct when several devices are used).
  MODMOE_CUDA_CHECK(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, C::kSmemBytes));
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(static_cast<unsigned>(shape.grid));
  config.blockDim = dim3(C::kThreads);
  config.dynamicSmemBytes = C::kSmemBytes;
  config.stream = shape.stream;
  cudaLaunchAttribute attribute;
  set_programmatic(config, attribute, shape.programmatic);
  MODMOE_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, maps.a, maps.b, maps.d, params));
}

void dispatch(const TileEntry& tile, bool fp8, bool split_scales, const Maps& maps,
              const KernelParams& params, const LaunchShape& shape) {
  const std::string name = tile.name;
  if (fp8) {
    if (name == "128x256" && split_scales)
      return launch_config<128, 256, true, true>(maps, params, shape);
    if (name == "128x256") return launch_config<128, 256, true>(maps, params, shape);
    if (name == "128x128") return launch_config<128, 128, true>(maps, params, shape);
    if (name == "64x256" && split_scales)
      return launch_config<64, 256, true, true>(maps, params, shape);
    if (name == "64x256") return launch_config<64, 256, true>(maps, params, shape);
    if (name == "64x128") return launch_config<64, 128, true>(maps, params, shape);
    if (name == "64x64") return launch_config<64, 64, true>(maps, params, shape);
  } else {
    if (name == "128x256") return launch_config<128, 256, false>(maps, params, shape);
    if (name == "128x128") return launch_config<128, 128, false>(maps, params, shape);
    if (name == "64x256") return launch_config<64, 256, false>(maps, params, shape);
    if (name == "64x128") return launch_config<64, 128, false>(maps, params, shape);
    if (name == "64x64") return launch_config<64, 64, false>(maps, params, shape);
    if (name == "144x256") return launch_config<144, 256, false>(maps, params, shape);
  }
  MODMOE_FAIL() << "moe_gemm (sm90): no kernel for tile " << name;
}

int device_sm_count() {
  int device = 0, sms = 0;
  MODMOE_CUDA_CHECK(cudaGetDevice(&device));
  MODMOE_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  return sms;
}

// B rows of one consumer's accumulator half (kWgN / 2 in the kernel's TileConfig).
constexpr int half_rows(const TileEntry& t) {
  return (consumer_holds_whole_rows(t.bm, t.bn) ? t.bn : t.bn / 2) / 2;
}

// B rows (Interleaved: outputs) of a half that share one fp8 weight scale in the kernel: a whole
// half, except the 128-row halves of the 256-wide tiles, whose two 64-row parts each read their
// own (ScaleCursor::b_mid in sm90_gemm_kernel.cuh).
constexpr int scale_rows(const TileEntry& t) { return half_rows(t) == 128 ? 64 : half_rows(t); }

constexpr bool every_scale_part_divides_a_scale_block() {
  for (const TileEntry& t : kTiles)
    if (128 % scale_rows(t) != 0 || 2 * scale_rows(t) > 128) return false;
  return true;
}
static_assert(
    every_scale_part_divides_a_scale_block(),
    "fp8_block_misfit assumes a half's scale parts divide the 128-row weight-scale block");

// MX keeps 32 scale words per accumulator half: no room beside a 256-column consumer's.
bool is_wide_fp8_mx_tile(const GemmArgs& g, const TileEntry& t) {
  return g.ab_dtype == DType::fp8_e4m3 && g.mx && half_rows(t) == 128;
}

// Why `t` cannot apply fp8 block scales to this call ("" when it can). The kernel reads one
// weight scale per part of s = scale_rows(t) B rows of an accumulator half and per K block
// (ScaleCursor), so the real B rows of every part must lie in one 128-row scale block of b
// (E, N_b, K); s divides 128. Plain: a part starts at a multiple of s, so it always fits (any
// N_b). Gated GateUp/UpGate: the gate parts start at out0 and the up parts at N + out0 (or the
// reverse), out0 a multiple of s, so all fit iff N % s == 0. Interleaved: a part's s outputs
// are rows 2*out0 .. 2*out0 + 2s - 1 with 2*out0 a multiple of 2s: 2s <= 128 always holds
// (static_assert above).
std::string fp8_block_misfit(const GemmArgs& g, const TileEntry& t) {
  if (g.ab_dtype != DType::fp8_e4m3 || g.mx || !g.gated ||
      g.gated_layout == GatedLayout::Interleaved)
    return "";
  const int s = scale_rows(t);
  std::ostringstream why;
  if ((g.N_b / 2) % s != 0) {
    why << "it reads one weight scale per " << s
        << " gate or up rows of b, and with N = b.size(1)/2 = " << g.N_b / 2
        << " (not a multiple of " << s
        << ") some of those rows straddle two 128-row weight-scale blocks (fp8 block scales "
           "need N % "
        << s << " == 0 for this tile)";
  }
  return why.str();
}

// Whether the tile's accumulator halves read two weight scales each (the kSplitScales kernel):
// fp8 block scales on a 256-wide tile (128x256, 64x256), gated, where a half's 128 rows may
// start inside a scale block (GateUp/UpGate with N % 128 != 0; Interleaved, whose halves span
// 256 rows of b, always).
bool splits_scales(const GemmArgs& g, const TileEntry& t) {
  return g.ab_dtype == DType::fp8_e4m3 && !g.mx && g.gated && half_rows(t) == 128 &&
         (g.gated_layout == GatedLayout::Interleaved || (g.N_b / 2) % 128 != 0);
}

// Why the swapped tile `t` cannot run this call ("" when it can, or t is not swapped): its
// consumer (consume_swapped) has no gated epilogue, fp8 out or folded reduce. (Its dtype, bf16,
// is the tile entry's.)
std::string swapped_misfit(const GemmArgs& g, const TileEntry& t) {
  if (!is_swapped_tile(t.bm)) return "";
  if (g.gated) return "it runs plain GEMMs only, got a gated one";
  if (g.d_dtype == DType::fp8_e4m3) return "it writes no fp8 out";
  if (g.row_pair != nullptr) return "it has no folded top-k reduce";
  return "";
}

bool tile_takes(const GemmArgs& g, const TileEntry& t) {
  return !is_wide_fp8_mx_tile(g, t) && fp8_block_misfit(g, t).empty() &&
         swapped_misfit(g, t).empty() && (g.ab_dtype == DType::fp8_e4m3 ? t.fp8 : t.bf16);
}

std::string choose_tile_among(int64_t total_rows, int64_t N_out, int64_t K, int64_t E, bool gated,
                              DType dtype, bool fp8_out, int sm_count, bool may_swap);

// A developer's override of the heuristic, read at each call: the tile gated (plain) GEMMs
// without args.tile start from, instead of choose_tile's. For tile studies on one binary
// (`scripts/gpu-ab env`, docs/hopper.md "Tile heuristic"); the heuristic's tiles are the
// measured default. A name that is no tile fails here, loudly: a refusal would send
// `automatic` callers to the portable kernel and a study would time the wrong kernel.
std::string tile_override(const GemmArgs& g) {
  const char* variable = g.gated ? "MODMOE_SM90_TILE_GATED" : "MODMOE_SM90_TILE_PLAIN";
  const char* value = std::getenv(variable);
  if (value == nullptr || *value == 0) return "";
  MODMOE_CHECK(find_tile(value) != nullptr)
      << variable << " must name one of the Hopper kernel's tiles (" << known_tiles(g.ab_dtype)
      << "), got \"" << value << "\"";
  return value;
}

}  // namespace

std::string resolve_tile(const GemmArgs& g) {
  if (!g.tile.empty()) return g.tile;
  const bool fp8_out = g.d_dtype == DType::fp8_e4m3;
  std::string tile = tile_override(g);
  if (tile.empty()) {
    const int sm_count = g.sm_count > 0 ? g.sm_count : device_sm_count();
    tile = choose_tile(g.total_rows, g.n_out(), g.K, g.E, g.gated, g.ab_dtype, fp8_out, sm_count);
    // The swapped tile where it cannot run this call (a folded reduce): the heuristic's pick
    // among the others.
    if (is_swapped_tile(find_tile(tile)->bm) && !tile_takes(g, *find_tile(tile)))
      tile = choose_tile_among(g.total_rows, g.n_out(), g.K, g.E, g.gated, g.ab_dtype, fp8_out,
                               sm_count, /*may_swap=*/false);
  }
  // Step down, in kTiles order, to the first tile that takes the call (an fp8 out keeps a
  // 256-wide tile: one quantization group per tile row; none steps down to the swapped tile,
  // which takes fewer calls than those before it). None: the last one tried, the least
  // demanding, whose refusal by can_implement then states the weakest requirement.
  bool after = false;
  const char* last = nullptr;
  for (const TileEntry& t : kTiles) {
    after = after || tile == t.name;
    if (!after || (fp8_out && t.bn != 256) || (is_swapped_tile(t.bm) && tile != t.name)) continue;
    if (tile_takes(g, t)) return t.name;
    last = t.name;
  }
  return last ? last : tile;
}

std::vector<std::string> tile_names() {
#ifdef MODMOE_HAVE_SM90A
  std::vector<std::string> names;
  for (const TileEntry& t : kTiles) names.push_back(t.name);
  return names;
#else
  return {};
#endif
}

bool tile_runs(const std::string& name, DType ab_dtype, bool gated) {
  const TileEntry* t = find_tile(name);
  return t != nullptr && (ab_dtype == DType::fp8_e4m3 ? t->fp8 : t->bf16) &&
         !(gated && is_swapped_tile(t->bm));
}

bool available(int device) {
#ifdef MODMOE_HAVE_SM90A
  int major = 0, minor = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess)
    return false;
  return major == 9 && minor == 0;
#else
  (void)device;
  return false;
#endif
}

std::string choose_tile(int64_t total_rows, int64_t N_out, int64_t K, int64_t E, bool gated,
                        DType dtype, bool fp8_out, int sm_count) {
  return choose_tile_among(total_rows, N_out, K, E, gated, dtype, fp8_out, sm_count,
                           /*may_swap=*/true);
}

namespace {

std::string choose_tile_among(int64_t total_rows, int64_t N_out, int64_t K, int64_t E, bool gated,
                              DType dtype, bool fp8_out, int sm_count, bool may_swap) {
  // One rule for bf16 and fp8 (fp8 has a 128x256 tile too), but for bf16's few waves below.
  const int64_t N_b = gated ? 2 * N_out : N_out;
  // Rows a busy expert is expected to own (the counts are on the device).
  const int64_t busy = std::max<int64_t>(1, std::min(E, total_rows));
  const int64_t rows_per_expert = ceil_div(std::max<int64_t>(total_rows, 1), busy);
  const auto tiles_of = [&](int bm, int bn) {
    return busy * ceil_div(rows_per_expert, bm) * ceil_div(N_b, bn);
  };
  // An fp8 gated output needs all 128 columns of a quantization group in one tile.
  if (fp8_out) return rows_per_expert > 64 ? "128x256" : "64x256";
  if (rows_per_expert <= 64) {
    // Decode-like: weight streaming dominates; narrower tiles until every SM has one.
    if (tiles_of(64, 256) >= 2 * sm_count) return "64x256";
    return tiles_of(64, 128) >= sm_count ? "64x128" : "64x64";
  }
  if (tiles_of(128, 256) < sm_count) return "128x128";
  // bf16 gated: the ping-pong tile, whose consumers take turns, so one's activation epilogue
  // runs under the other's main loop (128x256 runs both main loops together, then both
  // epilogues, the tensor cores idle). A bf16 main loop keeps the tensor cores busy with one
  // consumer; an fp8 one does not (two waits and promotions per K block: fp8 keeps 128x256,
  // 4-17 % faster there). Measured against 128x256 at M = 1024 / 8192 (H200, docs/perf.md
  // nineteenth session §2, two calls): Mixtral 0.95-0.99 / 0.975-1.01, Qwen3.5 0.97, Qwen3
  // 0.985, DeepSeek-V3 0.985-0.99 (M = 8192), gpt-oss within its spread.
  if (dtype == DType::bf16 && gated) return "64x256";
  // Few long plain tiles (bf16): the last wave decides. Around a multiple of 128 rows per expert
  // half the experts need one more 128-row block than the mean suggests (Mixtral M = 1024's GEMM2:
  // 8 x 2.5 x 16 = ~320 tiles, 2.4 waves on 132 SMs, the last 40 % full), and 64-row tiles fill
  // the waves better: 416 against 452-478 us there (docs/perf.md, eighteenth session §7). Cost
  // = waves x tile area, with each expert's blocks averaged over its rows +- one binomial sigma;
  // only while 128x256 takes <= 4 waves (with more the last one matters little; a plain 64x256
  // GEMM ran up to 12 % slower at M = 8192, gpt-oss's GEMM2: nineteenth session §2).
  if (dtype == DType::bf16) {
    const double mean = static_cast<double>(total_rows) / static_cast<double>(busy);
    const double p = 1.0 / static_cast<double>(std::max<int64_t>(E, 1));
    const double sigma = std::sqrt(static_cast<double>(total_rows) * p * (1.0 - p));
    const auto expected_tiles = [&](int bm, int bn) {
      double blocks = 0;
      for (const auto& [rows, weight] :
           {std::pair{mean - sigma, 0.25}, std::pair{mean, 0.5}, std::pair{mean + sigma, 0.25}})
        blocks += weight * std::ceil(std::max(rows, 1.0) / bm);
      return static_cast<double>(busy) * blocks * static_cast<double>(ceil_div(N_b, bn));
    };
    const auto waves = [&](int bm, int bn) { return std::ceil(expected_tiles(bm, bn) / sm_count); };
    if (waves(128, 256) <= 4) {
      // The swapped 144x256 tile (consume_swapped) in the same model, where its main loop is
      // long enough (K >= 4096: 64 K blocks) for its scattered 2-byte stores not to matter: it
      // covers an expert of up to 144 (288) rows with one (two) tiles where 64-row tiles take
      // three (five). Mixtral M = 1024's GEMM2 (~256 rows per expert, K = 14336): 2 waves x 144
      // against 5 x 64 and 3 x 128, and 361-373 us against 416 (64x256) and 452-478 (128x256)
      // measured (H200, docs/perf.md eighteenth session §7); where experts are many and K short
      // it lost 12-70 % there, calls this rule does not reach (more than 4 waves, or K < 4096).
      const double cost_64 = waves(64, 256) * 64, cost_128 = waves(128, 256) * 128;
      if (may_swap && K >= 4096 && waves(144, 256) * 144 < std::min(cost_64, cost_128))
        return "144x256";
      if (cost_64 < cost_128) return "64x256";
    }
  }
  return "128x256";
}

}  // namespace

std::string can_implement(const GemmArgs& g) {
  std::ostringstream why;
  const std::string name = resolve_tile(g);
  const TileEntry* tile = find_tile(name);
  const bool fp8 = g.ab_dtype == DType::fp8_e4m3;
  if (!tile) {
    why << "tile \"" << name << "\" is not one of the Hopper kernel's tiles ("
        << known_tiles(g.ab_dtype) << ")";
  } else if (g.ab_dtype != DType::bf16 && !fp8) {
    why << "a and b must be bf16 or fp8_e4m3, got " << dtype_name(g.ab_dtype);
  } else if (fp8 ? !tile->fp8 : !tile->bf16) {
    why << "tile " << name << " is not built for " << dtype_name(g.ab_dtype)
        << " (tiles: " << known_tiles(g.ab_dtype) << ")";
  } else if ((g.K * dtype_size(g.ab_dtype)) % 16 != 0 || g.K <= 0) {
    why << "K * element size must be a positive multiple of 16 bytes (TMA row pitch), got K = "
        << g.K;
  } else if (g.mx && (!fp8 || g.d_dtype == DType::fp8_e4m3 || g.row_pair != nullptr)) {
    why << "MX-FP8 scales need fp8_e4m3 a and b and a bf16, fp16 or fp32 out, with no folded "
           "reduce";
  } else if (g.mx && g.K % 128 != 0) {
    why << "K must be a multiple of 128 for MX-FP8 in the Hopper kernel (a K block reads one "
           "4-byte word of each scale row), got "
        << g.K;
  } else if (g.mx && ((reinterpret_cast<uintptr_t>(g.a_scale_mx) |
                       reinterpret_cast<uintptr_t>(g.b_scale_mx)) %
                          4 !=
                      0)) {
    why << "MX-FP8 scales must be 4-byte aligned";
  } else if (const std::string misfit = swapped_misfit(g, *tile); !misfit.empty()) {
    why << "tile " << name << " (swapped operands) cannot run this call: " << misfit;
  } else if (is_wide_fp8_mx_tile(g, *tile)) {
    why << "tile " << name << " takes no MX-FP8 scales (its consumers of 64 rows x 256 columns "
        << "have no registers for MX's per-step product buffer and scale words)";
  } else if (const std::string misfit = fp8_block_misfit(g, *tile); !misfit.empty()) {
    why << "tile " << name << " cannot apply fp8 block scales here: " << misfit;
  } else if (g.total_rows >= (int64_t{1} << 31) || g.E >= (int64_t{1} << 31) ||
             g.N_b >= (int64_t{1} << 31)) {
    why << "sizes must fit in int32";
  } else if (fp8 && !g.mx && g.scales_mn_major && g.total_rows >= (int64_t{1} << 28)) {
    // The 128x256 consumer steps between its two rows' scales by a 32-bit offset (8 rows).
    why << "MN-major fp8 block scales need fewer than 2^28 rows, got " << g.total_rows;
  } else if ((reinterpret_cast<uintptr_t>(g.a) | reinterpret_cast<uintptr_t>(g.b) |
              reinterpret_cast<uintptr_t>(g.d)) %
                 16 !=
             0) {
    why << "a, b and out must be 16-byte aligned";
  } else if (g.gated && g.N_b % 16 != 0) {
    why << "gated needs b.size(1) to be a multiple of 16, got " << g.N_b;
  } else if (g.n_out() % 2 != 0) {
    why << "the epilogue stores column pairs: out needs an even number of columns, got "
        << g.n_out();
  } else if (g.d_dtype == DType::fp8_e4m3 && (!g.gated || tile->bn != 256 || !g.d_scale)) {
    why << "an fp8 out needs gated, out_scale and a 256-wide tile (64x256 or 128x256), got tile "
        << name;
  } else if (g.row_pair != nullptr &&
             (g.gated || g.d_dtype != DType::fp32 || g.topk < 1 || g.d_scale != nullptr)) {
    why << "the folded top-k reduce needs a plain GEMM with an fp32 out and topk >= 1";
  } else if (g.d_dtype != DType::bf16 && g.d_dtype != DType::fp16 && g.d_dtype != DType::fp32 &&
             g.d_dtype != DType::fp8_e4m3) {
    why << "out must be bf16, fp16, fp32 or fp8_e4m3, got " << dtype_name(g.d_dtype);
  }
  return why.str();
}

int64_t tile_list_capacity(const GemmArgs& g) {
  const TileEntry* tile = find_tile(resolve_tile(g));
  MODMOE_CHECK(tile != nullptr) << "moe_gemm (sm90): unknown tile " << resolve_tile(g);
  const int64_t n_blocks = ceil_div(g.gated ? g.N_b / 2 : g.N_b, g.gated ? tile->bn / 2 : tile->bn);
  return 1 + (ceil_div(g.total_rows, tile->bm) + g.E) * n_blocks;
}

namespace {

KernelParams make_params(const GemmArgs& g, const TileEntry& tile) {
  const bool fp8 = g.ab_dtype == DType::fp8_e4m3;
  KernelParams p{};
  p.schedule.m_indptr = g.m_indptr;
  p.schedule.expert_num_tokens = g.expert_num_tokens;
  p.schedule.batch_rows = static_cast<int32_t>(g.batch_rows);
  p.schedule.E = static_cast<int32_t>(g.E);
  p.schedule.n_blocks =
      static_cast<int32_t>(g.gated ? ceil_div(g.N_b / 2, tile.bn / 2) : ceil_div(g.N_b, tile.bn));
  p.schedule.tile_list = g.tile_list;
  p.scheduler = g.scheduler == MoeGemmScheduler::linear_scan   ? kLinearScan
                : g.scheduler == MoeGemmScheduler::precomputed ? kPrecomputed
                                                               : kCooperative;
  p.num_k_blocks = static_cast<int32_t>(ceil_div(g.K, fp8 ? 128 : 64));
  p.N = static_cast<int32_t>(g.gated ? g.N_b / 2 : g.N_b);
  p.N_out = static_cast<int32_t>(g.n_out());
  p.N_b = static_cast<int32_t>(g.N_b);
  if (fp8 && g.mx) {
    p.mx = 1;
    p.a_scale_mx = g.a_scale_mx;
    p.b_scale_mx = g.b_scale_mx;
    p.mx_row_bytes = static_cast<int32_t>(g.K / 32);
  } else if (fp8) {
    // ceil: the last scale group of a row may be partial (K % 128 != 0); the kernel's last K
    // block then reads TMA's zero fill past K, and its scale index is still < kb.
    const int64_t kb = ceil_div(g.K, 128), nb = ceil_div(g.N_b, 128);
    p.a_scale = g.a_scale;
    p.b_scale = g.b_scale;
    p.b_n_blocks = static_cast<int32_t>(nb);
    p.b_e_stride = kb * nb;
    if (g.scales_mn_major) {
      p.a_row_stride = 1, p.a_k_stride = g.total_rows;
      p.b_n_stride = 1, p.b_k_stride = nb;
    } else {
      p.a_row_stride = kb, p.a_k_stride = 1;
      p.b_n_stride = kb, p.b_k_stride = 1;
    }
  }
  p.programmatic = g.programmatic;
  p.gated = g.gated;
  p.up_gate = g.gated && g.gated_layout == GatedLayout::UpGate;
  p.interleaved = g.gated && g.gated_layout == GatedLayout::Interleaved;
  p.activation = g.activation;
  p.d = g.d;
  p.ldd = g.n_out();
  p.out_kind = g.d_dtype == DType::bf16   ? kOutBf16
               : g.d_dtype == DType::fp16 ? kOutFp16
               : g.d_dtype == DType::fp32 ? kOutFp32
                                          : kOutFp8;
  p.d_scale = g.d_scale;
  p.tma_store = uses_tma_store(g, tile);
  p.row_pair = g.row_pair;
  p.pair_weight = g.pair_weight;
  p.topk = static_cast<int32_t>(g.topk);
  return p;
}

}  // namespace

void build_tile_list(const GemmArgs& g, WorkTile* list, cudaStream_t stream) {
  const TileEntry* tile = find_tile(resolve_tile(g));
  MODMOE_CHECK(tile != nullptr) << "moe_gemm (sm90): unknown tile " << resolve_tile(g);
  const KernelParams p = make_params(g, *tile);
  build_tile_list_kernel<<<1, 1024, 0, stream>>>(p.schedule, tile->bm, list);
  MODMOE_CUDA_CHECK(cudaGetLastError());
}

void launch(const GemmArgs& g, cudaStream_t stream, void* scratch) {
  const std::string reason = can_implement(g);
  MODMOE_CHECK(reason.empty()) << "moe_gemm_groupwise (sm90 kernel): " << reason;
  if (g.total_rows == 0 || g.E == 0) return;
  const TileEntry& tile = *find_tile(resolve_tile(g));
  GemmArgs args = g;
  if (args.scheduler == MoeGemmScheduler::precomputed && args.tile_list == nullptr) {
    MODMOE_CHECK(scratch != nullptr)
        << "moe_gemm_groupwise (sm90 kernel): the precomputed scheduler needs scratch memory";
    build_tile_list(args, static_cast<WorkTile*>(scratch), stream);
    args.tile_list = static_cast<const WorkTile*>(scratch);
    // The kernel's scheduler reads the list before its wait: it must have been written first.
    args.programmatic = false;
  }
  args.programmatic = args.programmatic && programmatic_launch_available();
  const KernelParams params = make_params(args, tile);
  const Maps maps = make_maps(args, tile);
  const LaunchShape shape{args.sm_count > 0 ? args.sm_count : device_sm_count(),
                          args.programmatic, stream};
  dispatch(tile, args.ab_dtype == DType::fp8_e4m3, splits_scales(args, tile), maps, params, shape);
}

}  // namespace modmoe::cuda::sm90
