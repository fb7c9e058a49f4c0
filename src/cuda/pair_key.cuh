// Which local expert a (token, k) pair goes to, on the device: one definition for every kernel
// that reads topk_ids (the permute's sort keys, the decode path).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace modmoe::cuda {

// The local expert of pair p, or E_local when it goes to no local expert (id outside [0, E),
// or a map entry outside [0, E_local)): bad routing never indexes out of bounds.
template <typename IdT>
__device__ __forceinline__ int32_t pair_key(const IdT* __restrict__ ids, int64_t p,
                                            const int32_t* __restrict__ expert_map,
                                            int64_t num_experts, int32_t num_local_experts) {
  const int64_t id = static_cast<int64_t>(ids[p]);
  int64_t local = -1;
  if (id >= 0 && id < num_experts) local = expert_map ? expert_map[id] : id;
  return (local >= 0 && local < num_local_experts) ? static_cast<int32_t>(local)
                                                   : num_local_experts;
}

}  // namespace modmoe::cuda
