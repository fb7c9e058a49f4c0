// The CUDA MoE data-movement kernels on their own (src/cuda/permute.h, reduce.h, activation.h,
// batched.h and the CUDA TopKWeightAndReduce kinds):
//   permute     m_indptr, the stable (token-order) row order and the row maps against a host
//               recount, out-of-range routing, no tokens, capture in a graph (CUB's multi-pass
//               sort)
//   reduce      Contiguous / NaiveBatched / NoOp against the CPU implementations on the same
//               data; rows of non-local pairs and rows past the counts are NaN, so reading one
//               fails
//   activation  every activation and gated layout against activation.h's formulas in double,
//               the device num_rows bound, in place
//   batched     slots, scatter, gather and packing (count clamping) against host recounts
// Every output is poisoned (0xff bytes: NaN, or -1 for indices) before the call.
#include <cuda_runtime.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "cpu/topk_weight_and_reduce.h"
#include "cuda/activation.h"
#include "cuda/batched.h"
#include "cuda/byte_carver.h"
#include "cuda/cuda_session.h"
#include "cuda/cuda_topk_weight_and_reduce.h"
#include "cuda/gpu_test.h"
#include "cuda/permute.h"
#include "modmoe/activation.h"
#include "modmoe/allocator.h"
#include "modmoe/numeric.h"

namespace modmoe {
namespace {

using ::modmoe::testing::bytes_of;
using ::modmoe::testing::CudaSession;
using ::modmoe::testing::error_of;
using ::testing::HasSubstr;

// ---- helpers --------------------------------------------------------------------------------

// Fills device memory with 0xff bytes: NaN for bf16/fp16/fp32/e4m3/e8m0, -1 for int32.
void poison_device(const CudaSession& s, const Tensor& t) {
  ASSERT_EQ(cudaMemsetAsync(t.data(), 0xff, t.nbytes(), s.stream()), cudaSuccess);
}

// Random routing: `topk` distinct ids per token in [0, E); optionally an expert map that makes
// `E_local` random global experts local, numbered in random order.
struct HostRouting {
  int64_t M, topk, E, E_local;
  OwnedTensor ids, weights, map;  // map undefined without EP

