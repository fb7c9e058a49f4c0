// Sm90Experts and BatchedSm90Experts (see sm90_experts.h).
//
// Workspaces (bytes, carved by the same functions in workspace_shapes and apply):
//   Sm90Experts, P = M * topk pairs:
//     workspace2:  permute arrays + CUB scratch | a (P, K) gathered rows | a scales (P, kb)
//                  | a2 (P, N) GEMM2 operand | a2 scales (P, nb)          (scales: fp8 only)
//     workspace13: y (P, K) bf16, GEMM2's output (the reduce sums its top-k rows in fp32, in
//                  fixed order); with the reduce folded into GEMM2, (M, K) fp32 token rows
//                  instead (the epilogue's atomics add into fp32)
//   BatchedSm90Experts, R = E_local * T rows:
//     workspace2:  a2 (R, N) | a2 scales (R, nb)
//     workspace13: (none: GEMM2 writes the output)
//   kb = ceil(K/128), nb = ceil(N/128): group-128 scales, the last group of a row partial when
//   K or N is not a multiple of 128 (act_scale_shape).
#include <cuda_runtime.h>

#include <algorithm>
#include <sstream>

#include "core/validate.h"
#include "cuda/batched.h"
#include "cuda/byte_carver.h"
#include "cuda/cuda_check.h"
#include "cuda/cuda_topk_weight_and_reduce.h"
#include "cuda/device_guard.h"
#include "cuda/experts_common.h"
#include "cuda/permute.h"
#include "cuda/quantize.h"
#include "cuda/reduce.h"
#include "cuda/sm90/sm90_experts.h"
#include "cuda/sm90/sm90_gemm.h"
#include "modmoe/quant.h"
#include "modmoe/trace.h"

