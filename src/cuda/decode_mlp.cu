// The decode path's kernels (see decode_mlp.h): gate_up and down, and with fp8 weights
// quantize_h between them; their building blocks are in decode_device.cuh.
//
// gate_up and down are weight-streaming matrix-vector products built the same way: a CTA owns
// one 16-row tile of the output (gate_up: the gate and up rows of 8 features of a pair; down: 16
// output rows of a token) and its warps split the reduction (K, or the token's (pair, N) ranges)
// into stages taken round-robin, streamed through their rings (decode_device.cuh). The warps'
// partial sums meet in shared memory at the end, in warp order: deterministic.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <sstream>
#include <string>

#include "cuda/activation_device.cuh"
#include "cuda/byte_carver.h"
#include "cuda/cuda_check.h"
#include "cuda/decode_device.cuh"
#include "cuda/decode_mlp.h"
#include "cuda/float_io.cuh"
#include "cuda/programmatic_launch.cuh"
#include "modmoe/error.h"
#include "modmoe/quant.h"

namespace modmoe::cuda {
namespace {

using namespace decode;  // NOLINT: the building blocks of every kernel here

// The shared memory of a CTA every GPU from sm_80 grants (99 KiB per block on sm_86 / sm_89):
// a config the decode path accepts runs with at most this much (decode_mlp_config_fits); the
// launch takes what the device gives (device_limits()), opting in above 48 KiB (launch()).
constexpr size_t kMaxSharedBytes = 96 * 1024;

// ---- shared-memory layouts (host and device) ----------------------------------------------------

struct GateUpShared {
  size_t x_offset, scale_offset, red_offset, bytes;
};
__host__ __device__ inline GateUpShared gate_up_shared(int64_t K, size_t weight_bytes, int warps) {
  GateUpShared s;
  const int64_t span = stage_span(weight_bytes), k_pad = ceil_div(K, span) * span;
  s.x_offset = warps * ring_bytes_per_warp(kGateUpDepth);
  s.scale_offset = s.x_offset + static_cast<size_t>(k_pad) * 2;  // 16-bit x, padded
  // fp8: the x scales, then the gate and the up rows' w13 scales, per group of K.
  s.red_offset = s.scale_offset + static_cast<size_t>(3 * ceil_div(K, kGroup)) * 4;
  s.bytes = s.red_offset + static_cast<size_t>(warps) * kTileRows * 4;
  return s;
}

struct DownShared {
  size_t a2_offset, fold_offset, expert_offset, red_offset, bytes;
};
__host__ __device__ inline DownShared down_shared(int64_t topk, int64_t N, size_t weight_bytes,
                                                  int warps) {
  DownShared s;
  const int64_t span = stage_span(weight_bytes), n_pad = ceil_div(N, span) * span;
  const int64_t folds = weight_bytes == 1 ? ceil_div(N, kGroup) : 1;  // per pair
  s.a2_offset = warps * ring_bytes_per_warp(kDownDepth);
  s.fold_offset = s.a2_offset + static_cast<size_t>(topk * n_pad) * 2;
  s.expert_offset = s.fold_offset + static_cast<size_t>(topk * folds) * 4;
  s.red_offset = (s.expert_offset + static_cast<size_t>(topk) * 4 + 15) / 16 * 16;
  s.bytes = s.red_offset + static_cast<size_t>(warps) * kTileRows * 4;
  return s;
}

// ---- gate_up ------------------------------------------------------------------------------------
//
// grid (M * topk, N / 8), gate_up_warps() warps. Tile row g is the gate row of feature n0 + g, row
// g + 8 its up row; units are the stages along K. N % 16 == 0: every tile is whole, and its gate
// rows (and its up rows) lie in one 128-row scale block.
// X: the token rows' element type: W, or with fp8 weights (W = uint8_t) 16-bit rows that the
// CTA quantizes (kQuantizeX).
template <typename W, typename X>
__global__ void __launch_bounds__(kMaxWarps * 32) decode_gate_up_kernel(const DecodeMlpArgs a) {
  constexpr bool kFp8 = std::is_same_v<W, uint8_t>;
  using S = OperandOf<W>;
  using Sp = Span<W>;
  allow_dependent_launch();
  extern __shared__ float4 shared_raw[];
  char* base = reinterpret_cast<char*>(shared_raw);
  const int64_t K = a.K, N = a.N, pair = blockIdx.x, t = pair / a.topk;
  const int64_t n0 = int64_t{blockIdx.y} * 8;
  const int32_t e = local_expert(a, pair);
  if (e >= a.num_local_experts) return;  // not routed here: its h row is never read
  const int warps = blockDim.x / 32;
  const GateUpShared layout = gate_up_shared(K, sizeof(W), warps);
  S* x_s = reinterpret_cast<S*>(base + layout.x_offset);
  const int64_t k_groups = ceil_div(K, kGroup);
  const int units = static_cast<int>(ceil_div(K, Sp::kStage));
  // fp8, per group of K: the token row's scale and the w13 scales of the tile's gate and up rows.
  float* x_scale_s = reinterpret_cast<float*>(base + layout.scale_offset);
  float* gate_scale_s = x_scale_s + k_groups;
  float* up_scale_s = gate_scale_s + k_groups;
  float* red = reinterpret_cast<float*>(base + layout.red_offset);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4, q = lane % 4;

  const W* w = static_cast<const W*>(a.w13) + int64_t{e} * 2 * N * K;
  // This lane's first element of rows g (gate) and g + 8 (up); a cursor is a stage index.
  const int lane_k = q * Sp::kValues;
  const W* rows[2] = {w + gate_column(a.gated_layout, n0 + g, N) * K + lane_k,
                      w + up_column(a.gated_layout, n0 + g, N) * K + lane_k};
  auto source = [&](int u, int c, const void** src) {
    const int k = u * Sp::kStage + (c / 2) * Sp::kStep;
    const bool valid = k + lane_k < K;
    *src = valid ? static_cast<const void*>(rows[c % 2] + k) : a.w13;
    return valid;
  };
  auto next = [warps](int& u) { u += warps; };
  auto prologue = [&] {
    const int64_t k_pad = int64_t{units} * Sp::kStage;  // fp8: whole groups of 128
    if constexpr (kFp8) {
      // The w13 scales of the tile's gate and up blocks, loaded before the token row so that
      // the two round trips overlap (they used to follow the quantization; docs/perf.md,
      // twelfth session).
      const float* ws = a.w13_scale + int64_t{e} * ceil_div(2 * N, kGroup) * k_groups;
      const int64_t gate_block = gate_column(a.gated_layout, n0, N) / kGroup,
                    up_block = up_column(a.gated_layout, n0, N) / kGroup;
      for (int64_t i = threadIdx.x; i < k_groups; i += blockDim.x) {
        gate_scale_s[i] = ws[gate_block * k_groups + i];
        up_scale_s[i] = ws[up_block * k_groups + i];
      }
    }
    // The token row as the MMAs' 16-bit operand (quantized first when it came unquantized).
    stage_token_row<W, X>(a, t, x_s, x_scale_s, k_pad);
    __syncthreads();
  };

  float acc_gate = 0.0f, acc_up = 0.0f;
  auto use = [&](int u, const uint4(&chunks)[kStageChunks]) {
    float d[4];
    stage_product<W>(d, chunks, x_s + u * Sp::kStage + lane_k);
    // Every column of d is the tile's: d[0] row g (gate), d[2] row g + 8 (up).
    if constexpr (kFp8) {
      const float xs = x_scale_s[u];
      acc_gate = fmaf(d[0], xs * gate_scale_s[u], acc_gate);
      acc_up = fmaf(d[2], xs * up_scale_s[u], acc_up);
    } else {
      acc_gate += d[0];
      acc_up += d[2];
    }
  };
  uint4* ring = reinterpret_cast<uint4*>(base + warp * ring_bytes_per_warp(kGateUpDepth));
  stream_stages<kGateUpDepth>(ring, stages_of_warp(units, warp, warps), warp, source, next, use,
                              prologue);

  publish_partials(red, warp, acc_gate, acc_up);
  __syncthreads();
  if (threadIdx.x < 8) {
    const int f = threadIdx.x;
    const float value = gated_function(a.activation, tile_row_total(red, warps, f),
                                       tile_row_total(red, warps, f + 8));
    // fp8: fp32 for quantize_h; else already down's operand (rounded once, here, not per CTA).
    if constexpr (kFp8) {
      static_cast<float*>(a.h)[pair * N + n0 + f] = value;
    } else {
      static_cast<OperandOf<W>*>(a.h)[pair * N + n0 + f] = from_float<OperandOf<W>>(value);
    }
  }
}

// ---- h quantized once for down (fp8) ------------------------------------------------------------
//
// grid (ceil(pairs * groups / kQuantizeWarps)), one warp per (pair, group of 128 values of h's
// row): amax, scale and e4m3 codes exactly as quantize_rows computes them (NaN included: the
// bit-pattern max makes a NaN group's scale NaN), codes past N zero (the padding of the last
// group, which down's stages read). Pairs of no local expert are skipped, as down skips them.
// This used to be down's prologue, run by each of its K / 16 CTAs per token before they stream;
// done once here, Mixtral / DeepSeek-V3 fp8 M = 1 took 0.89-0.91x the time (docs/perf.md,
// twelfth session).
constexpr int kQuantizeWarps = 8;

__global__ void __launch_bounds__(kQuantizeWarps * 32)
    decode_quantize_h_kernel(const DecodeMlpArgs a) {
  allow_dependent_launch();  // down may launch; it waits for this grid before reading the codes
  // Every thread waits, even one with no task: this grid then never completes before gate_up,
  // so down's wait for it covers gate_up too.
  wait_for_prerequisite_grids();
  const int64_t groups = ceil_div(a.N, kGroup);
  const int64_t task = int64_t{blockIdx.x} * kQuantizeWarps + threadIdx.x / 32;
  if (task >= a.M * a.topk * groups) return;  // warp-uniform
  const int64_t pair = task / groups, grp = task % groups;
  if (local_expert(a, pair) >= a.num_local_experts) return;  // warp-uniform
  quantize_h_group(a, pair, grp);
}

// ---- down + top-k weight + reduce -------------------------------------------------------------
//
// grid (M, K / 16), blockDim.x / 32 warps. Tile rows are output rows k0 .. k0 + 15 of token t;
// units are (pair j, stage along N), j-major. Shared: the token's topk operand rows a2 (16-bit,
// padded to whole stages with zeros), a factor per (pair, stage) (the router weight, times the
// group's h scale and w2 scale when fp8), the pairs' local experts, the warps' partials.
template <typename W, typename Out>
__global__ void __launch_bounds__(kMaxWarps * 32) decode_down_kernel(const DecodeMlpArgs a) {
  constexpr bool kFp8 = std::is_same_v<W, uint8_t>;
  using S = OperandOf<W>;
  using Sp = Span<W>;
  extern __shared__ float4 shared_raw[];
  char* base = reinterpret_cast<char*>(shared_raw);
  const int warps = blockDim.x / 32;
  const int64_t K = a.K, N = a.N, topk = a.topk, t = blockIdx.x, k0 = int64_t{blockIdx.y} * 16;
  const int n_stages = static_cast<int>(ceil_div(N, Sp::kStage));
  const int64_t n_pad = int64_t{n_stages} * Sp::kStage;
  const int folds = kFp8 ? n_stages : 1;  // per pair (fp8: a stage is a scale group)
  const DownShared layout = down_shared(topk, N, sizeof(W), warps);
  S* a2_s = reinterpret_cast<S*>(base + layout.a2_offset);
  float* fold_s = reinterpret_cast<float*>(base + layout.fold_offset);
  int32_t* expert_s = reinterpret_cast<int32_t*>(base + layout.expert_offset);
  float* red = reinterpret_cast<float*>(base + layout.red_offset);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4, q = lane % 4;
  const int32_t E_local = static_cast<int32_t>(a.num_local_experts);

  // The routing was written before gate_up was launched (which launched this grid): it and the
  // weights may be read before the wait; h may not. So the folds start as the router weight
  // (times, for fp8, the w2 scale of the tile's row block): the h scales multiply in later.
  for (int64_t j = threadIdx.x; j < topk; j += blockDim.x)
    expert_s[j] = local_expert(a, t * topk + j);
  __syncthreads();
  for (int i = threadIdx.x; i < topk * folds; i += blockDim.x) {
    const int j = i / folds, grp = i % folds;
    const int32_t e = expert_s[j];
    float fold = a.topk_weights ? a.topk_weights[t * topk + j] : 1.0f;
    if (kFp8 && e < E_local)
      fold *= a.w2_scale[(int64_t{e} * ceil_div(K, kGroup) + k0 / kGroup) * folds + grp];
    fold_s[i] = fold;
  }

  const W* w2 = static_cast<const W*>(a.w2);
  // A cursor is a (pair, stage) unit; the warps take them round-robin, j-major, so a warp's
  // next unit is `warps` stages on (no division in the loop).
  struct Unit {
    int j, stage;
  };
  const int lane_n = q * Sp::kValues, warps_j = warps / n_stages, warps_stage = warps % n_stages;
  const W* lane_w2 = w2 + (k0 + g) * N + lane_n;  // row g of the tile at this lane's n
  auto source = [&](const Unit& u, int c, const void** src) {
    const int32_t e = expert_s[u.j];
    const int n = u.stage * Sp::kStage + (c / 2) * Sp::kStep;
    const bool valid = e < E_local && n + lane_n < N;
    *src =
        valid ? static_cast<const void*>(lane_w2 + int64_t{e} * K * N + (c % 2) * 8 * N + n) : a.w2;
    return valid;
  };
  auto next = [&](Unit& u) {
    u.j += warps_j;
    u.stage += warps_stage;
    if (u.stage >= n_stages) u.stage -= n_stages, ++u.j;
  };
  auto prologue = [&] {
    wait_for_prerequisite_grids();
    __syncthreads();  // the folds above are complete
    // GEMM2's operand rows as the grouped path would see them (fp8: h as quantize_h quantized
    // it, each group's scale into its fold).
    stage_h_rows<W>(a, t * topk, static_cast<int>(topk), n_pad,
                    [&](int j) { return expert_s[j] < E_local; }, a2_s);
    if constexpr (kFp8) {
      for (int i = static_cast<int>(threadIdx.x); i < topk * folds; i += blockDim.x) {
        const int j = i / folds, grp = i % folds;
        if (expert_s[j] < E_local) fold_s[i] *= a.h_scale[(t * topk + j) * folds + grp];
      }
    }
    __syncthreads();
  };

  float acc_lo = 0.0f, acc_hi = 0.0f;
  auto use = [&](const Unit& u, const uint4(&chunks)[kStageChunks]) {
    if (expert_s[u.j] >= E_local) return;  // warp-uniform; its chunks were zero-filled
    float d[4];
    stage_product<W>(d, chunks, a2_s + u.j * n_pad + u.stage * Sp::kStage + lane_n);
    const float fold = fold_s[u.j * folds + (kFp8 ? u.stage : 0)];
    acc_lo = fmaf(d[0], fold, acc_lo);
    acc_hi = fmaf(d[2], fold, acc_hi);
  };
  uint4* ring = reinterpret_cast<uint4*>(base + warp * ring_bytes_per_warp(kDownDepth));
  const int units = static_cast<int>(topk) * n_stages;
  stream_stages<kDownDepth>(ring, stages_of_warp(units, warp, warps),
                            Unit{warp / n_stages, warp % n_stages}, source, next, use, prologue);

  publish_partials(red, warp, acc_lo, acc_hi);
  __syncthreads();
  if (threadIdx.x < kTileRows) {
    Out* out = static_cast<Out*>(a.out) + t * K + k0;
    out[threadIdx.x] = from_float<Out>(tile_row_total(red, warps, threadIdx.x));
  }
}

// ---- host side ----------------------------------------------------------------------------------

// The launch shapes. gate_up: gate_up_warps(), fewer if its shared memory does not fit; its
// grid is large and several CTAs share an SM. down: its grid has only K / 16 CTAs per token, so
// the warps of a CTA are what keeps bytes in flight: the most warps (16, 8, 4; 1, 2, 4 CTAs to
// an SM) at which the whole grid runs in one wave; else 8 warps two CTAs to an SM (a CTA's h
// staging then overlaps the other's streaming, and waves are finer); else the most warps that
// fit (a large topk * N operand takes shared memory from the rings). The 4-warp wave came from
// the H200 sweep of the twenty-first session (docs/perf.md, twenty-second session): Qwen3-sized
// layers at M = 4 (512 CTAs) took 0.91-0.98x the time of two 8-warp waves with fp8 weights.
struct DecodeShapes {
  int gate_up_warps = 0, down_warps = 0;
  size_t gate_up_bytes = 0, down_bytes = 0;
  bool fits() const { return gate_up_bytes > 0 && down_warps > 0; }
};

struct SharedLimits {
  size_t per_block;  // opt-in maximum of one CTA
  size_t per_sm;     // what the CTAs of one SM share (each also reserves 1 KiB)
  int64_t sms;
};

// gate_up's warps per CTA, from an H200 sweep of 4-16 warps x ring depths 2-8 at M = 1 and 4
// (docs/perf.md, twenty-first session). fp8 weights: 4 — the CTA quantizes its token row before
// its first MMA, and more CTAs per SM hide that better than more warps per CTA (8 warps took
// 0.99-1.07x the time of 4, faster only at DeepSeek-V3's K = 7168). 16-bit weights: the most
// warps (a power of two, 4-16) that still stream >= 4 stages each of the tile's K: each warp's
// ring is a chain (wait, MMAs, request), so the big layers go as fast as the SM runs chains
// (Mixtral M = 1: 0.96x the time with 16 warps), while fewer stages per warp leave the rings
// mostly ramp (Qwen3 M = 1 with 16 warps: 1.06x).
int gate_up_warps(int64_t K, size_t weight_bytes) {
  if (weight_bytes == 1) return 4;
  const int64_t stages = ceil_div(K, stage_span(weight_bytes));
  int warps = 4;
  while (warps < kMaxWarps && stages >= 4 * 2 * warps) warps *= 2;
  return warps;
}

DecodeShapes decode_shapes(int64_t M, int64_t K, int64_t N, int64_t topk, size_t weight_bytes,
                           const SharedLimits& limits) {
  DecodeShapes s;
  for (int warps = gate_up_warps(K, weight_bytes); warps >= 4 && s.gate_up_warps == 0; warps /= 2) {
    const size_t bytes = gate_up_shared(K, weight_bytes, warps).bytes;
    if (bytes <= limits.per_block) s.gate_up_warps = warps, s.gate_up_bytes = bytes;
  }
  auto try_down = [&](int warps, size_t budget) {
    const size_t bytes = down_shared(topk, N, weight_bytes, warps).bytes;
    if (s.down_warps > 0 || bytes > budget) return;
    s.down_warps = warps, s.down_bytes = bytes;
  };
  const int64_t ctas = M * (K / kTileRows);
  auto per_sm_budget = [&](int per_sm) {  // each CTA of an SM also reserves 1 KiB
    const size_t share = limits.per_sm / per_sm;
    return share > 1024 ? std::min(limits.per_block, share - 1024) : 0;
  };
  for (int warps = kMaxWarps; warps >= 4; warps /= 2) {
    const int per_sm = kMaxWarps / warps;
    if (ctas <= limits.sms * per_sm) try_down(warps, per_sm_budget(per_sm));
  }
  try_down(8, per_sm_budget(2));
  for (int warps = kMaxWarps; warps >= 2; warps /= 2) try_down(warps, limits.per_block);
  return s;
}

// What every GPU from sm_80 gives (sm_86 / sm_89: 99 KiB per CTA, 100 KiB per SM): the configs
// the decode path accepts run everywhere.
constexpr SharedLimits kPortableLimits{kMaxSharedBytes, 100 * 1024, 1};

SharedLimits device_limits() {
  int device = 0, per_block = 0, per_sm = 0, sms = 0;
  MODMOE_CUDA_CHECK(cudaGetDevice(&device));
  MODMOE_CUDA_CHECK(
      cudaDeviceGetAttribute(&per_block, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  MODMOE_CUDA_CHECK(
      cudaDeviceGetAttribute(&per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, device));
  MODMOE_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  return {static_cast<size_t>(per_block), static_cast<size_t>(per_sm), sms};
}

size_t weight_bytes_of(const MoEConfig& c) {
  return c.quant.quantized() ? 1 : dtype_size(c.in_dtype);
}

template <typename F>
void dispatch_weight(DType w, F&& f) {
  switch (w) {
    case DType::bf16:
      return f(TypeTag<__nv_bfloat16>{});
    case DType::fp16:
      return f(TypeTag<__half>{});
    case DType::fp8_e4m3:
      return f(TypeTag<uint8_t>{});
    default:
      MODMOE_FAIL() << "decode_mlp: weights must be bf16, fp16 or fp8_e4m3, got " << dtype_name(w);
  }
}

// `programmatic`: launched as a programmatic dependent of the stream's previous kernel (it
// may start before that kernel ends; see allow_dependent_launch).
template <typename Kernel>
void launch(Kernel kernel, dim3 grid, int warps, size_t shared, const DecodeMlpArgs& a,
            bool programmatic, cudaStream_t stream) {
  if (shared > 48 * 1024) {
    MODMOE_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           static_cast<int>(shared)));
  }
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = dim3(static_cast<unsigned>(warps * 32));
  config.dynamicSmemBytes = shared;
  config.stream = stream;
  cudaLaunchAttribute attribute;
  set_programmatic(config, attribute, programmatic);
  MODMOE_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, a));
}

}  // namespace

