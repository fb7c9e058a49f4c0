// The permute (see permute.h): keys -> stable radix sort (CUB) -> m_indptr by binary search
// -> row maps. Four launches plus CUB's; no atomics of ours, no host synchronization.
#include <algorithm>
#include <cub/device/device_radix_sort.cuh>
#include <limits>

#include "cuda/cuda_check.h"
#include "cuda/float_io.cuh"
#include "cuda/permute.h"
#include "modmoe/error.h"

namespace modmoe::cuda {
namespace {

constexpr int kThreads = 256;

// Bits needed for keys in [0, E_local] (E_local itself marks "not local").
int key_bits(int64_t num_local_experts) {
  int bits = 1;
  while ((int64_t{1} << bits) <= num_local_experts) ++bits;
  return bits;
}

// key[p] = local expert of pair p, or E_local when the pair goes to no local expert.
template <typename IdT>
__global__ void pair_keys_kernel(const IdT* __restrict__ ids, int32_t num_pairs,
                                 const int32_t* __restrict__ expert_map, int64_t num_experts,
                                 int32_t num_local_experts, uint32_t* __restrict__ keys,
                                 int32_t* __restrict__ pair_ids) {
  for (int64_t p = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; p < num_pairs;
       p += int64_t{gridDim.x} * blockDim.x) {
    const int64_t id = static_cast<int64_t>(ids[p]);
    int64_t local = -1;
    if (id >= 0 && id < num_experts) local = expert_map ? expert_map[id] : id;
    keys[p] = (local >= 0 && local < num_local_experts) ? static_cast<uint32_t>(local)
                                                        : static_cast<uint32_t>(num_local_experts);
    pair_ids[p] = static_cast<int32_t>(p);
  }
}

// m_indptr[e] = first sorted row whose key is >= e (a lower bound), for e in [0, E_local].
__global__ void m_indptr_kernel(const uint32_t* __restrict__ sorted_keys, int32_t num_pairs,
                                int32_t num_local_experts, int32_t* __restrict__ m_indptr) {
  const int32_t e = blockIdx.x * blockDim.x + threadIdx.x;
  if (e > num_local_experts) return;
  int32_t lo = 0, hi = num_pairs;
  while (lo < hi) {
    const int32_t mid = lo + (hi - lo) / 2;
    if (sorted_keys[mid] < static_cast<uint32_t>(e)) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  m_indptr[e] = lo;
}

__global__ void row_maps_kernel(const int32_t* __restrict__ sorted_pair,
                                const uint32_t* __restrict__ sorted_keys, int32_t num_pairs,
                                int32_t topk, int32_t num_local_experts,
                                int32_t* __restrict__ sorted_token,
                                int32_t* __restrict__ row_of_pair) {
  for (int64_t r = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; r < num_pairs;
       r += int64_t{gridDim.x} * blockDim.x) {
    const int32_t p = sorted_pair[r];
    sorted_token[r] = p / topk;
    row_of_pair[p] =
        sorted_keys[r] < static_cast<uint32_t>(num_local_experts) ? static_cast<int32_t>(r) : -1;
  }
}

// Grid for a grid-stride loop over `work` items: enough blocks to fill the GPU, not one per item.
int grid_for(int64_t work) {
  return static_cast<int>(std::min<int64_t>(blocks_for(work, kThreads), 65535));
}

}  // namespace

PermuteWorkspace PermuteWorkspace::carve(ByteCarver& carver, int64_t num_pairs,
                                         int64_t num_local_experts) {
  static constexpr const char* kFn = "cuda::permute";
  MODMOE_CHECK(num_pairs >= 0 && num_pairs < std::numeric_limits<int32_t>::max())
      << kFn << ": num_pairs = M * topk must be in [0, 2^31 - 1), got " << num_pairs;
  MODMOE_CHECK(num_local_experts >= 1 && num_local_experts < (int64_t{1} << 30))
      << kFn << ": num_local_experts must be in [1, 2^30), got " << num_local_experts;
  PermuteWorkspace ws;
  ws.num_pairs = num_pairs;
  ws.num_local_experts = num_local_experts;
  ws.sort_end_bit = key_bits(num_local_experts);
  if (num_pairs > 0) {
    // Size query only (null scratch): no device work and no synchronization.
    size_t bytes = 0;
    MODMOE_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(
        nullptr, bytes, static_cast<const uint32_t*>(nullptr), static_cast<uint32_t*>(nullptr),
        static_cast<const int32_t*>(nullptr), static_cast<int32_t*>(nullptr),
        static_cast<int>(num_pairs), 0, ws.sort_end_bit));
    ws.sort_temp_bytes = bytes;
  }
  ws.m_indptr = carver.take<int32_t>(num_local_experts + 1);
  ws.sorted_pair = carver.take<int32_t>(num_pairs);
  ws.sorted_expert = carver.take<int32_t>(num_pairs);
  ws.sorted_token = carver.take<int32_t>(num_pairs);
  ws.row_of_pair = carver.take<int32_t>(num_pairs);
  ws.keys = carver.take<uint32_t>(num_pairs);
  ws.pair_ids = carver.take<int32_t>(num_pairs);
  ws.sort_temp = carver.take_bytes(ws.sort_temp_bytes);
  return ws;
}

void permute(const PermuteArgs& a, const PermuteWorkspace& ws, cudaStream_t stream) {
  static constexpr const char* kFn = "cuda::permute";
  MODMOE_CHECK(a.ids_dtype == DType::int32 || a.ids_dtype == DType::int64)
      << kFn << ": topk_ids must be int32 or int64, got " << dtype_name(a.ids_dtype);
  MODMOE_CHECK(a.num_tokens >= 0 && a.topk >= 1)
      << kFn << ": num_tokens must be >= 0 and topk >= 1, got num_tokens = " << a.num_tokens
      << ", topk = " << a.topk;
  const int64_t num_pairs = a.num_tokens * a.topk;
  MODMOE_CHECK(ws.num_pairs == num_pairs && ws.num_local_experts == a.num_local_experts)
      << kFn << ": the workspace was carved for " << ws.num_pairs << " pairs and "
      << ws.num_local_experts << " local experts, the call has " << num_pairs << " pairs ("
      << a.num_tokens << " tokens x topk " << a.topk << ") and " << a.num_local_experts;
  MODMOE_CHECK(a.num_experts >= 1 && a.num_local_experts <= a.num_experts)
      << kFn << ": need 1 <= E_local <= E, got E = " << a.num_experts
      << ", E_local = " << a.num_local_experts;
  MODMOE_CHECK(ws.m_indptr != nullptr) << kFn << ": the workspace has no memory (sizing carve?)";
  const int32_t pairs = static_cast<int32_t>(num_pairs);
  const int32_t e_local = static_cast<int32_t>(a.num_local_experts);

  if (pairs == 0) {
    MODMOE_CUDA_CHECK(
        cudaMemsetAsync(ws.m_indptr, 0, sizeof(int32_t) * (a.num_local_experts + 1), stream));
    return;
  }
  if (a.ids_dtype == DType::int64) {
    pair_keys_kernel<<<grid_for(pairs), kThreads, 0, stream>>>(
        static_cast<const int64_t*>(a.topk_ids), pairs, a.expert_map, a.num_experts, e_local,
        ws.keys, ws.pair_ids);
  } else {
    pair_keys_kernel<<<grid_for(pairs), kThreads, 0, stream>>>(
        static_cast<const int32_t*>(a.topk_ids), pairs, a.expert_map, a.num_experts, e_local,
        ws.keys, ws.pair_ids);
  }
  MODMOE_CUDA_CHECK_LAUNCH();

  // LSD radix sort is stable: equal keys keep pair order, so each expert's rows are in token
  // order and the result is the same on every run.
  uint32_t* sorted_keys = reinterpret_cast<uint32_t*>(ws.sorted_expert);
  size_t temp_bytes = ws.sort_temp_bytes;
  MODMOE_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(
      ws.sort_temp, temp_bytes, ws.keys, sorted_keys, ws.pair_ids, ws.sorted_pair,
      static_cast<int>(pairs), 0, ws.sort_end_bit, stream));

  m_indptr_kernel<<<blocks_for(e_local + 1, kThreads), kThreads, 0, stream>>>(sorted_keys, pairs,
                                                                              e_local, ws.m_indptr);
  MODMOE_CUDA_CHECK_LAUNCH();
  row_maps_kernel<<<grid_for(pairs), kThreads, 0, stream>>>(ws.sorted_pair, sorted_keys, pairs,
                                                            static_cast<int32_t>(a.topk), e_local,
                                                            ws.sorted_token, ws.row_of_pair);
  MODMOE_CUDA_CHECK_LAUNCH();
}

}  // namespace modmoe::cuda