  int64_t id(int64_t p) const { return load_index(ids.tensor().data(), ids.tensor().dtype(), p); }
  int64_t local(int64_t p) const {
    const int64_t g = id(p);
    return map.tensor().defined() ? map.data_ptr<int32_t>()[g] : g;
  }
};

HostRouting random_routing(int64_t M, int64_t topk, int64_t E, int64_t E_local, bool int64_ids,
                           std::mt19937& rng) {
  HostRouting r{M,
                topk,
                E,
                E_local,
                host_tensor(int64_ids ? DType::int64 : DType::int32, {M, topk}),
                host_tensor(DType::fp32, {M, topk}),
                OwnedTensor()};
  std::vector<int64_t> perm(E);
  std::uniform_real_distribution<float> weight(0.1f, 1.0f);
  for (int64_t t = 0; t < M; ++t) {
    for (int64_t e = 0; e < E; ++e) perm[e] = e;
    std::shuffle(perm.begin(), perm.end(), rng);
    for (int64_t k = 0; k < topk; ++k) {
      store_float(r.ids.tensor().data(), r.ids.tensor().dtype(), t * topk + k,
                  static_cast<float>(perm[k]));
      r.weights.data_ptr<float>()[t * topk + k] = weight(rng);
    }
  }
  if (E_local < E) {
    r.map = host_tensor(DType::int32, {E});
    for (int64_t e = 0; e < E; ++e) perm[e] = e;
    std::shuffle(perm.begin(), perm.end(), rng);
    std::fill(r.map.data_ptr<int32_t>(), r.map.data_ptr<int32_t>() + E, -1);
    for (int64_t l = 0; l < E_local; ++l)
      r.map.data_ptr<int32_t>()[perm[l]] = static_cast<int32_t>(l);
  }
  return r;
}

OwnedTensor device_or_empty(const CudaSession& s, const OwnedTensor& host) {
  return host.tensor().defined() ? s.to_device(host) : OwnedTensor();
}

void fill_normal(const Tensor& t, std::mt19937& rng, float stddev = 1.0f) {
  std::normal_distribution<float> n(0.0f, stddev);
  for (int64_t i = 0; i < t.numel(); ++i) store_float(t.data(), t.dtype(), i, n(rng));
}

void fill_nan(const Tensor& t) {
  for (int64_t i = 0; i < t.numel(); ++i) store_float(t.data(), t.dtype(), i, NAN);
}

// A host-side permute: pairs of expert 0, 1, ... in pair order, then the non-local ones.
struct HostPermute {
  std::vector<int32_t> m_indptr, sorted_pair, sorted_expert, row_of_pair;
};

HostPermute host_permute(const HostRouting& r) {
  const int64_t P = r.M * r.topk;
  HostPermute h;
  h.m_indptr.assign(r.E_local + 1, 0);
  h.row_of_pair.assign(P, -1);
  for (int64_t e = 0; e <= r.E_local; ++e) {
    h.m_indptr[e] = static_cast<int32_t>(h.sorted_pair.size());
    for (int64_t p = 0; p < P; ++p) {
      const int64_t l = r.local(p);
      const bool here = e < r.E_local ? l == e : l < 0;
      if (!here) continue;
      if (e < r.E_local) h.row_of_pair[p] = static_cast<int32_t>(h.sorted_pair.size());
      h.sorted_pair.push_back(static_cast<int32_t>(p));
      h.sorted_expert.push_back(static_cast<int32_t>(e));
    }
  }
  return h;
}

template <typename T>
std::vector<T> download(const CudaSession& s, const T* device, int64_t n) {
  std::vector<T> host(n);
  if (n > 0) {
    EXPECT_EQ(
        cudaMemcpyAsync(host.data(), device, n * sizeof(T), cudaMemcpyDeviceToHost, s.stream()),
        cudaSuccess);
  }
  s.sync();
  return host;
}

// A device byte buffer for a carved layout, filled with 0x5a bytes (no valid index has them).
struct Scratch {
  OwnedTensor buffer;
  explicit Scratch(const CudaSession& s, size_t bytes)
      : buffer(s.empty(DType::uint8, {static_cast<int64_t>(bytes)})) {
    EXPECT_EQ(cudaMemsetAsync(buffer.tensor().data(), 0x5a, bytes, s.stream()), cudaSuccess);
  }
  void* data() const { return buffer.tensor().data(); }
};

// A PermuteWorkspace carved from fresh (poisoned) device memory.
struct DevicePermute {
  std::unique_ptr<Scratch> scratch;
  cuda::PermuteWorkspace ws;
  DevicePermute(const CudaSession& s, int64_t pairs, int64_t E_local) {
    cuda::ByteCarver sizing(nullptr);
    cuda::PermuteWorkspace::carve(sizing, pairs, E_local);
    scratch = std::make_unique<Scratch>(s, sizing.size());
    cuda::ByteCarver carver(scratch->data());
    ws = cuda::PermuteWorkspace::carve(carver, pairs, E_local);
  }
};

cuda::PermuteArgs permute_args(const HostRouting& r, const Tensor& ids, const Tensor& map) {
  cuda::PermuteArgs a;
  a.topk_ids = ids.data();
  a.ids_dtype = ids.dtype();
  a.num_tokens = r.M;
  a.topk = r.topk;
  a.expert_map = map.defined() ? map.data_ptr<int32_t>() : nullptr;
  a.num_experts = r.E;
  a.num_local_experts = r.E_local;
  return a;
}

// Relative distance per element, with an absolute floor for values near zero.
void expect_close(const Tensor& got, const Tensor& want, double rel, const std::string& what) {
  ASSERT_EQ(got.numel(), want.numel()) << what;
  int64_t bad = 0;
  for (int64_t i = 0; i < got.numel(); ++i) {
    const double g = load_float(got.data(), got.dtype(), i);
    const double w = load_float(want.data(), want.dtype(), i);
    if (!(std::fabs(g - w) <= rel * std::max(1.0, std::fabs(w)))) {
      if (++bad <= 5)
        ADD_FAILURE() << what << ": element " << i << " is " << g << ", expected " << w;
    }
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << got.numel() << " elements differ";
}

// One unit in the last place, relative, of a float dtype.
double ulp(DType d) { return d == DType::bf16 ? 1.0 / 128 : d == DType::fp16 ? 1.0 / 1024 : 5e-6; }

// ---- permute --------------------------------------------------------------------------------

struct PermuteCase {
  int64_t M, topk, E, E_local;
  bool int64_ids;
};

TEST(CudaPermute, GroupsPairsStablyByLocalExpert) {
  MODMOE_REQUIRE_GPU();
  CudaSession s;
  const PermuteCase cases[] = {{1, 1, 8, 8, false},    {1, 8, 64, 64, true},
                               {300, 2, 8, 8, false},  {300, 8, 64, 64, false},
                               {64, 2, 64, 24, false}, {300, 4, 64, 5, true},
                               {7, 8, 8, 3, true},     {2000, 8, 256, 256, false}};
  for (const PermuteCase& c : cases) {
    const unsigned seed = static_cast<unsigned>(c.M * 131 + c.E + c.E_local);
    std::mt19937 rng(seed);
    const HostRouting r = random_routing(c.M, c.topk, c.E, c.E_local, c.int64_ids, rng);
    const std::string where = "M=" + std::to_string(c.M) + " topk=" + std::to_string(c.topk) +
                              " E=" + std::to_string(c.E) +
                              " E_local=" + std::to_string(c.E_local) +
                              " seed=" + std::to_string(seed);
    const OwnedTensor ids = s.to_device(r.ids);
    const OwnedTensor map = device_or_empty(s, r.map);
    const int64_t P = c.M * c.topk;
    DevicePermute perm(s, P, c.E_local);
    cuda::permute(permute_args(r, ids, map), perm.ws, s.stream());

    const HostPermute want = host_permute(r);
    EXPECT_EQ(download(s, perm.ws.m_indptr, c.E_local + 1), want.m_indptr) << where;
    // The whole order, non-local tail included: stable means pair order within every key.
    EXPECT_EQ(download(s, perm.ws.sorted_pair, P), want.sorted_pair) << where;
    EXPECT_EQ(download(s, perm.ws.sorted_expert, P), want.sorted_expert) << where;
    EXPECT_EQ(download(s, perm.ws.row_of_pair, P), want.row_of_pair) << where;
    std::vector<int32_t> tokens(P);
    for (int64_t r_ = 0; r_ < P; ++r_)
      tokens[r_] = static_cast<int32_t>(want.sorted_pair[r_] / c.topk);
    EXPECT_EQ(download(s, perm.ws.sorted_token, P), tokens) << where;
  }
}

TEST(CudaPermute, NoTokensGiveAllZeroIndptr) {
  MODMOE_REQUIRE_GPU();
  CudaSession s;
  std::mt19937 rng(5);
  const HostRouting r = random_routing(0, 2, 8, 8, false, rng);
  DevicePermute perm(s, 0, 8);
  cuda::PermuteArgs a = permute_args(r, Tensor(), Tensor());
  a.ids_dtype = DType::int32;
  cuda::permute(a, perm.ws, s.stream());
  EXPECT_EQ(download(s, perm.ws.m_indptr, 9), std::vector<int32_t>(9, 0));
}

TEST(CudaPermute, OutOfRangeIdsAndMapEntriesCountAsNotLocal) {
  MODMOE_REQUIRE_GPU();
  CudaSession s;
  // ids 9 and -1 are outside [0, E = 8); map entry 5 -> 7 is outside [0, E_local = 4).
  OwnedTensor ids = host_tensor(DType::int32, {3, 2});
  const int32_t id_values[] = {0, 9, -1, 5, 2, 1};
  std::memcpy(ids.data_ptr<int32_t>(), id_values, sizeof(id_values));
  OwnedTensor map = host_tensor(DType::int32, {8});
  const int32_t map_values[] = {0, 1, 2, 3, -1, 7, -1, -1};
  std::memcpy(map.data_ptr<int32_t>(), map_values, sizeof(map_values));
  HostRouting r{3, 2, 8, 4, std::move(ids), host_tensor(DType::fp32, {3, 2}), std::move(map)};
  const OwnedTensor d_ids = s.to_device(r.ids), d_map = s.to_device(r.map);
  DevicePermute perm(s, 6, 4);
  cuda::permute(permute_args(r, d_ids, d_map), perm.ws, s.stream());
  // Local pairs: p0 -> 0, p4 -> 2, p5 -> 1.
  EXPECT_EQ(download(s, perm.ws.m_indptr, 5), (std::vector<int32_t>{0, 1, 2, 3, 3}));
  EXPECT_EQ(download(s, perm.ws.sorted_pair, 6), (std::vector<int32_t>{0, 5, 4, 1, 2, 3}));
  EXPECT_EQ(download(s, perm.ws.row_of_pair, 6), (std::vector<int32_t>{0, -1, -1, -1, 2, 1}));
}

// Big enough for CUB's multi-pass (onesweep) sort, captured in a graph and replayed: the
// permute enqueues only stream-ordered work.
TEST(CudaPermute, CapturesInAGraphAndReplays) {
  MODMOE_REQUIRE_GPU();
  CudaSession s;
  std::mt19937 rng(6);
  const HostRouting r = random_routing(4096, 8, 256, 100, false, rng);
  const OwnedTensor ids = s.to_device(r.ids), map = s.to_device(r.map);
  DevicePermute perm(s, 4096 * 8, 100);
  s.sync();
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(s.stream(), cudaStreamCaptureModeGlobal), cudaSuccess);
  cuda::permute(permute_args(r, ids, map), perm.ws, s.stream());
  ASSERT_EQ(cudaStreamEndCapture(s.stream(), &graph), cudaSuccess);
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  ASSERT_EQ(cudaGraphLaunch(exec, s.stream()), cudaSuccess);
  const HostPermute want = host_permute(r);
  EXPECT_EQ(download(s, perm.ws.m_indptr, 101), want.m_indptr);
  EXPECT_EQ(download(s, perm.ws.sorted_pair, 4096 * 8), want.sorted_pair);
  EXPECT_EQ(download(s, perm.ws.row_of_pair, 4096 * 8), want.row_of_pair);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
}

// ---- reduce ---------------------------------------------------------------------------------

struct ReduceCase {
  int64_t M, topk, E, E_local, K;
  DType fused_dtype, out_dtype;
  bool int64_ids, router_weight_on_input;
};

const ReduceCase kReduceCases[] = {
    {1, 1, 8, 8, 256, DType::fp32, DType::bf16, false, false},
    {300, 2, 8, 8, 256, DType::fp32, DType::fp32, false, false},
    {300, 8, 64, 64, 128, DType::bf16, DType::bf16, true, false},
    {64, 2, 64, 24, 72, DType::fp32, DType::fp16, false, false},
    {33, 4, 16, 5, 37, DType::fp16, DType::fp32, true, false},  // odd K: scalar path
    {20, 1, 8, 8, 64, DType::fp32, DType::bf16, false, true},
    // 16-bit in and out (16-byte vectors, reduce.cu's kVec = 8) at small topk (the k chunk
    // mostly empty), K not a whole number of column tiles.
    {257, 2, 8, 8, 1032, DType::bf16, DType::bf16, false, false},
    {40, 3, 16, 6, 2056, DType::fp16, DType::bf16, true, false},
    {70, 1, 8, 8, 4104, DType::bf16, DType::fp16, false, true},
};

std::string reduce_case_str(const ReduceCase& c) {
  return "M=" + std::to_string(c.M) + " topk=" + std::to_string(c.topk) +
         " E=" + std::to_string(c.E) + " E_local=" + std::to_string(c.E_local) +
         " K=" + std::to_string(c.K) + " " + dtype_name(c.fused_dtype) + "->" +
         dtype_name(c.out_dtype) + (c.router_weight_on_input ? " router_weight_on_input" : "");
}

// Runs one reduce on the CPU (the expectation) and on the device over the same inputs, with a
// poisoned device output, and compares them.
void expect_reduce_matches_cpu(const CudaSession& s, const TopKWeightAndReduce& on_cpu,
                               const TopKWeightAndReduce& on_gpu, const ReduceCase& c,
                               const HostRouting& r, const OwnedTensor& fused) {
  OwnedTensor want = host_tensor(c.out_dtype, {c.M, c.K});
  on_cpu.apply(Context::cpu(),
               ReduceArgs{want, fused, r.weights, r.ids, r.map.tensor(), c.router_weight_on_input});
  const OwnedTensor d_fused = s.to_device(fused), d_ids = s.to_device(r.ids),
                    d_w = s.to_device(r.weights), d_map = device_or_empty(s, r.map);
  const OwnedTensor d_out = s.empty(c.out_dtype, {c.M, c.K});
  poison_device(s, d_out);
  on_gpu.apply(s.ctx(),
               ReduceArgs{d_out, d_fused, d_w, d_ids, d_map.tensor(), c.router_weight_on_input});
  expect_close(s.to_host(d_out), want, 2 * ulp(c.out_dtype), reduce_case_str(c));
}

TEST(CudaReduce, ContiguousMatchesCpu) {
  MODMOE_REQUIRE_GPU();
  CudaSession s;
  for (const ReduceCase& c : kReduceCases) {
    std::mt19937 rng(static_cast<unsigned>(c.M + 7 * c.K));
    const HostRouting r = random_routing(c.M, c.topk, c.E, c.E_local, c.int64_ids, rng);
    OwnedTensor fused = host_tensor(c.fused_dtype, {c.M, c.topk, c.K});
    fill_normal(fused, rng);
    // Rows of non-local pairs are NaN: a reduce that reads one produces NaN.
    for (int64_t p = 0; p < c.M * c.topk; ++p)
      if (r.local(p) < 0) fill_nan(fused.tensor().reshape({c.M * c.topk, c.K}).slice(p, p + 1));
    expect_reduce_matches_cpu(s, cpu::TopKWeightAndReduceContiguous(),
                              cuda::TopKWeightAndReduceContiguous(), c, r, fused);
  }
}

TEST(CudaReduce, NaiveBatchedMatchesCpuAndSkipsRowsPastCounts) {
  MODMOE_REQUIRE_GPU();
  CudaSession s;
  for (const ReduceCase& c : kReduceCases) {
    std::mt19937 rng(static_cast<unsigned>(3 * c.M + c.K));
    const HostRouting r = random_routing(c.M, c.topk, c.E, c.E_local, c.int64_ids, rng);
    const int64_t T = c.M + 3;  // a few rows more than any expert can get
    OwnedTensor fused = host_tensor(c.fused_dtype, {c.E_local, T, c.K});
    fill_nan(fused);  // rows past the counts stay NaN
    std::vector<int64_t> count(c.E_local, 0);
    for (int64_t p = 0; p < c.M * c.topk; ++p) {
      const int64_t e = r.local(p);
      if (e < 0) continue;
      fill_normal(fused.tensor().select(e).slice(count[e], count[e] + 1), rng);
      ++count[e];
    }
    expect_reduce_matches_cpu(s, cpu::TopKWeightAndReduceNaiveBatched(),
                              cuda::TopKWeightAndReduceNaiveBatched(), c, r, fused);
  }
}

TEST(CudaReduce, NoOpConvertsOrLeavesTheSameMemoryAlone) {
  MODMOE_REQUIRE_GPU();
  CudaSession s;
  std::mt19937 rng(11);
  const int64_t M = 19, K = 96;
  OwnedTensor fused = host_tensor(DType::fp32, {M, K});
  fill_normal(fused, rng);
  OwnedTensor ids = host_tensor(DType::int32, {M, 1});
  std::fill(ids.data_ptr<int32_t>(), ids.data_ptr<int32_t>() + M, 0);
  OwnedTensor want = host_tensor(DType::bf16, {M, K});
  for (int64_t i = 0; i < M * K; ++i)
    store_float(want.tensor().data(), DType::bf16, i, fused.data_ptr<float>()[i]);

  const OwnedTensor d_fused = s.to_device(fused), d_ids = s.to_device(ids);
  const OwnedTensor d_out = s.empty(DType::bf16, {M, K});
  poison_device(s, d_out);
  cuda::TopKWeightAndReduceNoOp().apply(
      s.ctx(), ReduceArgs{d_out, d_fused, Tensor(), d_ids, Tensor(), true});
  EXPECT_EQ(bytes_of(s.to_host(d_out)), bytes_of(want));  // both round to nearest even
  // Same memory: nothing to do (the poisoned buffer stays poisoned).
  poison_device(s, d_out);
  const std::vector<uint8_t> before = bytes_of(s.to_host(d_out));
  cuda::TopKWeightAndReduceNoOp().apply(s.ctx(),
                                        ReduceArgs{d_out, d_out, Tensor(), d_ids, Tensor(), true});
  EXPECT_EQ(bytes_of(s.to_host(d_out)), before);
  EXPECT_THAT(error_of([&] {
                cuda::TopKWeightAndReduceDelegate().apply(
                    s.ctx(), ReduceArgs{d_out, d_fused, Tensor(), d_ids, Tensor(), true});
              }),
              HasSubstr("cannot be applied"));
}

TEST(CudaReduce, RejectsHostTensorsAndCpuContexts) {
  MODMOE_REQUIRE_GPU();
  CudaSession s;
  std::mt19937 rng(12);
  const HostRouting r = random_routing(4, 2, 8, 8, false, rng);
  OwnedTensor fused = host_tensor(DType::fp32, {4, 2, 16});
  OwnedTensor out = host_tensor(DType::fp32, {4, 16});
  EXPECT_THAT(error_of([&] {
                cuda::TopKWeightAndReduceContiguous().apply(
                    s.ctx(), ReduceArgs{out, fused, r.weights, r.ids, Tensor(), false});
              }),
              HasSubstr("must be on cuda:0"));
  EXPECT_THAT(error_of([&] {
                cuda::TopKWeightAndReduceContiguous().apply(
                    Context::cpu(), ReduceArgs{out, fused, r.weights, r.ids, Tensor(), false});
              }),
              HasSubstr("ctx.device must be cuda"));
}

// ---- activation -----------------------------------------------------------------------------

TEST(CudaActivation, NoMulFormsMatchTheFormulaAndStopAtNumRows) {
  MODMOE_REQUIRE_GPU();
  CudaSession s;
  const int64_t rows = 13, N = 200, ld = 208;
  const Activation acts[] = {Activation::silu_no_mul, Activation::gelu_no_mul,
                             Activation::gelu_tanh_no_mul, Activation::swigluoai_no_mul};
  std::mt19937 rng(21);
  OwnedTensor x = host_tensor(DType::fp32, {rows, ld});
  fill_normal(x, rng, 4.0f);  // beyond swigluoai's clamp at 7 too
  const OwnedTensor d_x = s.to_device(x);
  const OwnedTensor d_rows = s.empty(DType::int32, {1});
  const int32_t bound = rows - 3;
  ASSERT_EQ(cudaMemcpyAsync(d_rows.tensor().data(), &bound, 4, cudaMemcpyHostToDevice, s.stream()),
            cudaSuccess);
  for (Activation act : acts) {
    for (DType y_dtype : {DType::fp32, DType::bf16}) {
      const OwnedTensor d_y = s.empty(y_dtype, {rows, N});
      poison_device(s, d_y);
      cuda::activation_no_mul(act, d_x.tensor().data(), DType::fp32, ld, d_y.tensor().data(),
                              y_dtype, N, rows, d_rows.data_ptr<int32_t>(), N, s.stream());
      const OwnedTensor y = s.to_host(d_y);
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t j = 0; j < N; ++j) {
          const double got = load_float(y.tensor().data(), y_dtype, r * N + j);
          if (r >= bound) {
            ASSERT_TRUE(std::isnan(got))
                << activation_name(act) << " wrote row " << r << " past num_rows = " << bound;
            continue;
          }
          const double want = activation_gate<double>(act, x.data_ptr<float>()[r * ld + j]);
          ASSERT_NEAR(got, want, 2 * ulp(y_dtype) * std::max(1.0, std::fabs(want)))
              << activation_name(act) << " " << dtype_name(y_dtype) << " at (" << r << ", " << j
              << "), x = " << x.data_ptr<float>()[r * ld + j];
        }
      }
    }
    // In place on fp32, all rows (no bound).
    const OwnedTensor d_z = s.to_device(x);
    cuda::activation_no_mul(act, d_z.tensor().data(), DType::fp32, ld, d_z.tensor().data(),
                            DType::fp32, ld, rows, nullptr, N, s.stream());
    const OwnedTensor z = s.to_host(d_z);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = 0; j < ld; ++j) {
        const float in = x.data_ptr<float>()[r * ld + j];
        const double want = j < N ? activation_gate<double>(act, in) : in;  // padding untouched
        ASSERT_NEAR(z.data_ptr<float>()[r * ld + j], want, 1e-5 * std::max(1.0, std::fabs(want)))
            << "in place " << activation_name(act) << " at (" << r << ", " << j << ")";
      }
  }
}

