#include "cpu/reference_experts.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "core/validate.h"
#include "cpu/expert_mlp.h"
#include "cpu/rows.h"
#include "cpu/topk_weight_and_reduce.h"
#include "modmoe/numeric.h"
#include "modmoe/trace.h"

namespace modmoe::cpu {

namespace {

// Bytes of one row's scales in a per-row scale tensor, and the per-row scale pointer (or the
// per-tensor scale) of row `r`.
const void* row_scale_ptr(const Tensor& scale, int64_t r) {
  if (!scale.defined()) return nullptr;
  if (scale.ndim() == 1) return scale.data();  // per-tensor
  const int64_t groups = scale.size(-1);
  return static_cast<const char*>(scale.data()) + r * groups * dtype_size(scale.dtype());
}

void check_apply_common(const char* fn, const MoEConfig& c, const ApplyArgs& a) {
  MODMOE_CHECK(a.weights != nullptr) << fn << ": weights must not be null";
  MODMOE_CHECK(a.hidden_states.device().is_cpu())
      << fn << ": hidden_states must be on cpu, got " << a.hidden_states.describe();
  const DType in = c.quant.quantized() ? DType::fp8_e4m3 : c.in_dtype;
  MODMOE_CHECK(a.hidden_states.dtype() == in && a.hidden_states.is_contiguous())
      << fn << ": hidden_states must be contiguous " << dtype_name(in) << ", got "
      << a.hidden_states.describe();
  if (c.quant.quantized())
    MODMOE_CHECK(a.a1q_scale.defined())
        << fn << ": a1q_scale is required for quant scheme " << c.quant.str();
}

}  // namespace

// ---- ReferenceExperts ------------------------------------------------------------------------

WorkspaceShapes ReferenceExperts::workspace_shapes(int64_t M, int64_t N, int64_t K, int64_t topk,
                                                   int64_t, int64_t,
                                                   const ExpertTokensMetadata*) const {
  const int64_t rows = M * topk;
  WorkspaceShapes s;
  s.workspace13 = {rows, std::max(config().w13_rows(), K)};
  s.workspace2 = {rows, std::max(N, K)};
  s.workspace_dtype = DType::fp32;
  if (reduce_in_experts_) {
    s.output = {M, K};
    s.output_dtype = config().in_dtype;
  } else {
    s.output = {M, topk, K};
    s.output_dtype = DType::fp32;
  }
  return s;
}

TopKWeightAndReducePtr ReferenceExperts::finalize_weight_and_reduce_impl() const {
  if (reduce_in_experts_) return std::make_shared<TopKWeightAndReduceNoOp>();
  return std::make_shared<TopKWeightAndReduceDelegate>();
}

void ReferenceExperts::apply(const Context& ctx, const ApplyArgs& a) {
  static constexpr const char* kFn = "ReferenceExperts::apply";
  check_context_device(kFn, ctx, DeviceType::cpu);
  const MoEConfig& c = config();
  check_apply_common(kFn, c, a);
  const int64_t M = a.hidden_states.size(0), K = c.hidden_size, topk = c.topk;
  const int64_t E_local = c.num_local_experts;
  const WorkspaceShapes ws = workspace_shapes(M, c.intermediate_size, K, topk, c.num_experts,
                                              E_local, nullptr);
  MODMOE_CHECK(a.output.defined() && a.output.shape() == ws.output && a.output.dtype() == ws.output_dtype)
      << kFn << ": output must be " << dtype_name(ws.output_dtype) << " " << shape_str(ws.output)
      << ", got " << a.output.describe();
  MODMOE_CHECK(a.workspace13.numel() >= shape_numel(ws.workspace13) &&
               a.workspace2.numel() >= shape_numel(ws.workspace2))
      << kFn << ": workspaces smaller than workspace_shapes() declared";

  // Permute: group the (token, k) pairs by local expert, stable in pair order.
  TraceRange permute_range(ctx, "permute");
  const int32_t* map = a.expert_map.defined() ? a.expert_map.data_ptr<int32_t>() : nullptr;
  const int64_t pairs = M * topk;
  std::vector<int64_t> expert_of(pairs), m_indptr(E_local + 1, 0), row_of(pairs, -1);
  for (int64_t p = 0; p < pairs; ++p) {
    expert_of[p] = local_expert(map, load_index(a.topk_ids.data(), a.topk_ids.dtype(), p));
    if (expert_of[p] >= 0) ++m_indptr[expert_of[p] + 1];
  }
  for (int64_t e = 0; e < E_local; ++e) m_indptr[e + 1] += m_indptr[e];
  const int64_t rows = m_indptr[E_local];
  std::vector<int64_t> cursor(m_indptr.begin(), m_indptr.end() - 1), pair_of(rows);
  for (int64_t p = 0; p < pairs; ++p) {
    if (expert_of[p] < 0) continue;
    row_of[p] = cursor[expert_of[p]]++;
    pair_of[row_of[p]] = p;
  }
  permute_range.close();

  // Gather + dequantize the inputs into ws2, run the MLP, outputs land in ws13.
  float* ws13 = a.workspace13.data_ptr<float>();
  float* ws2 = a.workspace2.data_ptr<float>();
  const DType in_dtype = a.hidden_states.dtype();
  const size_t in_row_bytes = K * dtype_size(in_dtype);
  TraceRange gather_range(ctx, "gather");
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t t = pair_of[r] / topk;
    dequantize_input_row(static_cast<const char*>(a.hidden_states.data()) + t * in_row_bytes,
                         in_dtype, K, c.quant.scheme, row_scale_ptr(a.a1q_scale, t), ws2 + r * K);
  }
  gather_range.close();
  run_expert_mlp(ctx, c, *a.weights, rows, m_indptr.data(), ws13, ws2);
  const float* Y = ws13;

