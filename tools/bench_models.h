// The standard MoE layer shapes of ARCHITECTURE.md §10, shared by the CPU and GPU benchmarks.
#pragma once

#include <cstdint>
#include <string>

#include "modmoe/activation.h"
#include "modmoe/moe_types.h"
#include "modmoe/router.h"

namespace modmoe::bench {

enum class Routing : uint8_t {
  softmax_topk,  // softmax, top-k, renormalized (Mixtral, Qwen, gpt-oss's softmax over top-4)
  deepseek,      // sigmoid, grouped top-k (8 groups, keep 4), correction bias, x2.5
};

struct ModelShape {
  const char* name;
  int64_t E, topk, K, N;
  Activation activation;
  Routing routing;
};

inline constexpr ModelShape kModels[] = {
    {"mixtral-8x7b", 8, 2, 4096, 14336, Activation::silu, Routing::softmax_topk},
    {"qwen3-30b-a3b", 128, 8, 2048, 768, Activation::silu, Routing::softmax_topk},
    {"qwen3.5-35b-a3b", 256, 8, 2048, 512, Activation::silu, Routing::softmax_topk},
    {"deepseek-v3", 256, 8, 7168, 2048, Activation::silu, Routing::deepseek},
    {"gpt-oss-120b", 128, 4, 2880, 2880, Activation::swigluoai, Routing::softmax_topk},
};

// DeepSeek-V3's router (ARCHITECTURE.md §10).
inline GroupedTopKParams deepseek_routing() {
  GroupedTopKParams p;
  p.num_groups = 8;
  p.topk_groups = 4;
  p.scoring = ScoringFunc::sigmoid;
  p.renormalize = true;
  p.routed_scaling_factor = 2.5f;
  return p;
}

inline const ModelShape* find_model(const std::string& name) {
  for (const ModelShape& m : kModels)
    if (name == m.name) return &m;
  return nullptr;
}

// The layer config the benchmark builds for a model: bf16 activations, [gate; up] halves.
inline MoEConfig model_config(const ModelShape& m, DType dtype, QuantConfig quant) {
  MoEConfig c;
  c.num_experts = c.num_local_experts = m.E;
  c.topk = m.topk;
  c.hidden_size = m.K;
  c.intermediate_size = m.N;
  c.in_dtype = dtype;
  c.quant = quant;
  c.activation = m.activation;
  c.gated_layout = GatedLayout::GateUp;
  return c;
}

}  // namespace modmoe::bench
