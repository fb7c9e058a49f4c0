// Unpermute + top-k weight + reduce on the device (raw pointers + stream):
//
//   out[t, :] = sum over k = 0 .. topk-1 of  w[t, k] * src[row(t, k), :]
//
// skipping the pairs whose row is -1 (routed to an expert that is not local). Every output
// element is one thread's fp32 sum in fixed k order: deterministic, no atomics, and the same
// order as the CPU reduce. Where row(t, k) comes from:
//   pair_row given:  pair_row[t * topk + k]  (the permute's row_of_pair, or the batched slots)
//   pair_row null:   t * topk + k itself (src is (M, topk, K), TopKWeightAndReduceContiguous),
//                    -1 when expert_map says topk_ids[t, k] is not local (no map: all local)
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "modmoe/dtype.h"

namespace modmoe::cuda {

struct WeightedReduceArgs {
  const void* src = nullptr;  // rows of K elements, bf16/fp16/fp32
  DType src_dtype = DType::fp32;
  int64_t src_ld = 0;  // elements between src rows

  const int32_t* pair_row = nullptr;  // (M * topk) or null (see above)
  // Only read when pair_row is null and expert_map is given.
  const void* topk_ids = nullptr;  // (M, topk) int32/int64
  DType ids_dtype = DType::int32;
  const int32_t* expert_map = nullptr;  // (num_experts)
  int64_t num_experts = 0;

  const float* topk_weights = nullptr;  // (M, topk); null: every weight is 1 (router weight
                                        // already applied on the input)
  int64_t M = 0, topk = 0, K = 0;

  void* out = nullptr;  // (M, K) rows, bf16/fp16/fp32; must not overlap src
  DType out_dtype = DType::fp32;
  int64_t out_ld = 0;

  // A programmatic dependent launch of the stream's previous kernel (programmatic_launch.cuh;
  // sm_90, not with MODMOE_PDL=0): the blocks read pair_row / topk_ids / expert_map and
  // topk_weights before they wait for that kernel, src and out after. So the former must have
  // been written before it began (Sm90Experts: the permute's and the router's, before GEMM2).
  bool programmatic = false;
};

void weighted_reduce(const WeightedReduceArgs& args, cudaStream_t stream);

}  // namespace modmoe::cuda
