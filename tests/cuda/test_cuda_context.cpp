// The CUDA side of the public API (cuda.h): contexts, the default device allocator (a
// cudaMallocAsync pool), copy_tensor in every direction and its checks, and a CUDA graph that
// captures quantization and routing (with a stream-ordered allocation inside the capture) and
// replays them on new inputs.
#include <cuda_runtime.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cuda/cuda_session.h"
#include "cuda/gpu_test.h"
#include "modmoe/allocator.h"
#include "modmoe/cuda.h"
#include "modmoe/numeric.h"
#include "modmoe/quant.h"
#include "modmoe/router.h"

namespace modmoe {
namespace {

using ::modmoe::testing::bytes_of;
using ::modmoe::testing::CudaSession;
using ::modmoe::testing::error_of;
using ::testing::HasSubstr;

OwnedTensor random_host(DType dtype, const Shape& shape, uint32_t seed) {
  OwnedTensor t = host_tensor(dtype, shape);
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int64_t i = 0; i < t.tensor().numel(); ++i)
    store_float(t.tensor().data(), dtype, i, normal(rng));
  return t;
}

// ---- contexts -----------------------------------------------------------------------------------

TEST(CudaContext, FillsDeviceStreamSmCountAndAllocator) {
  MODMOE_REQUIRE_GPU();
  EXPECT_GE(cuda_device_count(), 1);
  CudaSession gpu;
  const Context& ctx = gpu.ctx();
  EXPECT_EQ(ctx.device, Device::cuda(0));
  EXPECT_EQ(ctx.stream, static_cast<void*>(gpu.stream()));
  int sm_count = 0;
  ASSERT_CUDA(cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, 0));
  EXPECT_GT(sm_count, 0);
  EXPECT_EQ(ctx.sm_count, sm_count);
  ASSERT_NE(ctx.allocator, nullptr);
  EXPECT_EQ(ctx.allocator, cuda_default_allocator(0));
  EXPECT_EQ(ctx.allocator->device(), Device::cuda(0));
  EXPECT_EQ(ctx.alloc(), ctx.allocator);

  // A hand-made CUDA context without an allocator gets the default one.
  Context bare;
  bare.device = Device::cuda(0);
  EXPECT_EQ(bare.alloc(), cuda_default_allocator(0));
}

TEST(CudaContext, RejectsBadIndexAndForeignAllocator) {
  MODMOE_REQUIRE_GPU();
  CudaSession gpu;
  const int count = cuda_device_count();
  const std::string range = "device index must be in [0, " + std::to_string(count) + ")";
  EXPECT_THAT(error_of([&] { cuda_context(count, gpu.stream()); }),
              HasSubstr("cuda_context: " + range + ", got " + std::to_string(count)));
  EXPECT_THAT(error_of([&] { cuda_context(-1, gpu.stream()); }),
              HasSubstr("cuda_context: " + range + ", got -1"));
  EXPECT_THAT(error_of([&] { cuda_default_allocator(count); }),
              HasSubstr("cuda_default_allocator: " + range));
  EXPECT_THAT(error_of([&] { cuda_context(0, gpu.stream(), host_allocator()); }),
              HasSubstr("cuda_context: allocator must allocate on cuda:0, got one for cpu"));
}

// ---- the default allocator ----------------------------------------------------------------------

