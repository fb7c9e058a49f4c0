// A whole ModularKernel::forward captured in one CUDA graph (ARCHITECTURE.md §6, rule 1).
//
// The capture runs in cudaStreamCaptureModeGlobal: any hidden host synchronization
// (cudaStreamSynchronize, a synchronous cudaMemcpy, reading a device value on the host) or a
// plain cudaMalloc inside forward fails the capture, so a forward that captures here never
// waits for the host. Stream-ordered allocations (cudaMallocAsync, the default device
// allocator) are legal: they become the graph's own memory nodes.
//
// With an ArenaAllocator as the context's allocator (GraphCase::arena) the forward allocates
// nothing in the graph: it must have no memory nodes, and leave the arena empty.
//
// The graph is then replayed on three fresh random problems of the same shape, written into the
// same device buffers, each checked against the float64 oracle; replaying one input twice and
// replaying the warm-up's input must reproduce the eager output bit for bit (deterministic
// forward: no float atomics).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "cuda/gpu_test.h"
#include "modmoe/cuda.h"
#include "modmoe/modmoe.h"
#include "oracle/oracle.h"
#include "oracle/problem.h"

namespace modmoe {
namespace {

// One device buffer shaped like a host tensor; moves its contents over on a stream.
class DeviceTensor {
 public:
  DeviceTensor() = default;
  explicit DeviceTensor(const Tensor& like) {
    if (!like.defined()) return;
    const size_t bytes = like.nbytes();
    if (cudaMalloc(&data_, bytes > 0 ? bytes : 1) != cudaSuccess) {
      data_ = nullptr;
      throw Error("DeviceTensor: cudaMalloc of " + std::to_string(bytes) + " bytes failed for " +
                  like.describe());
    }
    view_ = Tensor(data_, like.dtype(), like.shape(), Device::cuda(0));
  }
  ~DeviceTensor() {
    if (data_) cudaFree(data_);
  }
  DeviceTensor(const DeviceTensor&) = delete;
  DeviceTensor& operator=(const DeviceTensor&) = delete;
  DeviceTensor(DeviceTensor&& o) noexcept : data_(o.data_), view_(o.view_) { o.data_ = nullptr; }
  DeviceTensor& operator=(DeviceTensor&& o) noexcept {
    std::swap(data_, o.data_);
    std::swap(view_, o.view_);
    return *this;
  }

  const Tensor& view() const { return view_; }  // undefined when built from an undefined one
  cudaError_t upload(const Tensor& host, cudaStream_t stream) const {
    if (!view_.defined()) return cudaSuccess;
    return cudaMemcpyAsync(data_, host.data(), host.nbytes(), cudaMemcpyHostToDevice, stream);
  }
  cudaError_t download(const Tensor& host, cudaStream_t stream) const {
    return cudaMemcpyAsync(host.data(), data_, host.nbytes(), cudaMemcpyDeviceToHost, stream);
  }

 private:
  void* data_ = nullptr;
  Tensor view_;
};

// The device side of a testing::Problem: the same buffers are reused for every problem of the
// shape, which is what a captured graph needs (it bakes the pointers in).
struct DeviceProblem {
  DeviceTensor hidden_states, topk_weights, topk_ids, output, w13, w2, w13_scale, w2_scale,
      a13_scale, a2_scale;

  explicit DeviceProblem(const testing::Problem& p)
      : hidden_states(p.hidden_states),
        topk_weights(p.topk_weights),
        topk_ids(p.topk_ids),
        output(p.output),
        w13(p.w13),
        w2(p.w2),
        w13_scale(p.w13_scale),
        w2_scale(p.w2_scale),
        a13_scale(p.a13_scale),
        a2_scale(p.a2_scale) {}

