#include <cuda_runtime.h>

#include <memory>
#include <utility>

#include "core/validate.h"
#include "cuda/batched.h"
#include "cuda/byte_carver.h"
#include "cuda/cuda_check.h"
#include "cuda/cuda_prepare_finalize.h"
#include "cuda/cuda_topk_weight_and_reduce.h"
#include "cuda/device_guard.h"
#include "cuda/float_io.cuh"
#include "cuda/permute.h"
#include "cuda/quantize.h"
#include "modmoe/quant.h"
#include "modmoe/trace.h"

namespace modmoe::cuda {

namespace {

constexpr int kThreads = 256;

// out[t, :] = in[t, :] * weights[t * topk]  (the router weight of the token's only expert),
// rounded to T once, as the CPU does.
template <typename T>
__global__ void scale_rows_kernel(const T* __restrict__ in, const float* __restrict__ weights,
                                  int64_t topk, int64_t M, int64_t K, T* __restrict__ out) {
  for (int64_t t = blockIdx.x; t < M; t += gridDim.x) {
    const float w = weights[t * topk];
    for (int64_t i = threadIdx.x; i < K; i += blockDim.x)
      out[t * K + i] = from_float<T>(to_float(in[t * K + i]) * w);
  }
}

void check_prepare_args(const char* fn, const Context& ctx, const MoEConfig& c,
                        const PrepareArgs& a) {
  check_context_device(fn, ctx, DeviceType::cuda);
  MODMOE_CHECK(a.a1.defined() && a.a1.ndim() == 2)
      << fn << ": a1 must be 2-D (M, K), got " << a.a1.describe();
  const int64_t M = a.a1.size(0);
  check_tensor(fn, "a1", a.a1, {c.in_dtype}, {M, c.hidden_size}, "(M, K)", ctx.device);
  check_tensor(fn, "topk_ids", a.topk_ids, {DType::int32, DType::int64}, {M, c.topk}, "(M, topk)",
               ctx.device);
  check_tensor(fn, "topk_weights", a.topk_weights, {DType::fp32}, {M, c.topk}, "(M, topk)",
               ctx.device);
  if (a.expert_map.defined())
    check_tensor(fn, "expert_map", a.expert_map, {DType::int32}, {c.num_experts}, "(E)",
                 ctx.device);
  MODMOE_CHECK(!a.apply_router_weight_on_input || c.topk == 1)
      << fn << ": apply_router_weight_on_input requires topk == 1, got topk = " << c.topk;
  if (c.quant.static_act_scale) {
    MODMOE_CHECK(a.weights != nullptr && a.weights->a13_scale.defined())
        << fn << ": the config uses a static activation scale but weights.a13_scale is undefined";
    check_tensor(fn, "weights.a13_scale", a.weights->a13_scale, {DType::fp32}, {1},
                 "(static per-tensor)", ctx.device);
  }
}

// The hidden states the experts should see: a1, or a1 * topk_weights[:, 0] in a new buffer.
Tensor maybe_weighted_input(const Context& ctx, const PrepareArgs& args,
                            std::vector<OwnedTensor>& storage) {
  if (!args.apply_router_weight_on_input) return args.a1;
  const Tensor& a1 = args.a1;
  const int64_t M = a1.size(0), K = a1.size(1);
  storage.emplace_back(ctx.alloc(), a1.dtype(), Shape{M, K}, ctx.stream);
  const Tensor& out = storage.back().tensor();
  if (M == 0 || K == 0) return out;
  const int blocks = static_cast<int>(std::min<int64_t>(M, 65535));
  const int threads = static_cast<int>(std::min<int64_t>(kThreads, (K + 31) / 32 * 32));
  dispatch_float_io(a1.dtype(), "NoEPPrepareAndFinalize::prepare", [&](auto tag) {
    using T = typename decltype(tag)::type;
    scale_rows_kernel<T><<<blocks, threads, 0, static_cast<cudaStream_t>(ctx.stream)>>>(
        a1.data_ptr<T>(), args.topk_weights.data_ptr<float>(), args.topk_weights.size(1), M, K,
        out.data_ptr<T>());
    MODMOE_CUDA_CHECK_LAUNCH();
  });
  return out;
}

// Quantizes `a` (M, K) as the config says: returns (a1q, a1q_scale); storage keeps them alive.
std::pair<Tensor, Tensor> quantize_input(const Context& ctx, const Tensor& a, const MoEConfig& c,
                                         const ExpertWeights* weights,
                                         std::vector<OwnedTensor>& storage) {
  if (!c.quant.quantized()) return {a, Tensor()};
  const int64_t M = a.size(0), K = a.size(1);
  const QuantScheme scheme = c.quant.scheme;
  storage.emplace_back(ctx.alloc(), quantized_dtype(scheme), Shape{M, K}, ctx.stream);
  const Tensor q = storage.back().tensor();
  Tensor scale;
  if (c.quant.static_act_scale) {
    scale = weights->a13_scale;
  } else {
    storage.emplace_back(ctx.alloc(), scale_dtype(scheme), act_scale_shape(scheme, M, K),
                         ctx.stream);
    scale = storage.back().tensor();
  }
  TraceRange range(ctx, "quantize");
  quantize_rows(a.data(), a.dtype(), K, M, /*num_rows=*/nullptr, K, scheme,
                c.quant.static_act_scale, static_cast<uint8_t*>(q.data()), scale.data(),
                static_cast<cudaStream_t>(ctx.stream));
  return {q, scale};
}

void finalize_with(const char* fn, const Context& ctx, const FinalizeArgs& f,
                   const TopKWeightAndReduce& weight_and_reduce,
                   const TopKWeightAndReduce& format_default) {
  check_context_device(fn, ctx, DeviceType::cuda);
  const TopKWeightAndReduce& impl = weight_and_reduce.kind() == WeightAndReduceKind::Delegate
                                        ? format_default
                                        : weight_and_reduce;
  impl.apply(ctx, ReduceArgs{f.output, f.fused_expert_output, f.topk_weights, f.topk_ids,
                             f.expert_map, f.apply_router_weight_on_input});
}

}  // namespace

// ---- NoEPPrepareAndFinalize ------------------------------------------------------------------

PrepareResult NoEPPrepareAndFinalize::prepare(const Context& ctx, const PrepareArgs& args) {
  static constexpr const char* kFn = "cuda::NoEPPrepareAndFinalize::prepare";
  check_prepare_args(kFn, ctx, config(), args);
  DeviceGuard guard(ctx.device.index);
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
  static const TopKWeightAndReduceContiguous contiguous;
  finalize_with("cuda::NoEPPrepareAndFinalize::finalize", ctx, f, weight_and_reduce, contiguous);
}

// ---- BatchedPrepareAndFinalize ---------------------------------------------------------------

PrepareResult BatchedPrepareAndFinalize::prepare(const Context& ctx, const PrepareArgs& args) {
  static constexpr const char* kFn = "cuda::BatchedPrepareAndFinalize::prepare";
  const MoEConfig& c = config();
  check_prepare_args(kFn, ctx, c, args);
  const int64_t M = args.a1.size(0), K = args.a1.size(1), topk = args.topk_ids.size(1);
  const int64_t E_local = c.num_local_experts;
  const int64_t T = max_tokens();
  MODMOE_CHECK(M <= c.max_num_tokens)
      << kFn << ": M = " << M << " tokens exceed max_num_tokens_per_rank = " << c.max_num_tokens;
  DeviceGuard guard(ctx.device.index);
  const cudaStream_t stream = static_cast<cudaStream_t>(ctx.stream);

  PrepareResult r;
  const Tensor a = maybe_weighted_input(ctx, args, r.storage);
  const auto [q, scale] = quantize_input(ctx, a, c, args.weights, r.storage);
  const bool per_row_scale = scale.defined() && scale.ndim() == 2;
  const int64_t groups = per_row_scale ? scale.size(1) : 0;

  r.storage.emplace_back(ctx.alloc(), q.dtype(), Shape{E_local, T, K}, ctx.stream);
  r.a1q = r.storage.back().tensor();
  if (per_row_scale) {
    r.storage.emplace_back(ctx.alloc(), scale.dtype(), Shape{E_local, T, groups}, ctx.stream);
    r.a1q_scale = r.storage.back().tensor();
  } else {
    r.a1q_scale = scale;  // per-tensor (or undefined)
  }
  r.storage.emplace_back(ctx.alloc(), DType::int32, Shape{E_local}, ctx.stream);
  const Tensor counts = r.storage.back().tensor();

  // Slots in token order: the permute's stable sort ranks every pair within its expert.
  TraceRange range(ctx, "dispatch");
  const int64_t num_pairs = M * topk;
  ByteCarver sizing(nullptr);
  PermuteWorkspace::carve(sizing, num_pairs, E_local);
  sizing.take<int32_t>(num_pairs);
  OwnedTensor scratch(ctx.alloc(), DType::uint8, {static_cast<int64_t>(sizing.size())}, ctx.stream);
  ByteCarver carver(scratch.tensor().data());
  const PermuteWorkspace perm = PermuteWorkspace::carve(carver, num_pairs, E_local);
  int32_t* batched_row = carver.take<int32_t>(num_pairs);
  PermuteArgs p;
  p.topk_ids = args.topk_ids.data();
  p.ids_dtype = args.topk_ids.dtype();
  p.num_tokens = M;
  p.topk = topk;
  p.expert_map = args.expert_map.defined() ? args.expert_map.data_ptr<int32_t>() : nullptr;
  p.num_experts = c.num_experts;
  p.num_local_experts = E_local;
  permute(p, perm, stream);
  batched_slots(perm, T, batched_row, counts.data_ptr<int32_t>(), stream);

  const int64_t row_bytes = K * static_cast<int64_t>(dtype_size(q.dtype()));
  batched_scatter_rows(q.data(), row_bytes, r.a1q.data(), row_bytes, row_bytes, batched_row,
                       num_pairs, topk, stream);
  if (per_row_scale) {
    const int64_t scale_row_bytes = groups * static_cast<int64_t>(dtype_size(scale.dtype()));
    batched_scatter_rows(scale.data(), scale_row_bytes, r.a1q_scale.data(), scale_row_bytes,
                         scale_row_bytes, batched_row, num_pairs, topk, stream);
  }
  r.expert_tokens_meta = ExpertTokensMetadata{counts, Tensor()};
  r.topk_ids = args.topk_ids;
  r.topk_weights = args.topk_weights;
  return r;  // `scratch` returns to the pool stream-ordered, after the scatters
}

void BatchedPrepareAndFinalize::finalize(const Context& ctx, const FinalizeArgs& f,
                                         const TopKWeightAndReduce& weight_and_reduce) {
  static const TopKWeightAndReduceNaiveBatched naive_batched;
  finalize_with("cuda::BatchedPrepareAndFinalize::finalize", ctx, f, weight_and_reduce,
                naive_batched);
}

}  // namespace modmoe::cuda
