// The float64 oracle: the MoE layer computed from its definition (ARCHITECTURE.md §9).
//
// Independent of every backend on purpose: it decodes each input element itself (bf16, fp16,
// fp32, fp64, fp8 e4m3 codes, e8m0 scales) and emulates, in double, the quantizations the
// scheme prescribes. It only borrows the *definitions* from the public headers: the tensor
// types, the scale shapes of quant.h and the activation math and gate/up columns of
// activation.h. Slow and simple by design — clarity over speed.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "modmoe/activation.h"
#include "modmoe/moe_types.h"
#include "modmoe/quant.h"
#include "modmoe/tensor.h"

namespace modmoe {
namespace oracle {

struct OracleInputs {
  Tensor hidden_states;   // (M, K) bf16/fp16/fp32, host
  Tensor topk_weights;    // fp32 (M, topk)
  Tensor topk_ids;        // int32/int64 (M, topk), global expert ids
  ExpertWeights weights;  // local experts: w13 (E_local, 2N or N, K), w2 (E_local, K, N), scales
  Tensor expert_map;      // int32 (E) global->local, -1 = not local; undefined = identity
  QuantConfig quant;
  Activation activation = Activation::silu;
  GatedLayout layout = GatedLayout::GateUp;
  bool apply_router_weight_on_input = false;  // requires topk == 1
  // Emulate, in double, the quantizations the scheme prescribes: x -> fp8 with the scheme's
  // activation scales (dynamic, or static weights.a13_scale), and the intermediate
  // act(gate)*up -> fp8 with its scales (dynamic over the intermediate (rows, N) tensor of all
  // routed local (token, k) pairs, or static weights.a2_scale) before GEMM2.
  bool emulate_quantization = true;
  // Tokens per Experts::apply call (Context::chunk_size when the experts support chunking):
  // the experts then quantize the intermediate chunk by chunk, so a dynamic per-tensor
  // intermediate scale is one per chunk of tokens. <= 0: one chunk. (Row-wise schemes and the
  // GEMM1 input, quantized by prepare over the whole batch, do not depend on it.)
  int64_t chunk_size = 0;
};

// out (M*K, row-major) in double. out[t] = sum over k with local expert e = map(topk_ids[t,k]):
//   w * W2_e · act(W13_e · x_t)   where w = topk_weights[t,k] (or 1 with
//   apply_router_weight_on_input, in which case x_t is first multiplied by topk_weights[t,0]).
// Tokens routed to no local expert get zeros. Dynamic per-tensor activation scales of GEMM1
// are taken over all M rows (prepare quantizes the whole batch, routed locally or not).
std::vector<double> moe_forward(const OracleInputs& in);

// amax of the intermediate act(gate)*up over all routed local pairs (used to build static a2
// scales). The GEMM1 input is quantized as in moe_forward.
double intermediate_amax(const OracleInputs& in);

struct ErrorReport {
  bool all_finite = true;         // NaN/Inf in `out` are checked first
  int64_t first_non_finite = -1;  // flat index
  double first_non_finite_value = 0;
  int64_t num_non_finite = 0;
  int64_t row_length = 0;           // K, to print the row/column of the first non-finite element
  double rel_error = 0;             // ||out - ref|| / ||ref|| over everything
  double max_expert_rel_error = 0;  // same measure over the rows (tokens) routed to one expert,
                                    // max over the local experts
  int64_t worst_expert = -1;        // global expert id
  bool passed(double tol) const;    // finite and both errors <= tol
  std::string str() const;  // "rel 1.2e-03, worst expert 17: 3.4e-03" or "non-finite at ..."
};

// out: (M, K) in any float dtype on the host (strided views allowed); ref: moe_forward's result.
// The per-expert measure groups the rows by the local experts their topk_ids map to.
ErrorReport compare(const Tensor& out, const std::vector<double>& ref, const Tensor& topk_ids,
                    const Tensor& expert_map /* may be undefined */);

// ---- the oracle's own scalar definitions (exposed so the tests can hold them to numeric.h) ----

double decode_bf16(uint16_t bits);
double decode_fp16(uint16_t bits);
double decode_e4m3(uint8_t code);  // e4m3fn: S.1111.111 is NaN, max 448
double decode_e8m0(uint8_t code);  // 2^(code - 127); 0xff is NaN
// The e4m3 value nearest to v (ties to even), saturating to +-448; NaN stays NaN.
double round_to_e4m3(double v);
// Element `offset` (in elements, strides already applied) of a host tensor of any float,
// fp8, e8m0 or integer dtype, as a double.
double element_at(const Tensor& t, int64_t offset);

// Quantizes then dequantizes `data` (rows, cols) row-major in place, as the scheme quantizes an
// activation tensor: per-tensor, per-row, 1x128 blocks or MX-32 groups along the columns.
// `static_scale` > 0 replaces the dynamic scale (fp8_tensor only).
void fake_quantize(std::vector<double>& data, int64_t rows, int64_t cols, QuantScheme scheme,
                   double static_scale = 0);

}  // namespace oracle
}  // namespace modmoe