  if (reduce_in_experts_) {
    // Unpermute + top-k weight + reduce, in fixed k order (deterministic).
    TraceRange range(ctx, "reduce");
    const float* w = a.topk_weights.data_ptr<float>();
    const size_t out_row_bytes = K * dtype_size(a.output.dtype());
#pragma omp parallel
    {
      std::vector<float> acc(K);
#pragma omp for schedule(static)
      for (int64_t t = 0; t < M; ++t) {
        std::fill(acc.begin(), acc.end(), 0.0f);
        for (int64_t k = 0; k < topk; ++k) {
          const int64_t r = row_of[t * topk + k];
          if (r < 0) continue;
          const float weight = a.apply_router_weight_on_input ? 1.0f : w[t * topk + k];
          for (int64_t i = 0; i < K; ++i) acc[i] += weight * Y[r * K + i];
        }
        store_row(acc.data(), K, a.output.dtype(),
                  static_cast<char*>(a.output.data()) + t * out_row_bytes);
      }
    }
  } else {
    // Unpermute only: (M, topk, K); pairs of non-local experts are written as zeros.
    TraceRange range(ctx, "unpermute");
    float* out = a.output.data_ptr<float>();
#pragma omp parallel for schedule(static)
    for (int64_t p = 0; p < pairs; ++p) {
      if (row_of[p] < 0) {
        std::fill(out + p * K, out + (p + 1) * K, 0.0f);
      } else {
        std::memcpy(out + p * K, Y + row_of[p] * K, K * sizeof(float));
      }
    }
  }
}

// ---- BatchedReferenceExperts -----------------------------------------------------------------

WorkspaceShapes BatchedReferenceExperts::workspace_shapes(int64_t, int64_t N, int64_t K, int64_t,
                                                          int64_t, int64_t local_num_experts,
                                                          const ExpertTokensMetadata*) const {
  const int64_t T = config().max_num_tokens * num_dispatchers_;
  const int64_t rows = local_num_experts * T;
  WorkspaceShapes s;
  s.workspace13 = {rows, std::max(config().w13_rows(), K)};
  s.workspace2 = {rows, std::max(N, K)};
  s.workspace_dtype = DType::fp32;
  s.output = {local_num_experts, T, K};
  s.output_dtype = DType::fp32;
  return s;
}

