#include "cpu/topk_weight_and_reduce.h"

#include <cstring>
#include <vector>

#include "core/validate.h"
#include "cpu/rows.h"
#include "modmoe/numeric.h"

namespace modmoe::cpu {

namespace {

struct ReduceShape {
  int64_t M, topk, K;
};

ReduceShape check_common(const char* fn, const ReduceArgs& a) {
  MODMOE_CHECK(a.output.defined() && a.output.ndim() == 2)
      << fn << ": output must be 2-D (M, K), got " << a.output.describe();
  const int64_t M = a.output.size(0), K = a.output.size(1);
  MODMOE_CHECK(a.topk_ids.defined() && a.topk_ids.ndim() == 2 && a.topk_ids.size(0) == M)
      << fn << ": topk_ids must be (M, topk) with M = " << M << ", got " << a.topk_ids.describe();
  const int64_t topk = a.topk_ids.size(1);
  check_tensor(fn, "output", a.output, {DType::bf16, DType::fp16, DType::fp32}, {M, K}, "(M, K)",
               Device::cpu());
  check_tensor(fn, "topk_ids", a.topk_ids, {DType::int32, DType::int64}, {M, topk}, "(M, topk)",
               Device::cpu());
  if (!a.apply_router_weight_on_input)
    check_tensor(fn, "topk_weights", a.topk_weights, {DType::fp32}, {M, topk}, "(M, topk)",
                 Device::cpu());
  if (a.expert_map.defined())
    MODMOE_CHECK(a.expert_map.dtype() == DType::int32 && a.expert_map.ndim() == 1)
        << fn << ": expert_map must be int32 (E), got " << a.expert_map.describe();
  return {M, topk, K};
}

// output[t] = sum over k of weight(t, k) * row(t, k), skipping pairs whose row is null.
template <typename RowOf>
void weighted_sum(const ReduceArgs& a, const ReduceShape& s, DType fused_dtype, RowOf row_of) {
  const float* w = a.topk_weights.defined() ? a.topk_weights.data_ptr<float>() : nullptr;
  const size_t out_row_bytes = s.K * dtype_size(a.output.dtype());
#pragma omp parallel
  {
    std::vector<float> acc(s.K), row(s.K);
#pragma omp for schedule(static)
    for (int64_t t = 0; t < s.M; ++t) {
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int64_t k = 0; k < s.topk; ++k) {
        const void* src = row_of(t, k);
        if (!src) continue;  // routed to an expert that is not local
        const float weight = a.apply_router_weight_on_input ? 1.0f : w[t * s.topk + k];
        load_row(src, fused_dtype, s.K, row.data());
        for (int64_t i = 0; i < s.K; ++i) acc[i] += weight * row[i];
      }
      store_row(acc.data(), s.K, a.output.dtype(),
                static_cast<char*>(a.output.data()) + t * out_row_bytes);
    }
  }
}

}  // namespace

void TopKWeightAndReduceNoOp::apply(const Context&, const ReduceArgs& a) const {
  static constexpr const char* kFn = "TopKWeightAndReduceNoOp";
  if (a.output.data() == a.fused_expert_output.data()) return;
  MODMOE_CHECK(a.output.defined() && a.fused_expert_output.defined() &&
               a.output.shape() == a.fused_expert_output.shape())
      << kFn << ": fused_expert_output must already be the reduced (M, K) output "
      << a.output.shape_str() << ", got " << a.fused_expert_output.describe();
  const int64_t n = a.output.numel();
  if (a.output.dtype() == a.fused_expert_output.dtype()) {
    std::memcpy(a.output.data(), a.fused_expert_output.data(), a.output.nbytes());
  } else {
    for (int64_t i = 0; i < n; ++i)
      store_float(a.output.data(), a.output.dtype(), i,
                  load_float(a.fused_expert_output.data(), a.fused_expert_output.dtype(), i));
  }
}

void TopKWeightAndReduceContiguous::apply(const Context&, const ReduceArgs& a) const {
  static constexpr const char* kFn = "TopKWeightAndReduceContiguous";
  const ReduceShape s = check_common(kFn, a);
  const Tensor& f = a.fused_expert_output;
  check_tensor(kFn, "fused_expert_output", f, {DType::bf16, DType::fp16, DType::fp32},
               {s.M, s.topk, s.K}, "(M, topk, K)", Device::cpu());
  const int32_t* map = a.expert_map.defined() ? a.expert_map.data_ptr<int32_t>() : nullptr;
  const size_t row_bytes = s.K * dtype_size(f.dtype());
  weighted_sum(a, s, f.dtype(), [&](int64_t t, int64_t k) -> const void* {
    const int64_t id = load_index(a.topk_ids.data(), a.topk_ids.dtype(), t * s.topk + k);
    if (local_expert(map, id) < 0) return nullptr;
    return static_cast<const char*>(f.data()) + (t * s.topk + k) * row_bytes;
  });
}

void TopKWeightAndReduceNaiveBatched::apply(const Context&, const ReduceArgs& a) const {
  static constexpr const char* kFn = "TopKWeightAndReduceNaiveBatched";
  const ReduceShape s = check_common(kFn, a);
  const Tensor& f = a.fused_expert_output;
  MODMOE_CHECK(f.defined() && f.ndim() == 3 && f.size(2) == s.K)
      << kFn << ": fused_expert_output must be (E_local, max_tokens, K) with K = " << s.K
      << ", got " << f.describe();
  const int64_t E_local = f.size(0), T = f.size(1);
  check_tensor(kFn, "fused_expert_output", f, {DType::bf16, DType::fp16, DType::fp32},
               {E_local, T, s.K}, "(E_local, max_tokens, K)", Device::cpu());
  const int32_t* map = a.expert_map.defined() ? a.expert_map.data_ptr<int32_t>() : nullptr;

  // Slot of every (t, k): tokens fill an expert's rows in token order.
  std::vector<int64_t> slot(s.M * s.topk, -1), next(E_local, 0);
  for (int64_t p = 0; p < s.M * s.topk; ++p) {
    const int64_t e = local_expert(map, load_index(a.topk_ids.data(), a.topk_ids.dtype(), p));
    if (e < 0) continue;
    MODMOE_CHECK(e < E_local) << kFn << ": local expert " << e << " out of range [0, " << E_local
                              << ")";
    MODMOE_CHECK(next[e] < T) << kFn << ": expert " << e << " receives more than max_tokens = "
                              << T << " tokens";
    slot[p] = e * T + next[e]++;
  }
  const size_t row_bytes = s.K * dtype_size(f.dtype());
  weighted_sum(a, s, f.dtype(), [&](int64_t t, int64_t k) -> const void* {
    const int64_t sl = slot[t * s.topk + k];
    return sl < 0 ? nullptr : static_cast<const char*>(f.data()) + sl * row_bytes;
  });
}

void TopKWeightAndReduceDelegate::apply(const Context&, const ReduceArgs&) const {
  MODMOE_FAIL() << "TopKWeightAndReduceDelegate: cannot be applied; the PrepareAndFinalize must "
                   "replace it with the implementation that fits its activation format";
}

}  // namespace modmoe::cpu
