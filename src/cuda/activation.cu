// Activation kernels (see activation.h): one block per row (grid-stride over rows), threads
// across the columns. Memory-bound; the math is the accurate libdevice expf/erff/tanhf.
#include <algorithm>

#include "cuda/activation.h"
#include "cuda/activation_device.cuh"
#include "cuda/cuda_check.h"
#include "cuda/float_io.cuh"
#include "modmoe/error.h"

namespace modmoe::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxBlocks = 65535;

template <typename XT, typename YT>
__global__ void activation_no_mul_kernel(Activation act, const XT* x, int64_t ldx, YT* y,
                                         int64_t ldy, int64_t rows,
                                         const int32_t* __restrict__ num_rows, int64_t N) {
  const int64_t row_end = num_rows && *num_rows < rows ? int64_t{*num_rows} : rows;
  for (int64_t r = blockIdx.x; r < row_end; r += gridDim.x) {
    // x and y may be the same memory (in place): each element is read, then written, by one
    // thread, so no __restrict__ here.
    for (int64_t j = threadIdx.x; j < N; j += blockDim.x) {
      y[r * ldy + j] = from_float<YT>(gate_function(act, to_float(x[r * ldx + j])));
    }
  }
}

template <typename XT, typename YT>
__global__ void activation_and_mul_kernel(Activation act, GatedLayout layout,
                                          const XT* __restrict__ x, int64_t ldx, YT* __restrict__ y,
                                          int64_t ldy, int64_t rows,
                                          const int32_t* __restrict__ num_rows, int64_t N) {
  const int64_t row_end = num_rows && *num_rows < rows ? int64_t{*num_rows} : rows;
  for (int64_t r = blockIdx.x; r < row_end; r += gridDim.x) {
    const XT* xr = x + r * ldx;
    for (int64_t j = threadIdx.x; j < N; j += blockDim.x) {
      const float gate = to_float(xr[gate_column(layout, j, N)]);
      const float up = to_float(xr[up_column(layout, j, N)]);
      y[r * ldy + j] = from_float<YT>(gated_function(act, gate, up));
    }
  }
}

int threads_for(int64_t N) {
  return static_cast<int>(std::min<int64_t>(kThreads, std::max<int64_t>(32, (N + 31) / 32 * 32)));
}
int blocks_for_rows(int64_t rows) { return static_cast<int>(std::min<int64_t>(rows, kMaxBlocks)); }

void check_common(const char* fn, const void* x, DType x_dtype, int64_t ldx, const void* y,
                  DType y_dtype, int64_t ldy, int64_t rows, int64_t N, int64_t x_width) {
  MODMOE_CHECK(rows >= 0 && N >= 0)
      << fn << ": rows and N must be >= 0, got rows = " << rows << ", N = " << N;
  MODMOE_CHECK(ldx >= x_width && ldy >= N)
      << fn << ": ldx must be >= " << x_width << " and ldy >= N = " << N << ", got ldx = " << ldx
      << ", ldy = " << ldy;
  MODMOE_CHECK(is_float_io_dtype(x_dtype) && is_float_io_dtype(y_dtype))
      << fn << ": x and y must be bf16, fp16 or fp32, got " << dtype_name(x_dtype) << " and "
      << dtype_name(y_dtype);
  MODMOE_CHECK(rows * N == 0 || (x != nullptr && y != nullptr))
      << fn << ": x and y must not be null";
}

}  // namespace

void activation_no_mul(Activation act, const void* x, DType x_dtype, int64_t ldx, void* y,
                       DType y_dtype, int64_t ldy, int64_t rows, const int32_t* num_rows, int64_t N,
                       cudaStream_t stream) {
  static constexpr const char* kFn = "cuda::activation_no_mul";
  MODMOE_CHECK(!is_gated(act)) << kFn << ": act must be a _no_mul activation, got "
                               << activation_name(act);
  check_common(kFn, x, x_dtype, ldx, y, y_dtype, ldy, rows, N, N);
  MODMOE_CHECK(x != y || (x_dtype == y_dtype && ldx == ldy))
      << kFn << ": in place (y == x) needs the same dtype and leading dimension";
  if (rows == 0 || N == 0) return;
  dispatch_float_io(x_dtype, kFn, [&](auto x_tag) {
    using XT = typename decltype(x_tag)::type;
    dispatch_float_io(y_dtype, kFn, [&](auto y_tag) {
      using YT = typename decltype(y_tag)::type;
      activation_no_mul_kernel<XT, YT><<<blocks_for_rows(rows), threads_for(N), 0, stream>>>(
          act, static_cast<const XT*>(x), ldx, static_cast<YT*>(y), ldy, rows, num_rows, N);
      MODMOE_CUDA_CHECK_LAUNCH();
    });
  });
}

void activation_and_mul(Activation act, GatedLayout layout, const void* x, DType x_dtype,
                        int64_t ldx, void* y, DType y_dtype, int64_t ldy, int64_t rows,
                        const int32_t* num_rows, int64_t N, cudaStream_t stream) {
  static constexpr const char* kFn = "cuda::activation_and_mul";
  MODMOE_CHECK(is_gated(act)) << kFn << ": act must be a gated activation, got "
                              << activation_name(act);
  check_common(kFn, x, x_dtype, ldx, y, y_dtype, ldy, rows, N, 2 * N);
  if (rows == 0 || N == 0) return;
  dispatch_float_io(x_dtype, kFn, [&](auto x_tag) {
    using XT = typename decltype(x_tag)::type;
    dispatch_float_io(y_dtype, kFn, [&](auto y_tag) {
      using YT = typename decltype(y_tag)::type;
      activation_and_mul_kernel<XT, YT><<<blocks_for_rows(rows), threads_for(N), 0, stream>>>(
          act, layout, static_cast<const XT*>(x), ldx, static_cast<YT*>(y), ldy, rows, num_rows, N);
      MODMOE_CUDA_CHECK_LAUNCH();
    });
  });
}

}  // namespace modmoe::cuda
