// weighted_reduce (see reduce.h): one block per (token, column tile), each thread kVec adjacent
// columns (16-byte loads: kVec = 4 for fp32, 8 for 16-bit src and out).
//
// Latency, not bandwidth, sets the time at decode sizes (M = 1: 8 rows of a few KB): a thread
// that walked k = 0 .. topk-1 loading pair_row[p] and then the src row it names waited for two
// dependent memory round trips per k. Instead each thread takes the k in chunks of kKChunk:
// first every row index and weight of the chunk (independent loads), then every src vector of
// the chunk (independent loads), then the fmaf chain in k order. The summation order per
// element is unchanged (acc = fmaf(w_k, v_k, acc) for k ascending, skipped rows skipped), so
// the results are bit-identical to a plain k loop.
#include "cuda/cuda_check.h"
#include "cuda/float_io.cuh"
#include "cuda/programmatic_launch.cuh"
#include "cuda/reduce.h"
#include "modmoe/error.h"

namespace modmoe::cuda {
namespace {

constexpr int kMaxThreads = 128;
constexpr int kMinThreads = 32;
constexpr int kKChunk = 8;  // k per round of loads: all of topk for the usual topk <= 8
// Small problems use narrower blocks so that at least this many blocks spread the loads over
// the SMs (about the SM count of the GPUs we target; a constant, so no device query).
constexpr int64_t kMinBlocks = 128;

// Which src row holds pair p (-1: skip it).
struct PairRows {
  const int32_t* pair_row;  // explicit map, or null
  const void* ids;          // contiguous rows with a locality test through expert_map
  bool ids_int64;
  const int32_t* expert_map;
  int64_t num_experts;