TEST(CudaActivation, AndMulMatchesTheFormulaInEveryLayout) {
  MODMOE_REQUIRE_GPU();
  CudaSession s;
  const int64_t rows = 9, N = 96;
  const Activation acts[] = {Activation::silu, Activation::gelu, Activation::gelu_tanh,
                             Activation::swigluoai};
  const GatedLayout layouts[] = {GatedLayout::GateUp, GatedLayout::UpGate,
                                 GatedLayout::Interleaved};
  std::mt19937 rng(22);
  for (DType x_dtype : {DType::fp32, DType::bf16}) {
    OwnedTensor x = host_tensor(x_dtype, {rows, 2 * N});
    fill_normal(x, rng, 4.0f);
    const OwnedTensor d_x = s.to_device(x);
    for (Activation act : acts) {
      for (GatedLayout layout : layouts) {
        for (DType y_dtype : {DType::fp32, DType::fp16}) {
          const OwnedTensor d_y = s.empty(y_dtype, {rows, N});
          poison_device(s, d_y);
          cuda::activation_and_mul(act, layout, d_x.tensor().data(), x_dtype, 2 * N,
                                   d_y.tensor().data(), y_dtype, N, rows, nullptr, N, s.stream());
          const OwnedTensor y = s.to_host(d_y);
          for (int64_t r = 0; r < rows; ++r)
            for (int64_t j = 0; j < N; ++j) {
              const double gate =
                  load_float(x.tensor().data(), x_dtype, r * 2 * N + gate_column(layout, j, N));
              const double up =
                  load_float(x.tensor().data(), x_dtype, r * 2 * N + up_column(layout, j, N));
              const double want = activation_gated<double>(act, gate, up);
              ASSERT_NEAR(load_float(y.tensor().data(), y_dtype, r * N + j), want,
                          2 * ulp(y_dtype) * std::max(1.0, std::fabs(want)))
                  << activation_name(act) << " " << gated_layout_name(layout) << " "
                  << dtype_name(x_dtype) << "->" << dtype_name(y_dtype) << " at (" << r << ", " << j
                  << ")";
            }
        }
      }
    }
  }
}

