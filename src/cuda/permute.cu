// The permute (see permute.h), three paths with identical outputs:
//   single_block  one launch: a counting sort by one 1024-thread block in shared memory.
//   multi_block   two launches: per-block key counts, then the same sort by up to 64 blocks.
//   radix_sort    keys -> stable radix sort (CUB) -> row maps and m_indptr in one pass.
//                 Two launches plus CUB's.
// None uses global float atomics or synchronizes with the host.
#include <algorithm>
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

// ---- counting-sort paths (single_block, multi_block) -----------------------------------------
//
// A stable counting sort of one contiguous chunk of the pairs per 1024-thread block, so that
// "earlier pair" = "earlier block, or earlier in the block". single_block is one block over all
// the pairs; multi_block first counts each block's keys (block_counts_kernel), then runs one
// block per chunk, each offsetting its rows by the pairs of its key in earlier blocks.
//
// Inside a block the pairs are cut into `num_segments` contiguous segments, one per warp, and
// shared memory holds:
//   keys    (chunk)             each pair's key, read from global memory once
//   table   (segments, keys)    uint16: first the count of each key per segment, then the offset
//                               of the segment's first pair within the chunk's run of that key
//   staged  (chunk)             chunk-local row -> pair (within the chunk)
//   local_first, global_first, earlier_pairs
//                               per key: the chunk-local row of its run, the global row, and
//                               (multi_block) its pairs in earlier blocks
// Phases:
//   1. count:  each warp walks its segment 32 pairs at a time; __match_any_sync groups the
//              lanes with equal keys and the group's lowest lane adds the group size to
//              table[warp][key]. Only the owning warp touches its row: no atomics.
//   2. offsets: per key, the running sum over the segments (table -> offsets within the run),
//              the total over the chunk, and over all blocks the pairs of that key in total and
//              in earlier blocks; one warp's scan of the totals gives each key's first global
//              row (= m_indptr) and its first chunk-local row.
//   3. place:  each warp walks its segment again in the same order; a pair's offset in its run
//              is table[warp][key] + (lanes of its group below it); it writes row_of_pair
//              (coalesced: consecutive pairs) and its pair into staged[chunk-local row].
//   4. write:  one pass over the chunk-local rows writes sorted_pair / _expert / _token: rows of
//              one key are consecutive in both orders, so the stores coalesce. (Writing them
//              from phase 3, scattered, made one block take 40 us at 8192 pairs on the H200.)
// Rows within a chunk are < 2^16 (chunk <= kMaxChunk), hence uint16 in the table. The shared
// memory is at most ~90 KB (8192 pairs, 1024 local experts): within the 99 KB a block may opt
// into on sm86/sm89, the smallest of the GPUs this backend targets.
constexpr int kSortThreads = 1024;
constexpr int kSortWarps = kSortThreads / 32;
constexpr int64_t kMaxChunk = 8192;   // pairs per block: the single block's limit too
constexpr int64_t kMaxExperts = 1024;
constexpr int kTableEntries = 16384;  // 32 KB of uint16: >= 15 segments at E_local = 1024
// The automatic choice takes one block up to here, more blocks past it. One block's time grows
// with the pairs (5.2 us at 128, 10.3 at 2048; ncu, H200) while the two launches of the
// multi-block path take ~10 us from 4096 to 8192 pairs (perf.md, eleventh session); the
// crossover between 1024 and 4096 pairs was not measured finer.
constexpr int64_t kSingleAutoMaxPairs = 2048;
constexpr int kMultiMaxBlocks = 64;
constexpr int64_t kMultiMinChunk = 512;
static_assert(kTableEntries >= kMaxExperts + 1, "the table must hold one segment");
static_assert(kMaxChunk <= std::numeric_limits<uint16_t>::max(), "rows must fit uint16");

// As many segments as the table holds, at most one per warp, and no more than one per 32 pairs
// (a shorter segment would leave lanes idle and add offset work for nothing).
int32_t sort_segments(int64_t chunk, int32_t num_keys) {
  return std::max(1, std::min({kSortWarps, static_cast<int32_t>((chunk + 31) / 32),
                               kTableEntries / num_keys}));
}

