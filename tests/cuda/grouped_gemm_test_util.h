// The harness of the portable grouped GEMM tests (test_grouped_gemm_*.cpp; definitions in
// grouped_gemm_test_util.cpp): the GEMM (src/cuda/grouped_gemm.h) against a float64 reference
// computed here from the definition: dequant(A)[s][k] * dequant(B[e])[n][k] summed over k, then
// the gated activation of activation.h (activation_gated<double>) where the case is gated.
//
// Every case:
//   * draws its data from a seeded std::mt19937 (the seed is printed on failure); operands are
//     random codes of the operand dtype, scales random positive values of each layout;
//   * fills every A row that no expert owns (rows past m_indptr[E], batched rows past the
//     counts, rows the gather map skips) and A's row padding (lda > K) with NaN codes and NaN
//     scales: reading any of them turns some output into NaN;
//   * poisons D with 0xFF bytes (NaN in bf16 / fp16 / fp32) and checks that rows outside the
//     expert ranges and the columns past N_out (ldd padding) still hold the poison;
//   * runs the GEMM twice into two poisoned outputs and requires bitwise-equal results
//     (deterministic);
//   * checks, per expert, ||D - ref|| / ||ref|| and every element against
//     |D - ref| <= rtol * |ref| + 1e-4 * rms(ref of the expert): rtol is the output dtype's
//     rounding (2^-8 bf16, 2^-10 fp16, 1e-6 fp32); 1e-4 * rms bounds fp32 accumulation over
//     K <= 2880 terms by a wide margin while one missing K term (~1/sqrt(K) of rms) fails.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "cuda/cuda_check.h"
#include "cuda/grouped_gemm.h"
#include "cuda/grouped_gemm_heuristic.cuh"
#include "modmoe/activation.h"
#include "modmoe/dtype.h"
#include "modmoe/quant.h"

namespace modmoe::cuda::grouped_gemm_test {

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// ---- device memory -----------------------------------------------------------------------

// A cudaMalloc'd copy of a host vector (or `bytes` of uninitialized memory).
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes) : bytes_(bytes) {
    MODMOE_CUDA_CHECK(cudaMalloc(&ptr_, std::max<size_t>(bytes, 16)));
  }
  template <typename T>
  explicit DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(host.size() * sizeof(T)) {
    upload(host);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept { *this = std::move(o); }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    std::swap(ptr_, o.ptr_);
    std::swap(bytes_, o.bytes_);
    return *this;
  }
  ~DeviceBuffer() {
    if (ptr_ != nullptr) cudaFree(ptr_);
  }

  // upload() and fill() run on the legacy default stream and may return before the device
  // has finished (a pageable copy returns once staged, a device memset is asynchronous). The
  // GEMMs run on cudaStreamNonBlocking streams, which do not wait for the legacy stream, so
  // both wait for the device here: otherwise a late memset can overwrite results with the
  // poison (seen as -nan under GPU contention) and a late copy can feed stale operands.
  template <typename T>
  void upload(const std::vector<T>& host) {
    MODMOE_CUDA_CHECK(
        cudaMemcpy(ptr_, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
    MODMOE_CUDA_CHECK(cudaDeviceSynchronize());
  }
  std::vector<uint8_t> download() const {
    std::vector<uint8_t> host(bytes_);
    MODMOE_CUDA_CHECK(cudaMemcpy(host.data(), ptr_, bytes_, cudaMemcpyDeviceToHost));
    return host;
  }
  void fill(uint8_t byte) {
    MODMOE_CUDA_CHECK(cudaMemset(ptr_, byte, bytes_));
    MODMOE_CUDA_CHECK(cudaDeviceSynchronize());
  }

  void* get() const { return ptr_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// ---- a problem -----------------------------------------------------------------------------

struct Case {
  std::string name;
  DType ab = DType::bf16;
  QuantScheme scheme = QuantScheme::none;
  int64_t E = 1, N_b = 64, K = 64;
  std::vector<int> rows;  // rows per expert (standard) or expert_num_tokens (batched)
  bool batched = false;
  int64_t batch_rows = 0;
  bool gather = false;  // standard mode only: logical rows read A through a_row_index
  bool gated = false;
  Activation activation = Activation::silu;
  GatedLayout layout = GatedLayout::GateUp;
  DType d_dtype = DType::bf16;
  int64_t lda_pad = 0, ldd_pad = 0;
  int64_t extra_rows = 5;  // standard: unowned rows after m_indptr[E] (A and D)
  int64_t max_rows = -1;   // -1: the number of logical rows the case has
  uint32_t seed = 1;
};

// "name [dtype/scheme E=.. N_b=.. K=.. mode ... D=.. seed=..]", for failure messages.
std::string describe(const Case& c);

inline int64_t n_out(const Case& c) { return c.gated ? c.N_b / 2 : c.N_b; }

// Everything on the host side of a case, with the float64 dequantized operands.
struct HostProblem {
  // Logical rows: [begin, end) per expert; D has `d_rows` rows.
  std::vector<int32_t> m_indptr, num_tokens, row_index;
  std::vector<int64_t> begin, end;
  int64_t logical_rows = 0, a_rows = 0, d_rows = 0, lda = 0, ldd = 0;
  std::vector<int32_t> src_of_row;  // A row of each logical row (-1: no data)
  std::vector<uint8_t> a, b;        // codes
  std::vector<float> a_scale, b_scale;
  std::vector<uint8_t> a_scale_mx, b_scale_mx;
  std::vector<double> a_deq;  // (a_rows, K), NaN for unowned rows
};

// Draws operands and scales; unowned A rows get NaN codes and NaN scales.
HostProblem make_problem(const Case& c);

// Reference output (d_rows, N_out); rows nobody owns are left NaN (not compared).
std::vector<double> reference(const Case& c, const HostProblem& h);

// The problem on the device, and the arguments that point at it.
struct DeviceProblem {
  DeviceBuffer a, b, a_scale, b_scale, m_indptr, num_tokens, row_index, d, d2;
  GroupedGemmArgs args;
};

// Copies the host problem to the device; D and D2 are uninitialized (run_case poisons them).
DeviceProblem upload(const Case& c, const HostProblem& h);

// Compares D with the reference; checks that unowned rows and ldd padding kept the poison.
void check_output(const Case& c, const HostProblem& h, const std::vector<double>& ref,
                  const std::vector<uint8_t>& d);

// Runs the case (twice, into two poisoned outputs) and checks it.
void run_case(const Case& c);

// E row counts drawn uniformly from [lo, hi] with `seed`.
std::vector<int> random_rows(uint32_t seed, int64_t E, int lo, int hi);

// The tile grouped_gemm's heuristic picks for the case.
gemm::GemmTile tile_of(const Case& c);

}  // namespace modmoe::cuda::grouped_gemm_test