  // Writes every input of `p` into the buffers and NaN-poisons the output (0xffff is a bf16 and
  // fp16 NaN, 0xffffffff an fp32 NaN).
  cudaError_t upload(const testing::Problem& p, cudaStream_t stream) const {
    const std::pair<const DeviceTensor*, const OwnedTensor*> inputs[] = {
        {&hidden_states, &p.hidden_states},
        {&topk_weights, &p.topk_weights},
        {&topk_ids, &p.topk_ids},
        {&w13, &p.w13},
        {&w2, &p.w2},
        {&w13_scale, &p.w13_scale},
        {&w2_scale, &p.w2_scale},
        {&a13_scale, &p.a13_scale},
        {&a2_scale, &p.a2_scale}};
    for (const auto& [device, host] : inputs) {
      if (const cudaError_t e = device->upload(host->tensor(), stream); e != cudaSuccess) return e;
    }
    return poison_output(stream);
  }
  cudaError_t poison_output(cudaStream_t stream) const {
    return cudaMemsetAsync(output.view().data(), 0xff, output.view().nbytes(), stream);
  }

  ForwardArgs args() const {
    ForwardArgs a;
    a.hidden_states = hidden_states.view();
    a.topk_weights = topk_weights.view();
    a.topk_ids = topk_ids.view();
    a.output = output.view();
    a.weights.w13 = w13.view();
    a.weights.w2 = w2.view();
    a.weights.w13_scale = w13_scale.view();
    a.weights.w2_scale = w2_scale.view();
    a.weights.a13_scale = a13_scale.view();
    a.weights.a2_scale = a2_scale.view();
    return a;
  }
};

struct GraphCase {
  const char* prepare_finalize;
  const char* experts;
  QuantScheme scheme;
  int64_t chunk_size;  // Context::chunk_size; < M makes forward loop over chunks in the graph
  int64_t M = 48;      // 3 tokens: CudaExperts' decode path (6 pairs over 8 experts)
  bool arena = false;  // the workspaces from an ArenaAllocator (no graph memory nodes)
};

// What ctest shows after "GetParam() =" (instead of the struct's bytes).
void PrintTo(const GraphCase& c, std::ostream* os) {
  *os << c.prepare_finalize << "+" << c.experts << " " << quant_scheme_name(c.scheme)
      << " chunk=" << c.chunk_size << " M=" << c.M << (c.arena ? " arena" : "");
}

std::string case_name(const ::testing::TestParamInfo<GraphCase>& info) {
  const GraphCase& c = info.param;
  std::string name = std::string(c.experts) + "_" + quant_scheme_name(c.scheme);
  if (c.chunk_size > 0) name += "_chunk" + std::to_string(c.chunk_size);
  if (c.M != 48) name += "_M" + std::to_string(c.M);
  if (c.arena) name += "_arena";
  for (char& ch : name)
    if (ch == '-') ch = '_';
  return name;
}

class GraphCapture : public ::testing::TestWithParam<GraphCase> {
 protected:
  void SetUp() override {
    MODMOE_REQUIRE_GPU();
    ASSERT_CUDA(cudaSetDevice(0));
    ASSERT_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  }
  void TearDown() override {
    if (exec_) cudaGraphExecDestroy(exec_);
    if (graph_) cudaGraphDestroy(graph_);
    if (stream_) cudaStreamDestroy(stream_);
    if (arena_memory_) cudaFree(arena_memory_);
  }