// ---- batched --------------------------------------------------------------------------------

TEST(CudaBatched, SlotsScatterAndGatherFollowTokenOrder) {
  MODMOE_REQUIRE_GPU();
  CudaSession s;
  struct Case {
    int64_t M, topk, E, E_local, K;
  };
  // K = 37 bf16: 74-byte rows, the 2-byte copy path; K = 256: the 16-byte path.
  for (const Case& c : {Case{300, 8, 64, 64, 256}, Case{64, 2, 64, 24, 37}, Case{1, 1, 8, 8, 40}}) {
    std::mt19937 rng(static_cast<unsigned>(c.M + c.K));
    const HostRouting r = random_routing(c.M, c.topk, c.E, c.E_local, false, rng);
    const int64_t P = c.M * c.topk, T = c.M;
    const OwnedTensor ids = s.to_device(r.ids), map = device_or_empty(s, r.map);
    DevicePermute perm(s, P, c.E_local);
    cuda::permute(permute_args(r, ids, map), perm.ws, s.stream());
    const OwnedTensor d_rows = s.empty(DType::int32, {P}),
                      d_counts = s.empty(DType::int32, {c.E_local});
    cuda::batched_slots(perm.ws, T, d_rows.data_ptr<int32_t>(), d_counts.data_ptr<int32_t>(),
                        s.stream());

    std::vector<int32_t> want_rows(P, -1), want_counts(c.E_local, 0);
    for (int64_t p = 0; p < P; ++p) {
      const int64_t e = r.local(p);
      if (e >= 0) want_rows[p] = static_cast<int32_t>(e * T + want_counts[e]++);
    }
    EXPECT_EQ(download(s, d_rows.data_ptr<int32_t>(), P), want_rows);
    EXPECT_EQ(download(s, d_counts.data_ptr<int32_t>(), c.E_local), want_counts);

    OwnedTensor x = host_tensor(DType::bf16, {c.M, c.K});
    fill_normal(x, rng);
    const OwnedTensor d_x = s.to_device(x);
    const OwnedTensor d_batched = s.empty(DType::bf16, {c.E_local, T, c.K});
    poison_device(s, d_batched);
    const int64_t row_bytes = c.K * 2;
    cuda::batched_scatter_rows(d_x.tensor().data(), row_bytes, d_batched.tensor().data(), row_bytes,
                               row_bytes, d_rows.data_ptr<int32_t>(), P, c.topk, s.stream());
    const OwnedTensor d_gathered = s.empty(DType::bf16, {P, c.K});
    poison_device(s, d_gathered);
    cuda::batched_gather_rows(d_batched.tensor().data(), row_bytes, d_gathered.tensor().data(),
                              row_bytes, row_bytes, d_rows.data_ptr<int32_t>(), P, s.stream());
    const OwnedTensor batched = s.to_host(d_batched), gathered = s.to_host(d_gathered);
    const auto* xb = static_cast<const uint8_t*>(x.tensor().data());
    const auto* bb = static_cast<const uint8_t*>(batched.tensor().data());
    const auto* gb = static_cast<const uint8_t*>(gathered.tensor().data());
    const std::vector<uint8_t> zeros(row_bytes, 0);
    for (int64_t p = 0; p < P; ++p) {
      const uint8_t* src = xb + (p / c.topk) * row_bytes;
      if (want_rows[p] >= 0) {
        ASSERT_EQ(std::memcmp(bb + want_rows[p] * row_bytes, src, row_bytes), 0) << "pair " << p;
        ASSERT_EQ(std::memcmp(gb + p * row_bytes, src, row_bytes), 0) << "gather, pair " << p;
      } else {
        ASSERT_EQ(std::memcmp(gb + p * row_bytes, zeros.data(), row_bytes), 0) << "pair " << p;
      }
    }
    // Rows past the counts are not written (still 0xff).
    for (int64_t e = 0; e < c.E_local; ++e)
      for (int64_t i = want_counts[e]; i < T; ++i)
        ASSERT_EQ(bb[(e * T + i) * row_bytes], 0xff) << "expert " << e << " row " << i;
  }
}