namespace modmoe::cuda {

namespace {

bool is_fp8(const MoEConfig& c) { return c.quant.scheme == QuantScheme::fp8_block; }
// The group-128 scales of `rows` rows of `cols` fp8 values (act_scale_shape: the last group of
// a row may be partial).
int64_t scale_count(int64_t rows, int64_t cols) {
  return shape_numel(act_scale_shape(QuantScheme::fp8_block, rows, cols));
}
DType operand_dtype(const MoEConfig& c) { return is_fp8(c) ? DType::fp8_e4m3 : DType::bf16; }

// Decode-sized applies (at most 16 rows per busy expert: each GEMM streams its experts'
// weights) launch both GEMMs and the weighted reduce programmatically (GemmArgs::programmatic,
// WeightedReduceArgs::programmatic): GEMM1's CTAs request their first weight stages while the
// gather or quantize-scatter runs, GEMM2's while GEMM1's last tiles run on a few SMs and the
// others stand idle, and the reduce's blocks load their rows' indices and weights while GEMM2's
// last tiles run (Qwen3 / Qwen3.5 fp8 M = 16: 0.97-0.98x, docs/perf.md thirty-third session).
// Not for larger applies: launched so at every M (ninth session, docs/perf.md), bf16 layers at
// M >= 1024 ran 5-14 % slower (not explained; the suspect is where a dependent grid's CTAs land);
// with the rule at 32 rows, DeepSeek-V3 M = 1024 (32 rows per expert) ran 1.13-1.17x slower and
// Mixtral M = 128 0.975-0.99x faster (A/B, thirty-third session): 16 it stays.
constexpr int64_t kProgrammaticRowsPerExpert = 16;
bool launches_programmatically(int64_t pairs, int64_t E_local) {
  const int64_t busy = std::max<int64_t>(1, std::min(E_local, pairs));
  return (pairs + busy - 1) / busy <= kProgrammaticRowsPerExpert;
}

// GEMM2's operand: (rows, N) in the operand dtype, with its group-128 scales when fp8.
struct Intermediate {
  void* a2 = nullptr;
  float* a2_scale = nullptr;
};

Intermediate carve_intermediate(const MoEConfig& c, int64_t rows, ByteCarver& carver) {
  const int64_t N = c.intermediate_size;
  Intermediate m;
  m.a2 = carver.take_bytes(static_cast<size_t>(rows * N) * dtype_size(operand_dtype(c)));
  if (is_fp8(c)) m.a2_scale = carver.take<float>(scale_count(rows, N));
  return m;
}

// The parts of both GEMMs that do not depend on the row structure.
sm90::GemmArgs gemm1_args(const MoEConfig& c, const ExpertWeights& w, const void* a,
                          const void* a_scale, int64_t rows, const Intermediate& m) {
  sm90::GemmArgs g;
  g.a = a;
  g.total_rows = rows;
  g.b = w.w13.data();
  g.E = c.num_local_experts;
  g.N_b = c.w13_rows();
  g.K = c.hidden_size;
  g.ab_dtype = operand_dtype(c);
  g.a_scale = static_cast<const float*>(a_scale);
  g.b_scale = w.w13_scale.defined() ? w.w13_scale.data_ptr<float>() : nullptr;
  g.gated = true;
  g.gated_layout = c.gated_layout;
  g.activation = c.activation;
  g.d = m.a2;
  g.d_dtype = is_fp8(c) ? DType::fp8_e4m3 : DType::bf16;
  g.d_scale = m.a2_scale;
  return g;
}

sm90::GemmArgs gemm2_args(const MoEConfig& c, const ExpertWeights& w, int64_t rows,
                          const Intermediate& m, void* y, DType y_dtype) {
  sm90::GemmArgs g;
  g.a = m.a2;
  g.total_rows = rows;
  g.b = w.w2.data();
  g.E = c.num_local_experts;
  g.N_b = c.hidden_size;
  g.K = c.intermediate_size;
  g.ab_dtype = operand_dtype(c);
  g.a_scale = m.a2_scale;
  g.b_scale = w.w2_scale.defined() ? w.w2_scale.data_ptr<float>() : nullptr;
  g.d = y;
  g.d_dtype = y_dtype;
  return g;
}

void check_supported(const char* name, const MoEConfig& c, const Context& ctx) {
  const std::string why = sm90_experts_unsupported(c);
  MODMOE_CHECK(why.empty()) << name << ": " << why;
  MODMOE_CHECK(sm90::available(ctx.device.index))
      << name << ": needs an sm_90 device and a build with the sm_90a kernels; " << ctx.device.str()
      << " cannot run them";
}

// ---- Sm90Experts layout -----------------------------------------------------------------------

struct StandardLayout {
  PermuteWorkspace perm;
  void* a = nullptr;         // (P, K) gathered rows
  float* a_scale = nullptr;  // (P, ceil(K/128))
  Intermediate mid;
  void* y = nullptr;  // (P, K) y_dtype, or (M, K) fp32 with the folded reduce
  DType y_dtype = DType::bf16;
  size_t ws13_bytes = 0, ws2_bytes = 0;
};

// GEMM2's output. The fixed-order reduce reads y once, so y's traffic (written by GEMM2, read by
// the reduce: 2 * P * K elements) grows with the pairs: in fp32 at Qwen3-30B, M = 8192 that is
// 1.07 GB, and the reduce alone took 166 of the 1333 us (docs/perf.md, seventh session). In bf16
// (what the input and output already are) each of a token's top-k rows is rounded once before
// the fp32 weighted sum, as in vLLM's fused MoE. The folded reduce adds into fp32 with atomics.
DType y_dtype(bool reduce_in_gemm2) { return reduce_in_gemm2 ? DType::fp32 : DType::bf16; }

StandardLayout standard_layout(const MoEConfig& c, int64_t M, bool reduce_in_gemm2, void* ws13,
                               void* ws2) {
  const int64_t P = M * c.topk, K = c.hidden_size;
  StandardLayout l;
  ByteCarver c2(ws2), c13(ws13);
  l.perm = PermuteWorkspace::carve(c2, P, c.num_local_experts);
  l.a = c2.take_bytes(static_cast<size_t>(P * K) * dtype_size(operand_dtype(c)));
  if (is_fp8(c)) l.a_scale = c2.take<float>(scale_count(P, K));
  l.mid = carve_intermediate(c, P, c2);
  l.y_dtype = y_dtype(reduce_in_gemm2);
  l.y = c13.take_bytes(static_cast<size_t>((reduce_in_gemm2 ? M : P) * K) * dtype_size(l.y_dtype));
  l.ws13_bytes = c13.size();
  l.ws2_bytes = c2.size();
  return l;
}

}  // namespace

std::string sm90_experts_unsupported(const MoEConfig& c) {
  std::ostringstream why;
  const int64_t K = c.hidden_size, N = c.intermediate_size;
  if (c.in_dtype != DType::bf16) {
    why << "in_dtype must be bf16, got " << dtype_name(c.in_dtype);
  } else if (c.quant.scheme != QuantScheme::none && c.quant.scheme != QuantScheme::fp8_block) {
    why << "the scheme must be none or fp8_block, got " << c.quant.str();
  } else if (c.quant.static_act_scale) {
    why << "static activation scales are not supported";
  } else if (!is_gated(c.activation)) {
    why << "the activation must be gated (the epilogue computes act(gate)*up), got "
        << activation_name(c.activation);
  } else if (K % 16 != 0 || N % 16 != 0) {
    why << "K and N must be multiples of 16, got K = " << K << ", N = " << N;
  } else if (is_fp8(c) && c.gated_layout != GatedLayout::Interleaved && N % 64 != 0) {
    // GEMM1 writes the fp8 intermediate from 256-wide tiles (one 128-column quantization group
    // per tile row); both, 64x256 and 128x256, read one weight scale per 64 gate or up rows,
    // each part of which must lie in one 128-row weight-scale block of w13: N % 64 == 0
    // (sm90_gemm.cu, fp8_block_misfit). K and N need not be multiples of 128 (partial last scale
    // groups).
    why << "fp8_block with a " << gated_layout_name(c.gated_layout)
        << " w13 needs N to be a multiple of 64 (one weight-scale block per gate or up half of "
           "a 64x256 tile), got K = "
        << K << ", N = " << N;
  }
  return why.str();
}

namespace {
// What both constructors accept: the CUDA experts' configs that the Hopper kernels run.
void check_sm90_config(const char* name, const MoEConfig& c) {
  check_experts_config(name, c);
  const std::string why = sm90_experts_unsupported(c);
  MODMOE_CHECK(why.empty()) << name << ": " << why;
}
}  // namespace

// ---- Sm90Experts -----------------------------------------------------------------------------

Sm90Experts::Sm90Experts(const MoEConfig& config, bool reduce_in_gemm2)
    : Experts(config), reduce_in_gemm2_(reduce_in_gemm2) {
  check_sm90_config("Sm90Experts", config);
  // The small-M route (runs_portable) is for the default, fixed-order reduce; an Sm90Experts
  // asked to fold the reduce into GEMM2 always runs that epilogue (and keeps its smaller
  // workspace).
  if (!reduce_in_gemm2) portable_ = std::make_unique<CudaExperts>(config);
}

int64_t Sm90Experts::decode_rows_per_expert() const {
  return is_fp8(config()) ? kDecodeRowsPerExpertFp8 : kDecodeRowsPerExpertBf16;
}

bool Sm90Experts::runs_portable(int64_t M) const {
  return portable_ && (M <= max_portable_tokens() || portable_->runs_decode(M));
}

int64_t Sm90Experts::max_portable_tokens() const {
  // M * topk pairs spread over min(E_local, pairs) busy experts: at most R rows each while
  // pairs <= E_local (one row each) or pairs <= R * E_local, so M <= R * E_local / topk.
  if (!portable_) return 0;
  return decode_rows_per_expert() * std::max<int64_t>(1, config().num_local_experts) /
         std::max<int64_t>(1, config().topk);
}

WorkspaceShapes Sm90Experts::workspace_shapes(int64_t M, int64_t N, int64_t K, int64_t topk,
                                              int64_t E, int64_t E_local,
                                              const ExpertTokensMetadata* meta) const {
  const StandardLayout l = standard_layout(config(), M, reduce_in_gemm2_, nullptr, nullptr);
  size_t ws13 = l.ws13_bytes, ws2 = l.ws2_bytes;
  if (portable_) {
    // An apply of up to M tokens may take the portable CudaExperts, but only one of at most
    // max_portable_tokens() (its grouped pipeline) or max_decode_tokens() (its decode path)
    // tokens: its workspace for that many.
    const int64_t M_portable =
        std::min(M, std::max(max_portable_tokens(), portable_->max_decode_tokens()));
    const WorkspaceShapes w = portable_->workspace_shapes(M_portable, N, K, topk, E, E_local, meta);
    ws13 = std::max<size_t>(ws13, static_cast<size_t>(shape_numel(w.workspace13)));
    ws2 = std::max<size_t>(ws2, static_cast<size_t>(shape_numel(w.workspace2)));
  }
  return byte_workspaces(ws13, ws2, {M, K}, config().in_dtype);
}

TopKWeightAndReducePtr Sm90Experts::finalize_weight_and_reduce_impl() const {
  return std::make_shared<TopKWeightAndReduceNoOp>();
}

bool Sm90Experts::expects_unquantized_input() const { return is_fp8(config()); }

void Sm90Experts::apply(const Context& ctx, const ApplyArgs& a) {
  static constexpr const char* kFn = "Sm90Experts::apply";
  const MoEConfig& c = config();
  const int64_t M = check_standard_apply(kFn, ctx, c, a, /*may_be_unquantized=*/true),
                K = c.hidden_size, topk = c.topk;
  check_supported(kFn, c, ctx);
  MODMOE_CHECK(!reduce_in_gemm2_ || !ctx.deterministic)
      << kFn << ": this Sm90Experts folds the top-k reduce into GEMM2 with float atomics, which a "
      << "deterministic forward forbids; set Context::deterministic = false, or build it with "
      << "reduce_in_gemm2 = false";
  if (M == 0) return;
  // The portable route: CudaExperts, whose decode path quantizes unquantized fp8-block rows
  // itself (it expects them whenever it runs decode-sized applies).
  if (runs_portable(M)) return portable_->apply(ctx, a);

  DeviceGuard guard(ctx.device.index);
  const cudaStream_t stream = static_cast<cudaStream_t>(ctx.stream);
  const StandardLayout need = standard_layout(c, M, reduce_in_gemm2_, nullptr, nullptr);
  check_workspace(kFn, "workspace13", a.workspace13, need.ws13_bytes, ctx.device);
  check_workspace(kFn, "workspace2", a.workspace2, need.ws2_bytes, ctx.device);
  const StandardLayout l =
      standard_layout(c, M, reduce_in_gemm2_, a.workspace13.data(), a.workspace2.data());
  const int64_t P = M * topk;

  // 1. Permute, then gather each row's token (and its scales): TMA reads contiguous rows.
  //    Unquantized fp8-block input: each token quantized once and written to its rows.
  const PermuteArgs p = standard_permute_args(c, a, M);
  {
    TraceRange range(ctx, "permute");
    permute(p, l.perm, stream);
    const int64_t row_bytes = K * static_cast<int64_t>(dtype_size(operand_dtype(c)));
    const RowCopy rows{a.hidden_states.data(), row_bytes, l.a, row_bytes, row_bytes};
    if (is_fp8(c) && a.hidden_states.dtype() != DType::fp8_e4m3) {
      quantize_scatter_rows(a.hidden_states.data(), c.in_dtype, M, K, QuantScheme::fp8_block,
                            l.perm.row_of_pair, topk, static_cast<uint8_t*>(l.a), l.a_scale,
                            stream);
    } else if (is_fp8(c)) {
      // The rows and their scale rows in one launch (where a copy unit fits both).
      const int64_t scale_bytes = scale_count(1, K) * 4;
      const RowCopy scales{a.a1q_scale.data(), scale_bytes, l.a_scale, scale_bytes, scale_bytes};
      batched_gather_rows(rows, scales, l.perm.sorted_token, P, stream);
    } else {
      batched_gather_rows(rows.src, row_bytes, rows.dst, row_bytes, row_bytes, l.perm.sorted_token,
                          P, stream);
    }
  }

  // 2. GEMM1 + act(gate)*up (+ fp8 quantization) in its epilogue. m_indptr is the permute's,
  //    written before the gather began: a programmatic GEMM1 may read it before its wait.
  const bool programmatic = launches_programmatically(P, c.num_local_experts);
  sm90::GemmArgs g1 = gemm1_args(c, *a.weights, l.a, l.a_scale, P, l.mid);
  g1.m_indptr = l.perm.m_indptr;
  g1.sm_count = ctx.sm_count;
  g1.programmatic = programmatic;
  {
    TraceRange range(ctx, "gemm1");
    sm90::launch(g1, stream);
  }

  // 3. GEMM2, then unpermute + top-k weight + reduce: either GEMM2 writes y (P, K) and a
  //    kernel reduces in fixed k order, or GEMM2's epilogue adds weighted rows into y (M, K)
  //    (float atomics) and the same kernel only converts y to the output dtype.
  sm90::GemmArgs g2 = gemm2_args(c, *a.weights, P, l.mid, l.y, l.y_dtype);
  g2.m_indptr = l.perm.m_indptr;
  g2.sm_count = ctx.sm_count;
  g2.programmatic = programmatic && !reduce_in_gemm2_;  // (not after the memset of y below)
  WeightedReduceArgs r = standard_reduce_args(c, a, l.y, l.y_dtype, l.perm.row_of_pair, M);
  if (reduce_in_gemm2_) {
    g2.row_pair = l.perm.sorted_pair;
    g2.pair_weight = a.apply_router_weight_on_input ? nullptr : a.topk_weights.data_ptr<float>();
    g2.topk = topk;
    MODMOE_CUDA_CHECK(cudaMemsetAsync(l.y, 0, static_cast<size_t>(M * K) * sizeof(float), stream));
    r.pair_row = nullptr;  // y is already (M, K): out[t] = y[t]
    r.topk = 1;
    r.topk_weights = nullptr;
  }
  {
    TraceRange range(ctx, "gemm2");
    sm90::launch(g2, stream);
  }
  // Programmatic after GEMM2 as GEMM2 after GEMM1 (row_of_pair and the weights are older; y is
  // GEMM2's, read after the wait). After a folded GEMM2 too: its atomics into y end with it.
  r.programmatic = programmatic;
  TraceRange range(ctx, "reduce");
  weighted_reduce(r, stream);
}

// ---- BatchedSm90Experts ----------------------------------------------------------------------

BatchedSm90Experts::BatchedSm90Experts(const MoEConfig& config, int num_dispatchers)
    : Experts(config), num_dispatchers_(num_dispatchers) {
  check_sm90_config("BatchedSm90Experts", config);
  check_batched_experts("BatchedSm90Experts", config, num_dispatchers);
}

WorkspaceShapes BatchedSm90Experts::workspace_shapes(int64_t, int64_t, int64_t K, int64_t, int64_t,
                                                     int64_t local_num_experts,
                                                     const ExpertTokensMetadata*) const {
  const MoEConfig& c = config();
  const int64_t T = c.max_num_tokens * num_dispatchers_;
  ByteCarver c2(nullptr);
  carve_intermediate(c, c.num_local_experts * T, c2);
  return byte_workspaces(0, c2.size(), {local_num_experts, T, K}, DType::fp32);
}

TopKWeightAndReducePtr BatchedSm90Experts::finalize_weight_and_reduce_impl() const {
  return std::make_shared<TopKWeightAndReduceDelegate>();
}

void BatchedSm90Experts::apply(const Context& ctx, const ApplyArgs& a) {
  static constexpr const char* kFn = "BatchedSm90Experts::apply";
  const MoEConfig& c = config();
  const int64_t T = c.max_num_tokens * num_dispatchers_, rows = c.num_local_experts * T;
  check_batched_apply(kFn, ctx, c, a, T);
  check_supported(kFn, c, ctx);
  ByteCarver need(nullptr);
  carve_intermediate(c, rows, need);
  check_workspace(kFn, "workspace2", a.workspace2, need.size(), ctx.device);
  ByteCarver c2(a.workspace2.data());
  const Intermediate mid = carve_intermediate(c, rows, c2);

  DeviceGuard guard(ctx.device.index);
  const cudaStream_t stream = static_cast<cudaStream_t>(ctx.stream);
  const int32_t* counts = a.expert_tokens_meta->expert_num_tokens.data_ptr<int32_t>();

  sm90::GemmArgs g1 = gemm1_args(c, *a.weights, a.hidden_states.data(),
                                 a.a1q_scale.defined() ? a.a1q_scale.data() : nullptr, rows, mid);
  g1.expert_num_tokens = counts;
  g1.batch_rows = T;
  g1.sm_count = ctx.sm_count;
  {
    TraceRange range(ctx, "gemm1");
    sm90::launch(g1, stream);
  }
  sm90::GemmArgs g2 = gemm2_args(c, *a.weights, rows, mid, a.output.data_ptr<float>(), DType::fp32);
  g2.expert_num_tokens = counts;
  g2.batch_rows = T;
  g2.sm_count = ctx.sm_count;
  // Decode-sized batches (at most 16 rows per expert): GEMM2 after GEMM1 as Sm90Experts launches
  // it (the counts are the dispatch's, older than GEMM1). GEMM1 stays normal: its scheduler reads
  // the counts before any wait, and the kernel before it wrote them. M = 1: 0.88-0.96x on Qwen3,
  // Qwen3.5 and gpt-oss, M = 16 0.97-0.99x (A/B, docs/perf.md thirty-third session §4).
  g2.programmatic = T <= kProgrammaticRowsPerExpert;
  TraceRange range(ctx, "gemm2");
  sm90::launch(g2, stream);
}

}  // namespace modmoe::cuda
