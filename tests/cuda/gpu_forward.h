// One forward of a test problem through NoEPPrepareAndFinalize + the given experts on the GPU:
// the problem's host tensors copied to the device, the output copied back.
#pragma once

#include <memory>
#include <utility>

#include "cuda/cuda_prepare_finalize.h"
#include "cuda/cuda_session.h"
#include "modmoe/modmoe.h"
#include "oracle/problem.h"

namespace modmoe::testing {

// One forward of `p` through NoEP + `experts` on the GPU; the output on the host.
inline OwnedTensor forward_on_gpu(CudaSession& s, const Problem& p,
                                  std::shared_ptr<Experts> experts, const Context& ctx) {
  const MoEConfig& cfg = p.spec.config;
  ModularKernel kernel(std::make_shared<cuda::NoEPPrepareAndFinalize>(cfg), std::move(experts));
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