// Rows and their scale rows gathered by the same indices (Sm90Experts' permute): one launch
// when a copy unit fits both tables (2048-byte rows, 64-byte scale rows: 16 bytes), two when
// the second table is narrower (2880 and 92 bytes: gpt-oss's fp8 rows and scales). Pairs with
// index -1 get zeros in both; nothing past P rows is written. 1500 pairs of 2048 + 64 bytes
// (198 000 16-byte units over 774 blocks, the scale table's in the last 24) cover a grid of
// many blocks.
TEST(CudaBatched, GatherOfTwoTablesCopiesBoth) {
  MODMOE_REQUIRE_GPU();
  CudaSession s;
  struct Case {
    int64_t row_bytes, scale_bytes, P;
  };
  for (const Case& c :
       {Case{2048, 64, 150}, Case{2880, 92, 150}, Case{256, 0, 150}, Case{2048, 64, 1500}}) {
    SCOPED_TRACE(std::to_string(c.row_bytes) + " + " + std::to_string(c.scale_bytes) + " bytes, " +
                 std::to_string(c.P) + " pairs");
    const int64_t tokens = 37, P = c.P;
    std::mt19937 rng(static_cast<unsigned>(c.row_bytes + c.scale_bytes));
    std::uniform_int_distribution<int32_t> token(-1, tokens - 1);  // -1: zeros
    std::uniform_int_distribution<int> byte(0, 255);
    std::vector<int32_t> index(P);
    for (auto& i : index) i = token(rng);
    std::vector<uint8_t> rows(tokens * c.row_bytes), scales(tokens * c.scale_bytes);
    for (auto& b : rows) b = static_cast<uint8_t>(byte(rng));
    for (auto& b : scales) b = static_cast<uint8_t>(byte(rng));
    OwnedTensor h_index = host_tensor(DType::int32, {P});
    std::memcpy(h_index.data_ptr<int32_t>(), index.data(), P * 4);
    auto bytes_tensor = [&](const std::vector<uint8_t>& v) {
      OwnedTensor t = host_tensor(DType::uint8, {static_cast<int64_t>(v.size()) + 1});
      std::memcpy(t.tensor().data(), v.data(), v.size());
      return s.to_device(t);
    };
    const OwnedTensor d_index = s.to_device(h_index), d_rows = bytes_tensor(rows),
                      d_scales = bytes_tensor(scales);
    // One spare row each: it must keep its poison.
    const OwnedTensor d_out_rows = s.empty(DType::uint8, {(P + 1) * c.row_bytes}),
                      d_out_scales = s.empty(DType::uint8, {(P + 1) * c.scale_bytes + 1});
    poison_device(s, d_out_rows);
    poison_device(s, d_out_scales);
    cuda::batched_gather_rows(
        cuda::RowCopy{d_rows.tensor().data(), c.row_bytes, d_out_rows.tensor().data(), c.row_bytes,
                      c.row_bytes},
        cuda::RowCopy{d_scales.tensor().data(), c.scale_bytes, d_out_scales.tensor().data(),
                      c.scale_bytes, c.scale_bytes},
        d_index.data_ptr<int32_t>(), P, s.stream());
    const OwnedTensor out_rows = s.to_host(d_out_rows), out_scales = s.to_host(d_out_scales);
    const auto* orow = static_cast<const uint8_t*>(out_rows.tensor().data());
    const auto* oscale = static_cast<const uint8_t*>(out_scales.tensor().data());
    for (int64_t p = 0; p < P; ++p) {
      for (int64_t b = 0; b < c.row_bytes; ++b) {
        const uint8_t want = index[p] < 0 ? 0 : rows[index[p] * c.row_bytes + b];
        ASSERT_EQ(orow[p * c.row_bytes + b], want) << "row of pair " << p << ", byte " << b;
      }
      for (int64_t b = 0; b < c.scale_bytes; ++b) {
        const uint8_t want = index[p] < 0 ? 0 : scales[index[p] * c.scale_bytes + b];
        ASSERT_EQ(oscale[p * c.scale_bytes + b], want) << "scales of pair " << p << ", byte " << b;
      }
    }
    for (int64_t b = 0; b < c.row_bytes; ++b) ASSERT_EQ(orow[P * c.row_bytes + b], 0xff) << b;
    for (int64_t b = 0; b <= c.scale_bytes; ++b) ASSERT_EQ(oscale[P * c.scale_bytes + b], 0xff);
  }
}

