// Experts: permute -> GEMM1 -> activation -> [quantize] -> GEMM2 -> unpermute
// [-> top-k weight and reduce]. The core of the MoE layer.
#pragma once

#include <string>
#include <utility>

#include "modmoe/context.h"
#include "modmoe/moe_types.h"
#include "modmoe/topk_weight_and_reduce.h"

namespace modmoe {

// What Experts needs allocated for one apply() over M tokens (vLLM workspace_shapes()).
struct WorkspaceShapes {
  Shape workspace13;  // first scratch buffer (GEMM1 output, ...)
  Shape workspace2;   // second scratch buffer (activation output, ...)
  Shape output;       // fused_expert_output: (M, K) for NoOp, (M, topk, K) otherwise,
                      // (E_local, max_tokens, K) for batched experts
  DType workspace_dtype = DType::fp32;  // of workspace13 and workspace2
  DType output_dtype = DType::fp32;     // of the fused expert output
};

struct ApplyArgs {
  Tensor output;         // workspace_shapes().output, written by apply
  Tensor hidden_states;  // a1q: (M, K) or (E_local, max_tokens, K)
  Tensor a1q_scale;      // undefined when not quantized (or left to the experts: in_dtype rows)
  const ExpertWeights* weights = nullptr;
  Tensor topk_weights;  // fp32 (M, topk)
  Tensor topk_ids;      // (M, topk), global ids
  int64_t global_num_experts = 0;
  Tensor expert_map;  // int32 (E), or undefined
  Tensor workspace13;
  Tensor workspace2;
  const ExpertTokensMetadata* expert_tokens_meta = nullptr;  // batched formats
  bool apply_router_weight_on_input = false;
};

class Experts {
 public:
  explicit Experts(const MoEConfig& config) : config_(config) {}
  virtual ~Experts() = default;

  virtual std::string name() const = 0;
  const MoEConfig& config() const { return config_; }

  // (input format, output format).
  virtual std::pair<ActivationFormat, ActivationFormat> activation_formats() const = 0;
  virtual bool supports_expert_map() const = 0;
  // True when apply() may be called on slices of the tokens (Standard formats).
  virtual bool supports_chunking() const = 0;
  virtual WorkspaceShapes workspace_shapes(int64_t M, int64_t N, int64_t K, int64_t topk,
                                           int64_t global_num_experts,
                                           int64_t local_num_experts,
                                           const ExpertTokensMetadata* meta) const = 0;
  // NoOp when apply() already weighted and reduced over top-k.
  virtual TopKWeightAndReducePtr finalize_weight_and_reduce_impl() const = 0;
  // True when apply() never reads workspace13 after it starts writing `output`, so the kernel
  // may place the fused output inside workspace13 (vLLM reuses workspace13 the same way).
  virtual bool workspace13_reusable_for_output() const { return false; }
  // True when apply() quantizes the activations itself (e.g. inside the gather that groups the
  // rows by expert: each token is then read once and written topk times already quantized, and
  // no quantize kernel runs before the experts). A prepare whose dispatch does not need the
  // quantized rows (no all-to-all: NoEPPrepareAndFinalize) then hands over the unquantized
  // hidden states (a1q in in_dtype, a1q_scale undefined; PrepareArgs::defer_input_quantization).
  // Such an apply() must still accept quantized activations, from prepares that quantize
  // anyway (vLLM: expects_unquantized_inputs).
  virtual bool expects_unquantized_input() const { return false; }
  virtual void apply(const Context& ctx, const ApplyArgs& args) = 0;

 private:
  MoEConfig config_;
};

}  // namespace modmoe