// The dynamic shared memory of one block, carved in this order (16-byte aligned pieces).
struct SortSmemLayout {
  size_t table = 0, keys = 0, staged = 0, local_first = 0, global_first = 0, earlier_pairs = 0;
  size_t bytes = 0;
  __host__ __device__ SortSmemLayout(int32_t num_segments, int32_t num_keys, int32_t chunk) {
    auto take = [this](size_t n) {
      const size_t at = bytes;
      bytes += (n + 15) / 16 * 16;
      return at;
    };
    table = take(sizeof(uint16_t) * num_segments * num_keys);
    keys = take(sizeof(uint16_t) * chunk);
    staged = take(sizeof(int32_t) * chunk);
    local_first = take(sizeof(int32_t) * num_keys);
    global_first = take(sizeof(int32_t) * num_keys);
    earlier_pairs = take(sizeof(int32_t) * num_keys);
  }
};

struct SortParams {
  int64_t num_pairs = 0;
  int32_t topk = 1;
  const int32_t* expert_map = nullptr;
  int64_t num_experts = 0;
  int32_t num_local_experts = 0;
  int32_t chunk = 0;  // pairs per block (the last block may have fewer)
  int32_t num_segments = 1;
  int32_t segment_len = 0;
  // multi_block: (blocks, num_keys) block-major key counts of every block; null: one block.
  const int32_t* block_counts = nullptr;
  int32_t* m_indptr = nullptr;
  int32_t* sorted_pair = nullptr;
  int32_t* sorted_expert = nullptr;
  int32_t* sorted_token = nullptr;
  int32_t* row_of_pair = nullptr;
};

// multi_block's first pass: each block's count of every key, block-major.
template <typename IdT>
__global__ void __launch_bounds__(kSortThreads)
    block_counts_kernel(const IdT* __restrict__ ids, SortParams p, int32_t* __restrict__ counts) {
  __shared__ int32_t hist[kMaxExperts + 1];
  const int32_t num_keys = p.num_local_experts + 1;
  for (int32_t k = threadIdx.x; k < num_keys; k += kSortThreads) hist[k] = 0;
  __syncthreads();
  const int64_t begin = int64_t{blockIdx.x} * p.chunk, end = min(p.num_pairs, begin + p.chunk);
  for (int64_t q = begin + threadIdx.x; q < end; q += kSortThreads)
    atomicAdd(&hist[pair_key(ids, q, p.expert_map, p.num_experts, p.num_local_experts)], 1);
  __syncthreads();
  for (int32_t k = threadIdx.x; k < num_keys; k += kSortThreads)
    counts[int64_t{blockIdx.x} * num_keys + k] = hist[k];
}