TopKWeightAndReducePtr BatchedReferenceExperts::finalize_weight_and_reduce_impl() const {
  return std::make_shared<TopKWeightAndReduceDelegate>();
}

void BatchedReferenceExperts::apply(const Context& ctx, const ApplyArgs& a) {
  static constexpr const char* kFn = "BatchedReferenceExperts::apply";
  check_context_device(kFn, ctx, DeviceType::cpu);
  const MoEConfig& c = config();
  check_apply_common(kFn, c, a);
  const int64_t E_local = c.num_local_experts, K = c.hidden_size;
  const int64_t T = c.max_num_tokens * num_dispatchers_;
  MODMOE_CHECK(a.hidden_states.ndim() == 3 && a.hidden_states.shape() == (Shape{E_local, T, K}))
      << kFn << ": hidden_states must be (E_local, max_tokens, K) = "
      << shape_str({E_local, T, K}) << ", got " << a.hidden_states.describe();
  MODMOE_CHECK(a.expert_tokens_meta != nullptr)
      << kFn << ": expert_tokens_meta (expert_num_tokens) is required for batched inputs";
  const Tensor& counts_t = a.expert_tokens_meta->expert_num_tokens_cpu.defined()
                               ? a.expert_tokens_meta->expert_num_tokens_cpu
                               : a.expert_tokens_meta->expert_num_tokens;
  check_tensor(kFn, "expert_num_tokens", counts_t, {DType::int32}, {E_local}, "(E_local)",
               Device::cpu());
  MODMOE_CHECK(a.output.shape() == (Shape{E_local, T, K}) && a.output.dtype() == DType::fp32)
      << kFn << ": output must be fp32 " << shape_str({E_local, T, K}) << ", got "
      << a.output.describe();

  // Valid rows of every expert, packed: rows [m_indptr[e], m_indptr[e+1]) <- (e, 0..n_e).
  const int32_t* n = counts_t.data_ptr<int32_t>();
  std::vector<int64_t> m_indptr(E_local + 1, 0);
  for (int64_t e = 0; e < E_local; ++e) {
    MODMOE_CHECK(n[e] >= 0 && n[e] <= T)
        << kFn << ": expert_num_tokens[" << e << "] must be in [0, max_tokens=" << T << "], got "
        << n[e];
    m_indptr[e + 1] = m_indptr[e] + n[e];
  }
  const int64_t rows = m_indptr[E_local];
  float* ws13 = a.workspace13.data_ptr<float>();
  float* ws2 = a.workspace2.data_ptr<float>();
  const DType in_dtype = a.hidden_states.dtype();
  const size_t in_row_bytes = K * dtype_size(in_dtype);
  TraceRange gather_range(ctx, "gather");
#pragma omp parallel for schedule(static)
  for (int64_t e = 0; e < E_local; ++e) {
    for (int64_t i = 0; i < n[e]; ++i) {
      const int64_t src = e * T + i, r = m_indptr[e] + i;
      dequantize_input_row(static_cast<const char*>(a.hidden_states.data()) + src * in_row_bytes,
                           in_dtype, K, c.quant.scheme, row_scale_ptr(a.a1q_scale, src),
                           ws2 + r * K);
    }
  }
  gather_range.close();
  run_expert_mlp(ctx, c, *a.weights, rows, m_indptr.data(), ws13, ws2);
  TraceRange scatter_range(ctx, "scatter");
  float* out = a.output.data_ptr<float>();
#pragma omp parallel for schedule(static)
  for (int64_t e = 0; e < E_local; ++e) {
    std::memcpy(out + e * T * K, ws13 + m_indptr[e] * K, n[e] * K * sizeof(float));
  }
}

}  // namespace modmoe::cpu
