// `modmoe-bench --gemm`, fused vs unfused FC1: the sm90 kernel with act(gate)*up in its
// epilogue against the same kernel ungated followed by the activation kernel, the portable
// kernel as the reference, and for fp8 inputs the fused variant that quantizes its output and
// the fused variant with MX-FP8 scales.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "bench_device.h"
#include "bench_kernels.h"
#include "bench_sm90_cases.h"
#include "cuda/activation.h"
#include "cuda/sm90/sm90_gemm.h"
#include "modmoe/moe_gemm.h"
#include "modmoe/quant.h"

namespace modmoe::bench::gemm_bench {

namespace sm90 = modmoe::cuda::sm90;

namespace {

// The fused FC1 on the same e4m3 codes with MX scales: e8m0 codes around the block scales'
// magnitudes (weights ~ N(0, 1/K) as make_weights makes them; activations ~ N(0, 1)), a random
// one per 32 K elements of every row. Its reference is the portable kernel's MX result
// (computed once, untimed). `out` is scratch (the fused buffer, checked already).
void run_mx_variant(Env& env, Fc1Case& c, const Weights& w, const Activations& x,
                    const Tensor& tm, DeviceBuffer& out) {
  const Fc1Shape& s = *c.shape;
  const int64_t rows = c.rows, N = s.N2 / 2, kq = s.K / kMxBlockSize;
  c.mx.attempted = true;
  DeviceBuffer a_mx(size_t(rows * kq)), b_mx(size_t(s.E * s.N2 * kq)), ref(size_t(rows * N) * 2);
  // 2^(code - 127) ~ 1 / (112 sqrt(K)) for the weights, ~ 1 / 112 for the activations.
  const int b_code = 127 - static_cast<int>(std::lround(std::log2(112.0 * std::sqrt(double(s.K)))));
  fill_e8m0(b_mx.as<uint8_t>(), s.E * s.N2 * kq, 91, b_code - 1, b_code + 1, env.stream);
  fill_e8m0(a_mx.as<uint8_t>(), rows * kq, 92, 127 - 7 - 1, 127 - 7 + 1, env.stream);
  const Tensor ta_mx = on_gpu(a_mx, DType::e8m0, {rows, kq}),
               tb_mx = on_gpu(b_mx, DType::e8m0, {s.E, s.N2, kq});
  const Tensor t_out = on_gpu(out, DType::bf16, {rows, N}), t_ref = on_gpu(ref, DType::bf16, {rows, N});
  MoeGemmOptions o;
  o.gated = true;
  o.gated_layout = GatedLayout::GateUp;
  o.activation = Activation::silu;
  o.kernel = MoeGemmKernel::portable;
  try {
    poison(ref, env.stream);
    moe_gemm_groupwise(env.ctx, x.ta, w.tb, ta_mx, tb_mx, tm, t_ref, o);
    ensure_context_alive("the portable MX reference");
  } catch (const ContextLost&) {
    throw;
  } catch (const std::exception& e) {
    c.mx.error = std::string("the portable MX reference failed: ") + e.what();
    return;
  }
  o.kernel = MoeGemmKernel::sm90;
  measure(
      env, c.mx, [&] { poison(out, env.stream); },
      [&] { moe_gemm_groupwise(env.ctx, x.ta, w.tb, ta_mx, tb_mx, tm, t_out, o); },
      [&] { return compare(env, out.get(), ref.get(), rows * N); });
}

}  // namespace

void run_fc1_case(Env& env, Fc1Case& c, const Weights& w, uint64_t seed) {
  const Fc1Shape& s = *c.shape;
  const int64_t E = s.E, K = s.K, N2 = s.N2, N = N2 / 2, R = c.rows_per_expert, rows = E * R;
  const cudaStream_t stream = env.stream;
  const Context& ctx = env.ctx;
  c.rows = rows;
  c.flops = 2.0 * double(rows) * N2 * K;
  c.weight_bytes = E * w.bytes_per_expert;  // every expert receives rows
  c.tile_fused = moe_gemm_sm90_tile_for(rows, N, K, E, true, c.dtype, env.info.sm_count);
  c.tile_unfused = moe_gemm_sm90_tile_for(rows, N2, K, E, false, c.dtype, env.info.sm_count);

  std::vector<int32_t> indptr(size_t(E + 1));
  for (int64_t e = 0; e <= E; ++e) indptr[size_t(e)] = static_cast<int32_t>(e * R);
  const DeviceBuffer m_indptr = upload(indptr);
  const Tensor tm = on_gpu(m_indptr, DType::int32, {E + 1});
  const Activations x = make_activations(env, c.dtype, rows, K, seed);
  c.bytes = c.weight_bytes + x.bytes + 2.0 * rows * N;

  DeviceBuffer ref(size_t(rows * N) * 2), fused(size_t(rows * N) * 2), act(size_t(rows * N) * 2),
      h(size_t(rows * N2) * 2);
  const Tensor t_ref = on_gpu(ref, DType::bf16, {rows, N}),
               t_fused = on_gpu(fused, DType::bf16, {rows, N}),
               t_h = on_gpu(h, DType::bf16, {rows, N2});
  auto gemm = [&](const Tensor& out, const MoeGemmOptions& o) {
    moe_gemm_groupwise(ctx, x.ta, w.tb, x.ta_scale, w.tb_scale, tm, out, o);
  };
  MoeGemmOptions gated;
  gated.gated = true;
  gated.gated_layout = GatedLayout::GateUp;
  gated.activation = Activation::silu;
  gated.kernel = MoeGemmKernel::sm90;
  MoeGemmOptions portable = gated;
  portable.kernel = MoeGemmKernel::portable;
  MoeGemmOptions plain;
  plain.kernel = MoeGemmKernel::sm90;

  // The reference first: every check compares with it.
  const int64_t n_out = rows * N;
  measure(
      env, c.portable, [&] { poison(ref, stream); }, [&] { gemm(t_ref, portable); },
      [&] {
        Diff d = compare(env, ref.get(), ref.get(), n_out);
        d.rel = 0;  // the reference itself
        return d;
      });
  if (!c.portable.error.empty() || c.portable.diff.non_finite != 0) {
    c.error = "the portable reference " +
              (c.portable.error.empty()
                   ? "wrote " + std::to_string(c.portable.diff.non_finite) + " non-finite values"
                   : "failed: " + c.portable.error);
    return;
  }
  auto against_ref = [&](const void* out) {
    return [&env, out, &ref, n_out] { return compare(env, out, ref.get(), n_out); };
  };

  measure(
      env, c.fused, [&] { poison(fused, stream); }, [&] { gemm(t_fused, gated); },
      against_ref(fused.get()));
  measure(
      env, c.unfused,
      [&] {
        poison(h, stream);
        poison(act, stream);
      },
      [&] {
        gemm(t_h, plain);
        cuda::activation_and_mul(Activation::silu, GatedLayout::GateUp, h.get(), DType::bf16, N2,
                                 act.get(), DType::bf16, N, rows, nullptr, N, stream);
      },
      against_ref(act.get()));

  if (c.dtype != DType::fp8_e4m3) return;
  run_mx_variant(env, c, w, x, tm, fused);

  // The fp8-out fused variant: act(gate)*up quantized per row and 128 columns (GEMM2's input).
  c.fp8_out.tolerance = kFp8OutTolerance;
  c.tile_fp8_out = sm90::choose_tile(rows, N, K, E, true, DType::fp8_e4m3, true, env.info.sm_count);
  if (c.tile_fp8_out.empty() || N % kBlockSize != 0) {
    c.fp8_out.attempted = true;
    c.fp8_out.not_applicable = true;
    c.fp8_out.note =
        c.tile_fp8_out.empty() ? "no tile for an fp8 output" : "N is not a multiple of 128";
    return;
  }
  DeviceBuffer q(size_t(rows * N)), q_scale(size_t(rows * (N / kBlockSize)) * 4);
  const Tensor t_q = on_gpu(q, DType::fp8_e4m3, {rows, N}),
               t_q_scale = on_gpu(q_scale, DType::fp32, {rows, N / kBlockSize});
  MoeGemmOptions fp8_out = gated;
  fp8_out.out_scale = t_q_scale;
  measure(
      env, c.fp8_out,
      [&] {
        poison(q, stream);
        poison(q_scale, stream);
      },
      [&] { gemm(t_q, fp8_out); },
      [&] {  // dequantized into the (free by now) fused buffer, then compared
        dequantize_activations(ctx, t_q, t_q_scale, QuantScheme::fp8_block, t_fused);
        return compare(env, fused.get(), ref.get(), n_out);
      },
      /*declinable=*/true);
}

}  // namespace modmoe::bench::gemm_bench
