// Host side of the portable grouped GEMM: argument checks (grouped_gemm_can_implement), the
// kernel choice (operand x scale mode x tile), the pipeline depth that fits the device's
// shared memory, the persistent grid size, and the launch. The kernel is in
// grouped_gemm_kernel.cuh, the tile heuristic in grouped_gemm_heuristic.cuh.
#include <algorithm>
#include <climits>
#include <map>
#include <mutex>
#include <sstream>
#include <utility>

#include "cuda/cuda_check.h"
#include "cuda/grouped_gemm.h"
#include "cuda/grouped_gemm_heuristic.cuh"
#include "cuda/grouped_gemm_kernel.cuh"
#include "modmoe/error.h"

namespace modmoe::cuda {
namespace {

using gemm::GemmTile;
using gemm::Operand;
using gemm::ScaleMode;

constexpr int64_t kMaxExperts = 1024;  // the schedule tables live in shared memory

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

bool aligned(const void* p, size_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

// "grouped_gemm: " + the streamed pieces.
template <typename... Parts>
std::string failure(const Parts&... parts) {
  std::ostringstream s;
  s << "grouped_gemm: ";
  (s << ... << parts);
  return s.str();
}

bool is_operand_dtype(DType d) {
  return d == DType::bf16 || d == DType::fp16 || d == DType::fp8_e4m3;
}

// Elements per 16-byte cp.async piece: K, lda must be multiples of it.
int64_t k_alignment(DType ab) { return ab == DType::fp8_e4m3 ? 16 : 8; }

int64_t n_out_of(const GroupedGemmArgs& a) { return a.gated ? a.N_b / 2 : a.N_b; }

// ---- kernels -----------------------------------------------------------------------------

using KernelFn = void (*)(gemm::Params);

struct KernelInfo {
  KernelFn fn = nullptr;
  int threads = 0, block_m = 0, block_n = 0;
  int stage_bytes = 0;
  int max_stages = 0;
  int static_smem = 0;  // the kernel's __shared__ arrays (filled from the device, see below)
};

template <class Tile, Operand OP, ScaleMode SM>
KernelInfo kernel_info(int max_stages) {
  KernelInfo k;
  k.fn = gemm::grouped_gemm_kernel<Tile, OP, SM>;
  k.threads = Tile::kThreads;
  k.block_m = Tile::BLOCK_M;
  k.block_n = Tile::BLOCK_N;
  k.stage_bytes = gemm::SmemLayout<Tile, SM>::kStageBytes;
  k.max_stages = max_stages;
  return k;
}

template <class Tile>
KernelInfo fp8_kernel(ScaleMode sm, int max_stages) {
  switch (sm) {
    case ScaleMode::block128:
      return kernel_info<Tile, Operand::e4m3, ScaleMode::block128>(max_stages);
    case ScaleMode::mx32:
      return kernel_info<Tile, Operand::e4m3, ScaleMode::mx32>(max_stages);
    default:
      return kernel_info<Tile, Operand::e4m3, ScaleMode::epilogue>(max_stages);
  }
}

template <class Tile>
KernelInfo fp16_kernel(Operand op, int max_stages) {
  return op == Operand::bf16 ? kernel_info<Tile, Operand::bf16, ScaleMode::none>(max_stages)
                             : kernel_info<Tile, Operand::fp16, ScaleMode::none>(max_stages);
}

// The 10 instantiations: {bf16, fp16} x {large, small} and fp8 {epilogue, block, mx} x
// {large, small}, each with a 4-deep ring (3 where shared memory is short, e.g. sm86/sm89).
// Decode tiles are small, so several CTAs per SM keep enough weight bytes in flight.
KernelInfo select_kernel(GemmTile tile, Operand op, ScaleMode sm) {
  const bool small = tile == GemmTile::k16x64;
  if (op == Operand::e4m3) {
    return small ? fp8_kernel<gemm::TileSmall>(sm, 4) : fp8_kernel<gemm::TileLargeFp8>(sm, 4);
  }
  return small ? fp16_kernel<gemm::TileSmall>(op, 4) : fp16_kernel<gemm::TileLarge>(op, 4);
}

Operand operand_of(DType d) {
  return d == DType::bf16 ? Operand::bf16 : d == DType::fp16 ? Operand::fp16 : Operand::e4m3;
}

ScaleMode scale_mode_of(QuantScheme s) {
  switch (s) {
    case QuantScheme::none:
      return ScaleMode::none;
    case QuantScheme::fp8_block:
      return ScaleMode::block128;
    case QuantScheme::mxfp8:
      return ScaleMode::mx32;
    default:
      return ScaleMode::epilogue;
  }
}

// ---- the device --------------------------------------------------------------------------

struct DeviceInfo {
  int sm_count = 0;
  int arch = 0;        // major * 10 + minor
  int smem_optin = 0;  // bytes of shared memory one block may use
};

// Cached per device: these attributes never change, and the launch path should not pay for
// driver queries every call.
std::string query_device(int* device_out, DeviceInfo* info) {
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) {
    cudaGetLastError();  // not sticky; clear it so later launch checks see their own errors
    return failure("no usable CUDA device (cudaGetDevice: ", cudaGetErrorString(err), ")");
  }
  static std::mutex mutex;
  static std::map<int, DeviceInfo> cache;
  std::lock_guard<std::mutex> lock(mutex);
  auto it = cache.find(device);
  if (it == cache.end()) {
    DeviceInfo d;
    int major = 0, minor = 0;
    if (cudaDeviceGetAttribute(&d.sm_count, cudaDevAttrMultiProcessorCount, device) !=
            cudaSuccess ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess ||
        cudaDeviceGetAttribute(&d.smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) !=
            cudaSuccess) {
      cudaGetLastError();
      return failure("cannot query CUDA device ", device);
    }
    d.arch = major * 10 + minor;
    it = cache.emplace(device, d).first;
  }
  *device_out = device;
  *info = it->second;
  return {};
}

// Bytes after the pipeline ring: the tile prefix (E + 1 ints, 8-byte rounded), expert rows.
int64_t schedule_bytes(int64_t E) { return (E + 2) / 2 * 8 + E * 8; }

// The deepest ring (<= the kernel's maximum) that fits, or 0 when not even kMinStages does.
int pick_stages(const KernelInfo& k, const DeviceInfo& d, int64_t E) {
  const int64_t budget = d.smem_optin - k.static_smem - schedule_bytes(E);
  const int64_t stages =
      std::min<int64_t>({k.max_stages, gemm::kMaxStages, budget / k.stage_bytes});
  return stages >= gemm::kMinStages ? static_cast<int>(stages) : 0;
}

// The kernel's static shared memory (as compiled), and its dynamic limit raised to the rest
// of the device's opt-in shared memory. Once per device and kernel: attributes do not change.
std::string prepare_kernel(int device, const DeviceInfo& d, KernelInfo* k) {
  static std::mutex mutex;
  static std::map<std::pair<int, KernelFn>, int> static_smem;
  std::lock_guard<std::mutex> lock(mutex);
  auto it = static_smem.find({device, k->fn});
  if (it == static_smem.end()) {
    cudaFuncAttributes attributes{};
    cudaError_t err = cudaFuncGetAttributes(&attributes, k->fn);
    if (err == cudaSuccess) {
      err = cudaFuncSetAttribute(k->fn, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 d.smem_optin - static_cast<int>(attributes.sharedSizeBytes));
    }
    if (err != cudaSuccess) {
      cudaGetLastError();  // not sticky; keep it from being reported by a later launch check
      return failure("cannot prepare the kernel on device ", device, ": ", cudaGetErrorString(err),
                     " (was the library built for this GPU?)");
    }
    it = static_smem
             .emplace(std::make_pair(device, k->fn), static_cast<int>(attributes.sharedSizeBytes))
             .first;
  }
  k->static_smem = it->second;
  return {};
}

int activation_code(Activation a) {
  switch (a) {
    case Activation::gelu:
      return gemm::kActGelu;
    case Activation::gelu_tanh:
      return gemm::kActGeluTanh;
    case Activation::swigluoai:
      return gemm::kActSwigluOai;
    default:
      return gemm::kActSilu;
  }
}

int layout_code(GatedLayout l) {
  return l == GatedLayout::GateUp   ? gemm::kLayoutGateUp
         : l == GatedLayout::UpGate ? gemm::kLayoutUpGate
                                    : gemm::kLayoutInterleaved;
}

// Argument checks that need no device.
std::string check_arguments(const GroupedGemmArgs& a) {
  if (!is_operand_dtype(a.ab_dtype)) {
    return failure("ab_dtype must be bf16, fp16 or fp8_e4m3, got ", dtype_name(a.ab_dtype));
  }
  const int64_t esize = a.ab_dtype == DType::fp8_e4m3 ? 1 : 2;
  const int64_t align = k_alignment(a.ab_dtype);
  if (a.E < 1 || a.E > kMaxExperts) {
    return failure("E must be in [1, ", kMaxExperts,
                   "] (the schedule is kept in shared memory), "
                   "got ",
                   a.E);
  }
  if (a.gated ? (a.N_b < 2 || a.N_b % 2 != 0) : a.N_b < 1) {
    return failure("N_b must be ",
                   a.gated ? "even and >= 2 in gated mode (gate and up halves)" : ">= 1", ", got ",
                   a.N_b);
  }
  if (a.K < 1 || a.K % align != 0) {
    return failure("K must be a positive multiple of ", align, " for ", dtype_name(a.ab_dtype),
                   " (A and B rows are copied in 16-byte pieces), got K = ", a.K);
  }
  if (a.N_b * a.K * esize > INT32_MAX) {
    return failure("one expert's B must be < 2^31 bytes, got (N_b, K) = (", a.N_b, ", ", a.K,
                   ") of ", dtype_name(a.ab_dtype));
  }
  if (a.A == nullptr || a.B == nullptr || a.D == nullptr) {
    return failure("A, B and D must be device pointers, got null ", a.A == nullptr   ? "A"
                                                                    : a.B == nullptr ? "B"
                                                                                     : "D");
  }
  if (!aligned(a.A, 16) || !aligned(a.B, 16)) {
    return failure("A and B must be 16-byte aligned (cp.async), got A = ", a.A, ", B = ", a.B);
  }
  if (a.lda < a.K || a.lda % align != 0) {
    return failure("lda must be >= K = ", a.K, " and a multiple of ", align, " for ",
                   dtype_name(a.ab_dtype), " (16-byte aligned rows), got lda = ", a.lda);
  }
  if ((a.m_indptr == nullptr) == (a.expert_num_tokens == nullptr)) {
    return failure(
        "exactly one of m_indptr (standard) and expert_num_tokens (batched) must "
        "be given, got ",
        a.m_indptr ? "both" : "neither");
  }
  if (!aligned(a.m_indptr, 4) || !aligned(a.expert_num_tokens, 4) || !aligned(a.a_row_index, 4)) {
    return failure("m_indptr, expert_num_tokens and a_row_index must be int32-aligned");
  }
  if (a.expert_num_tokens != nullptr && (a.batch_rows < 0 || a.E * a.batch_rows > INT32_MAX)) {
    return failure("batch_rows must be >= 0 with E * batch_rows < 2^31 in batched mode, got E = ",
                   a.E, ", batch_rows = ", a.batch_rows);
  }
  if (a.max_rows < 0 || a.max_rows > INT32_MAX) {
    return failure("max_rows must be in [0, 2^31), got ", a.max_rows);
  }
  const bool fp8 = a.ab_dtype == DType::fp8_e4m3;
  if (!fp8 && a.scheme != QuantScheme::none) {
    return failure("scheme must be none for ", dtype_name(a.ab_dtype), " operands, got ",
                   quant_scheme_name(a.scheme));
  }
  if (fp8) {
    if (a.scheme == QuantScheme::none) {
      return failure(
          "scheme must be fp8-tensor, fp8-token, fp8-block or mxfp8 for fp8_e4m3 "
          "operands, got none");
    }
    if (a.a_scale == nullptr || a.b_scale == nullptr) {
      return failure("a_scale and b_scale must be given for ", quant_scheme_name(a.scheme),
                     ", got ", a.a_scale ? "" : "a_scale = null ",
                     a.b_scale ? "" : "b_scale = null");
    }
    if (a.scheme != QuantScheme::mxfp8 && (!aligned(a.a_scale, 4) || !aligned(a.b_scale, 4))) {
      return failure("a_scale and b_scale must be fp32-aligned for ", quant_scheme_name(a.scheme));
    }
  }
  if (a.gated && !is_gated(a.activation)) {
    return failure(
        "activation must be a gated form (silu, gelu, gelu_tanh, swigluoai) in "
        "gated mode, got ",
        activation_name(a.activation));
  }
  if (a.d_dtype != DType::bf16 && a.d_dtype != DType::fp16 && a.d_dtype != DType::fp32) {
    return failure("d_dtype must be bf16, fp16 or fp32, got ", dtype_name(a.d_dtype));
  }
  if (a.ldd < n_out_of(a)) {
    return failure("ldd must be >= N_out = ", n_out_of(a), a.gated ? " (N_b / 2, gated)" : "",
                   ", got ", a.ldd);
  }
  if (!aligned(a.D, dtype_size(a.d_dtype))) {
    return failure("D must be aligned to its element size (", dtype_size(a.d_dtype),
                   " bytes), got ", a.D);
  }
  return {};
}

struct Plan {
  KernelInfo kernel;
  GemmTile tile = GemmTile::k64x128;
  int device = 0;
  DeviceInfo info;
  int stages = 0;
  int64_t smem_bytes = 0;
};

// Arguments, then what the device can do; fills `plan` when it can run.
std::string make_plan(const GroupedGemmArgs& a, Plan* plan) {
  std::string why = check_arguments(a);
  if (!why.empty()) return why;
  const bool batched = a.expert_num_tokens != nullptr;
  plan->tile = gemm::choose_gemm_tile(a.max_rows, a.E, batched, a.batch_rows);
  plan->kernel = select_kernel(plan->tile, operand_of(a.ab_dtype), scale_mode_of(a.scheme));
  why = query_device(&plan->device, &plan->info);
  if (!why.empty()) return why;
  const int arch = plan->info.arch;
  if (arch < 80) {
    return failure("needs an sm80+ GPU (cp.async, ldmatrix, mma.sync), device ", plan->device,
                   " is sm", arch);
  }
  if (a.ab_dtype == DType::fp8_e4m3 && arch < 89) {
    return failure("fp8_e4m3 needs an sm89+ GPU (fp8 mma.sync), device ", plan->device, " is sm",
                   arch);
  }
  why = prepare_kernel(plan->device, plan->info, &plan->kernel);
  if (!why.empty()) return why;
  plan->stages = pick_stages(plan->kernel, plan->info, a.E);
  if (plan->stages == 0) {
    return failure("E = ", a.E, " needs ",
                   schedule_bytes(a.E) + plan->kernel.static_smem +
                       gemm::kMinStages * plan->kernel.stage_bytes,
                   " bytes of shared memory with the ", gemm::gemm_tile_name(plan->tile),
                   " tile, device ", plan->device, " allows ", plan->info.smem_optin);
  }
  plan->smem_bytes = int64_t(plan->stages) * plan->kernel.stage_bytes + schedule_bytes(a.E);
  return {};
}

// An upper bound of the tiles the device will find: every non-empty expert adds at most one
// partial m-tile to ceil(rows / BLOCK_M).
int64_t tile_bound(const GroupedGemmArgs& a, const KernelInfo& k, int64_t n_tiles) {
  int64_t m_tiles = 0;
  const int64_t standard_bound = ceil_div(a.max_rows, k.block_m) + std::min(a.E, a.max_rows);
  if (a.expert_num_tokens != nullptr) {
    m_tiles = a.E * ceil_div(a.batch_rows, k.block_m);
    if (a.max_rows > 0) m_tiles = std::min(m_tiles, standard_bound);
  } else {
    m_tiles = standard_bound;
  }
  return m_tiles * n_tiles;
}

}  // namespace

std::string grouped_gemm_can_implement(const GroupedGemmArgs& args) {
  Plan plan;
  return make_plan(args, &plan);
}

void grouped_gemm(const GroupedGemmArgs& a, cudaStream_t stream) {
  Plan plan;
  const std::string why = make_plan(a, &plan);
  MODMOE_CHECK(why.empty()) << why;

  const bool batched = a.expert_num_tokens != nullptr;
  if (batched ? a.batch_rows == 0 : a.max_rows == 0) return;  // no rows can exist

  const KernelInfo& k = plan.kernel;
  const int64_t esize = a.ab_dtype == DType::fp8_e4m3 ? 1 : 2;
  const int64_t out_size = dtype_size(a.d_dtype);
  const int64_t n_out = n_out_of(a);
  const int64_t out_cols = a.gated ? k.block_n / 2 : k.block_n;

  gemm::Params p{};
  p.A = static_cast<const uint8_t*>(a.A);
  p.lda_bytes = a.lda * esize;
  p.a_row_index = a.a_row_index;
  p.B = static_cast<const uint8_t*>(a.B);
  p.b_expert_bytes = a.N_b * a.K * esize;
  p.b_row_bytes = static_cast<int32_t>(a.K * esize);
  p.E = static_cast<int32_t>(a.E);
  p.N_b = static_cast<int32_t>(a.N_b);
  p.N_out = static_cast<int32_t>(n_out);
  p.k_bytes = static_cast<int32_t>(a.K * esize);
  p.num_k_tiles = static_cast<int32_t>(ceil_div(a.K * esize, gemm::kSliceBytes));
  p.n_tiles = static_cast<int32_t>(ceil_div(n_out, out_cols));
  p.m_indptr = a.m_indptr;
  p.expert_num_tokens = a.expert_num_tokens;
  p.batch_rows = static_cast<int32_t>(a.batch_rows);
  p.per_token_scales = a.scheme == QuantScheme::fp8_token ? 1 : 0;
  p.a_scale = a.a_scale;
  p.b_scale = a.b_scale;
  p.k_groups = static_cast<int32_t>(a.scheme == QuantScheme::mxfp8 ? ceil_div(a.K, kMxBlockSize)
                                    : a.scheme == QuantScheme::fp8_block ? ceil_div(a.K, kBlockSize)
                                                                         : 1);
  p.b_row_blocks = static_cast<int32_t>(ceil_div(a.N_b, kBlockSize));
  p.gated = a.gated ? 1 : 0;
  p.activation = activation_code(a.activation);
  p.gated_layout = layout_code(a.gated_layout);
  p.D = a.D;
  p.ldd = a.ldd;
  p.d_dtype = a.d_dtype == DType::fp32   ? gemm::kOutFp32
              : a.d_dtype == DType::fp16 ? gemm::kOutFp16
                                         : gemm::kOutBf16;
  p.d_vector_ok = aligned(a.D, 16) && (a.ldd * out_size) % 16 == 0 ? 1 : 0;
  p.num_stages = plan.stages;

  int blocks_per_sm = 0;
  MODMOE_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
      &blocks_per_sm, k.fn, k.threads, static_cast<size_t>(plan.smem_bytes)));
  const int64_t resident = int64_t(plan.info.sm_count) * std::max(blocks_per_sm, 1);
  const int64_t grid =
      std::max<int64_t>(1, std::min<int64_t>({tile_bound(a, k, p.n_tiles), resident, INT32_MAX}));

  k.fn<<<static_cast<unsigned>(grid), k.threads, static_cast<size_t>(plan.smem_bytes), stream>>>(p);
  MODMOE_CUDA_CHECK_LAUNCH();
}

}  // namespace modmoe::cuda
