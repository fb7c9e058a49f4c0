// The stages of the portable CUDA path, one at a time (bench_stages.h). The sequence mirrors
// CudaExperts::apply (src/cuda/cuda_experts.cu) with the NoEP prepare in front:
//
//   route -> quantize (fp8) -> permute -> GEMM1 + act -> quantize intermediate (fp8) -> GEMM2
//   -> reduce
//
// Buffers and dtypes are CudaExperts': GEMM1 writes bf16 when nothing follows it and fp32
// when the intermediate is quantized; GEMM2 writes fp32; the reduce writes bf16.
#include <functional>

#include "bench_stages.h"
#include "cuda/byte_carver.h"
#include "cuda/grouped_gemm.h"
#include "cuda/permute.h"
#include "cuda/quantize.h"
#include "cuda/reduce.h"
#include "cuda/router.h"
#include "modmoe/quant.h"

namespace modmoe::bench {

namespace {

struct Stage {
  const char* name;
  const char* covers;
  std::function<void()> enqueue;  // empty: not on this configuration's path
};

}  // namespace

std::vector<StageTiming> time_stages(const StageInputs& in, cudaStream_t stream, int replays,
                                     L2Flush* flush) {
  const MoEConfig& c = in.config;
  const int64_t M = in.M, E = c.num_experts, K = c.hidden_size, N = c.intermediate_size;
  const int64_t topk = c.topk, pairs = M * topk;
  const QuantScheme scheme = c.quant.scheme;
  const bool fp8 = c.quant.quantized();

  DeviceBuffer topk_weights(size_t(pairs) * sizeof(float)), topk_ids(size_t(pairs) * 4);
  DeviceBuffer q, q_scale, h, hq, h_scale, y, out(size_t(M) * K * 2);
  if (fp8) {
    q = DeviceBuffer(size_t(M) * K);
    q_scale = DeviceBuffer(size_t(shape_numel(act_scale_shape(scheme, M, K))) * 4);
    hq = DeviceBuffer(size_t(pairs) * N);
    h_scale = DeviceBuffer(size_t(shape_numel(act_scale_shape(scheme, pairs, N))) * 4);
  }
  h = DeviceBuffer(size_t(pairs) * N * (fp8 ? 4 : 2));
  y = DeviceBuffer(size_t(pairs) * K * 4);
  cuda::ByteCarver sizer(nullptr);
  cuda::PermuteWorkspace::carve(sizer, pairs, E);
  DeviceBuffer perm_bytes(sizer.size());
  cuda::ByteCarver carver(perm_bytes.get());
  const cuda::PermuteWorkspace perm = cuda::PermuteWorkspace::carve(carver, pairs, E);

  cuda::RouterLogits logits;
  logits.data = in.logits;
  logits.dtype = DType::fp32;
  logits.rows = M;
  logits.num_experts = E;
  logits.row_stride = E;
  logits.col_stride = 1;
  cuda::RouterOutput routed;
  routed.weights = topk_weights.as<float>();
  routed.weights_row_stride = topk;
  routed.ids = topk_ids.get();
  routed.ids_dtype = DType::int32;
  routed.ids_row_stride = topk;

  cuda::PermuteArgs permute_args;
  permute_args.topk_ids = topk_ids.get();
  permute_args.ids_dtype = DType::int32;
  permute_args.num_tokens = M;
  permute_args.topk = topk;
  permute_args.num_experts = E;
  permute_args.num_local_experts = E;

  cuda::GroupedGemmArgs g1;
  g1.A = fp8 ? q.get() : in.x;
  g1.lda = K;
  g1.a_row_index = perm.sorted_token;
  g1.B = in.weights.w13.data();
  g1.ab_dtype = fp8 ? DType::fp8_e4m3 : c.in_dtype;
  g1.E = E;
  g1.N_b = c.w13_rows();
  g1.K = K;
  g1.m_indptr = perm.m_indptr;
  g1.max_rows = pairs;
  g1.scheme = scheme;
  g1.a_scale = fp8 ? q_scale.get() : nullptr;
  g1.b_scale = in.weights.w13_scale.defined() ? in.weights.w13_scale.data() : nullptr;
  g1.gated = is_gated(c.activation);
  g1.activation = c.activation;
  g1.gated_layout = c.gated_layout;
  g1.D = h.get();
  g1.ldd = N;
  g1.d_dtype = fp8 ? DType::fp32 : c.in_dtype;

  cuda::GroupedGemmArgs g2;
  g2.A = fp8 ? hq.get() : h.get();
  g2.lda = N;
  g2.B = in.weights.w2.data();
  g2.ab_dtype = g1.ab_dtype;
  g2.E = E;
  g2.N_b = K;
  g2.K = N;
  g2.m_indptr = perm.m_indptr;
  g2.max_rows = pairs;
  g2.scheme = scheme;
  g2.a_scale = fp8 ? h_scale.get() : nullptr;
  g2.b_scale = in.weights.w2_scale.defined() ? in.weights.w2_scale.data() : nullptr;
  g2.D = y.get();
  g2.ldd = K;
  g2.d_dtype = DType::fp32;

  cuda::WeightedReduceArgs reduce;
  reduce.src = y.get();
  reduce.src_dtype = DType::fp32;
  reduce.src_ld = K;
  reduce.pair_row = perm.row_of_pair;
  reduce.topk_weights = topk_weights.as<float>();
  reduce.M = M;
  reduce.topk = topk;
  reduce.K = K;
  reduce.out = out.get();
  reduce.out_dtype = DType::bf16;
  reduce.out_ld = K;

  const bool deepseek = in.routing == Routing::deepseek;
  std::vector<Stage> stages = {
      {"route",
       deepseek ? "sigmoid grouped top-k with bias over (M, E) fp32 logits (grouped_topk_rows)"
                : "softmax top-k over (M, E) fp32 logits, renormalized (softmax_topk_rows)",
       [&] {
         if (deepseek) {
           cuda::grouped_topk_rows(logits, in.correction_bias, topk, deepseek_routing(), routed,
                                   stream);
         } else {
           cuda::softmax_topk_rows(logits, topk, /*renormalize=*/true, routed, stream);
         }
       }},
      {"quantize", "hidden states (M, K) bf16 -> e4m3 + scales (quantize_rows), the NoEP prepare",
       fp8 ? std::function<void()>([&] {
         cuda::quantize_rows(in.x, c.in_dtype, K, M, nullptr, K, scheme, false, q.as<uint8_t>(),
                             q_scale.get(), stream);
       })
           : std::function<void()>()},
      {"permute", "stable radix sort of the M*topk pairs by expert -> m_indptr, row maps (permute)",
       [&] { cuda::permute(permute_args, perm, stream); }},
      {"gemm1_act",
       "grouped GEMM over w13 (E, 2N, K), rows gathered by sorted_token, act(gate)*up fused",
       [&] { cuda::grouped_gemm(g1, stream); }},
      {"quantize2", "intermediate (M*topk, N) fp32 -> e4m3 + scales, rows bounded on the device",
       fp8 ? std::function<void()>([&] {
         cuda::quantize_rows(h.get(), DType::fp32, N, pairs, perm.m_indptr + E, N, scheme, false,
                             hq.as<uint8_t>(), h_scale.get(), stream);
       })
           : std::function<void()>()},
      {"gemm2", "grouped GEMM over w2 (E, K, N) into (M*topk, K) fp32",
       [&] { cuda::grouped_gemm(g2, stream); }},
      {"reduce", "unpermute + top-k weighted fp32 sum -> (M, K) bf16 (weighted_reduce)",
       [&] { cuda::weighted_reduce(reduce, stream); }},
  };

  std::vector<StageTiming> results;
  // The whole path once, in order, so every stage's inputs are real.
  std::string failed;
  for (const Stage& s : stages) {
    StageTiming r{s.name, s.covers, {}, failed.empty() ? "" : "not run: " + failed + " failed"};
    if (s.enqueue && failed.empty()) {
      try {
        s.enqueue();
        BENCH_CUDA(cudaStreamSynchronize(stream));
      } catch (const std::exception& e) {
        r.error = e.what();
        failed = s.name;
      }
    }
    results.push_back(r);
  }
  for (size_t i = 0; i < stages.size(); ++i) {
    if (!stages[i].enqueue || !results[i].error.empty()) continue;
    try {
      const Graph graph(stream, cudaStreamCaptureModeGlobal, stages[i].enqueue);
      results[i].time = time_replays(stream, replays, 2, flush, [&] { graph.launch(stream); });
    } catch (const std::exception& e) {
      results[i].error = e.what();
    }
  }
  return results;
}

}  // namespace modmoe::bench
