// Argument checks shared by every public entry point. Each throws modmoe::Error with
// "<fn>: <arg> must be <expected>, got <actual>".
#pragma once

#include <initializer_list>
#include <string>

#include "modmoe/context.h"
#include "modmoe/error.h"
#include "modmoe/moe_types.h"
#include "modmoe/tensor.h"

namespace modmoe {

// "bf16" or "int32 or int64".
std::string dtype_list(std::initializer_list<DType> dtypes);

// `t` must be defined, on `device`, one of `dtypes`, with exactly `shape` (`shape_names` such as
// "(M, K)" documents it in the message; pass "" to omit), and row-major contiguous.
void check_tensor(const char* fn, const char* arg, const Tensor& t,
                  std::initializer_list<DType> dtypes, const Shape& shape,
                  const char* shape_names, Device device);

// The scale tensor of a quantized operand: dtype and shape from the scheme.
void check_scale(const char* fn, const char* arg, const Tensor& scale, QuantScheme scheme,
                 const Shape& expected_shape, Device device);

// Weights of the local experts against the layer config (dtypes, shapes, scales).
void check_expert_weights(const char* fn, const ExpertWeights& w, const MoEConfig& config,
                          Device device);

// A backend's part was handed a Context for another device.
void check_context_device(const char* fn, const Context& ctx, DeviceType expected);

// topk_ids values in [0, num_experts) and expert_map values in [-1, num_local_experts).
// Reads memory: host tensors only (device backends check inside their kernels).
void check_routing_values(const char* fn, const Tensor& topk_ids, int64_t num_experts,
                          const Tensor& expert_map, int64_t num_local_experts);

}  // namespace modmoe
