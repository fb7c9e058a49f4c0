// The permute (see permute.h), two paths with identical outputs:
//   single_block  one launch: a counting sort by one 1024-thread block in shared memory.
//   radix_sort    keys -> stable radix sort (CUB) -> row maps and m_indptr in one pass.
//                 Two launches plus CUB's.
// Neither uses global atomics or synchronizes with the host.
#include <algorithm>
#include <cub/block/block_scan.cuh>
#include <cub/device/device_radix_sort.cuh>
#include <limits>

#include "cuda/cuda_check.h"
#include "cuda/float_io.cuh"
#include "cuda/pair_key.cuh"
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

// ---- single_block path ------------------------------------------------------------------------
//
// A stable counting sort by one block. The pairs are cut into `num_segments` contiguous
// segments, one per warp, so that "earlier pair" = "earlier segment, or earlier in the same
// segment". Shared memory holds a (segment, key) table of uint16:
//   1. count:  each warp walks its segment 32 pairs at a time; __match_any_sync groups the
//              lanes with equal keys and the group's lowest lane adds the group size to
//              table[warp][key]. Only the owning warp touches its row: no atomics.
//   2. scan:   per key, the total over segments; a block-wide exclusive scan of the totals is
//              m_indptr (the offset of key E_local = the number of local pairs); then
//              table[s][key] = m_indptr[key] + the count of key in segments < s.
//   3. place:  each warp walks its segment again in the same order; a pair's row is
//              table[warp][key] + (lanes of its group below it), and the group's lowest lane
//              advances table[warp][key] by the group size.
// Counts and rows are < 2^16 (num_pairs <= kSingleMaxPairs), hence uint16. The number of
// segments shrinks when E_local + 1 keys times 32 segments would overflow the table.
constexpr int kSingleThreads = 1024;
constexpr int kSingleWarps = kSingleThreads / 32;
constexpr int64_t kSingleMaxPairs = 8192;
// The automatic choice stops below that: one block's scattered row writes (3 per pair, one SM)
// made it 40 us at 8192 pairs on the H200, where the radix path's five kernels take ~15-24
// (ncu; perf.md, tenth session). At 1024 pairs it is 10 us.
constexpr int64_t kSingleAutoMaxPairs = 2048;
constexpr int64_t kSingleMaxExperts = 1024;
constexpr int kKeysPerThread = 2;     // keys [0, E_local] over the block for the scan
constexpr int kTableEntries = 20480;  // 40 KB of uint16: >= 19 segments at E_local = 1024
static_assert(kKeysPerThread * kSingleThreads >= kSingleMaxExperts + 1,
              "the scan must cover every key");
static_assert(kTableEntries >= kSingleMaxExperts + 1, "the table must hold one segment");
static_assert(kSingleMaxPairs <= std::numeric_limits<uint16_t>::max(), "rows must fit uint16");

using SingleBlockScan = cub::BlockScan<int32_t, kSingleThreads, cub::BLOCK_SCAN_WARP_SCANS>;

struct SingleBlockStorage {
  uint16_t table[kTableEntries];  // (num_segments, E_local + 1)
  SingleBlockScan::TempStorage scan;
};
static_assert(sizeof(SingleBlockStorage) <= 48 * 1024, "static shared memory is 48 KB");

