// One forward of a test problem through NoEPPrepareAndFinalize + the given experts on the GPU:
// the problem's host tensors copied to the device, the output copied back.
#pragma once

#include <memory>
#include <utility>

#include "core/prepare_finalize_kinds.h"
#include "cuda/cuda_prepare_finalize.h"
#include "cuda/cuda_session.h"
#include "modmoe/modmoe.h"
#include "oracle/problem.h"

namespace modmoe::testing {

// The CUDA NoEP prepare that always quantizes, as a prepare before an all-to-all would, even
// for experts that expect unquantized rows (Experts::expects_unquantized_input): they then get
// e4m3 rows and their scales instead of the hidden states.
class QuantizingNoEP final : public NoEPPrepareAndFinalizeBase {
 public:
  explicit QuantizingNoEP(const MoEConfig& c)
      : NoEPPrepareAndFinalizeBase(c), inner_(std::make_shared<cuda::NoEPPrepareAndFinalize>(c)) {}
  PrepareResult prepare(const Context& ctx, const PrepareArgs& args) override {
    PrepareArgs quantize = args;
    quantize.defer_input_quantization = false;
    return inner_->prepare(ctx, quantize);
  }
  void finalize(const Context& ctx, const FinalizeArgs& f, const TopKWeightAndReduce& w) override {
    inner_->finalize(ctx, f, w);
  }

 private:
  std::shared_ptr<cuda::NoEPPrepareAndFinalize> inner_;
};

// One forward of `p` through NoEP (or `prepare`) + `experts` on the GPU; the output on the host.
inline OwnedTensor forward_on_gpu(CudaSession& s, const Problem& p,
                                  std::shared_ptr<Experts> experts, const Context& ctx,
                                  std::shared_ptr<PrepareAndFinalize> prepare = nullptr) {
  const MoEConfig& cfg = p.spec.config;
  if (!prepare) prepare = std::make_shared<cuda::NoEPPrepareAndFinalize>(cfg);
  ModularKernel kernel(std::move(prepare), std::move(experts));
  ForwardArgs a = p.forward_args();
  OwnedTensor hidden = s.to_device(p.hidden_states), weights = s.to_device(p.topk_weights),
              ids = s.to_device(p.topk_ids), out = s.to_device(p.output), w13 = s.to_device(p.w13),
              w2 = s.to_device(p.w2);
  OwnedTensor map, w13s, w2s;
  if (p.expert_map.tensor().defined()) map = s.to_device(p.expert_map);
  if (p.w13_scale.tensor().defined())
    w13s = s.to_device(p.w13_scale), w2s = s.to_device(p.w2_scale);
  a.hidden_states = hidden;
  a.topk_weights = weights;
  a.topk_ids = ids;
  a.output = out;
  a.expert_map = map;
  a.weights.w13 = w13;
  a.weights.w2 = w2;
  a.weights.w13_scale = w13s;
  a.weights.w2_scale = w2s;
  kernel.forward(ctx, a);
  return s.to_host(out);
}

}  // namespace modmoe::testing
