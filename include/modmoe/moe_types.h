// The shared vocabulary of the modular kernel: activation formats, the layer configuration,
// expert weights and per-expert token metadata.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "modmoe/activation.h"
#include "modmoe/quant.h"
#include "modmoe/tensor.h"

namespace modmoe {

// How prepare() hands activations to the experts (vLLM FusedMoEActivationFormat).
enum class ActivationFormat : uint8_t {
  Standard,  // a1q (M, K) contiguous rows + topk_ids/topk_weights (M, topk)
  Batched,   // a1q (E_local, max_tokens, K) + expert_num_tokens (E_local)
};
const char* activation_format_name(ActivationFormat f);

// The MoE layer a kernel is built for. Parts are constructed from it; forward() checks the
// tensors it gets against it.
struct MoEConfig {
  int64_t num_experts = 0;        // global E
  int64_t num_local_experts = 0;  // E_local (w13.size(0)); == num_experts without EP
  int64_t hidden_size = 0;        // K
  int64_t intermediate_size = 0;  // N (w13 has 2N rows when gated, N otherwise)
  int64_t topk = 0;
  DType in_dtype = DType::bf16;   // dtype of hidden_states and output: bf16/fp16/fp32
  QuantConfig quant{};
  Activation activation = Activation::silu;
  GatedLayout gated_layout = GatedLayout::GateUp;
  // Batched formats: tokens one rank may send per forward (vLLM max_num_tokens_per_rank).
  int64_t max_num_tokens = 0;

  int64_t w13_rows() const { return is_gated(activation) ? 2 * intermediate_size : intermediate_size; }
  std::string str() const;
};

// The expert weights (and static activation scales) of the local experts.
struct ExpertWeights {
  Tensor w13;        // (E_local, 2N, K) gated, (E_local, N, K) for _no_mul activations
  Tensor w2;         // (E_local, K, N)
  Tensor w13_scale;  // weight_scale_shape(scheme, E_local, w13 rows, K); undefined when none
  Tensor w2_scale;   // weight_scale_shape(scheme, E_local, K, N)
  Tensor a13_scale;  // static activation scale of GEMM1's input (fp32 (1)), static schemes
  Tensor a2_scale;   // static activation scale of GEMM2's input (fp32 (1)), static schemes
};

// Tokens per local expert, as produced by a batched prepare (vLLM ExpertTokensMetadata).
struct ExpertTokensMetadata {
  Tensor expert_num_tokens;      // int32 (E_local), on the compute device
  Tensor expert_num_tokens_cpu;  // int32 (E_local) host copy, or undefined
};

}  // namespace modmoe
