// Checks and helpers shared by the CUDA experts (CudaExperts, BatchedCudaExperts and their
// Hopper twins): the config they accept, the workspaces they were given, the apply inputs.
#pragma once

#include <cstddef>

#include "modmoe/experts.h"

namespace modmoe::cuda {

// bf16/fp16 inputs (fp32 only with an fp8 scheme) and positive sizes.
void check_experts_config(const char* name, const MoEConfig& c);

// A contiguous device buffer of at least `bytes` bytes on `device`.
void check_workspace(const char* fn, const char* arg, const Tensor& ws, size_t bytes,
                     Device device);

// Inputs shared by the experts; `a1q_rows` is the row shape of the activations ((M) standard,
// (E_local, T) batched).
void check_apply_inputs(const char* fn, const Context& ctx, const MoEConfig& c, const ApplyArgs& a,
                        const Shape& a1q_rows);

// Byte workspaces (uint8) and the output shape.
WorkspaceShapes byte_workspaces(size_t ws13_bytes, size_t ws2_bytes, Shape output,
                                DType output_dtype);

}  // namespace modmoe::cuda
