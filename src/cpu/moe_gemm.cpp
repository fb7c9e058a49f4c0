// moe_gemm_groupwise on the CPU: dequantize A rows to fp32, the blocked grouped GEMM
// (cpu::grouped_gemm_nt dequantizes B per panel), then the (gated) epilogue.
#include "cpu/moe_gemm.h"

#include <vector>

#include "cpu/expert_mlp.h"
#include "cpu/gemm.h"
#include "cpu/rows.h"
#include "modmoe/error.h"

namespace modmoe::cpu {

void moe_gemm_groupwise(const Context&, const Tensor& a, const Tensor& b, const Tensor& a_scale,
                        const Tensor& b_scale, const Tensor& m_indptr, const Tensor& out,
                        QuantScheme scheme, const MoeGemmOptions& o) {
  static constexpr const char* kFn = "moe_gemm_groupwise";
  const int64_t E = b.size(0), N_b = b.size(1), K = b.size(2), rows = a.size(0);
  const int64_t N_out = out.size(1);

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

  // A rows in fp32 (only the rows some expert owns).
  std::vector<float> A((last - first) * K), C((last - first) * N_b);
  const size_t a_row_bytes = K * dtype_size(a.dtype());
  const int64_t groups = scheme == QuantScheme::none ? 0 : a_scale.size(1);
#pragma omp parallel for schedule(static)
  for (int64_t r = first; r < last; ++r) {
    const void* row = static_cast<const char*>(a.data()) + r * a_row_bytes;
    const void* rs = scheme == QuantScheme::none ? nullptr : a_scale.data_ptr<float>() + r * groups;
    dequantize_input_row(row, a.dtype(), K, scheme, rs, A.data() + (r - first) * K);
  }
  std::vector<WeightOperand> B(E);
  std::vector<int64_t> local(E + 1);
  for (int64_t e = 0; e < E; ++e) B[e] = expert_operand(b, b_scale, scheme, e);
  for (int64_t e = 0; e <= E; ++e) local[e] = offsets[e] - first;
  grouped_gemm_nt(E, local.data(), A.data(), K, B.data(), C.data(), N_b);

  const size_t out_row_bytes = N_out * dtype_size(out.dtype());
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
      store_row(row.data(), N_out, out.dtype(), static_cast<char*>(out.data()) + r * out_row_bytes);
    }
  }
}

}  // namespace modmoe::cpu
