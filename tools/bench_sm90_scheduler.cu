// `modmoe-bench --gemm`, the MoE scheduler at decode: the same sm90 kernel finding its tiles by
// the cooperative scheduler, a linear scan, or a tile list built in the graph, against a tile
// list built once outside the timed graph (the ideal).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "bench_device.h"
#include "bench_sm90_cases.h"
#include "cuda/sm90/sm90_gemm.h"
#include "modmoe/error.h"
#include "modmoe/moe_gemm.h"

namespace modmoe::bench::gemm_bench {

namespace sm90 = modmoe::cuda::sm90;

namespace {

// Each of M tokens picks topk distinct experts (seeded): the rows per expert of a real decode
// step. Row order inside an expert does not matter to the GEMM.
std::vector<int32_t> decode_indptr(int64_t M, int64_t E, int64_t topk, uint64_t seed,
                                   int64_t* experts_hit) {
  std::mt19937_64 rng(seed);
  std::vector<int32_t> count(size_t(E), 0);
  for (int64_t t = 0; t < M; ++t) {
    std::vector<int64_t> picked;
    while (int64_t(picked.size()) < topk) {
      const int64_t e = static_cast<int64_t>(rng() % uint64_t(E));
      if (std::find(picked.begin(), picked.end(), e) == picked.end()) picked.push_back(e);
    }
    for (int64_t e : picked) ++count[size_t(e)];
  }
  std::vector<int32_t> indptr(size_t(E + 1), 0);
  for (int64_t e = 0; e < E; ++e) indptr[size_t(e + 1)] = indptr[size_t(e)] + count[size_t(e)];
  *experts_hit = std::count_if(count.begin(), count.end(), [](int32_t n) { return n > 0; });
  return indptr;
}

}  // namespace

void run_scheduler_case(Env& env, SchedulerCase& c, const Weights& w, uint64_t seed) {
  const Fc1Shape& s = kDecodeShape;
  const int64_t E = s.E, K = s.K, N2 = s.N2, N = N2 / 2;
  const cudaStream_t stream = env.stream;
  const std::vector<int32_t> indptr = decode_indptr(c.M, E, kDecodeTopk, seed, &c.experts_hit);
  const int64_t rows = indptr.back();
  c.rows = rows;
  c.flops = 2.0 * double(rows) * N2 * K;
  c.weight_bytes = c.experts_hit * w.bytes_per_expert;
  c.tile = sm90::choose_tile(rows, N, K, E, true, c.dtype, false, env.info.sm_count);

  const DeviceBuffer m_indptr = upload(indptr);
  const Tensor tm = on_gpu(m_indptr, DType::int32, {E + 1});
  const Activations x = make_activations(env, c.dtype, rows, K, seed + 1);
  DeviceBuffer ref(size_t(rows * N) * 2), out(size_t(rows * N) * 2);
  const int64_t n_out = rows * N;

  MoeGemmOptions portable;
  portable.gated = true;
  portable.kernel = MoeGemmKernel::portable;
  measure(
      env, c.portable, [&] { poison(ref, stream); },
      [&] {
        moe_gemm_groupwise(env.ctx, x.ta, w.tb, x.ta_scale, w.tb_scale, tm,
                           on_gpu(ref, DType::bf16, {rows, N}), portable);
      },
      [&] {
        Diff d = compare(env, ref.get(), ref.get(), n_out);
        d.rel = 0;
        return d;
      });
  if (!c.portable.error.empty() || c.portable.diff.non_finite != 0) {
    c.error = "the portable reference " + (c.portable.error.empty()
                                               ? std::string("wrote non-finite values")
                                               : "failed: " + c.portable.error);
    return;
  }

  // All four variants launch the same kernel with the same arguments and tile; only the way
  // its CTAs find their tiles differs.
  sm90::GemmArgs g;
  g.a = x.a.get();
  g.total_rows = rows;
  g.b = w.b.get();
  g.E = E;
  g.N_b = N2;
  g.K = K;
  g.ab_dtype = c.dtype;
  g.m_indptr = m_indptr.as<int32_t>();
  g.a_scale = x.a_scale.as<float>();
  g.b_scale = w.b_scale.as<float>();
  g.gated = true;
  g.gated_layout = GatedLayout::GateUp;
  g.activation = Activation::silu;
  g.d = out.get();
  g.d_dtype = DType::bf16;
  g.tile = c.tile;
  g.sm_count = env.info.sm_count;

  auto variant = [&](Measured& m, MoeGemmScheduler scheduler, const sm90::WorkTile* list,
                     void* scratch) {
    sm90::GemmArgs a = g;
    a.scheduler = scheduler;
    a.tile_list = list;
    measure(
        env, m, [&] { poison(out, stream); }, [&, a, scratch] { sm90::launch(a, stream, scratch); },
        [&] { return compare(env, out.get(), ref.get(), n_out); });
  };

  // The ideal: the tile list written once, here, outside every timed graph.
  sm90::GemmArgs list_args = g;
  list_args.scheduler = MoeGemmScheduler::precomputed;
  DeviceBuffer list, scratch;
  try {
    const int64_t capacity = sm90::tile_list_capacity(list_args);
    list = DeviceBuffer(size_t(capacity) * sizeof(sm90::WorkTile));
    scratch = DeviceBuffer(size_t(capacity) * sizeof(sm90::WorkTile));
    sm90::build_tile_list(list_args, list.as<sm90::WorkTile>(), stream);
    BENCH_CUDA(cudaStreamSynchronize(stream));
  } catch (const Error& e) {
    ensure_context_alive(e.what());
    c.error = std::string("building the tile list: ") + e.what();
    return;
  }
  variant(c.ideal, MoeGemmScheduler::precomputed, list.as<sm90::WorkTile>(), nullptr);
  variant(c.cooperative, MoeGemmScheduler::cooperative, nullptr, nullptr);
  variant(c.linear_scan, MoeGemmScheduler::linear_scan, nullptr, nullptr);
  variant(c.precomputed, MoeGemmScheduler::precomputed, nullptr, scratch.get());
}

}  // namespace modmoe::bench::gemm_bench