  __device__ __forceinline__ int64_t operator()(int64_t p) const {
    if (pair_row) return pair_row[p];
    if (!expert_map) return p;
    const int64_t id =
        ids_int64 ? static_cast<const int64_t*>(ids)[p] : static_cast<const int32_t*>(ids)[p];
    if (id < 0 || id >= num_experts) return -1;
    return expert_map[id] >= 0 ? p : -1;
  }
};

// grid: (M, column tiles). Token t = blockIdx.x.
// Five resident blocks of 128 threads per SM (ptxas: at most 96 registers, no spills). Unbounded,
// the 16-bit kernel took 126 registers, so four blocks, and at M = 8192 it read y at 64-74 % of
// the DRAM peak, each thread's row loads waiting behind the row-index round trip. Five: Qwen3.5
// fp8 M = 8192's reduce 96.8 -> 76.1 us (ncu, H200, 2026-12-01). Six (80 registers) spilled and
// lost (84.1 -> 89.0 us).
//
// src is not __restrict__: a read-only, non-aliased pointer lets the compiler load it through the
// non-coherent path as an invariant load, which it may hoist above griddepcontrol.wait. It did
// (SASS, 2026-12-04: every y load ran before the wait), and a programmatic reduce of a chunked
// forward read the previous chunk's y. Plain loads stay after the wait's memory clobber.
template <typename SrcT, typename OutT, int kVec>
__global__ void __launch_bounds__(kMaxThreads, 5)
    weighted_reduce_kernel(const SrcT* src, int64_t src_ld, PairRows rows,
                           const float* __restrict__ weights, int32_t topk, int64_t K,
                           OutT* __restrict__ out, int64_t out_ld) {
  const int64_t t = blockIdx.x;
  const int64_t col = (int64_t{blockIdx.y} * blockDim.x + threadIdx.x) * kVec;
  if (col >= K) return;
  float acc[kVec];
#pragma unroll
  for (int j = 0; j < kVec; ++j) acc[j] = 0.0f;
  for (int32_t k0 = 0; k0 < topk; k0 += kKChunk) {
    int64_t row[kKChunk];
    float w[kKChunk];
#pragma unroll
    for (int i = 0; i < kKChunk; ++i) {
      const int64_t p = t * topk + k0 + i;
      const bool in_range = k0 + i < topk;
      row[i] = in_range ? rows(p) : -1;
      w[i] = (in_range && weights) ? weights[p] : 1.0f;
    }
    // Launched programmatically: the rows' indices and weights are older than the kernel before
    // (GEMM2), src is its output. Once per thread (the first k chunk); a no-op launched normally.
    if (k0 == 0) wait_for_prerequisite_grids();
    // Kept in the source type until used: half the registers for 16-bit src.
    Vec<SrcT, kVec> v[kKChunk];
#pragma unroll
    for (int i = 0; i < kKChunk; ++i) {
      if (row[i] >= 0)
        v[i] = *reinterpret_cast<const Vec<SrcT, kVec>*>(src + row[i] * src_ld + col);
    }
#pragma unroll
    for (int i = 0; i < kKChunk; ++i) {
      if (row[i] < 0) continue;
#pragma unroll
      for (int j = 0; j < kVec; ++j) acc[j] = fmaf(w[i], to_float(v[i].v[j]), acc[j]);
    }
  }
  store_floats<OutT, kVec>(acc, out + t * out_ld + col);
}

int64_t column_tiles(int64_t K, int threads, int vec) {
  return (K + int64_t{threads} * vec - 1) / (int64_t{threads} * vec);
}

template <typename SrcT, typename OutT, int kVec>
void launch(const WeightedReduceArgs& a, const PairRows& rows, cudaStream_t stream) {
  // Narrower blocks only re-partition the columns; every element's sum is the same.
  int threads = kMaxThreads;
  while (threads > kMinThreads && a.M * column_tiles(a.K, threads, kVec) < kMinBlocks) threads /= 2;
  const dim3 grid(static_cast<unsigned>(a.M),
                  static_cast<unsigned>(column_tiles(a.K, threads, kVec)));
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = dim3(static_cast<unsigned>(threads));
  config.stream = stream;
  cudaLaunchAttribute attribute;
  set_programmatic(config, attribute, a.programmatic && programmatic_launch_available());
  MODMOE_CUDA_CHECK(cudaLaunchKernelEx(&config, weighted_reduce_kernel<SrcT, OutT, kVec>,
                                       static_cast<const SrcT*>(a.src), a.src_ld, rows,
                                       a.topk_weights, static_cast<int32_t>(a.topk), a.K,
                                       static_cast<OutT*>(a.out), a.out_ld));
}

// The widest vector that K, both leading dimensions and both pointers allow: 8 elements when
// src and out are both 16-bit (16-byte accesses), else 4, 2 or 1.
int vector_width(const WeightedReduceArgs& a) {
  const size_t src_size = dtype_size(a.src_dtype), out_size = dtype_size(a.out_dtype);
  const int widest = src_size == 2 && out_size == 2 ? 8 : 4;
  for (int vec : {8, 4, 2}) {
    if (vec > widest) continue;
    if (a.K % vec == 0 && a.src_ld % vec == 0 && a.out_ld % vec == 0 &&
        is_aligned(a.src, src_size * vec) && is_aligned(a.out, out_size * vec))
      return vec;
  }
  return 1;
}

}  // namespace

void weighted_reduce(const WeightedReduceArgs& a, cudaStream_t stream) {
  static constexpr const char* kFn = "cuda::weighted_reduce";
  MODMOE_CHECK(a.M >= 0 && a.topk >= 1 && a.K >= 0)
      << kFn << ": need M >= 0, topk >= 1, K >= 0, got M = " << a.M << ", topk = " << a.topk
      << ", K = " << a.K;
  MODMOE_CHECK(a.M < (int64_t{1} << 31) && a.M * a.topk < (int64_t{1} << 31))
      << kFn << ": M * topk must be < 2^31, got M = " << a.M << ", topk = " << a.topk;
  MODMOE_CHECK(a.src_ld >= a.K && a.out_ld >= a.K)
      << kFn << ": src_ld and out_ld must be >= K = " << a.K << ", got " << a.src_ld << " and "
      << a.out_ld;
  MODMOE_CHECK(is_float_io_dtype(a.src_dtype) && is_float_io_dtype(a.out_dtype))
      << kFn << ": src and out must be bf16, fp16 or fp32, got " << dtype_name(a.src_dtype)
      << " and " << dtype_name(a.out_dtype);
  MODMOE_CHECK(a.pair_row != nullptr || a.expert_map == nullptr || a.topk_ids != nullptr)
      << kFn << ": topk_ids are needed to test locality through expert_map";
  MODMOE_CHECK(a.ids_dtype == DType::int32 || a.ids_dtype == DType::int64)
      << kFn << ": topk_ids must be int32 or int64, got " << dtype_name(a.ids_dtype);
  if (a.M == 0 || a.K == 0) return;
  MODMOE_CHECK(a.src != nullptr && a.out != nullptr) << kFn << ": src and out must not be null";

  const PairRows rows{a.pair_row, a.topk_ids, a.ids_dtype == DType::int64, a.expert_map,
                      a.num_experts};
  const int vec = vector_width(a);
  dispatch_float_io(a.src_dtype, kFn, [&](auto src_tag) {
    using SrcT = typename decltype(src_tag)::type;
    dispatch_float_io(a.out_dtype, kFn, [&](auto out_tag) {
      using OutT = typename decltype(out_tag)::type;
      if constexpr (sizeof(SrcT) == 2 && sizeof(OutT) == 2) {
        if (vec == 8) return launch<SrcT, OutT, 8>(a, rows, stream);
      }
      if (vec == 4) {
        launch<SrcT, OutT, 4>(a, rows, stream);
      } else if (vec == 2) {
        launch<SrcT, OutT, 2>(a, rows, stream);
      } else {
        launch<SrcT, OutT, 1>(a, rows, stream);
      }
    });
  });
}

}  // namespace modmoe::cuda
