// CudaExperts and BatchedCudaExperts (see cuda_experts.h).
//
// Workspaces (bytes, carved in this order by the same functions in workspace_shapes and apply):
//   CudaExperts, P = M * topk pairs:
//     workspace2:  permute arrays + CUB scratch | a2 (P, N) fp8 or in dtype | a2 scales
//     workspace13: h (P, N or 2N) fp32 | act (P, N) fp32      — GEMM1 output, activation
//                  y (P, K) fp32 from offset 0                 — GEMM2 output (h, act are dead)
//   BatchedCudaExperts, R = T * min(E_local, topk) packed rows (every dispatched pair):
//     workspace2:  counts | m_indptr | packed_to_batched (R) | batched_to_packed (E_local * T)
//                  | a2 (R, N) | a2 scales
//     workspace13: h (R, N or 2N) fp32 | act (R, N) fp32
//   GEMM2 of the batched experts writes the (E_local, T, K) output directly.
#include <cuda_runtime.h>

#include <algorithm>

#include "core/validate.h"
#include "cuda/activation.h"
#include "cuda/batched.h"
#include "cuda/byte_carver.h"
#include "cuda/cuda_experts.h"
#include "cuda/cuda_topk_weight_and_reduce.h"
#include "cuda/decode_mlp.h"
#include "cuda/device_guard.h"
#include "cuda/experts_common.h"
#include "cuda/grouped_gemm.h"
#include "cuda/permute.h"
#include "cuda/quantize.h"
#include "cuda/reduce.h"
#include "modmoe/quant.h"
#include "modmoe/trace.h"