  cudaStream_t stream_ = nullptr;
  void* arena_memory_ = nullptr;
  cudaGraph_t graph_ = nullptr;
  cudaGraphExec_t exec_ = nullptr;
};

// Problem spec shared by every problem of the test: only the seed changes.
testing::ProblemSpec spec_for(const GraphCase& c, uint64_t seed) {
  testing::ProblemSpec spec;
  MoEConfig& cfg = spec.config;
  cfg.num_experts = cfg.num_local_experts = 8;
  cfg.hidden_size = 256;
  cfg.intermediate_size = 128;
  cfg.topk = 2;
  cfg.in_dtype = DType::bf16;
  cfg.quant.scheme = c.scheme;
  spec.M = c.M;
  spec.seed = seed;
  if (std::string(c.prepare_finalize) == "BatchedPrepareAndFinalize") cfg.max_num_tokens = spec.M;
  return spec;
}

double tolerance(QuantScheme scheme) { return scheme == QuantScheme::none ? 1e-2 : 3e-2; }

using testing::bytes_of;

TEST_P(GraphCapture, WholeForwardReplaysWithNewInputs) {
  const GraphCase& c = GetParam();
  if (std::string(c.experts).find("Sm90") != std::string::npos &&
      !moe_gemm_sm90_available(cuda_context(0, stream_)))
    GTEST_SKIP() << c.experts << " needs an sm_90 device";
  const uint64_t base_seed = 20261129;
  testing::Problem first = testing::make_problem(spec_for(c, base_seed));
  const MoEConfig& config = first.spec.config;
  ModularKernel kernel =
      make_modular_kernel(c.prepare_finalize, c.experts, config, Device::cuda(0));
  Context ctx = cuda_context(0, stream_);
  if (c.chunk_size > 0) ctx.chunk_size = c.chunk_size;
  constexpr size_t kArenaBytes = size_t(64) << 20;  // these shapes need well under 1 MiB
  std::unique_ptr<ArenaAllocator> arena;
  if (c.arena) {
    ASSERT_CUDA(cudaMalloc(&arena_memory_, kArenaBytes));
    arena = std::make_unique<ArenaAllocator>(arena_memory_, kArenaBytes, Device::cuda(0));
    ctx.allocator = arena.get();
  }

  DeviceProblem device(first);
  const ForwardArgs args = device.args();

  // Eager warm-up: loads modules, grows the allocator's pool, and gives the reference bits.
  ASSERT_CUDA(device.upload(first, stream_));
  kernel.forward(ctx, args);
  ASSERT_CUDA(device.output.download(first.output, stream_));
  ASSERT_CUDA(cudaStreamSynchronize(stream_));
  const std::vector<double> first_ref = oracle::moe_forward(first.oracle_inputs());
  const oracle::ErrorReport eager =
      oracle::compare(first.output, first_ref, first.topk_ids, Tensor());
  ASSERT_TRUE(eager.passed(tolerance(c.scheme)))
      << "eager forward before capture: " << eager.str() << " (seed " << base_seed << ")";
  const std::vector<uint8_t> eager_bits = bytes_of(first.output);

  // Capture. Global mode: a synchronizing or allocating call anywhere in forward invalidates it.
  ASSERT_CUDA(device.poison_output(stream_));
  ASSERT_CUDA(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeGlobal));
  std::string thrown;
  try {
    kernel.forward(ctx, args);
  } catch (const std::exception& e) {
    thrown = e.what();
  }
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  const cudaError_t query = cudaStreamIsCapturing(stream_, &status);
  const cudaError_t ended = cudaStreamEndCapture(stream_, &graph_);
  ASSERT_TRUE(thrown.empty()) << "forward threw during capture (a host sync or cudaMalloc "
                                 "inside forward?): "
                              << thrown;
  ASSERT_CUDA(query);
  ASSERT_EQ(status, cudaStreamCaptureStatusActive)
      << "the capture was invalidated during forward: something synchronized with the host";
  ASSERT_CUDA(ended);
  ASSERT_NE(graph_, nullptr);
  size_t num_nodes = 0;
  ASSERT_CUDA(cudaGraphGetNodes(graph_, nullptr, &num_nodes));
  EXPECT_GT(num_nodes, 1u) << "a whole forward is more than one node";
  if (c.arena) {
    std::vector<cudaGraphNode_t> nodes(num_nodes);
    ASSERT_CUDA(cudaGraphGetNodes(graph_, nodes.data(), &num_nodes));
    for (cudaGraphNode_t node : nodes) {
      cudaGraphNodeType type = cudaGraphNodeTypeEmpty;
      ASSERT_CUDA(cudaGraphNodeGetType(node, &type));
      EXPECT_TRUE(type != cudaGraphNodeTypeMemAlloc && type != cudaGraphNodeTypeMemFree)
          << "a forward on an arena allocated in the graph (node type " << int(type) << ")";
    }
    EXPECT_GT(arena->high_water(), 0u);
    EXPECT_EQ(arena->in_use(), 0u);
    EXPECT_EQ(arena->foreign_frees(), 0u);
  }
  ASSERT_CUDA(cudaGraphInstantiate(&exec_, graph_, 0));