template <typename IdT>
__global__ void __launch_bounds__(kSortThreads, 1)
    counting_sort_kernel(const IdT* __restrict__ ids, const SortParams p) {
  extern __shared__ __align__(16) unsigned char smem[];
  const int32_t num_keys = p.num_local_experts + 1;
  const int64_t chunk_begin = int64_t{blockIdx.x} * p.chunk;
  const int32_t chunk_pairs = static_cast<int32_t>(min(p.num_pairs - chunk_begin, int64_t{p.chunk}));
  const SortSmemLayout layout(p.num_segments, num_keys, p.chunk);
  uint16_t* const table = reinterpret_cast<uint16_t*>(smem + layout.table);
  uint16_t* const keys = reinterpret_cast<uint16_t*>(smem + layout.keys);
  int32_t* const staged = reinterpret_cast<int32_t*>(smem + layout.staged);
  int32_t* const local_first = reinterpret_cast<int32_t*>(smem + layout.local_first);
  int32_t* const global_first = reinterpret_cast<int32_t*>(smem + layout.global_first);
  int32_t* const earlier_pairs = reinterpret_cast<int32_t*>(smem + layout.earlier_pairs);

  for (int32_t i = threadIdx.x; i < p.num_segments * num_keys; i += kSortThreads) table[i] = 0;
  for (int32_t q = threadIdx.x; q < chunk_pairs; q += kSortThreads)
    keys[q] = static_cast<uint16_t>(
        pair_key(ids, chunk_begin + q, p.expert_map, p.num_experts, p.num_local_experts));
  __syncthreads();

  const int32_t warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const unsigned lanes_below = (1u << lane) - 1;
  // Warp-uniform: a warp without a segment only helps with the offsets and the writes.
  const bool has_segment = warp < p.num_segments;
  const int32_t seg_begin = has_segment ? warp * p.segment_len : 0;
  const int32_t seg_end = has_segment ? min(chunk_pairs, seg_begin + p.segment_len) : 0;
  uint16_t* const seg_table = table + (has_segment ? warp : 0) * num_keys;

  // 1. Count each key per segment.
  for (int32_t base = seg_begin; base < seg_end; base += 32) {
    const int32_t q = base + lane;
    const int32_t key = q < seg_end ? keys[q] : -1;
    const unsigned group = __match_any_sync(0xffffffffu, key);
    if (key >= 0 && lane == __ffs(group) - 1)
      seg_table[key] = static_cast<uint16_t>(seg_table[key] + __popc(group));
    __syncwarp();  // the next group's leader may be another lane: order the update before it
  }
  __syncthreads();

  // 2a. Per key: the running sum over the segments (table -> offsets within the key's run), the
  // pairs in this chunk, and (multi_block) the pairs in all blocks and in earlier blocks. The
  // totals wait in local_first / global_first until 2b turns them into first rows.
  for (int32_t key = threadIdx.x; key < num_keys; key += kSortThreads) {
    int32_t in_chunk = 0;
    for (int32_t s = 0; s < p.num_segments; ++s) {
      const int32_t count = table[s * num_keys + key];
      table[s * num_keys + key] = static_cast<uint16_t>(in_chunk);
      in_chunk += count;
    }
    int32_t all = in_chunk, earlier = 0;
    if (p.block_counts != nullptr) {
      all = 0;
      for (int32_t b = 0; b < static_cast<int32_t>(gridDim.x); ++b) {
        const int32_t count = p.block_counts[int64_t{b} * num_keys + key];
        all += count;
        earlier += b < static_cast<int32_t>(blockIdx.x) ? count : 0;
      }
    }
    local_first[key] = in_chunk;
    global_first[key] = all;
    earlier_pairs[key] = earlier;
  }
  __syncthreads();
  // 2b. One warp turns the totals into exclusive prefix sums (m_indptr, the chunk's first rows):
  // lane l takes a contiguous run of keys, and __shfl_up_sync scans the runs' sums. A block-wide
  // scan had all 32 warps run it for at most 1025 keys: 43 % of the kernel's instructions at
  // 1024 pairs (ncu, eleventh session).
  if (warp == 0) {
    const int32_t per_lane = (num_keys + 31) / 32;
    const int32_t first_key = min(num_keys, lane * per_lane);
    const int32_t end_key = min(num_keys, first_key + per_lane);
    int32_t run_all = 0, run_chunk = 0;
    for (int32_t key = first_key; key < end_key; ++key) {
      run_all += global_first[key];
      run_chunk += local_first[key];
    }
    int32_t scan_all = run_all, scan_chunk = run_chunk;  // inclusive over lanes
#pragma unroll
    for (int d = 1; d < 32; d *= 2) {
      const int32_t up_all = __shfl_up_sync(0xffffffffu, scan_all, d);
      const int32_t up_chunk = __shfl_up_sync(0xffffffffu, scan_chunk, d);
      if (lane >= d) {
        scan_all += up_all;
        scan_chunk += up_chunk;
      }
    }
    int32_t row_all = scan_all - run_all, row_chunk = scan_chunk - run_chunk;
    for (int32_t key = first_key; key < end_key; ++key) {
      const int32_t all = global_first[key], in_chunk = local_first[key];
      if (blockIdx.x == 0) p.m_indptr[key] = row_all;
      global_first[key] = row_all + earlier_pairs[key];
      local_first[key] = row_chunk;
      row_all += all;
      row_chunk += in_chunk;
    }
  }
  __syncthreads();

  // 3. Place every pair, in pair order within its key.
  for (int32_t base = seg_begin; base < seg_end; base += 32) {
    const int32_t q = base + lane;
    const int32_t key = q < seg_end ? keys[q] : -1;
    const unsigned group = __match_any_sync(0xffffffffu, key);
    const int32_t offset = key >= 0 ? seg_table[key] + __popc(group & lanes_below) : 0;
    __syncwarp();  // every lane has read its group's offset before the leader advances it
    if (key >= 0 && lane == __ffs(group) - 1)
      seg_table[key] = static_cast<uint16_t>(seg_table[key] + __popc(group));
    __syncwarp();
    if (key >= 0) {
      staged[local_first[key] + offset] = q;
      p.row_of_pair[chunk_begin + q] =
          key < p.num_local_experts ? global_first[key] + offset : -1;
    }
  }
  __syncthreads();

  // 4. Write the sorted rows.
  for (int32_t local = threadIdx.x; local < chunk_pairs; local += kSortThreads) {
    const int32_t q = staged[local];
    const int32_t key = keys[q];
    const int32_t row = global_first[key] + (local - local_first[key]);
    const int64_t pair = chunk_begin + q;
    p.sorted_pair[row] = static_cast<int32_t>(pair);
    p.sorted_expert[row] = key;
    p.sorted_token[row] = static_cast<int32_t>(pair / p.topk);
  }
}

