#include "cpu/prepare_finalize.h"

#include <cstring>
#include <vector>

#include "core/validate.h"
#include "cpu/rows.h"
#include "cpu/topk_weight_and_reduce.h"
#include "modmoe/quant.h"
#include "modmoe/trace.h"

namespace modmoe::cpu {

namespace {

// The hidden states the experts should see: a1, or a1 * topk_weights[:, 0] (rounded to the
// input dtype, as vLLM does) when the router weight is applied on the input.
Tensor maybe_weighted_input(const Context& ctx, const PrepareArgs& args,
                            std::vector<OwnedTensor>& storage) {
  if (!args.apply_router_weight_on_input) return args.a1;
  const Tensor& a1 = args.a1;
  const int64_t M = a1.size(0), K = a1.size(1);
  storage.emplace_back(ctx.alloc(), a1.dtype(), Shape{M, K});
  const Tensor& out = storage.back().tensor();
  const float* w = args.topk_weights.data_ptr<float>();
  const size_t row_bytes = K * dtype_size(a1.dtype());
#pragma omp parallel
  {
    std::vector<float> row(K);
#pragma omp for
    for (int64_t t = 0; t < M; ++t) {
      load_row(static_cast<const char*>(a1.data()) + t * row_bytes, a1.dtype(), K, row.data());
      for (int64_t i = 0; i < K; ++i) row[i] *= w[t * args.topk_weights.size(1)];
      store_row(row.data(), K, a1.dtype(), static_cast<char*>(out.data()) + t * row_bytes);
    }
  }
  return out;
}

// Quantizes `a` (M, K) as the config says: returns (a1q, a1q_scale); storage keeps them alive.
std::pair<Tensor, Tensor> quantize_input(const Context& ctx, const Tensor& a, const MoEConfig& c,
                                         const ExpertWeights* weights,
                                         std::vector<OwnedTensor>& storage) {
  if (!c.quant.quantized()) return {a, Tensor()};
  const int64_t M = a.size(0), K = a.size(1);
  const QuantScheme scheme = c.quant.scheme;
  storage.emplace_back(ctx.alloc(), quantized_dtype(scheme), Shape{M, K});
  Tensor q = storage.back().tensor();
  Tensor scale;
  if (c.quant.static_act_scale) {
    MODMOE_CHECK(weights && weights->a13_scale.defined())
        << "prepare: the config uses a static activation scale but weights.a13_scale is undefined";
    scale = weights->a13_scale;
  } else {
    storage.emplace_back(ctx.alloc(), scale_dtype(scheme), act_scale_shape(scheme, M, K));
    scale = storage.back().tensor();
  }
  TraceRange range(ctx, "quantize");
  quantize_activations(ctx, a, scheme, c.quant.static_act_scale, q, scale);
  return {q, scale};
}

}  // namespace

// ---- NoEPPrepareAndFinalize ------------------------------------------------------------------

PrepareResult NoEPPrepareAndFinalize::prepare(const Context& ctx, const PrepareArgs& args) {
  check_context_device("NoEPPrepareAndFinalize::prepare", ctx, DeviceType::cpu);
  PrepareResult r;
  const Tensor a = maybe_weighted_input(ctx, args, r.storage);
  // No dispatch here needs quantized rows: experts that quantize themselves get them as they are.
  if (args.defer_input_quantization)
    r.a1q = a;
  else
    std::tie(r.a1q, r.a1q_scale) = quantize_input(ctx, a, config(), args.weights, r.storage);
  r.topk_ids = args.topk_ids;
  r.topk_weights = args.topk_weights;
  return r;
}

void NoEPPrepareAndFinalize::finalize(const Context& ctx, const FinalizeArgs& f,
                                      const TopKWeightAndReduce& weight_and_reduce) {
  check_context_device("NoEPPrepareAndFinalize::finalize", ctx, DeviceType::cpu);
  static const TopKWeightAndReduceContiguous contiguous;
  const TopKWeightAndReduce& impl =
      weight_and_reduce.kind() == WeightAndReduceKind::Delegate ? contiguous : weight_and_reduce;
  impl.apply(ctx, ReduceArgs{f.output, f.fused_expert_output, f.topk_weights, f.topk_ids,
                             f.expert_map, f.apply_router_weight_on_input});
}

// ---- BatchedPrepareAndFinalize ---------------------------------------------------------------

PrepareResult BatchedPrepareAndFinalize::prepare(const Context& ctx, const PrepareArgs& args) {
  static constexpr const char* kFn = "BatchedPrepareAndFinalize::prepare";
  check_context_device(kFn, ctx, DeviceType::cpu);
  const MoEConfig& c = config();
  const int64_t M = args.a1.size(0), K = args.a1.size(1), topk = args.topk_ids.size(1);
  const int64_t E_local = c.num_local_experts;
  const int64_t T = max_tokens();
  MODMOE_CHECK(M <= c.max_num_tokens)
      << kFn << ": M = " << M << " tokens exceed max_num_tokens_per_rank = " << c.max_num_tokens;

  PrepareResult r;
  const Tensor a = maybe_weighted_input(ctx, args, r.storage);
  const auto [q, scale] = quantize_input(ctx, a, c, args.weights, r.storage);
  const bool per_row_scale = scale.defined() && scale.ndim() == 2;
  const int64_t groups = per_row_scale ? scale.size(1) : 0;

  r.storage.emplace_back(ctx.alloc(), q.dtype(), Shape{E_local, T, K});
  r.a1q = r.storage.back().tensor();
  poison(r.a1q);
  if (per_row_scale) {
    r.storage.emplace_back(ctx.alloc(), scale.dtype(), Shape{E_local, T, groups});
    r.a1q_scale = r.storage.back().tensor();
    poison(r.a1q_scale);
  } else {
    r.a1q_scale = scale;  // per-tensor (or undefined)
  }
  r.storage.emplace_back(ctx.alloc(), DType::int32, Shape{E_local});
  const Tensor counts = r.storage.back().tensor();
  int32_t* n = counts.data_ptr<int32_t>();
  std::fill(n, n + E_local, 0);

  // Token order within each expert: the order NaiveBatched assumes when it reduces.
  TraceRange range(ctx, "dispatch");
  const int32_t* map = args.expert_map.defined() ? args.expert_map.data_ptr<int32_t>() : nullptr;
  const size_t row_bytes = K * dtype_size(q.dtype());
  const size_t scale_row_bytes = groups * (per_row_scale ? dtype_size(scale.dtype()) : 0);
  for (int64_t t = 0; t < M; ++t) {
    for (int64_t k = 0; k < topk; ++k) {
      const int64_t e =
          local_expert(map, load_index(args.topk_ids.data(), args.topk_ids.dtype(), t * topk + k));
      if (e < 0) continue;
      const int64_t dst = e * T + n[e]++;
      std::memcpy(static_cast<char*>(r.a1q.data()) + dst * row_bytes,
                  static_cast<const char*>(q.data()) + t * row_bytes, row_bytes);
      if (per_row_scale)
        std::memcpy(static_cast<char*>(r.a1q_scale.data()) + dst * scale_row_bytes,
                    static_cast<const char*>(scale.data()) + t * scale_row_bytes, scale_row_bytes);
    }
  }
  r.expert_tokens_meta = ExpertTokensMetadata{counts, counts};
  r.topk_ids = args.topk_ids;
  r.topk_weights = args.topk_weights;
  return r;
}

void BatchedPrepareAndFinalize::finalize(const Context& ctx, const FinalizeArgs& f,
                                         const TopKWeightAndReduce& weight_and_reduce) {
  check_context_device("BatchedPrepareAndFinalize::finalize", ctx, DeviceType::cpu);
  static const TopKWeightAndReduceNaiveBatched naive_batched;
  const TopKWeightAndReduce& impl = weight_and_reduce.kind() == WeightAndReduceKind::Delegate
                                        ? naive_batched
                                        : weight_and_reduce;
  impl.apply(ctx, ReduceArgs{f.output, f.fused_expert_output, f.topk_weights, f.topk_ids,
                             f.expert_map, f.apply_router_weight_on_input});
}

}  // namespace modmoe::cpu