bool decode_mlp_config_fits(const MoEConfig& c) {
  const int64_t K = c.hidden_size, N = c.intermediate_size;
  const QuantScheme q = c.quant.scheme;
  return is_gated(c.activation) &&
         (q == QuantScheme::none || (q == QuantScheme::fp8_block && !c.quant.static_act_scale)) &&
         K % 16 == 0 && N % 16 == 0 &&
         decode_shapes(1, K, N, c.topk, weight_bytes_of(c), kPortableLimits).fits();
}

std::string decode_mlp_unsupported(const MoEConfig& c, const DecodeMlpArgs& a) {
  std::ostringstream why;
  if (!decode_mlp_config_fits(c)) {
    why << "the config is not one the decode path runs (gated, none or dynamic fp8_block, K and N "
           "multiples of 16, shared memory within "
        << kMaxSharedBytes << " bytes): " << c.str();
  } else if (!is_aligned(a.x, 16) || !is_aligned(a.w13, 16) || !is_aligned(a.w2, 16) ||
             !is_aligned(a.h, 16) || !is_aligned(a.h_codes, 16)) {
    why << "x, w13, w2, h and h_codes must be 16-byte aligned";
  }
  return why.str();
}

DecodeWorkspace carve_decode_workspace(void* base, const MoEConfig& c, int64_t M) {
  ByteCarver carver(base);
  const int64_t pairs = M * c.topk, N = c.intermediate_size, groups = ceil_div(N, kGroup);
  DecodeWorkspace w;
  // fp8: h in fp32 (quantize_h reads it); else in the 16-bit operand dtype down reads.
  w.h = carver.take_bytes(static_cast<size_t>(pairs * N) *
                          (c.quant.quantized() ? sizeof(float) : dtype_size(c.in_dtype)));
  if (c.quant.quantized()) {
    w.h_codes = carver.take<uint8_t>(pairs * groups * kGroup);
    w.h_scale = carver.take<float>(pairs * groups);
  }
  w.bytes = carver.size();
  return w;
}

