// moe_gemm_groupwise on CUDA: the portable grouped GEMM (src/cuda/grouped_gemm.h), rows owned
// through m_indptr on the device, launched on ctx.stream without reading device data.
#include "cuda/device_guard.h"
#include "cuda/grouped_gemm.h"
#include "cuda/moe_gemm.h"

namespace modmoe::cuda {

void moe_gemm_groupwise(const Context& ctx, const Tensor& a, const Tensor& b,
                        const Tensor& a_scale, const Tensor& b_scale, const Tensor& m_indptr,
                        const Tensor& out, QuantScheme scheme, const MoeGemmOptions& o) {
  DeviceGuard guard(ctx.device.index);
  GroupedGemmArgs g;
  g.A = a.data();
  g.lda = a.size(1);
  g.B = b.data();
  g.ab_dtype = a.dtype();
  g.E = b.size(0);
  g.N_b = b.size(1);
  g.K = b.size(2);
  g.m_indptr = m_indptr.data_ptr<int32_t>();
  g.max_rows = a.size(0);
  g.scheme = scheme;
  g.a_scale = a_scale.defined() ? a_scale.data() : nullptr;
  g.b_scale = b_scale.defined() ? b_scale.data() : nullptr;
  g.gated = o.gated;
  g.activation = o.activation;
  g.gated_layout = o.gated_layout;
  g.D = out.data();
  g.ldd = out.size(1);
  g.d_dtype = out.dtype();
  grouped_gemm(g, static_cast<cudaStream_t>(ctx.stream));
}

}  // namespace modmoe::cuda
