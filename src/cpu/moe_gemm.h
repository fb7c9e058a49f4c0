// CPU implementation of moe_gemm_groupwise (arguments already checked by src/moe_gemm.cpp).
#pragma once

#include "modmoe/moe_gemm.h"
#include "modmoe/quant.h"

namespace modmoe::cpu {

void moe_gemm_groupwise(const Context& ctx, const Tensor& a, const Tensor& b,
                        const Tensor& a_scale, const Tensor& b_scale, const Tensor& m_indptr,
                        const Tensor& out, QuantScheme scheme, const MoeGemmOptions& options);

}  // namespace modmoe::cpu