template <typename IdT>
__global__ void __launch_bounds__(kSingleThreads)
    single_block_permute_kernel(const IdT* __restrict__ ids, int32_t num_pairs, int32_t topk,
                                const int32_t* __restrict__ expert_map, int64_t num_experts,
                                int32_t num_local_experts, int32_t num_segments,
                                int32_t segment_len, int32_t* __restrict__ m_indptr,
                                int32_t* __restrict__ sorted_pair,
                                int32_t* __restrict__ sorted_expert,
                                int32_t* __restrict__ sorted_token,
                                int32_t* __restrict__ row_of_pair) {
  __shared__ SingleBlockStorage smem;
  const int32_t num_keys = num_local_experts + 1;
  for (int32_t i = threadIdx.x; i < num_segments * num_keys; i += kSingleThreads) smem.table[i] = 0;
  __syncthreads();

  const int32_t warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const unsigned lanes_below = (1u << lane) - 1;
  // Warp-uniform: a warp without a segment only helps with the scan.
  const bool has_segment = warp < num_segments;
  const int32_t seg_begin = has_segment ? warp * segment_len : 0;
  const int32_t seg_end = has_segment ? min(num_pairs, seg_begin + segment_len) : 0;
  uint16_t* const seg_table = smem.table + (has_segment ? warp : 0) * num_keys;

  // 1. Count each key per segment.
  for (int32_t base = seg_begin; base < seg_end; base += 32) {
    const int32_t p = base + lane;
    const int32_t key =
        p < seg_end ? pair_key(ids, p, expert_map, num_experts, num_local_experts) : -1;
    const unsigned group = __match_any_sync(0xffffffffu, key);
    if (key >= 0 && lane == __ffs(group) - 1)
      seg_table[key] = static_cast<uint16_t>(seg_table[key] + __popc(group));
    __syncwarp();  // the next group's leader may be another lane: order the update before it
  }
  __syncthreads();

  // 2. Totals per key -> exclusive scan = m_indptr -> per-segment first rows. Thread i owns
  // keys kKeysPerThread * i + j (a blocked arrangement, as BlockScan wants).
  int32_t first_row[kKeysPerThread];
#pragma unroll
  for (int j = 0; j < kKeysPerThread; ++j) {
    const int32_t key = threadIdx.x * kKeysPerThread + j;
    int32_t total = 0;
    if (key < num_keys)
      for (int32_t s = 0; s < num_segments; ++s) total += smem.table[s * num_keys + key];
    first_row[j] = total;
  }
  SingleBlockScan(smem.scan).ExclusiveSum(first_row, first_row);
#pragma unroll
  for (int j = 0; j < kKeysPerThread; ++j) {
    const int32_t key = threadIdx.x * kKeysPerThread + j;
    if (key >= num_keys) continue;
    m_indptr[key] = first_row[j];
    int32_t row = first_row[j];
    for (int32_t s = 0; s < num_segments; ++s) {
      const int32_t count = smem.table[s * num_keys + key];
      smem.table[s * num_keys + key] = static_cast<uint16_t>(row);
      row += count;
    }
  }
  __syncthreads();

  // 3. Place every pair, in pair order within its key.
  for (int32_t base = seg_begin; base < seg_end; base += 32) {
    const int32_t p = base + lane;
    const int32_t key =
        p < seg_end ? pair_key(ids, p, expert_map, num_experts, num_local_experts) : -1;
    const unsigned group = __match_any_sync(0xffffffffu, key);
    const int32_t row = key >= 0 ? seg_table[key] + __popc(group & lanes_below) : 0;
    __syncwarp();  // every lane has read its group's first row before the leader advances it
    if (key >= 0 && lane == __ffs(group) - 1)
      seg_table[key] = static_cast<uint16_t>(seg_table[key] + __popc(group));
    __syncwarp();
    if (key >= 0) {
      sorted_pair[row] = p;
      sorted_expert[row] = key;
      sorted_token[row] = p / topk;
      row_of_pair[p] = key < num_local_experts ? row : -1;
    }
  }
}

// ---- radix_sort path --------------------------------------------------------------------------

// key[p] = pair_key(p) (local expert or E_local), pair_ids[p] = p: the radix sort's input.
template <typename IdT>
__global__ void pair_keys_kernel(const IdT* __restrict__ ids, int32_t num_pairs,
                                 const int32_t* __restrict__ expert_map, int64_t num_experts,
                                 int32_t num_local_experts, uint32_t* __restrict__ keys,
                                 int32_t* __restrict__ pair_ids) {
  for (int64_t p = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; p < num_pairs;
       p += int64_t{gridDim.x} * blockDim.x) {
    keys[p] = static_cast<uint32_t>(pair_key(ids, p, expert_map, num_experts, num_local_experts));
    pair_ids[p] = static_cast<int32_t>(p);
  }
}