TEST(CudaBatched, PackIndicesClampCountsAndMapBothWays) {
  MODMOE_REQUIRE_GPU();
  CudaSession s;
  // 300 experts (more than one scan tile of 256), T = 10; counts in [-2, 14]: some clamped.
  const int64_t E_local = 300, T = 10;
  std::mt19937 rng(31);
  std::uniform_int_distribution<int32_t> count(-2, 14);
  std::vector<int32_t> counts(E_local);
  for (auto& n : counts) n = count(rng);
  for (int64_t max_rows : {E_local * T, int64_t{1000}}) {
    OwnedTensor host_counts = host_tensor(DType::int32, {E_local});
    std::memcpy(host_counts.data_ptr<int32_t>(), counts.data(), counts.size() * 4);
    const OwnedTensor d_in = s.to_device(host_counts);
    const OwnedTensor d_counts = s.empty(DType::int32, {E_local}),
                      d_indptr = s.empty(DType::int32, {E_local + 1}),
                      d_p2b = s.empty(DType::int32, {E_local * T}),
                      d_b2p = s.empty(DType::int32, {E_local * T});
    for (const OwnedTensor* t : {&d_counts, &d_indptr, &d_p2b, &d_b2p}) poison_device(s, *t);
    cuda::batched_pack_indices(d_in.data_ptr<int32_t>(), E_local, T, max_rows,
                               d_counts.data_ptr<int32_t>(), d_indptr.data_ptr<int32_t>(),
                               d_p2b.data_ptr<int32_t>(), d_b2p.data_ptr<int32_t>(), s.stream());
    std::vector<int32_t> want_counts(E_local), want_indptr(E_local + 1, 0);
    for (int64_t e = 0; e < E_local; ++e) {
      const int64_t n = std::clamp<int64_t>(counts[e], 0, T);
      const int64_t end = std::min<int64_t>(want_indptr[e] + n, max_rows);
      want_counts[e] = static_cast<int32_t>(end - want_indptr[e]);
      want_indptr[e + 1] = static_cast<int32_t>(end);
    }
    EXPECT_EQ(download(s, d_counts.data_ptr<int32_t>(), E_local), want_counts) << max_rows;
    EXPECT_EQ(download(s, d_indptr.data_ptr<int32_t>(), E_local + 1), want_indptr) << max_rows;
    const std::vector<int32_t> p2b = download(s, d_p2b.data_ptr<int32_t>(), E_local * T);
    const std::vector<int32_t> b2p = download(s, d_b2p.data_ptr<int32_t>(), E_local * T);
    for (int64_t e = 0; e < E_local; ++e)
      for (int64_t i = 0; i < want_counts[e]; ++i) {
        ASSERT_EQ(p2b[want_indptr[e] + i], e * T + i) << "expert " << e << " row " << i;
        ASSERT_EQ(b2p[e * T + i], want_indptr[e] + i) << "expert " << e << " row " << i;
      }
    EXPECT_LE(want_indptr[E_local], max_rows);
  }
}

// The batched prepare moves exactly the rows (and scale rows) the NoEP prepare quantized.

}  // namespace
}  // namespace modmoe