TEST(CudaAllocator, AllocatesStreamOrderedDeviceMemory) {
  MODMOE_REQUIRE_GPU();
  CudaSession gpu;
  Allocator* allocator = cuda_default_allocator(0);
  const size_t bytes = (1 << 20) + 7;
  void* ptr = allocator->allocate(bytes, gpu.stream());
  ASSERT_NE(ptr, nullptr);
  cudaPointerAttributes attributes{};
  ASSERT_CUDA(cudaPointerGetAttributes(&attributes, ptr));
  EXPECT_EQ(attributes.type, cudaMemoryTypeDevice);
  EXPECT_EQ(attributes.device, 0);
  ASSERT_CUDA(cudaMemsetAsync(ptr, 0x5a, bytes, gpu.stream()));
  std::vector<uint8_t> back(bytes, 0);
  ASSERT_CUDA(cudaMemcpyAsync(back.data(), ptr, bytes, cudaMemcpyDeviceToHost, gpu.stream()));
  ASSERT_CUDA(cudaStreamSynchronize(gpu.stream()));
  EXPECT_EQ(back, std::vector<uint8_t>(bytes, 0x5a));
  allocator->deallocate(ptr, bytes, gpu.stream());
  ASSERT_CUDA(cudaStreamSynchronize(gpu.stream()));

  EXPECT_EQ(allocator->allocate(0, gpu.stream()), nullptr);
  allocator->deallocate(nullptr, 0, gpu.stream());  // a no-op

  // The pool keeps freed memory instead of returning it at every synchronization.
  cudaMemPool_t pool = nullptr;
  ASSERT_CUDA(cudaDeviceGetDefaultMemPool(&pool, 0));
  uint64_t threshold = 0;
  ASSERT_CUDA(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold));
  EXPECT_EQ(threshold, UINT64_MAX);

  // Owned tensors through the context allocate and free on the context's stream.
  {
    const OwnedTensor t = gpu.empty(DType::bf16, {64, 128});
    ASSERT_NE(t.tensor().data(), nullptr);
    EXPECT_EQ(t.tensor().device(), Device::cuda(0));
  }
  gpu.sync();
}

// ---- copy_tensor --------------------------------------------------------------------------------

TEST(CudaCopy, RoundTripsInEveryDirection) {
  MODMOE_REQUIRE_GPU();
  CudaSession gpu;
  const Context& ctx = gpu.ctx();
  for (DType dtype : {DType::fp32, DType::bf16, DType::int64}) {
    const OwnedTensor host = random_host(dtype, {7, 33}, 11);
    const OwnedTensor a = gpu.empty(dtype, {7, 33});
    const OwnedTensor b = gpu.empty(dtype, {7, 33});
    OwnedTensor back = host_tensor(dtype, {7, 33});
    OwnedTensor host_copy = host_tensor(dtype, {7, 33});
    std::memset(back.tensor().data(), 0xee, back.tensor().nbytes());
    std::memset(host_copy.tensor().data(), 0xee, host_copy.tensor().nbytes());
    copy_tensor(ctx, a, host);          // host -> device
    copy_tensor(ctx, b, a);             // device -> device (stream-ordered)
    copy_tensor(ctx, back, b);          // device -> host (waits)
    copy_tensor(ctx, host_copy, back);  // host -> host
    EXPECT_EQ(bytes_of(back), bytes_of(host)) << dtype_name(dtype);
    EXPECT_EQ(bytes_of(host_copy), bytes_of(host)) << dtype_name(dtype);
  }
  // Empty tensors copy nothing and need no memory.
  const OwnedTensor empty_host = host_tensor(DType::fp32, {0, 8});
  const OwnedTensor empty_dev = gpu.empty(DType::fp32, {0, 8});
  EXPECT_NO_THROW(copy_tensor(ctx, empty_dev, empty_host));
}

