// CUDA implementation of moe_gemm_groupwise (arguments already checked by src/moe_gemm.cpp).
#pragma once

#include "modmoe/moe_gemm.h"
#include "modmoe/quant.h"

#include <string>
#include <vector>

namespace modmoe::cuda {

void moe_gemm_groupwise(const Context& ctx, const Tensor& a, const Tensor& b,
                        const Tensor& a_scale, const Tensor& b_scale, const Tensor& m_indptr,
                        const Tensor& out, QuantScheme scheme, const MoeGemmOptions& options);

// The public Hopper-kernel queries of modmoe/moe_gemm.h, on the CUDA side.
std::vector<std::string> moe_gemm_sm90_tiles();
bool moe_gemm_sm90_available(int device);
std::string moe_gemm_sm90_tile_for(int64_t total_rows, int64_t N_out, int64_t K, int64_t E,
                                   bool gated, DType dtype, int sm_count);

}  // namespace modmoe::cuda