// Pairs per block of the multi-block path: at least kMultiMinChunk, so that at most
// kMultiMaxBlocks blocks cover the pairs.
int64_t multi_chunk(int64_t num_pairs) {
  return std::max<int64_t>(kMultiMinChunk, (num_pairs + kMultiMaxBlocks - 1) / kMultiMaxBlocks);
}

// One block over all pairs (multi = false), or multi_chunk(num_pairs) pairs per block.
template <typename IdT>
void launch_counting_sort(const PermuteArgs& a, const PermuteWorkspace& ws, bool multi,
                          cudaStream_t stream) {
  SortParams p;
  p.num_pairs = ws.num_pairs;
  p.topk = static_cast<int32_t>(a.topk);
  p.expert_map = a.expert_map;
  p.num_experts = a.num_experts;
  p.num_local_experts = static_cast<int32_t>(a.num_local_experts);
  p.chunk = static_cast<int32_t>(multi ? multi_chunk(ws.num_pairs) : ws.num_pairs);
  const int32_t num_keys = p.num_local_experts + 1;
  p.num_segments = sort_segments(p.chunk, num_keys);
  p.segment_len = (p.chunk + p.num_segments - 1) / p.num_segments;
  p.m_indptr = ws.m_indptr;
  p.sorted_pair = ws.sorted_pair;
  p.sorted_expert = ws.sorted_expert;
  p.sorted_token = ws.sorted_token;
  p.row_of_pair = ws.row_of_pair;
  const auto blocks = static_cast<unsigned>((ws.num_pairs + p.chunk - 1) / p.chunk);
  const IdT* ids = static_cast<const IdT*>(a.topk_ids);
  if (multi) {
    block_counts_kernel<IdT><<<blocks, kSortThreads, 0, stream>>>(ids, p, ws.block_counts);
    MODMOE_CUDA_CHECK_LAUNCH();
    p.block_counts = ws.block_counts;
  }
  const size_t smem = SortSmemLayout(p.num_segments, num_keys, p.chunk).bytes;
  auto* kernel = &counting_sort_kernel<IdT>;
  if (smem > 48 * 1024) {
    MODMOE_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           static_cast<int>(smem)));
  }
  kernel<<<blocks, kSortThreads, smem, stream>>>(ids, p);
  MODMOE_CUDA_CHECK_LAUNCH();
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
  return num_pairs <= kMaxChunk && num_local_experts <= kMaxExperts;
}

bool permute_multi_block_fits(int64_t num_pairs, int64_t num_local_experts) {
  return multi_chunk(num_pairs) <= kMaxChunk && num_local_experts <= kMaxExperts;
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
  // multi_block's per-block key counts: only where that path can run.
  ws.block_counts = carver.take<int32_t>(
      num_local_experts <= kMaxExperts ? int64_t{kMultiMaxBlocks} * (num_local_experts + 1) : 0);
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
  const bool single_fits = permute_single_block_fits(num_pairs, a.num_local_experts);
  const bool multi_fits = permute_multi_block_fits(num_pairs, a.num_local_experts);
  MODMOE_CHECK(a.force_path != PermutePath::single_block || single_fits)
      << kFn << ": force_path = single_block needs num_pairs <= " << kMaxChunk
      << " and E_local <= " << kMaxExperts << ", got num_pairs = " << num_pairs
      << ", E_local = " << a.num_local_experts;
  MODMOE_CHECK(a.force_path != PermutePath::multi_block || multi_fits)
      << kFn << ": force_path = multi_block needs num_pairs <= " << kMultiMaxBlocks * kMaxChunk
      << " and E_local <= " << kMaxExperts << ", got num_pairs = " << num_pairs
      << ", E_local = " << a.num_local_experts;

  if (num_pairs == 0) {
    MODMOE_CUDA_CHECK(
        cudaMemsetAsync(ws.m_indptr, 0, sizeof(int32_t) * (a.num_local_experts + 1), stream));
    return;
  }
  PermutePath path = a.force_path;
  if (path == PermutePath::automatic) {
    path = permute_single_block_preferred(num_pairs, a.num_local_experts) ? PermutePath::single_block
           : multi_fits                                                   ? PermutePath::multi_block
                                                                          : PermutePath::radix_sort;
  }
  if (path == PermutePath::radix_sort) return radix_sort_permute(a, ws, stream);
  const bool multi = path == PermutePath::multi_block;
  if (a.ids_dtype == DType::int64) {
    launch_counting_sort<int64_t>(a, ws, multi, stream);
  } else {
    launch_counting_sort<int32_t>(a, ws, multi, stream);
  }
}

}  // namespace modmoe::cuda