namespace modmoe::cuda {

namespace {

// How the intermediate flows from GEMM1 to GEMM2's operand for one config.
//   fused gated, unquantized:  GEMM1 epilogue act(gate)*up -> a2 (in dtype)
//   fused gated, fp8:          GEMM1 epilogue -> h fp32 (rows, N) -> quantize -> a2
//   _no_mul, unquantized:      GEMM1 -> h fp32 (rows, N) -> act -> a2 (in dtype)
//   _no_mul, fp8:              GEMM1 -> h fp32 -> act in place -> quantize -> a2
//   unfused gated, unquant.:   GEMM1 -> h fp32 (rows, 2N) -> act_and_mul -> a2 (in dtype)
//   unfused gated, fp8:        GEMM1 -> h fp32 (rows, 2N) -> act_and_mul -> act fp32 -> quantize
struct MlpPlan {
  bool gated = false;
  bool fused = false;  // gated and computed in GEMM1's epilogue
  bool quantized = false;
  int64_t h_cols = 0;       // 0: GEMM1 writes a2 directly
  bool act_buffer = false;  // an fp32 (rows, N) buffer between act_and_mul and quantize
  DType a2_dtype = DType::bf16;
};

MlpPlan make_plan(const MoEConfig& c, bool fuse_gated) {
  MlpPlan p;
  p.gated = is_gated(c.activation);
  p.fused = p.gated && fuse_gated;
  p.quantized = c.quant.quantized();
  const int64_t N = c.intermediate_size;
  if (!p.gated) {
    p.h_cols = N;
  } else if (!p.fused) {
    p.h_cols = 2 * N;
  } else {
    p.h_cols = p.quantized ? N : 0;
  }
  p.act_buffer = p.gated && !p.fused && p.quantized;
  p.a2_dtype = p.quantized ? quantized_dtype(c.quant.scheme) : c.in_dtype;
  return p;
}

// The intermediate buffers of `rows` packed rows.
struct MlpBuffers {
  float* h = nullptr;        // (rows, plan.h_cols) fp32
  float* act = nullptr;      // (rows, N) fp32
  void* a2 = nullptr;        // (rows, N) plan.a2_dtype
  void* a2_scale = nullptr;  // act_scale_shape(scheme, rows, N), dynamic fp8 schemes only
};

// Takes the fp32 pieces from `c13` and the GEMM2 operand from `c2`.
MlpBuffers carve_mlp(const MoEConfig& c, const MlpPlan& plan, int64_t rows, ByteCarver& c13,
                     ByteCarver& c2) {
  const int64_t N = c.intermediate_size;
  MlpBuffers b;
  if (plan.h_cols > 0) b.h = c13.take<float>(rows * plan.h_cols);
  if (plan.act_buffer) b.act = c13.take<float>(rows * N);
  b.a2 = c2.take_bytes(static_cast<size_t>(rows * N) * dtype_size(plan.a2_dtype));
  if (plan.quantized && !c.quant.static_act_scale) {
    const QuantScheme scheme = c.quant.scheme;
    b.a2_scale = c2.take_bytes(static_cast<size_t>(shape_numel(act_scale_shape(scheme, rows, N))) *
                               dtype_size(scale_dtype(scheme)));
  }
  return b;
}

// GEMM1's A operand and the row structure it runs over.
struct Gemm1Input {
  const void* a = nullptr;  // rows of K elements
  const int32_t* a_row_index = nullptr;
  const void* a_scale = nullptr;
  const int32_t* m_indptr = nullptr;  // (E_local + 1) on the device
  int64_t max_rows = 0;
};

// GEMM1 -> activation -> [quantize]. Afterwards buf.a2 holds GEMM2's operand for the rows
// [0, m_indptr[E_local]); returns the scale GEMM2 must apply to it (null when unquantized).
const void* run_gemm1_and_activation(const Context& ctx, const MoEConfig& c, const MlpPlan& plan,
                                     const ExpertWeights& w, const Gemm1Input& in,
                                     const MlpBuffers& buf, cudaStream_t stream) {
  const int64_t N = c.intermediate_size, K = c.hidden_size, E_local = c.num_local_experts;
  const QuantScheme scheme = c.quant.scheme;
  const int32_t* num_rows = in.m_indptr + E_local;  // device: rows actually routed here

  GroupedGemmArgs g;
  g.A = in.a;
  g.lda = K;
  g.a_row_index = in.a_row_index;
  g.B = w.w13.data();
  g.ab_dtype = plan.quantized ? DType::fp8_e4m3 : c.in_dtype;
  g.E = E_local;
  g.N_b = c.w13_rows();
  g.K = K;
  g.m_indptr = in.m_indptr;
  g.max_rows = in.max_rows;
  g.scheme = scheme;
  g.a_scale = in.a_scale;
  g.b_scale = w.w13_scale.defined() ? w.w13_scale.data() : nullptr;
  g.gated = plan.fused;
  g.activation = c.activation;
  g.gated_layout = c.gated_layout;
  if (plan.h_cols == 0) {
    g.D = buf.a2;
    g.ldd = N;
    g.d_dtype = c.in_dtype;
  } else {
    g.D = buf.h;
    g.ldd = plan.h_cols;
    g.d_dtype = DType::fp32;
  }
  {
    // With a fused gated activation the epilogue computes it: no "activation" range follows.
    TraceRange range(ctx, "gemm1");
    grouped_gemm(g, stream);
  }

  // The fp32 rows the quantizer reads (when quantized).
  const float* to_quantize = buf.h;
  if (!plan.gated) {
    TraceRange range(ctx, "activation");
    // In place when a quantization follows; into GEMM2's operand otherwise.
    void* out = plan.quantized ? static_cast<void*>(buf.h) : buf.a2;
    activation_no_mul(c.activation, buf.h, DType::fp32, N, out,
                      plan.quantized ? DType::fp32 : c.in_dtype, N, in.max_rows, num_rows, N,
                      stream);
  } else if (!plan.fused) {
    TraceRange range(ctx, "activation");
    void* out = plan.quantized ? static_cast<void*>(buf.act) : buf.a2;
    activation_and_mul(c.activation, c.gated_layout, buf.h, DType::fp32, 2 * N, out,
                       plan.quantized ? DType::fp32 : c.in_dtype, N, in.max_rows, num_rows, N,
                       stream);
    to_quantize = buf.act;
  }
  if (!plan.quantized) return nullptr;

  // One dynamic per-tensor scale per apply call (per chunk), over the routed rows only.
  void* scale = c.quant.static_act_scale ? w.a2_scale.data() : buf.a2_scale;
  TraceRange range(ctx, "quantize2");
  quantize_rows(to_quantize, DType::fp32, N, in.max_rows, num_rows, N, scheme,
                c.quant.static_act_scale, static_cast<uint8_t*>(buf.a2), scale, stream);
  return scale;
}

// GEMM2's arguments common to both experts (row structure and output set by the caller).
GroupedGemmArgs gemm2_args(const MoEConfig& c, const MlpPlan& plan, const ExpertWeights& w,
                           const MlpBuffers& buf, const void* a2_scale) {
  GroupedGemmArgs g;
  g.A = buf.a2;
  g.lda = c.intermediate_size;
  g.B = w.w2.data();
  g.ab_dtype = plan.quantized ? DType::fp8_e4m3 : c.in_dtype;
  g.E = c.num_local_experts;
  g.N_b = c.hidden_size;
  g.K = c.intermediate_size;
  g.scheme = c.quant.scheme;
  g.a_scale = a2_scale;
  g.b_scale = w.w2_scale.defined() ? w.w2_scale.data() : nullptr;
  g.gated = false;
  g.D = nullptr;
  g.ldd = c.hidden_size;
  g.d_dtype = DType::fp32;
  return g;
}

// ---- CudaExperts layout ------------------------------------------------------------------

struct StandardLayout {
  PermuteWorkspace perm;
  MlpBuffers mlp;
  float* y = nullptr;  // (P, K) fp32
  uint8_t* xq = nullptr;       // (M, K) e4m3: unquantized input rows, quantized for the grouped
  float* xq_scale = nullptr;   // path; (M, ceil(K/128)) group scales
  size_t ws13_bytes = 0, ws2_bytes = 0;
};

// `quantizes_input`: the experts may get unquantized fp8-block rows (expects_unquantized_input).
StandardLayout standard_layout(const MoEConfig& c, const MlpPlan& plan, int64_t M,
                               bool quantizes_input, void* ws13, void* ws2) {
  const int64_t pairs = M * c.topk;
  StandardLayout l;
  ByteCarver c2(ws2), c13(ws13), c_y(ws13);
  l.perm = PermuteWorkspace::carve(c2, pairs, c.num_local_experts);
  l.mlp = carve_mlp(c, plan, pairs, c13, c2);
  if (quantizes_input) {
    l.xq = c2.take<uint8_t>(M * c.hidden_size);
    l.xq_scale = c2.take<float>(
        shape_numel(act_scale_shape(QuantScheme::fp8_block, M, c.hidden_size)));
  }
  l.y = c_y.take<float>(pairs * c.hidden_size);  // aliases h/act: written after they are dead
  l.ws13_bytes = std::max(c13.size(), c_y.size());
  l.ws2_bytes = c2.size();
  return l;
}

// ---- BatchedCudaExperts layout -----------------------------------------------------------

struct BatchedLayout {
  int32_t* counts = nullptr;             // (E_local) clamped expert_num_tokens
  int32_t* m_indptr = nullptr;           // (E_local + 1) over the packed rows
  int32_t* packed_to_batched = nullptr;  // (R)
  int32_t* batched_to_packed = nullptr;  // (E_local * T)
  MlpBuffers mlp;
  int64_t packed_rows = 0;  // R
  size_t ws13_bytes = 0, ws2_bytes = 0;
};

BatchedLayout batched_layout(const MoEConfig& c, const MlpPlan& plan, int64_t T, void* ws13,
                             void* ws2) {
  const int64_t E_local = c.num_local_experts;
  BatchedLayout l;
  // Every dispatched pair is one row: at most T tokens each bring <= topk pairs, and no expert
  // takes more than T of them.
  l.packed_rows = T * std::min(E_local, c.topk);
  ByteCarver c2(ws2), c13(ws13);
  l.counts = c2.take<int32_t>(E_local);
  l.m_indptr = c2.take<int32_t>(E_local + 1);
  l.packed_to_batched = c2.take<int32_t>(l.packed_rows);
  l.batched_to_packed = c2.take<int32_t>(E_local * T);
  l.mlp = carve_mlp(c, plan, l.packed_rows, c13, c2);
  l.ws13_bytes = c13.size();
  l.ws2_bytes = c2.size();
  return l;
}

}  // namespace

// ---- CudaExperts -----------------------------------------------------------------------------

CudaExperts::CudaExperts(const MoEConfig& config, bool fuse_gated_activation, DecodePath decode)
    : Experts(config),
      fuse_gated_activation_(fuse_gated_activation),
      decode_(fuse_gated_activation ? decode : DecodePath::never) {
  check_experts_config("CudaExperts", config);
  MODMOE_CHECK(decode_ != DecodePath::always || decode_mlp_config_fits(config))
      << "CudaExperts: DecodePath::always, but the decode path cannot run this config (it needs "
      << "a gated activation, scheme none or dynamic fp8_block, K and N multiples of 16): "
      << config.str();
}

int64_t CudaExperts::max_decode_tokens() const {
  const MoEConfig& c = config();
  if (decode_ == DecodePath::never || !decode_mlp_config_fits(c)) return 0;
  if (decode_ == DecodePath::always) return INT64_MAX;
  // One token always; more while the weights streamed (an upper bound: pairs x one expert's
  // weights) stay within a bound that depends on how many pairs share an expert: at most one
  // pair per local expert on average and kMaxDecodeWeightBytes, or at most half a pair and
  // kMaxSparseDecodeWeightBytes for up to kMaxSparseDecodeTokens tokens (cuda_experts.h).
  const int64_t weight_bytes =
      c.quant.quantized() ? 1 : static_cast<int64_t>(dtype_size(c.in_dtype));
  const int64_t expert_bytes = (c.w13_rows() + c.intermediate_size) * c.hidden_size * weight_bytes;
  const int64_t token_bytes = std::max<int64_t>(1, c.topk * expert_bytes);
  const int64_t dense = std::min(c.num_local_experts / c.topk, kMaxDecodeWeightBytes / token_bytes);
  const int64_t sparse = std::min({kMaxSparseDecodeTokens, c.num_local_experts / (2 * c.topk),
                                   kMaxSparseDecodeWeightBytes / token_bytes});
  return std::max<int64_t>({1, dense, sparse});
}

bool CudaExperts::runs_decode(int64_t M) const { return M <= max_decode_tokens(); }

bool CudaExperts::expects_unquantized_input() const {
  const QuantConfig& q = config().quant;
  return q.scheme == QuantScheme::fp8_block && !q.static_act_scale && max_decode_tokens() > 0 &&
         (config().in_dtype == DType::bf16 || config().in_dtype == DType::fp16);
}

WorkspaceShapes CudaExperts::workspace_shapes(int64_t M, int64_t, int64_t K, int64_t, int64_t,
                                              int64_t, const ExpertTokensMetadata*) const {
  const MoEConfig& c = config();
  const StandardLayout l = standard_layout(c, make_plan(c, fuse_gated_activation_), M,
                                           expects_unquantized_input(), nullptr, nullptr);
  // The decode path's workspace (h, and with fp8 h's codes and scales) aliases workspace13's
  // start (one path runs).
  const size_t decode_bytes = decode_mlp_workspace_bytes(c, std::min(M, max_decode_tokens()));
  return byte_workspaces(std::max(l.ws13_bytes, decode_bytes), l.ws2_bytes, {M, K}, c.in_dtype);
}

namespace {
DecodeMlpArgs decode_args(const MoEConfig& c, const ApplyArgs& a, int64_t M, void* workspace) {
  DecodeMlpArgs d;
  d.x = a.hidden_states.data();
  d.x_scale = a.a1q_scale.defined() ? a.a1q_scale.data_ptr<float>() : nullptr;
  d.x_dtype = a.hidden_states.dtype();
  d.M = M;
  d.K = c.hidden_size;
  d.N = c.intermediate_size;
  d.topk = c.topk;
  const PermuteArgs p = standard_permute_args(c, a, M);
  d.topk_ids = p.topk_ids;
  d.ids_dtype = p.ids_dtype;
  d.expert_map = p.expert_map;
  d.num_experts = p.num_experts;
  d.num_local_experts = p.num_local_experts;
  d.topk_weights = a.apply_router_weight_on_input ? nullptr : a.topk_weights.data_ptr<float>();
  const ExpertWeights& w = *a.weights;
  d.w13 = w.w13.data();
  d.w2 = w.w2.data();
  d.w13_scale = w.w13_scale.defined() ? w.w13_scale.data_ptr<float>() : nullptr;
  d.w2_scale = w.w2_scale.defined() ? w.w2_scale.data_ptr<float>() : nullptr;
  d.w_dtype = w.w13.dtype();
  d.activation = c.activation;
  d.gated_layout = c.gated_layout;
  const DecodeWorkspace ws = carve_decode_workspace(workspace, c, M);
  d.h = ws.h;
  d.h_codes = ws.h_codes;
  d.h_scale = ws.h_scale;
  d.out = a.output.data();
  d.out_dtype = a.output.dtype();
  return d;
}
}  // namespace

TopKWeightAndReducePtr CudaExperts::finalize_weight_and_reduce_impl() const {
  return std::make_shared<TopKWeightAndReduceNoOp>();
}

void CudaExperts::apply(const Context& ctx, const ApplyArgs& a) {
  static constexpr const char* kFn = "CudaExperts::apply";
  const MoEConfig& c = config();
  const bool quantizes_input = expects_unquantized_input();
  const int64_t M = check_standard_apply(kFn, ctx, c, a, quantizes_input), topk = c.topk;
  if (M == 0) return;
  const bool unquantized = c.quant.quantized() && a.hidden_states.dtype() == c.in_dtype;

  // The device first: CUB's scratch size (queried while carving) is the current device's.
  DeviceGuard guard(ctx.device.index);
  const cudaStream_t stream = static_cast<cudaStream_t>(ctx.stream);

  if (runs_decode(M)) {
    check_workspace(kFn, "workspace13", a.workspace13, decode_mlp_workspace_bytes(c, M),
                    ctx.device);
    const DecodeMlpArgs d = decode_args(c, a, M, a.workspace13.data());
    const std::string why = decode_mlp_unsupported(c, d);
    MODMOE_CHECK(why.empty() || decode_ == DecodePath::automatic)
        << kFn << ": DecodePath::always, but " << why;
    if (why.empty()) {
      TraceRange range(ctx, "decode_mlp");
      decode_mlp(d, stream);
      return;
    }
  }

  const MlpPlan plan = make_plan(c, fuse_gated_activation_);
  const StandardLayout need = standard_layout(c, plan, M, quantizes_input, nullptr, nullptr);
  check_workspace(kFn, "workspace13", a.workspace13, need.ws13_bytes, ctx.device);
  check_workspace(kFn, "workspace2", a.workspace2, need.ws2_bytes, ctx.device);
  const StandardLayout l = standard_layout(c, plan, M, quantizes_input, a.workspace13.data(),
                                           a.workspace2.data());
  // Unquantized fp8-block rows (the prepare left them to us): quantized here, as it would have.
  const void* x = a.hidden_states.data();
  const void* x_scale = a.a1q_scale.defined() ? a.a1q_scale.data() : nullptr;
  if (unquantized) {
    TraceRange range(ctx, "quantize");
    quantize_rows(x, c.in_dtype, c.hidden_size, M, /*num_rows=*/nullptr, c.hidden_size,
                  QuantScheme::fp8_block, /*static_scale=*/false, l.xq, l.xq_scale, stream);
    x = l.xq;
    x_scale = l.xq_scale;
  }

  // 1. Permute: rows grouped by local expert, token order within an expert.
  const PermuteArgs p = standard_permute_args(c, a, M);
  TraceRange permute_range(ctx, "permute");
  permute(p, l.perm, stream);
  permute_range.close();

  // 2. GEMM1 (gathering the token rows) -> activation -> [quantize].
  Gemm1Input in;
  in.a = x;
  in.a_row_index = l.perm.sorted_token;
  in.a_scale = x_scale;
  in.m_indptr = l.perm.m_indptr;
  in.max_rows = M * topk;
  const void* a2_scale = run_gemm1_and_activation(ctx, c, plan, *a.weights, in, l.mlp, stream);

  // 3. GEMM2 over the same rows into y (P, K) fp32.
  GroupedGemmArgs g2 = gemm2_args(c, plan, *a.weights, l.mlp, a2_scale);
  g2.m_indptr = l.perm.m_indptr;
  g2.max_rows = M * topk;
  g2.D = l.y;
  TraceRange gemm2_range(ctx, "gemm2");
  grouped_gemm(g2, stream);
  gemm2_range.close();

  // 4. Unpermute + top-k weight + reduce: out[t] = sum_k w[t, k] * y[row_of_pair[t, k]].
  const WeightedReduceArgs r = standard_reduce_args(c, a, l.y, DType::fp32, l.perm.row_of_pair, M);
  TraceRange reduce_range(ctx, "reduce");
  weighted_reduce(r, stream);
}

// ---- BatchedCudaExperts ----------------------------------------------------------------------

BatchedCudaExperts::BatchedCudaExperts(const MoEConfig& config, int num_dispatchers,
                                       bool fuse_gated_activation)
    : Experts(config),
      num_dispatchers_(num_dispatchers),
      fuse_gated_activation_(fuse_gated_activation) {
  check_experts_config("BatchedCudaExperts", config);
  check_batched_experts("BatchedCudaExperts", config, num_dispatchers);
}

WorkspaceShapes BatchedCudaExperts::workspace_shapes(int64_t, int64_t, int64_t K, int64_t, int64_t,
                                                     int64_t local_num_experts,
                                                     const ExpertTokensMetadata*) const {
  const MoEConfig& c = config();
  const int64_t T = c.max_num_tokens * num_dispatchers_;
  const BatchedLayout l =
      batched_layout(c, make_plan(c, fuse_gated_activation_), T, nullptr, nullptr);
  return byte_workspaces(l.ws13_bytes, l.ws2_bytes, {local_num_experts, T, K}, DType::fp32);
}

TopKWeightAndReducePtr BatchedCudaExperts::finalize_weight_and_reduce_impl() const {
  return std::make_shared<TopKWeightAndReduceDelegate>();
}

void BatchedCudaExperts::apply(const Context& ctx, const ApplyArgs& a) {
  static constexpr const char* kFn = "BatchedCudaExperts::apply";
  const MoEConfig& c = config();
  const int64_t E_local = c.num_local_experts;
  const int64_t T = c.max_num_tokens * num_dispatchers_;
  check_batched_apply(kFn, ctx, c, a, T);

  const MlpPlan plan = make_plan(c, fuse_gated_activation_);
  const BatchedLayout need = batched_layout(c, plan, T, nullptr, nullptr);
  check_workspace(kFn, "workspace13", a.workspace13, need.ws13_bytes, ctx.device);
  check_workspace(kFn, "workspace2", a.workspace2, need.ws2_bytes, ctx.device);
  const BatchedLayout l = batched_layout(c, plan, T, a.workspace13.data(), a.workspace2.data());

  DeviceGuard guard(ctx.device.index);
  const cudaStream_t stream = static_cast<cudaStream_t>(ctx.stream);

  // 1. Pack the valid rows: m_indptr over the counts, and the maps both ways.
  TraceRange pack_range(ctx, "pack");
  batched_pack_indices(a.expert_tokens_meta->expert_num_tokens.data_ptr<int32_t>(), E_local, T,
                       l.packed_rows, l.counts, l.m_indptr, l.packed_to_batched,
                       l.batched_to_packed, stream);
  pack_range.close();

  // 2. GEMM1 over the packed rows, gathering from (E_local, T, K) -> activation -> [quantize].
  Gemm1Input in;
  in.a = a.hidden_states.data();
  in.a_row_index = l.packed_to_batched;
  in.a_scale = a.a1q_scale.defined() ? a.a1q_scale.data() : nullptr;
  in.m_indptr = l.m_indptr;
  in.max_rows = l.packed_rows;
  const void* a2_scale = run_gemm1_and_activation(ctx, c, plan, *a.weights, in, l.mlp, stream);

  // 3. GEMM2 in batched mode: logical row e * T + i (i < counts[e]) reads packed row
  //    batched_to_packed[e * T + i] and is written to output row e * T + i.
  GroupedGemmArgs g2 = gemm2_args(c, plan, *a.weights, l.mlp, a2_scale);
  g2.a_row_index = l.batched_to_packed;
  g2.expert_num_tokens = l.counts;
  g2.batch_rows = T;
  g2.max_rows = l.packed_rows;  // bounds the sum of the (clamped) counts
  g2.D = a.output.data();
  TraceRange gemm2_range(ctx, "gemm2");
  grouped_gemm(g2, stream);
}

}  // namespace modmoe::cuda
