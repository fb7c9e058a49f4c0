// Checks and helpers shared by the CUDA experts (CudaExperts, BatchedCudaExperts and their
// Hopper twins): the config they accept, the workspaces they were given, the apply inputs.
#pragma once

#include <cstddef>

#include "cuda/permute.h"
#include "cuda/reduce.h"
#include "modmoe/experts.h"

namespace modmoe::cuda {

// bf16/fp16 inputs (fp32 only with an fp8 scheme) and positive sizes.
void check_experts_config(const char* name, const MoEConfig& c);

// A contiguous device buffer of at least `bytes` bytes on `device`.
void check_workspace(const char* fn, const char* arg, const Tensor& ws, size_t bytes,
                     Device device);

// Inputs shared by the experts; `a1q_rows` is the row shape of the activations ((M) standard,
// (E_local, T) batched). `may_be_unquantized`: with a quantized scheme the activations may also
// come in in_dtype with no a1q_scale (Experts::expects_unquantized_input).
void check_apply_inputs(const char* fn, const Context& ctx, const MoEConfig& c, const ApplyArgs& a,
                        const Shape& a1q_rows, bool may_be_unquantized = false);

// The checks of a standard-format apply ((M, K) activations and output, topk ids and weights,
// expert_map). Returns M.
int64_t check_standard_apply(const char* fn, const Context& ctx, const MoEConfig& c,
                             const ApplyArgs& a, bool may_be_unquantized = false);

// The batched experts' own settings: max_num_tokens > 0 and num_dispatchers >= 1.
void check_batched_experts(const char* name, const MoEConfig& c, int num_dispatchers);

// The checks of a batched apply over (E_local, T, K) activations, expert_num_tokens and the
// (E_local, T, K) fp32 output.
void check_batched_apply(const char* fn, const Context& ctx, const MoEConfig& c, const ApplyArgs& a,
                         int64_t T);

// The permute of a standard apply: the routing of its M tokens over the local experts.
PermuteArgs standard_permute_args(const MoEConfig& c, const ApplyArgs& a, int64_t M);

// The unpermute + top-k weight + reduce of a standard apply, from y (M * topk, K) rows of
// y_dtype (row_of_pair from the permute) into a.output:
// out[t] = sum_k w[t, k] * y[row_of_pair[t, k]], summed in fp32.
WeightedReduceArgs standard_reduce_args(const MoEConfig& c, const ApplyArgs& a, const void* y,
                                        DType y_dtype, const int32_t* row_of_pair, int64_t M);

// Byte workspaces (uint8) and the output shape.
WorkspaceShapes byte_workspaces(size_t ws13_bytes, size_t ws2_bytes, Shape output,
                                DType output_dtype);

}  // namespace modmoe::cuda
