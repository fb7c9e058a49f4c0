// The batched layout on the device (raw pointers + stream): (E_local, T, ...) tensors whose
// expert e holds its tokens in rows [0, expert_num_tokens[e]), in token order (the order the
// CPU BatchedPrepareAndFinalize scatters them in and NaiveBatched reduces them in).
//
// Built from a finished permute (permute.h), whose stable sort already gives each pair its rank
// among the pairs of its expert. Rows past a count are never written here; a count above T
// (more pairs for one expert than T rows, only possible with duplicate ids in a row) is clamped
// to T and the extra pairs are dropped rather than written out of bounds.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/permute.h"

namespace modmoe::cuda {

// batched_row[p] = e * T + rank of pair p among expert e's pairs, -1 for non-local pairs
// (and pairs past T); expert_num_tokens[e] = min(pairs of expert e, T). Both may be null.
void batched_slots(const PermuteWorkspace& perm, int64_t T, int32_t* batched_row,
                   int32_t* expert_num_tokens, cudaStream_t stream);

// Row copies of `row_bytes` bytes; strides in bytes.
//   scatter: dst row batched_row[p] = src row p / topk, for every pair p with batched_row[p] >= 0
//   gather:  dst row p = src row batched_row[p], or zeros when batched_row[p] < 0
void batched_scatter_rows(const void* src, int64_t src_stride, void* dst, int64_t dst_stride,
                          int64_t row_bytes, const int32_t* batched_row, int64_t num_pairs,
                          int64_t topk, cudaStream_t stream);
void batched_gather_rows(const void* src, int64_t src_stride, void* dst, int64_t dst_stride,
                         int64_t row_bytes, const int32_t* batched_row, int64_t num_pairs,
                         cudaStream_t stream);

// One gather's source and destination (strides in bytes).
struct RowCopy {
  const void* src;
  int64_t src_stride;
  void* dst;
  int64_t dst_stride;
  int64_t row_bytes;
};
// Two gathers by the same batched_row (rows and their scale rows): one launch where a copy unit
// fits both, else two (one launch less per forward: 1-4 % at fp8 M = 16 / 128, perf.md).
void batched_gather_rows(const RowCopy& a, const RowCopy& b, const int32_t* batched_row,
                         int64_t num_pairs, cudaStream_t stream);

// The valid rows of a batched tensor, packed (so the experts run one standard grouped GEMM
// over them and quantize them with one device row bound):
//   counts[e]             = clamp(expert_num_tokens[e], 0, T), further cut so that the total
//                           stays <= max_rows (the packed buffers' capacity; never binds for
//                           counts a dispatch produced)
//   m_indptr (E_local+1)  = exclusive prefix sum of counts; m_indptr[E_local] = valid rows
//   packed_to_batched[m_indptr[e] + i] = e * T + i        for i < counts[e]
//   batched_to_packed[e * T + i]       = m_indptr[e] + i  for i < counts[e] (others unwritten)
void batched_pack_indices(const int32_t* expert_num_tokens, int64_t E_local, int64_t T,
                          int64_t max_rows, int32_t* counts, int32_t* m_indptr,
                          int32_t* packed_to_batched, int32_t* batched_to_packed,
                          cudaStream_t stream);

}  // namespace modmoe::cuda