TEST(CudaCopy, RejectsMismatchedOrStridedTensors) {
  MODMOE_REQUIRE_GPU();
  CudaSession gpu;
  const Context& ctx = gpu.ctx();
  const OwnedTensor host = random_host(DType::fp32, {4, 6}, 12);
  const OwnedTensor dev = gpu.empty(DType::fp32, {4, 6});
  const OwnedTensor dev_bf16 = gpu.empty(DType::bf16, {4, 6});
  const OwnedTensor dev_wide = gpu.empty(DType::fp32, {4, 7});

  EXPECT_THAT(error_of([&] { copy_tensor(ctx, dev_bf16, host); }),
              HasSubstr("copy_tensor: dst must have the dtype and shape of src, fp32 (4, 6), got "
                        "bf16 (4, 6) on cuda:0"));
  EXPECT_THAT(error_of([&] { copy_tensor(ctx, dev_wide, host); }),
              HasSubstr("copy_tensor: dst must have the dtype and shape of src, fp32 (4, 6), got "
                        "fp32 (4, 7) on cuda:0"));
  const Tensor column(host.tensor().data(), DType::fp32, {4, 1}, {6, 1}, Device::cpu());
  const Tensor dev_column(dev.tensor().data(), DType::fp32, {4, 1}, Device::cuda(0));
  EXPECT_THAT(error_of([&] { copy_tensor(ctx, dev_column, column); }),
              HasSubstr("copy_tensor: src must be contiguous (row-major), got fp32 (4, 1) on cpu "
                        "with strides (6, 1)"));
  EXPECT_THAT(error_of([&] { copy_tensor(Context::cpu(), dev, host); }),
              HasSubstr("copy_tensor: ctx.device must be cuda"));
  const Tensor elsewhere(dev.tensor().data(), DType::fp32, {4, 6}, Device::cuda(7));
  EXPECT_THAT(error_of([&] { copy_tensor(ctx, elsewhere, host); }),
              HasSubstr("copy_tensor: dst must be on cpu or on cuda:0 (ctx.device), got fp32 "
                        "(4, 6) on cuda:7"));
  EXPECT_THAT(error_of([&] { copy_tensor(ctx, dev, dev); }),
              HasSubstr("copy_tensor: dst must not overlap src"));
  EXPECT_THAT(error_of([&] { copy_tensor(ctx, dev, Tensor()); }),
              HasSubstr("copy_tensor: src must be defined"));
}

// ---- graph capture ------------------------------------------------------------------------------

