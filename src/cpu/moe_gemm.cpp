// moe_gemm_groupwise on the CPU: dequantize A rows to fp32, the blocked grouped GEMM
// (cpu::grouped_gemm_nt dequantizes B per panel), then the (gated) epilogue, which stores the
// row as is or, for an fp8_e4m3 out, quantizes it per 128 columns like the fp8_block
// activation quantizer (the operand GEMM2 takes). fp8_block and mxfp8 inputs share the path:
// the row and expert helpers read either scale layout of quant.h.
//
// "MN"-major scales are the transposed layout GPU kernels prefer (FlashInfer's and DeepGEMM's
// option). Here they are only turned back into the K-major values the rest of the path
// expects (a row's A scales gathered with a stride, B scales transposed into a temporary),
// so both modes share one computation.
#include "cpu/moe_gemm.h"

#include <vector>

#include "cpu/expert_mlp.h"
#include "cpu/gemm.h"
#include "cpu/quant_rows.h"
#include "cpu/rows.h"
#include "modmoe/allocator.h"
#include "modmoe/error.h"

namespace modmoe::cpu {

namespace {

// b_scale (E, K/128, ceil(N_b/128)) MN-major -> (E, ceil(N_b/128), K/128) K-major.
OwnedTensor k_major_weight_scales(const Tensor& mn_scale) {
  const int64_t E = mn_scale.size(0), kb = mn_scale.size(1), nb = mn_scale.size(2);
  OwnedTensor k_major = host_tensor(DType::fp32, {E, nb, kb});
  const float* src = mn_scale.data_ptr<const float>();
  float* dst = k_major.data_ptr<float>();
  for (int64_t e = 0; e < E; ++e)
    for (int64_t n = 0; n < nb; ++n)
      for (int64_t k = 0; k < kb; ++k) dst[(e * nb + n) * kb + k] = src[(e * kb + k) * nb + n];
  return k_major;
}

}  // namespace

void moe_gemm_groupwise(const Context&, const Tensor& a, const Tensor& b, const Tensor& a_scale,
                        const Tensor& b_scale, const Tensor& m_indptr, const Tensor& out,
                        QuantScheme scheme, const MoeGemmOptions& o) {
  static constexpr const char* kFn = "moe_gemm_groupwise";
  const int64_t E = b.size(0), N_b = b.size(1), K = b.size(2), rows = a.size(0);
  const int64_t N_out = out.size(1);
  const bool quantized = scheme != QuantScheme::none;
  const bool mn_major = quantized && o.scale_major_mode == "MN";

  // m_indptr is host memory here, so it is checked (the CUDA backend cannot without a sync).
  const int32_t* indptr = m_indptr.data_ptr<int32_t>();
  std::vector<int64_t> offsets(E + 1);
  MODMOE_CHECK(indptr[0] >= 0) << kFn << ": m_indptr[0] must be >= 0, got " << indptr[0];
  for (int64_t e = 0; e <= E; ++e) {
    offsets[e] = indptr[e];
    MODMOE_CHECK(e == 0 || indptr[e] >= indptr[e - 1])
        << kFn << ": m_indptr must be non-decreasing, got m_indptr[" << e << "] = " << indptr[e]
        << " < m_indptr[" << e - 1 << "] = " << indptr[e - 1];
  }
  MODMOE_CHECK(indptr[E] <= rows) << kFn << ": m_indptr[E] = " << indptr[E]
                                  << " exceeds a.size(0) = " << rows;
  const int64_t first = offsets[0], last = offsets[E];
  if (last == first) return;

  // A rows in fp32 (only the rows some expert owns). A row's scales are k_groups consecutive
  // elements of a_scale when K-major: fp32 for fp8_block, e8m0 bytes for mxfp8 (which
  // dequantize_row reads as such); MN-major (fp8_block only) gathers them into fp32.
  std::vector<float> A((last - first) * K), C((last - first) * N_b);
  const size_t a_row_bytes = K * dtype_size(a.dtype());
  const int64_t k_groups = quantized ? K / scale_group_k(scheme, K) : 0;
  const size_t a_scale_row_bytes = quantized ? k_groups * dtype_size(a_scale.dtype()) : 0;
  const char* a_scales = quantized ? static_cast<const char*>(a_scale.data()) : nullptr;
#pragma omp parallel
  {
    std::vector<float> gathered(mn_major ? k_groups : 0);  // one row's MN-major A scales
#pragma omp for schedule(static)
    for (int64_t r = first; r < last; ++r) {
      const void* row = static_cast<const char*>(a.data()) + r * a_row_bytes;
      const void* rs = nullptr;
      if (mn_major) {
        const float* mn_scales = reinterpret_cast<const float*>(a_scales);
        for (int64_t g = 0; g < k_groups; ++g) gathered[g] = mn_scales[g * rows + r];
        rs = gathered.data();
      } else if (quantized) {
        rs = a_scales + r * a_scale_row_bytes;
      }
      dequantize_input_row(row, a.dtype(), K, scheme, rs, A.data() + (r - first) * K);
    }
  }
  const OwnedTensor b_scale_k_major = mn_major ? k_major_weight_scales(b_scale) : OwnedTensor();
  const Tensor& b_scale_k = mn_major ? b_scale_k_major.tensor() : b_scale;
  std::vector<WeightOperand> B(E);
  std::vector<int64_t> local(E + 1);
  for (int64_t e = 0; e < E; ++e) B[e] = expert_operand(b, b_scale_k, scheme, e);
  for (int64_t e = 0; e <= E; ++e) local[e] = offsets[e] - first;
  grouped_gemm_nt(E, local.data(), A.data(), K, B.data(), C.data(), N_b);

  const bool fp8_out = out.dtype() == DType::fp8_e4m3;
  const size_t out_row_bytes = N_out * dtype_size(out.dtype());
  const int64_t out_groups = fp8_out ? N_out / kBlockSize : 0;
#pragma omp parallel
  {
    std::vector<float> row(N_out);
#pragma omp for schedule(static)
    for (int64_t r = first; r < last; ++r) {
      const float* c = C.data() + (r - first) * N_b;
      for (int64_t j = 0; j < N_out; ++j) {
        row[j] = o.gated ? activation_gated(o.activation, c[gate_column(o.gated_layout, j, N_out)],
                                            c[up_column(o.gated_layout, j, N_out)])
                         : c[j];
      }
      char* dst = static_cast<char*>(out.data()) + r * out_row_bytes;
      if (fp8_out) {
        // The fp8_block activation quantizer's own row routine: same scales, same codes.
        quantize_row(row.data(), N_out, QuantScheme::fp8_block, nullptr,
                     reinterpret_cast<uint8_t*>(dst),
                     o.out_scale.data_ptr<float>() + r * out_groups);
      } else {
        store_row(row.data(), N_out, out.dtype(), dst);
      }
    }
  }
}

}  // namespace modmoe::cpu