size_t decode_mlp_workspace_bytes(const MoEConfig& c, int64_t M) {
  return carve_decode_workspace(nullptr, c, M).bytes;
}

void decode_mlp(const DecodeMlpArgs& a, cudaStream_t stream) {
  if (a.M == 0) return;
  MODMOE_CHECK(a.K % 16 == 0 && a.N % 16 == 0)
      << "decode_mlp: K and N must be multiples of 16 (whole 16-row tiles), got K = " << a.K
      << ", N = " << a.N;
  MODMOE_CHECK(a.N / 8 <= 65535 && a.K / 16 <= 65535)
      << "decode_mlp: N must be <= " << 65535 * 8 << " and K <= " << 65535 * 16
      << " (grid.y), got K = " << a.K << ", N = " << a.N;
  if (a.w_dtype == DType::fp8_e4m3) {
    const bool codes = a.x_dtype == DType::fp8_e4m3;
    MODMOE_CHECK((codes || a.x_dtype == DType::bf16 || a.x_dtype == DType::fp16) &&
                 codes == (a.x_scale != nullptr))
        << "decode_mlp: with fp8 weights x must be e4m3 codes with x_scale, or bf16/fp16 rows "
           "without (gate_up quantizes them), got "
        << dtype_name(a.x_dtype) << (a.x_scale ? " with" : " without") << " x_scale";
    MODMOE_CHECK(a.h_codes != nullptr && a.h_scale != nullptr)
        << "decode_mlp: with fp8 weights h_codes and h_scale must be set (carve_decode_workspace)";
  } else {
    MODMOE_CHECK(a.x_dtype == a.w_dtype)
        << "decode_mlp: x must have the weights' dtype " << dtype_name(a.w_dtype) << ", got "
        << dtype_name(a.x_dtype);
  }
  const SharedLimits limits = device_limits();
  const DecodeShapes shapes = decode_shapes(a.M, a.K, a.N, a.topk, dtype_size(a.w_dtype), limits);
  MODMOE_CHECK(shapes.fits()) << "decode_mlp: K = " << a.K << ", N = " << a.N
                              << ", topk = " << a.topk << " need more than " << limits.per_block
                              << " bytes of shared memory per CTA";
  // Pairs (tokens) are the fastest grid dimension: the CTAs of one weight slice run side by
  // side, so pairs that share an expert read its rows while they are in the L2.
  const dim3 gate_up_grid(static_cast<unsigned>(a.M * a.topk), static_cast<unsigned>(a.N / 8));
  const dim3 down_grid(static_cast<unsigned>(a.M), static_cast<unsigned>(a.K / 16));
  const bool programmatic = programmatic_launch_available();
  dispatch_weight(a.w_dtype, [&](auto w_tag) {
    using W = typename decltype(w_tag)::type;
    auto launch_gate_up = [&](auto kernel) {
      launch(kernel, gate_up_grid, shapes.gate_up_warps, shapes.gate_up_bytes, a, false, stream);
    };
    if constexpr (std::is_same_v<W, uint8_t>) {
      if (a.x_dtype == DType::fp8_e4m3) {
        launch_gate_up(decode_gate_up_kernel<W, W>);
      } else {
        dispatch_float_io(a.x_dtype, "decode_mlp x", [&](auto x_tag) {
          using X = typename decltype(x_tag)::type;
          if constexpr (std::is_same_v<X, float>) {
            MODMOE_FAIL() << "decode_mlp: unreachable (fp32 x refused above)";
          } else {
            launch_gate_up(decode_gate_up_kernel<W, X>);
          }
        });
      }
    } else {
      launch_gate_up(decode_gate_up_kernel<W, W>);
    }
    auto launch_down = [&](auto kernel) {
      launch(kernel, down_grid, shapes.down_warps, shapes.down_bytes, a, programmatic, stream);
    };
    // Unquantized, the output dtype is the weights' (in_dtype); fp8 writes any of the three.
    if constexpr (std::is_same_v<W, uint8_t>) {
      const int64_t tasks = a.M * a.topk * ceil_div(a.N, kGroup);
      launch(decode_quantize_h_kernel, dim3(static_cast<unsigned>(ceil_div(tasks, kQuantizeWarps))),
             kQuantizeWarps, 0, a, programmatic, stream);
      dispatch_float_io(a.out_dtype, "decode_mlp", [&](auto out_tag) {
        launch_down(decode_down_kernel<W, typename decltype(out_tag)::type>);
      });
    } else {
      MODMOE_CHECK(a.out_dtype == a.w_dtype)
          << "decode_mlp: unquantized, out_dtype must be the weights' dtype "
          << dtype_name(a.w_dtype) << ", got " << dtype_name(a.out_dtype);
      launch_down(decode_down_kernel<W, W>);
    }
  });
}

}  // namespace modmoe::cuda