// Quantization (the per-tensor path: memset, amax, scale, rows; and block scales) and both
// routers, captured in cudaStreamCaptureModeGlobal — where any host synchronization or plain
// cudaMalloc fails the capture — together with a workspace allocated and freed inside it. The
// graph is replayed on fresh inputs written into the same buffers; each replay must equal the
// CPU.
TEST(CudaGraph, QuantizeAndRouteCaptureAndReplay) {
  MODMOE_REQUIRE_GPU();
  CudaSession gpu;
  const Context& ctx = gpu.ctx();
  const int64_t M = 40, K = 512, E = 256, topk = 8;
  GroupedTopKParams params;
  params.num_groups = 8;
  params.topk_groups = 4;
  params.routed_scaling_factor = 2.5f;

  const OwnedTensor x = gpu.empty(DType::bf16, {M, K});
  const OwnedTensor logits = gpu.empty(DType::fp32, {M, E});
  const OwnedTensor bias = gpu.to_device(random_host(DType::fp32, {E}, 99));
  const OwnedTensor q_tensor = gpu.empty(DType::fp8_e4m3, {M, K});
  const OwnedTensor s_tensor = gpu.empty(DType::fp32, {1});
  const OwnedTensor q_block = gpu.empty(DType::fp8_e4m3, {M, K});
  const OwnedTensor s_block = gpu.empty(DType::fp32, act_scale_shape(QuantScheme::fp8_block, M, K));
  const OwnedTensor w_soft = gpu.empty(DType::fp32, {M, topk});
  const OwnedTensor ids_soft = gpu.empty(DType::int32, {M, topk});
  const OwnedTensor w_group = gpu.empty(DType::fp32, {M, topk});
  const OwnedTensor ids_group = gpu.empty(DType::int32, {M, topk});

  auto work = [&] {
    quantize_activations(ctx, x, QuantScheme::fp8_tensor, false, q_tensor, s_tensor);
    // A workspace from the default allocator, inside the capture: a graph memory node.
    const OwnedTensor scratch = gpu.empty(DType::fp8_e4m3, {M, K});
    quantize_activations(ctx, x, QuantScheme::fp8_block, false, scratch, s_block);
    ASSERT_CUDA(cudaMemcpyAsync(q_block.tensor().data(), scratch.tensor().data(),
                                scratch.tensor().nbytes(), cudaMemcpyDeviceToDevice, gpu.stream()));
    softmax_topk(ctx, logits, topk, true, w_soft, ids_soft);
    grouped_topk(ctx, logits, bias, topk, params, w_group, ids_group);
  };

  // Warm up eagerly (first-use initialization stays out of the capture).
  copy_tensor(ctx, x, random_host(DType::bf16, {M, K}, 1));
  copy_tensor(ctx, logits, random_host(DType::fp32, {M, E}, 2));
  work();
  gpu.sync();

  cudaGraph_t graph = nullptr;
  ASSERT_CUDA(cudaStreamBeginCapture(gpu.stream(), cudaStreamCaptureModeGlobal));
  work();
  ASSERT_CUDA(cudaStreamEndCapture(gpu.stream(), &graph));
  cudaGraphExec_t exec = nullptr;
  ASSERT_CUDA(cudaGraphInstantiate(&exec, graph, 0));

  const OwnedTensor host_bias = gpu.to_host(bias);
  for (uint32_t replay = 0; replay < 2; ++replay) {
    SCOPED_TRACE("replay " + std::to_string(replay));
    const OwnedTensor x_host = random_host(DType::bf16, {M, K}, 10 + replay);
    const OwnedTensor logits_host = random_host(DType::fp32, {M, E}, 20 + replay);
    copy_tensor(ctx, x, x_host);
    copy_tensor(ctx, logits, logits_host);
    ASSERT_CUDA(cudaGraphLaunch(exec, gpu.stream()));
    gpu.sync();

    OwnedTensor q = host_tensor(DType::fp8_e4m3, {M, K}), s = host_tensor(DType::fp32, {1});
    quantize_activations(Context::cpu(), x_host, QuantScheme::fp8_tensor, false, q, s);
    EXPECT_EQ(bytes_of(gpu.to_host(q_tensor)), bytes_of(q));
    EXPECT_EQ(bytes_of(gpu.to_host(s_tensor)), bytes_of(s));
    OwnedTensor qb = host_tensor(DType::fp8_e4m3, {M, K});
    OwnedTensor sb = host_tensor(DType::fp32, act_scale_shape(QuantScheme::fp8_block, M, K));
    quantize_activations(Context::cpu(), x_host, QuantScheme::fp8_block, false, qb, sb);
    EXPECT_EQ(bytes_of(gpu.to_host(q_block)), bytes_of(qb));
    EXPECT_EQ(bytes_of(gpu.to_host(s_block)), bytes_of(sb));

    OwnedTensor w = host_tensor(DType::fp32, {M, topk}), ids = host_tensor(DType::int32, {M, topk});
    softmax_topk(Context::cpu(), logits_host, topk, true, w, ids);
    EXPECT_EQ(bytes_of(gpu.to_host(ids_soft)), bytes_of(ids)) << "softmax ids";
    const OwnedTensor w_soft_host = gpu.to_host(w_soft);
    for (int64_t i = 0; i < M * topk; ++i) {
      EXPECT_NEAR(w_soft_host.data_ptr<float>()[i], w.data_ptr<float>()[i], 1e-6) << i;
    }
    grouped_topk(Context::cpu(), logits_host, host_bias, topk, params, w, ids);
    EXPECT_EQ(bytes_of(gpu.to_host(ids_group)), bytes_of(ids)) << "grouped ids";
    const OwnedTensor w_group_host = gpu.to_host(w_group);
    for (int64_t i = 0; i < M * topk; ++i) {
      EXPECT_NEAR(w_group_host.data_ptr<float>()[i], w.data_ptr<float>()[i], 2.5e-6) << i;
    }
  }
  ASSERT_CUDA(cudaGraphExecDestroy(exec));
  ASSERT_CUDA(cudaGraphDestroy(graph));
}

}  // namespace
}  // namespace modmoe
