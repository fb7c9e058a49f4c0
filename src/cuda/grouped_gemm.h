// The portable grouped GEMM (sm80+, fp8 on sm89+): tensor cores through mma.sync, ldmatrix,
// cp.async multi-stage pipelining. One launch computes, for every local expert e,
//
//   D[rows of e] = A[rows of e] · B[e]^T          (A: rows x K, B[e]: N_b x K, both K-major)
//
// with the rows of each expert known only on the device, so a launch never waits for the host:
//   Standard (m_indptr): expert e owns logical rows [m_indptr[e], m_indptr[e+1]).
//   Batched (expert_num_tokens): expert e owns logical rows [e*T, e*T + expert_num_tokens[e]),
//                                 with T = batch_rows; rows past the count are never read.
// A logical row r reads A row a_row_index ? a_row_index[r] : r (a fused gather: the permute
// does not copy activations), and the per-row activation scales of that same source row.
// Gated mode: N_out = N_b / 2; the kernel computes gate and up columns of the same tile and
// writes act(gate) * up (GatedLayout picks where they are in B's rows). Plain mode: N_out = N_b.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "modmoe/activation.h"
#include "modmoe/dtype.h"
#include "modmoe/quant.h"

namespace modmoe::cuda {

struct GroupedGemmArgs {
  // Operands. A and B are both bf16, both fp16, or both fp8_e4m3.
  const void* A = nullptr;
  int64_t lda = 0;                       // elements between A rows
  const int32_t* a_row_index = nullptr;  // optional gather map, logical row -> A row
  const void* B = nullptr;               // (E, N_b, K) contiguous
  DType ab_dtype = DType::bf16;
  int64_t E = 0, N_b = 0, K = 0;

  // Row ownership, on the device (exactly one of the two).
  const int32_t* m_indptr = nullptr;           // (E + 1)
  const int32_t* expert_num_tokens = nullptr;  // (E), with batch_rows rows per expert
  int64_t batch_rows = 0;
  int64_t max_rows = 0;  // upper bound of logical rows (sizes the grid; e.g. M * topk)

  // Scales (fp8 only), layouts of quant.h: per A *source* row for token/block/mx schemes,
  // per expert for B (w13_scale / w2_scale of expert e at offset e * per-expert size).
  QuantScheme scheme = QuantScheme::none;
  const void* a_scale = nullptr;
  const void* b_scale = nullptr;

  // Epilogue.
  bool gated = false;
  Activation activation = Activation::silu;  // gated forms only when gated
  GatedLayout gated_layout = GatedLayout::GateUp;
  void* D = nullptr;        // (logical rows, N_out)
  int64_t ldd = 0;          // elements between D rows
  DType d_dtype = DType::bf16;  // bf16, fp16 or fp32
};

// Checks the arguments (shapes, alignment the kernel needs, dtypes, scale presence) and
// launches on `stream`. Throws modmoe::Error with the argument, expected and actual value.
void grouped_gemm(const GroupedGemmArgs& args, cudaStream_t stream);

// Why the kernel cannot run these arguments (empty string when it can).
std::string grouped_gemm_can_implement(const GroupedGemmArgs& args);

}  // namespace modmoe::cuda