  // Replays on new problems written into the same buffers.
  testing::Problem last;
  for (int i = 1; i <= 3; ++i) {
    const uint64_t seed = base_seed + i;
    testing::Problem p = testing::make_problem(spec_for(c, seed));
    testing::poison(p.output);
    ASSERT_CUDA(device.upload(p, stream_));
    ASSERT_CUDA(cudaGraphLaunch(exec_, stream_));
    ASSERT_CUDA(device.output.download(p.output, stream_));
    ASSERT_CUDA(cudaStreamSynchronize(stream_));
    const std::vector<double> ref = oracle::moe_forward(p.oracle_inputs());
    const oracle::ErrorReport report = oracle::compare(p.output, ref, p.topk_ids, Tensor());
    EXPECT_TRUE(report.passed(tolerance(c.scheme)))
        << "graph replay " << i << ": " << report.str() << " (" << p.spec.str() << ")";
    last = std::move(p);
  }

  // The same inputs replayed again give the same bits.
  const std::vector<uint8_t> last_bits = bytes_of(last.output);
  ASSERT_CUDA(device.poison_output(stream_));
  ASSERT_CUDA(cudaGraphLaunch(exec_, stream_));
  ASSERT_CUDA(device.output.download(last.output, stream_));
  ASSERT_CUDA(cudaStreamSynchronize(stream_));
  EXPECT_TRUE(bytes_of(last.output) == last_bits) << "two replays of one input differ";

  // And the graph reproduces the eager forward on the warm-up's input.
  ASSERT_CUDA(device.upload(first, stream_));
  ASSERT_CUDA(cudaGraphLaunch(exec_, stream_));
  ASSERT_CUDA(device.output.download(first.output, stream_));
  ASSERT_CUDA(cudaStreamSynchronize(stream_));
  EXPECT_TRUE(bytes_of(first.output) == eager_bits) << "graph replay differs from eager forward";
}

INSTANTIATE_TEST_SUITE_P(
    CudaPairs, GraphCapture,
    ::testing::Values(
        GraphCase{"NoEPPrepareAndFinalize", "CudaExperts", QuantScheme::none, 0},
        GraphCase{"NoEPPrepareAndFinalize", "CudaExperts", QuantScheme::fp8_block, 0},
        GraphCase{"NoEPPrepareAndFinalize", "CudaExperts", QuantScheme::fp8_tensor, 0},
        GraphCase{"NoEPPrepareAndFinalize", "CudaExperts", QuantScheme::none, 16},
        GraphCase{"NoEPPrepareAndFinalize", "CudaExperts", QuantScheme::none, 0, 3},
        GraphCase{"NoEPPrepareAndFinalize", "CudaExperts", QuantScheme::fp8_block, 0, 3},
        GraphCase{"NoEPPrepareAndFinalize", "CudaExperts", QuantScheme::fp8_block, 0, 3, true},
        GraphCase{"NoEPPrepareAndFinalize", "CudaExperts", QuantScheme::none, 16, 48, true},
        GraphCase{"BatchedPrepareAndFinalize", "BatchedCudaExperts", QuantScheme::none, 0},
        GraphCase{"BatchedPrepareAndFinalize", "BatchedCudaExperts", QuantScheme::fp8_block, 0},
        // The Hopper experts (skipped where the device is not sm_90).
        GraphCase{"NoEPPrepareAndFinalize", "Sm90Experts", QuantScheme::none, 0},
        GraphCase{"NoEPPrepareAndFinalize", "Sm90Experts", QuantScheme::fp8_block, 0},
        GraphCase{"NoEPPrepareAndFinalize", "Sm90Experts", QuantScheme::fp8_block, 16},
        GraphCase{"NoEPPrepareAndFinalize", "Sm90Experts", QuantScheme::fp8_block, 0, 48, true},
        GraphCase{"BatchedPrepareAndFinalize", "BatchedSm90Experts", QuantScheme::none, 0},
        GraphCase{"BatchedPrepareAndFinalize", "BatchedSm90Experts", QuantScheme::fp8_block, 0}),
    case_name);

}  // namespace
}  // namespace modmoe
