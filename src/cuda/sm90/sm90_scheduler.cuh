// The tile schedulers of the Hopper grouped GEMM (see sm90_gemm.h). Each persistent CTA takes
// the global tile indices t = blockIdx.x, blockIdx.x + gridDim.x, ... in increasing order; tile
// t is found in the order "expert by expert; inside an expert, row blocks fastest, then column
// blocks" (the CTAs working at once on one expert share its weight tile through the L2).
// Tiles of expert e: ceil(rows_e / BM) row blocks x n_blocks column blocks; rows_e comes from
// m_indptr (or the batched counts) on the device.
//
// All three finders run in one warp (the scheduler warp) and return the same tiles:
//   CooperativeFinder  32 experts per window, one per lane: a __shfl_up_sync prefix sum of
//                      their tile counts, __ballot_sync + __ffs to find the lane owning t;
//                      the window only moves forward (t only grows).
//   LinearScanFinder   walks the experts one at a time (the baseline of the A/B benchmark).
//   ListFinder         reads a precomputed list (build_tile_list; entry 0 holds the count).
#pragma once

#include <cstdint>

#include "cuda/sm90/sm90_gemm.h"

namespace modmoe::cuda::sm90 {

struct ScheduleParams {
  const int32_t* m_indptr;           // standard: rows of e = [m_indptr[e], m_indptr[e+1])
  const int32_t* expert_num_tokens;  // batched: rows of e = e * batch_rows + [0, count)
  int32_t batch_rows;
  int32_t E;
  int32_t n_blocks;  // column blocks per expert
  const WorkTile* tile_list;
};

// The rows expert e owns (a batched count is clamped to [0, batch_rows]).
__device__ __forceinline__ void expert_rows(const ScheduleParams& p, int32_t e, int32_t& begin,
                                            int32_t& end) {
  if (p.expert_num_tokens != nullptr) {
    begin = e * p.batch_rows;
    end = begin + min(max(p.expert_num_tokens[e], 0), p.batch_rows);
  } else {
    begin = p.m_indptr[e];
    end = p.m_indptr[e + 1];
  }
}

__device__ __forceinline__ WorkTile end_of_work() { return WorkTile{-1, 0, 0, 0}; }

__device__ __forceinline__ int32_t row_blocks(int32_t rows, int32_t bm) {
  return rows > 0 ? (rows + bm - 1) / bm : 0;
}

template <int BM>
class CooperativeFinder {
 public:
  __device__ explicit CooperativeFinder(const ScheduleParams& p) : p_(p) { load_window(); }

  // The tile with global index t (t never decreases between calls).
  __device__ WorkTile find(int32_t t) {
    while (t >= tiles_before_ + window_tiles_) {
      if (window_ + 32 >= p_.E) return end_of_work();
      tiles_before_ += window_tiles_;
      window_ += 32;
      load_window();
    }
    const uint32_t owners = __ballot_sync(0xffffffffu, tiles_before_ + inclusive_ > t);
    const int owner = __ffs(owners) - 1;
    const int32_t first = __shfl_sync(0xffffffffu, inclusive_ - tiles_, owner);
    const int32_t begin = __shfl_sync(0xffffffffu, begin_, owner);
    const int32_t end = __shfl_sync(0xffffffffu, end_, owner);
    const int32_t local = t - tiles_before_ - first;
    const int32_t m_blocks = row_blocks(end - begin, BM);
    return WorkTile{window_ + owner, begin + (local % m_blocks) * BM, end, local / m_blocks};
  }

 private:
  __device__ void load_window() {
    const int lane = threadIdx.x % 32;
    const int32_t e = window_ + lane;
    begin_ = end_ = 0;
    if (e < p_.E) expert_rows(p_, e, begin_, end_);
    tiles_ = row_blocks(end_ - begin_, BM) * p_.n_blocks;
    inclusive_ = tiles_;
#pragma unroll
    for (int offset = 1; offset < 32; offset *= 2) {
      const int32_t below = __shfl_up_sync(0xffffffffu, inclusive_, offset);
      if (lane >= offset) inclusive_ += below;
    }
    window_tiles_ = __shfl_sync(0xffffffffu, inclusive_, 31);
  }

  ScheduleParams p_;
  int32_t window_ = 0;        // first expert of the window
  int32_t tiles_before_ = 0;  // tiles of the experts before the window
  int32_t window_tiles_ = 0;
  int32_t begin_ = 0, end_ = 0, tiles_ = 0, inclusive_ = 0;  // this lane's expert
};

template <int BM>
class LinearScanFinder {
 public:
  __device__ explicit LinearScanFinder(const ScheduleParams& p) : p_(p) { load(); }

  __device__ WorkTile find(int32_t t) {
    while (expert_ < p_.E && t >= tiles_before_ + tiles_) {
      tiles_before_ += tiles_;
      ++expert_;
      load();
    }
    if (expert_ >= p_.E) return end_of_work();
    const int32_t local = t - tiles_before_;
    const int32_t m_blocks = row_blocks(end_ - begin_, BM);
    return WorkTile{expert_, begin_ + (local % m_blocks) * BM, end_, local / m_blocks};
  }

 private:
  __device__ void load() {
    begin_ = end_ = tiles_ = 0;
    if (expert_ < p_.E) {
      expert_rows(p_, expert_, begin_, end_);
      tiles_ = row_blocks(end_ - begin_, BM) * p_.n_blocks;
    }
  }

  ScheduleParams p_;
  int32_t expert_ = 0, tiles_before_ = 0;
  int32_t begin_ = 0, end_ = 0, tiles_ = 0;
};

class ListFinder {
 public:
  __device__ explicit ListFinder(const ScheduleParams& p)
      : list_(p.tile_list), count_(p.tile_list[0].expert) {}
  __device__ WorkTile find(int32_t t) const { return t < count_ ? list_[1 + t] : end_of_work(); }

 private:
  const WorkTile* list_;
  int32_t count_;
};

}  // namespace modmoe::cuda::sm90
