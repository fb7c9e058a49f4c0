// include/modmoe/cuda.h: device discovery, CUDA contexts, the default device allocator (a
// cudaMallocAsync pool), and host<->device copies.
#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "cuda/cuda_check.h"
#include "cuda/device_guard.h"
#include "modmoe/cuda.h"
#include "modmoe/error.h"

namespace modmoe {
namespace {

// Stream-ordered allocations from the device's default memory pool. The pool's release
// threshold is raised to the maximum, so freed memory stays cached in the pool instead of
// going back to the driver at every synchronization: a forward that allocates its workspaces
// each call then costs no cudaMalloc after the first. Inside stream capture the same calls
// become graph allocation nodes, so a captured forward may allocate.
class DevicePoolAllocator final : public Allocator {
 public:
  explicit DevicePoolAllocator(int index) : index_(index) {
    MODMOE_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool_, index));
    uint64_t keep_everything = UINT64_MAX;
    MODMOE_CUDA_CHECK(
        cudaMemPoolSetAttribute(pool_, cudaMemPoolAttrReleaseThreshold, &keep_everything));
  }

  void* allocate(size_t bytes, void* stream) override {
    if (bytes == 0) return nullptr;
    void* ptr = nullptr;
    const cudaError_t err =
        cudaMallocFromPoolAsync(&ptr, bytes, pool_, static_cast<cudaStream_t>(stream));
    MODMOE_CHECK(err == cudaSuccess)
        << "cuda allocator: cudaMallocFromPoolAsync of " << bytes << " bytes on cuda:" << index_
        << " failed: " << cudaGetErrorName(err) << " (" << cudaGetErrorString(err) << ")";
    return ptr;
  }

  // Called from destructors (Buffer), possibly while the CUDA runtime shuts down at process
  // exit: it must not throw, so a failure is dropped (and cleared, so it does not surface as a
  // later launch error).
  void deallocate(void* ptr, size_t, void* stream) override {
    if (ptr == nullptr) return;
    if (cudaFreeAsync(ptr, static_cast<cudaStream_t>(stream)) != cudaSuccess) {
      cudaGetLastError();
    }
  }

  Device device() const override { return Device::cuda(index_); }

 private:
  int index_;
  cudaMemPool_t pool_ = nullptr;
};

void check_device_index(const char* fn, int index) {
  const int count = cuda_device_count();
  MODMOE_CHECK(count > 0) << fn << ": no CUDA device is visible (cuda_device_count() = 0)";
  MODMOE_CHECK(index >= 0 && index < count)
      << fn << ": device index must be in [0, " << count << "), got " << index;
}

void check_cuda_context(const char* fn, const Context& ctx) {
  MODMOE_CHECK(ctx.device.is_cuda())
      << fn << ": ctx.device must be cuda (a context from cuda_context()), got "
      << ctx.device.str();
}

// A copy operand: defined, contiguous, on the host or on the context's device.
void check_copy_operand(const char* fn, const char* arg, const Tensor& t, const Context& ctx) {
  MODMOE_CHECK(t.defined()) << fn << ": " << arg << " must be defined, got undefined";
  MODMOE_CHECK(t.device().is_cpu() || t.device() == ctx.device)
      << fn << ": " << arg << " must be on cpu or on " << ctx.device.str() << " (ctx.device), got "
      << t.describe();
  MODMOE_CHECK(t.is_contiguous()) << fn << ": " << arg << " must be contiguous (row-major), got "
                                  << t.describe() << " with strides " << shape_str(t.strides());
}

}  // namespace

bool cuda_available() { return cuda_device_count() > 0; }

int cuda_device_count() {
  int count = 0;
  // No driver or no device is an answer (0), not an error: CI runs without a GPU.
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return count;
}

Allocator* cuda_default_allocator(int index) {
  check_device_index("cuda_default_allocator", index);
  // One allocator per device for the life of the process. They are never destroyed: the CUDA
  // runtime may already be gone when static destructors run.
  static std::mutex mutex;
  static auto* allocators = new std::vector<std::unique_ptr<DevicePoolAllocator>>();
  std::lock_guard<std::mutex> lock(mutex);
  if (allocators->size() <= static_cast<size_t>(index)) allocators->resize(index + 1);
  auto& slot = (*allocators)[index];
  if (!slot) slot = std::make_unique<DevicePoolAllocator>(index);
  return slot.get();
}

Context cuda_context(int index, void* stream, Allocator* allocator) {
  constexpr const char* fn = "cuda_context";
  check_device_index(fn, index);
  MODMOE_CHECK(allocator == nullptr || allocator->device() == Device::cuda(index))
      << fn << ": allocator must allocate on cuda:" << index << ", got one for "
      << allocator->device().str();
  Context ctx;
  ctx.device = Device::cuda(index);
  ctx.stream = stream;
  ctx.allocator = allocator ? allocator : cuda_default_allocator(index);
  MODMOE_CUDA_CHECK(cudaDeviceGetAttribute(&ctx.sm_count, cudaDevAttrMultiProcessorCount, index));
  return ctx;
}

void copy_tensor(const Context& ctx, const Tensor& dst, const Tensor& src) {
  constexpr const char* fn = "copy_tensor";
  check_cuda_context(fn, ctx);
  check_copy_operand(fn, "src", src, ctx);
  check_copy_operand(fn, "dst", dst, ctx);
  MODMOE_CHECK(dst.dtype() == src.dtype() && dst.shape() == src.shape())
      << fn << ": dst must have the dtype and shape of src, " << dtype_name(src.dtype()) << " "
      << src.shape_str() << ", got " << dst.describe();
  MODMOE_CHECK(!dst.overlaps(src)) << fn << ": dst must not overlap src (dst " << dst.describe()
                                   << ", src " << src.describe() << ")";

  const bool from_host = src.device().is_cpu(), to_host = dst.device().is_cpu();
  const cudaMemcpyKind kind = from_host
                                  ? (to_host ? cudaMemcpyHostToHost : cudaMemcpyHostToDevice)
                                  : (to_host ? cudaMemcpyDeviceToHost : cudaMemcpyDeviceToDevice);
  const size_t bytes = src.nbytes();
  if (bytes == 0) return;
  cuda::DeviceGuard guard(ctx.device.index);
  const auto stream = static_cast<cudaStream_t>(ctx.stream);
  MODMOE_CUDA_CHECK(cudaMemcpyAsync(dst.data(), src.data(), bytes, kind, stream));
  // With host memory on either side the caller reads, reuses or frees it right after the
  // call, so the copy must be complete. Device-to-device copies stay stream-ordered.
  if (from_host || to_host) MODMOE_CUDA_CHECK(cudaStreamSynchronize(stream));
}

void synchronize(const Context& ctx) {
  check_cuda_context("synchronize", ctx);
  cuda::DeviceGuard guard(ctx.device.index);
  MODMOE_CUDA_CHECK(cudaStreamSynchronize(static_cast<cudaStream_t>(ctx.stream)));
}

}  // namespace modmoe
