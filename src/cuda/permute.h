// The permute step on the device: groups the (token, k) pairs of a routing by local expert.
//
// Pair p = t * topk + k is routed to local expert e = expert_map[topk_ids[t, k]] (or the id
// itself without a map). A stable sort on e puts the pairs of expert 0 first, then expert 1,
// ..., each expert's pairs in pair order (= token order, the order the CPU reference and
// NaiveBatched use), and the pairs of no local expert last. Three implementations give the same
// bits (PermutePath):
//   single_block  num_pairs <= 8192, E_local <= 1024: one launch, one 1024-thread block, a
//                 counting sort in shared memory. The automatic choice takes it up to 2048
//                 pairs (decode and small batches).
//   multi_block   num_pairs <= 64 * 8192, E_local <= 1024: the same sort by up to 64 blocks,
//                 one chunk of the pairs each, after a launch that counts each chunk's keys.
//                 The automatic choice past 2048 pairs.
//   radix_sort    anything: CUB DeviceRadixSort plus two kernels of ours (five launches or
//                 more); the automatic choice where neither counting sort fits.
// From that order:
//
//   m_indptr[e]     (E_local + 1) rows of expert e are [m_indptr[e], m_indptr[e+1]);
//                   m_indptr[E_local] = number of local pairs
//   sorted_pair[r]  pair of row r (rows >= m_indptr[E_local]: the non-local pairs)
//   sorted_expert[r] local expert of row r (E_local for the non-local tail)
//   sorted_token[r] token of row r = sorted_pair[r] / topk: the A row of the fused gather
//   row_of_pair[p]  the inverse: row of pair p, -1 when p is not routed to a local expert
//
// Everything stays on the device and nothing synchronizes: CUB's scratch size is a host-side
// query (no device work), the scratch itself is part of the workspace (carved whichever path
// runs, so one workspace serves both), and the path is chosen from host-known sizes only.
// Ids outside [0, E) and map entries outside [0, E_local) count as "not local": the kernels
// never index out of bounds on bad routing (the CPU path rejects it with an error instead).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "cuda/byte_carver.h"
#include "modmoe/dtype.h"

namespace modmoe::cuda {

// The permute's arrays, carved from a byte workspace. With a null-base carver only the size
// is counted (the pointers stay null).
struct PermuteWorkspace {
  static PermuteWorkspace carve(ByteCarver& carver, int64_t num_pairs, int64_t num_local_experts);

  int64_t num_pairs = 0;
  int64_t num_local_experts = 0;
  // Outputs.
  int32_t* m_indptr = nullptr;       // (E_local + 1)
  int32_t* sorted_pair = nullptr;    // (num_pairs)
  int32_t* sorted_expert = nullptr;  // (num_pairs)
  int32_t* sorted_token = nullptr;   // (num_pairs)
  int32_t* row_of_pair = nullptr;    // (num_pairs)
  // Scratch.
  uint32_t* keys = nullptr;     // (num_pairs) unsorted local expert per pair
  int32_t* pair_ids = nullptr;  // (num_pairs) 0, 1, ..., num_pairs - 1
  void* sort_temp = nullptr;    // CUB DeviceRadixSort scratch
  int32_t* block_counts = nullptr;  // multi_block: (64, E_local + 1) per-block key counts
  size_t sort_temp_bytes = 0;
  int sort_end_bit = 1;  // keys are in [0, E_local]: only these low bits are sorted
};

// Which implementation runs (see the top of this file). All give identical outputs; forcing
// one exists for tests and benchmarks.
enum class PermutePath : uint8_t { automatic, single_block, radix_sort, multi_block };

// Whether the one-block counting sort handles this size (what force_path = single_block needs).
bool permute_single_block_fits(int64_t num_pairs, int64_t num_local_experts);
// Whether the multi-block counting sort handles this size (what force_path = multi_block needs).
bool permute_multi_block_fits(int64_t num_pairs, int64_t num_local_experts);
// Whether the `automatic` choice takes it: it fits and num_pairs <= 2048.
bool permute_single_block_preferred(int64_t num_pairs, int64_t num_local_experts);

struct PermuteArgs {
  const void* topk_ids = nullptr;  // (num_tokens, topk) int32 or int64, global expert ids
  DType ids_dtype = DType::int32;
  int64_t num_tokens = 0;
  int64_t topk = 0;
  const int32_t* expert_map = nullptr;  // (num_experts) global -> local, -1 = not here; or null
  int64_t num_experts = 0;              // E
  int64_t num_local_experts = 0;        // E_local
  // automatic: single_block when permute_single_block_preferred, else multi_block when it fits,
  // else radix_sort. Forcing a counting sort on a size it does not fit is an error.
  PermutePath force_path = PermutePath::automatic;
};

// Fills the outputs of `ws` (carved for num_tokens * topk pairs and E_local experts).
void permute(const PermuteArgs& args, const PermuteWorkspace& ws, cudaStream_t stream);

}  // namespace modmoe::cuda
