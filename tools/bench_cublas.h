// cuBLAS in the GPU benchmark: the GEMM peaks the floor is computed from, and the per-expert
// baseline modmoe is compared against.
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "modmoe/moe_types.h"

namespace modmoe::bench {

// One cuBLAS and one cuBLASLt handle with a user workspace (needed for graph capture: cuBLAS
// must not allocate while a stream is being captured).
class Cublas {
 public:
  explicit Cublas(cudaStream_t stream);
  ~Cublas();
  Cublas(const Cublas&) = delete;
  Cublas& operator=(const Cublas&) = delete;

  cublasHandle_t handle() const { return handle_; }
  cublasLtHandle_t lt() const { return lt_; }
  void* workspace() const { return workspace_; }
  size_t workspace_bytes() const { return kWorkspaceBytes; }
  cudaStream_t stream() const { return stream_; }

 private:
  static constexpr size_t kWorkspaceBytes = size_t(64) << 20;
  cudaStream_t stream_;
  cublasHandle_t handle_ = nullptr;
  cublasLtHandle_t lt_ = nullptr;
  void* workspace_ = nullptr;
};

// The 128x128-block fp8 GEMM through cuBLASLt (CUDA 12.9+ on sm90): D (m x n, col-major bf16)
// = A^T B with A (k x m) e4m3 scaled per 128x128 block
// (CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F, scales [ceil(m/128)][round_up(ceil(k/128), 4)]) and
// B (k x n) e4m3 scaled per 1x128 group (VEC128_32F, scales [ceil(k/128)][n], n a multiple of 4).
// In row-major terms: A is a weight (m rows of k), B holds n token rows of k, D holds n rows of m.
class BlockFp8Gemm {
 public:
  explicit BlockFp8Gemm(const Cublas& cublas);
  ~BlockFp8Gemm();
  BlockFp8Gemm(const BlockFp8Gemm&) = delete;
  BlockFp8Gemm& operator=(const BlockFp8Gemm&) = delete;

  // Empty when cuBLASLt has an algorithm for this shape, else why not.
  std::string supports(int64_t m, int64_t n, int64_t k);
  // Enqueues on the Cublas stream; throws Error when unsupported.
  void run(int64_t m, int64_t n, int64_t k, const uint8_t* A, const float* a_scale,
           const uint8_t* B, const float* b_scale, void* D);

 private:
  struct Plan;
  const Plan* plan_for(int64_t m, int64_t n, int64_t k, std::string* why);
  const Cublas& cublas_;
  cublasLtMatmulDesc_t desc_ = nullptr;
  std::vector<std::unique_ptr<Plan>> plans_;  // by shape: experts share row counts
};

struct GemmPeaks {
  double bf16_tflops = 0;        // cublasGemmEx, bf16 in/out, fp32 accumulate
  double fp8_tensor_tflops = 0;  // cublasLt e4m3, per-tensor scales; 0 when unavailable
  double fp8_block_tflops = 0;   // cublasLt e4m3, 128x128 / 1x128 block scales; 0 when unavailable
  int64_t size = 0;              // m = n = k
  std::string notes;             // why an fp8 measurement is missing
};
// Dense square GEMMs on random data; median of `repeats` timed runs after warm-up.
GemmPeaks measure_gemm_peaks(const Cublas& cublas, int64_t size, int repeats);

// The per-expert cuBLAS loop for one case (ARCHITECTURE.md §10's baseline): gather the rows of
// each expert (quantizing them per 1x128 group for fp8), GEMM1 per expert with tokens, the
// gated activation (quantized for fp8), GEMM2 per expert, then the top-k weighted sum. Rows and
// per-expert sizes come from the routing on the host, the generous case for the baseline: it
// needs no device-side permute and its GEMM shapes are fixed when the graph is captured.
struct BaselineInputs {
  MoEConfig config;  // bf16 in; quant none (cublasGemmEx) or fp8_block (cuBLASLt block fp8)
  int64_t M = 0;
  const void* x = nullptr;              // (M, K) bf16, device
  const float* topk_weights = nullptr;  // (M, topk), device
  std::vector<int32_t> topk_ids;        // (M, topk), host
  ExpertWeights weights;                // device, modmoe's layouts
};

class CublasBaseline {
 public:
  // Throws Error when the case cannot run (the reason says why, e.g. cuBLASLt has no block-fp8
  // algorithm for a shape).
  CublasBaseline(const Cublas& cublas, const BaselineInputs& in);
  ~CublasBaseline();
  CublasBaseline(const CublasBaseline&) = delete;
  CublasBaseline& operator=(const CublasBaseline&) = delete;

  void enqueue();                              // the whole layer, on the Cublas stream (capturable)
  const void* output() const { return out_; }  // (M, K) bf16
  std::string kind() const;                    // what ran, for the JSON
  int64_t gemm_calls() const { return gemm_calls_; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  void* out_ = nullptr;
  int64_t gemm_calls_ = 0;
};

}  // namespace modmoe::bench