// Per sorted row r: sorted_token and row_of_pair, and m_indptr[e] = first sorted row whose key
// is >= e (a lower bound) for e in [0, E_local], written by the row where the key steps past e
// (the keys are sorted, so each e is written once: by row r for keys[r - 1] < e <= keys[r], by
// the last row for e > keys[last]). One pass instead of a binary search per expert, which was
// a chain of ~17 dependent loads: 8 us at 65536 pairs on the H200 (docs/perf.md).
__global__ void row_maps_kernel(const int32_t* __restrict__ sorted_pair,
                                const uint32_t* __restrict__ sorted_keys, int32_t num_pairs,
                                int32_t topk, int32_t num_local_experts,
                                int32_t* __restrict__ sorted_token,
                                int32_t* __restrict__ row_of_pair, int32_t* __restrict__ m_indptr) {
  const uint32_t e_local = static_cast<uint32_t>(num_local_experts);
  for (int64_t r = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; r < num_pairs;
       r += int64_t{gridDim.x} * blockDim.x) {
    const int32_t p = sorted_pair[r];
    const uint32_t key = min(sorted_keys[r], e_local);
    sorted_token[r] = p / topk;
    row_of_pair[p] = key < e_local ? static_cast<int32_t>(r) : -1;
    const uint32_t first_e = r == 0 ? 0u : min(sorted_keys[r - 1], e_local) + 1;
    for (uint32_t e = first_e; e <= key; ++e) m_indptr[e] = static_cast<int32_t>(r);
    if (r == num_pairs - 1)
      for (uint32_t e = key + 1; e <= e_local; ++e) m_indptr[e] = num_pairs;
  }
}

// Grid for a grid-stride loop over `work` items: enough blocks to fill the GPU, not one per item.
int grid_for(int64_t work) {
  return static_cast<int>(std::min<int64_t>(blocks_for(work, kThreads), 65535));
}

template <typename IdT>
void launch_single_block(const PermuteArgs& a, const PermuteWorkspace& ws, cudaStream_t stream) {
  const int32_t pairs = static_cast<int32_t>(ws.num_pairs);
  const int32_t num_keys = static_cast<int32_t>(a.num_local_experts) + 1;
  // As many segments as the table holds, at most one per warp, and no more than one per 32
  // pairs (a shorter segment would leave lanes idle and add scan work for nothing).
  const int32_t num_segments =
      std::max(1, std::min({kSingleWarps, (pairs + 31) / 32, kTableEntries / num_keys}));
  const int32_t segment_len = (pairs + num_segments - 1) / num_segments;
  single_block_permute_kernel<IdT><<<1, kSingleThreads, 0, stream>>>(
      static_cast<const IdT*>(a.topk_ids), pairs, static_cast<int32_t>(a.topk), a.expert_map,
      a.num_experts, static_cast<int32_t>(a.num_local_experts), num_segments, segment_len,
      ws.m_indptr, ws.sorted_pair, ws.sorted_expert, ws.sorted_token, ws.row_of_pair);
  MODMOE_CUDA_CHECK_LAUNCH();
}

void radix_sort_permute(const PermuteArgs& a, const PermuteWorkspace& ws, cudaStream_t stream) {
  const int32_t pairs = static_cast<int32_t>(ws.num_pairs);
  const int32_t e_local = static_cast<int32_t>(a.num_local_experts);
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

  row_maps_kernel<<<grid_for(pairs), kThreads, 0, stream>>>(
      ws.sorted_pair, sorted_keys, pairs, static_cast<int32_t>(a.topk), e_local, ws.sorted_token,
      ws.row_of_pair, ws.m_indptr);
  MODMOE_CUDA_CHECK_LAUNCH();
}

}  // namespace

bool permute_single_block_fits(int64_t num_pairs, int64_t num_local_experts) {
  return num_pairs <= kSingleMaxPairs && num_local_experts <= kSingleMaxExperts;
}

bool permute_single_block_preferred(int64_t num_pairs, int64_t num_local_experts) {
  return num_pairs <= kSingleAutoMaxPairs &&
         permute_single_block_fits(num_pairs, num_local_experts);
}

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
  const bool single_block = permute_single_block_fits(num_pairs, a.num_local_experts);
  const bool preferred = permute_single_block_preferred(num_pairs, a.num_local_experts);
  MODMOE_CHECK(a.force_path != PermutePath::single_block || single_block)
      << kFn << ": force_path = single_block needs num_pairs <= " << kSingleMaxPairs
      << " and E_local <= " << kSingleMaxExperts << ", got num_pairs = " << num_pairs
      << ", E_local = " << a.num_local_experts;

  if (num_pairs == 0) {
    MODMOE_CUDA_CHECK(
        cudaMemsetAsync(ws.m_indptr, 0, sizeof(int32_t) * (a.num_local_experts + 1), stream));
    return;
  }
  if (a.force_path == PermutePath::radix_sort ||
      (a.force_path == PermutePath::automatic && !preferred)) {
    radix_sort_permute(a, ws, stream);
  } else if (a.ids_dtype == DType::int64) {
    launch_single_block<int64_t>(a, ws, stream);
  } else {
    launch_single_block<int32_t>(a, ws, stream);
  }
}

}  // namespace modmoe::cuda
