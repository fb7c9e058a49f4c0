// moe_gemm_groupwise on CUDA (arguments already checked by src/moe_gemm.cpp): the Hopper kernel
// (src/cuda/sm90/) when the device, the build and the arguments allow it and the caller did not
// ask for the portable one; the portable mma.sync grouped GEMM (src/cuda/grouped_gemm.h)
// otherwise. Rows are owned through m_indptr on the device; nothing reads it on the host.
#include "cuda/device_guard.h"
#include "cuda/grouped_gemm.h"
#include "cuda/moe_gemm.h"
#include "cuda/sm90/sm90_gemm.h"
#include "modmoe/allocator.h"
#include "modmoe/error.h"

namespace modmoe::cuda {

namespace {

constexpr const char* kFn = "moe_gemm_groupwise";

sm90::GemmArgs sm90_args(const Context& ctx, const Tensor& a, const Tensor& b,
                         const Tensor& a_scale, const Tensor& b_scale, const Tensor& m_indptr,
                         const Tensor& out, QuantScheme scheme, const MoeGemmOptions& o) {
  sm90::GemmArgs g;
  g.a = a.data();
  g.total_rows = a.size(0);
  g.b = b.data();
  g.E = b.size(0);
  g.N_b = b.size(1);
  g.K = b.size(2);
  g.ab_dtype = a.dtype();
  g.m_indptr = m_indptr.data_ptr<int32_t>();
  // Block scales are fp32, MX scales e8m0 bytes: each kind goes to its own fields only, so the
  // kernel never reads one as the other.
  g.mx = scheme == QuantScheme::mxfp8;
  if (g.mx) {
    g.a_scale_mx = static_cast<const uint8_t*>(a_scale.data());
    g.b_scale_mx = static_cast<const uint8_t*>(b_scale.data());
  } else {
    g.a_scale = a_scale.defined() ? a_scale.data_ptr<float>() : nullptr;
    g.b_scale = b_scale.defined() ? b_scale.data_ptr<float>() : nullptr;
  }
  g.scales_mn_major = o.scale_major_mode == "MN";
  g.gated = o.gated;
  g.gated_layout = o.gated_layout;
  g.activation = o.activation;
  g.d = out.data();
  g.d_dtype = out.dtype();
  g.d_scale = o.out_scale.defined() ? o.out_scale.data_ptr<float>() : nullptr;
  g.scheduler = o.scheduler;
  g.tile = o.tile;
  g.sm_count = ctx.sm_count;
  return g;
}

}  // namespace

void moe_gemm_groupwise(const Context& ctx, const Tensor& a, const Tensor& b, const Tensor& a_scale,
                        const Tensor& b_scale, const Tensor& m_indptr, const Tensor& out,
                        QuantScheme scheme, const MoeGemmOptions& o) {
  DeviceGuard guard(ctx.device.index);
  const cudaStream_t stream = static_cast<cudaStream_t>(ctx.stream);
  const bool hopper = sm90::available(ctx.device.index);
  // What only the Hopper kernel runs. MX-FP8 is not among it (the portable kernel takes it):
  // with automatic, a Hopper kernel that refuses MX (sm90::can_implement) hands the call on to
  // the portable kernel below, and one that accepts it runs it.
  const bool needs_hopper = o.scale_major_mode == "MN" || out.dtype() == DType::fp8_e4m3 ||
                            o.kernel == MoeGemmKernel::sm90;
  if (o.kernel != MoeGemmKernel::portable && (hopper || needs_hopper)) {
    const sm90::GemmArgs g = sm90_args(ctx, a, b, a_scale, b_scale, m_indptr, out, scheme, o);
    const std::string reason = hopper ? sm90::can_implement(g)
                                      : "the device is not sm_90 or the build has no sm_90a "
                                        "kernels";
    if (reason.empty()) {
      if (o.scheduler == MoeGemmScheduler::precomputed) {
        const int64_t bytes = sm90::tile_list_capacity(g) * int64_t(sizeof(sm90::WorkTile));
        OwnedTensor list(ctx.alloc(), DType::uint8, {bytes}, ctx.stream);
        sm90::launch(g, stream, list.tensor().data());
      } else {
        sm90::launch(g, stream);
      }
      return;
    }
    MODMOE_CHECK(!needs_hopper) << kFn << ": "
                                << (o.kernel == MoeGemmKernel::sm90 ? std::string("kernel sm90")
                                    : o.scale_major_mode == "MN"
                                        ? std::string("scale_major_mode \"MN\"")
                                        : std::string("an fp8_e4m3 out"))
                                << " needs the Hopper kernel, which cannot run this call: "
                                << reason;
  }
  MODMOE_CHECK(o.tile.empty()) << kFn << ": tile \"" << o.tile
                               << "\" is a Hopper-kernel option, but the portable kernel "
                               << "runs this call";

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
  g.scheme = scheme;  // fp8_block: fp32 scales; mxfp8: e8m0 bytes, (rows, K/32), (E, N_b, K/32)
  g.a_scale = a_scale.defined() ? a_scale.data() : nullptr;
  g.b_scale = b_scale.defined() ? b_scale.data() : nullptr;
  g.gated = o.gated;
  g.activation = o.activation;
  g.gated_layout = o.gated_layout;
  g.D = out.data();
  g.ldd = out.size(1);
  g.d_dtype = out.dtype();
  grouped_gemm(g, stream);
}

std::vector<std::string> moe_gemm_sm90_tiles() { return sm90::tile_names(); }

bool moe_gemm_sm90_available(int device) { return sm90::available(device); }

std::string moe_gemm_sm90_tile_for(int64_t total_rows, int64_t N_out, int64_t K, int64_t E,
                                   bool gated, DType dtype, int sm_count) {
  if (sm90::tile_names().empty()) return "";
  return sm90::choose_tile(total_rows, N_out, K, E, gated, dtype, false, sm_count);
}

}  // namespace modmoe::cuda
