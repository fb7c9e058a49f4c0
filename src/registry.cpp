// The catalog: the one file that knows every backend's parts. Capabilities are data; the
// compatibility check reads only them.
#include "modmoe/registry.h"

#include <algorithm>
#include <sstream>

#include "cpu/prepare_finalize.h"
#include "cpu/reference_experts.h"
#include "modmoe/cuda.h"
#include "modmoe/error.h"
#include "modmoe/moe_gemm.h"

#ifdef MODMOE_WITH_CUDA
#include "cuda/cuda_experts.h"
#include "cuda/cuda_prepare_finalize.h"
#include "cuda/sm90/sm90_experts.h"
#endif

namespace modmoe {

namespace {

const std::vector<DType> kFloatDTypes = {DType::bf16, DType::fp16, DType::fp32};
const std::vector<QuantScheme> kAllSchemes = {QuantScheme::none, QuantScheme::fp8_tensor,
                                              QuantScheme::fp8_token, QuantScheme::fp8_block,
                                              QuantScheme::mxfp8};
const std::vector<Activation> kAllActivations = {Activation::silu,
                                                 Activation::gelu,
                                                 Activation::gelu_tanh,
                                                 Activation::swigluoai,
                                                 Activation::silu_no_mul,
                                                 Activation::gelu_no_mul,
                                                 Activation::gelu_tanh_no_mul,
                                                 Activation::swigluoai_no_mul};
const std::vector<GatedLayout> kAllLayouts = {GatedLayout::GateUp, GatedLayout::UpGate,
                                              GatedLayout::Interleaved};

PartCapabilities cpu_part(const char* name, PartKind kind, ActivationFormat format) {
  PartCapabilities p;
  p.name = name;
  p.kind = kind;
  p.backends = {Backend::cpu};
  p.format = format;
  p.in_dtypes = kFloatDTypes;
  p.quant_schemes = kAllSchemes;
  p.static_act_scale = true;
  p.block_quant = true;
  p.expert_map = true;
  p.graph_capturable = false;  // no graphs on the CPU
  p.ranks_needed = 1;
  if (kind == PartKind::experts) {
    p.activations = kAllActivations;
    p.gated_layouts = kAllLayouts;
  }
  return p;
}

// Factories of the parts that exist on several backends: the CUDA class on Backend::cuda (in a
// build without the CUDA backend that is an error), the CPU class otherwise.
std::shared_ptr<PrepareAndFinalize> make_noep_prepare_finalize(const MoEConfig& cfg, Backend b) {
  if (b == Backend::cuda) {
#ifdef MODMOE_WITH_CUDA
    return std::make_shared<cuda::NoEPPrepareAndFinalize>(cfg);
#else
    MODMOE_FAIL() << "NoEPPrepareAndFinalize: this build has no CUDA backend";
#endif
  }
  return std::make_shared<cpu::NoEPPrepareAndFinalize>(cfg);
}

std::shared_ptr<PrepareAndFinalize> make_batched_prepare_finalize(const MoEConfig& cfg, Backend b) {
  if (b == Backend::cuda) {
#ifdef MODMOE_WITH_CUDA
    return std::make_shared<cuda::BatchedPrepareAndFinalize>(cfg);
#else
    MODMOE_FAIL() << "BatchedPrepareAndFinalize: this build has no CUDA backend";
#endif
  }
  return std::make_shared<cpu::BatchedPrepareAndFinalize>(cfg);
}

// Factories of the CUDA-only experts.
std::shared_ptr<Experts> make_cuda_experts(const MoEConfig& cfg, Backend) {
#ifdef MODMOE_WITH_CUDA
  return std::make_shared<cuda::CudaExperts>(cfg);
#else
  MODMOE_FAIL() << "CudaExperts: this build has no CUDA backend";
  return nullptr;
#endif
}

std::shared_ptr<Experts> make_sm90_experts(const MoEConfig& cfg, Backend) {
#ifdef MODMOE_WITH_CUDA
  return std::make_shared<cuda::Sm90Experts>(cfg);
#else
  MODMOE_FAIL() << "Sm90Experts: this build has no CUDA backend";
  return nullptr;
#endif
}

std::shared_ptr<Experts> make_batched_sm90_experts(const MoEConfig& cfg, Backend) {
#ifdef MODMOE_WITH_CUDA
  return std::make_shared<cuda::BatchedSm90Experts>(cfg);
#else
  MODMOE_FAIL() << "BatchedSm90Experts: this build has no CUDA backend";
  return nullptr;
#endif
}

// Whether `device` runs the Hopper kernels (the hopper_only parts).
bool hopper_device(Device device) {
  if (!device.is_cuda()) return false;
  Context ctx;
  ctx.device = device;
  return moe_gemm_sm90_available(ctx);
}

std::shared_ptr<Experts> make_batched_cuda_experts(const MoEConfig& cfg, Backend) {
#ifdef MODMOE_WITH_CUDA
  return std::make_shared<cuda::BatchedCudaExperts>(cfg);
#else
  MODMOE_FAIL() << "BatchedCudaExperts: this build has no CUDA backend";
  return nullptr;
#endif
}

// A CUDA experts part: every scheme, activation and layout; bf16/fp16 inputs (the tensor-core
// GEMM has no fp32 operands); K and N aligned for the GEMM's 16-byte operand copies
// (multiples of 8 elements for bf16/fp16, of 16 for fp8: 16 covers both); up to 1024 local
// experts (the GEMM keeps its schedule in shared memory).
PartCapabilities cuda_experts_part(const char* name, ActivationFormat format) {
  PartCapabilities p;
  p.name = name;
  p.kind = PartKind::experts;
  p.backends = {Backend::cuda};
  p.format = format;
  p.in_dtypes = {DType::bf16, DType::fp16};
  p.quant_schemes = kAllSchemes;
  p.static_act_scale = true;
  p.block_quant = true;
  p.expert_map = true;
  p.graph_capturable = true;
  p.ranks_needed = 1;
  p.k_alignment = 16;
  p.n_alignment = 16;
  p.activations = kAllActivations;
  p.gated_layouts = kAllLayouts;
  return p;
}

std::vector<PrepareFinalizeEntry> build_prepare_finalize() {
  std::vector<PrepareFinalizeEntry> parts;
  {
    PartCapabilities c =
        cpu_part("NoEPPrepareAndFinalize", PartKind::prepare_finalize, ActivationFormat::Standard);
    c.backends = {Backend::cpu, Backend::cuda};
    c.graph_capturable = true;  // on cuda; nothing to capture on the CPU
    c.chunking = true;
    c.summary = "single rank, quantize only; finalize Delegate -> Contiguous";
    parts.push_back({c, make_noep_prepare_finalize});
  }
  {
    PartCapabilities c = cpu_part("BatchedPrepareAndFinalize", PartKind::prepare_finalize,
                                  ActivationFormat::Batched);
    c.backends = {Backend::cpu, Backend::cuda};
    c.graph_capturable = true;  // on cuda
    c.chunking = false;
    c.summary = "scatter to (E, max_tokens, K) + counts; finalize Delegate -> NaiveBatched";
    parts.push_back({c, make_batched_prepare_finalize});
  }
  return parts;
}

std::vector<ExpertsEntry> build_experts() {
  std::vector<ExpertsEntry> parts;
  // Best first: "auto" takes the first compatible one on the requested backend.
  for (ActivationFormat format : {ActivationFormat::Standard, ActivationFormat::Batched}) {
    const bool standard = format == ActivationFormat::Standard;
    PartCapabilities c = cuda_experts_part(standard ? "Sm90Experts" : "BatchedSm90Experts", format);
    c.in_dtypes = {DType::bf16};
    c.quant_schemes = {QuantScheme::none, QuantScheme::fp8_block};
    c.static_act_scale = false;
    c.activations = {Activation::silu, Activation::gelu, Activation::gelu_tanh,
                     Activation::swigluoai};
    c.hopper_only = true;
#ifdef MODMOE_WITH_CUDA
    c.config_check = cuda::sm90_experts_unsupported;
#endif
    c.chunking = standard;
    c.weight_and_reduce = standard ? WeightAndReduceKind::NoOp : WeightAndReduceKind::Delegate;
    c.summary = standard ? "Hopper TMA+wgmma grouped GEMMs (fused gated FC1, fp8 epilogue "
                           "quantization), reduces itself; sm_90 only"
                         : "Hopper TMA+wgmma grouped GEMMs on (E, max_tokens, K) reading the "
                           "counts on the device; finalize reduces; sm_90 only";
    parts.push_back({c, standard ? make_sm90_experts : make_batched_sm90_experts});
  }
  {
    PartCapabilities c = cuda_experts_part("CudaExperts", ActivationFormat::Standard);
    c.chunking = true;
    c.weight_and_reduce = WeightAndReduceKind::NoOp;
    c.summary = "CUB permute, mma.sync grouped GEMMs (fused gated epilogue), reduces itself";
    parts.push_back({c, make_cuda_experts});
  }
  {
    PartCapabilities c = cuda_experts_part("BatchedCudaExperts", ActivationFormat::Batched);
    c.chunking = false;
    c.weight_and_reduce = WeightAndReduceKind::Delegate;
    c.summary =
        "packs rows < expert_num_tokens on the device, mma.sync grouped GEMMs; "
        "finalize reduces";
    parts.push_back({c, make_batched_cuda_experts});
  }
  {
    PartCapabilities c =
        cpu_part("ReferenceExperts", PartKind::experts, ActivationFormat::Standard);
    c.chunking = true;
    c.weight_and_reduce = WeightAndReduceKind::NoOp;
    c.summary = "permute, blocked OpenMP GEMMs (fp32 accumulate), reduces itself";
    parts.push_back({c, [](const MoEConfig& cfg, Backend) {
                       return std::make_shared<cpu::ReferenceExperts>(cfg);
                     }});
  }
  {
    PartCapabilities c =
        cpu_part("BatchedReferenceExperts", PartKind::experts, ActivationFormat::Batched);
    c.chunking = false;
    c.weight_and_reduce = WeightAndReduceKind::Delegate;
    c.summary = "per-expert rows < expert_num_tokens, blocked OpenMP GEMMs; finalize reduces";
    parts.push_back({c, [](const MoEConfig& cfg, Backend) {
                       return std::make_shared<cpu::BatchedReferenceExperts>(cfg);
                     }});
  }
  return parts;
}

template <typename T>
bool contains(const std::vector<T>& v, const T& x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}

Compatibility no(const std::string& reason) { return {false, reason}; }

bool is_block_scheme(QuantScheme s) {
  return s == QuantScheme::fp8_block || s == QuantScheme::mxfp8;
}

}  // namespace

const std::vector<PrepareFinalizeEntry>& prepare_finalize_registry() {
  static const std::vector<PrepareFinalizeEntry> parts = build_prepare_finalize();
  return parts;
}

const std::vector<ExpertsEntry>& experts_registry() {
  static const std::vector<ExpertsEntry> parts = build_experts();
  return parts;
}

const PrepareFinalizeEntry* find_prepare_finalize(const std::string& name) {
  for (const auto& p : prepare_finalize_registry())
    if (p.caps.name == name) return &p;
  return nullptr;
}

const ExpertsEntry* find_experts(const std::string& name) {
  for (const auto& p : experts_registry())
    if (p.caps.name == name) return &p;
  return nullptr;
}

Compatibility check_config(const MoEConfig& c) {
  std::ostringstream s;
  if (c.num_experts <= 0)
    s << "num_experts must be > 0, got " << c.num_experts;
  else if (c.num_local_experts <= 0 || c.num_local_experts > c.num_experts)
    s << "num_local_experts must be in [1, num_experts=" << c.num_experts << "], got "
      << c.num_local_experts;
  else if (c.hidden_size <= 0)
    s << "hidden_size K must be > 0, got " << c.hidden_size;
  else if (c.intermediate_size <= 0)
    s << "intermediate_size N must be > 0, got " << c.intermediate_size;
  else if (c.topk < 1 || c.topk > c.num_experts)
    s << "topk must be in [1, E=" << c.num_experts << "], got " << c.topk;
  else if (!is_float_dtype(c.in_dtype) || c.in_dtype == DType::fp64)
    s << "in_dtype must be bf16, fp16 or fp32, got " << dtype_name(c.in_dtype);
  else if (c.quant.static_act_scale && c.quant.scheme != QuantScheme::fp8_tensor)
    s << "static activation scales exist only for fp8-tensor, got " << c.quant.str();
  else if (c.max_num_tokens < 0)
    s << "max_num_tokens must be >= 0, got " << c.max_num_tokens;
  const std::string reason = s.str();
  return reason.empty() ? Compatibility{} : no(reason);
}

Compatibility check_part(const PartCapabilities& p, const MoEConfig& c) {
  std::ostringstream s;
  if (!contains(p.in_dtypes, c.in_dtype))
    s << p.name << " does not support in_dtype " << dtype_name(c.in_dtype);
  else if (!contains(p.quant_schemes, c.quant.scheme))
    s << p.name << " does not support quant scheme " << quant_scheme_name(c.quant.scheme);
  else if (c.quant.static_act_scale && !p.static_act_scale)
    s << p.name << " does not support static activation scales";
  else if (is_block_scheme(c.quant.scheme) && !p.block_quant)
    s << p.name << " does not support block-scaled quantization (" << c.quant.str() << ")";
  else if (c.num_local_experts < c.num_experts && !p.expert_map)
    s << p.name << " does not support expert_map (E_local = " << c.num_local_experts
      << " < E = " << c.num_experts << ")";
  else if (c.hidden_size % p.k_alignment != 0)
    s << p.name << " needs K % " << p.k_alignment << " == 0, got K = " << c.hidden_size;
  else if (c.intermediate_size % p.n_alignment != 0)
    s << p.name << " needs N % " << p.n_alignment << " == 0, got N = " << c.intermediate_size;
  else if (p.kind == PartKind::experts && !contains(p.activations, c.activation))
    s << p.name << " does not support activation " << activation_name(c.activation);
  else if (p.kind == PartKind::experts && is_gated(c.activation) &&
           !contains(p.gated_layouts, c.gated_layout))
    s << p.name << " does not support gated layout " << gated_layout_name(c.gated_layout);
  else if (p.format == ActivationFormat::Batched && c.max_num_tokens <= 0)
    s << p.name << " is batched and needs config.max_num_tokens > 0, got " << c.max_num_tokens;
  else if (p.config_check)
    if (const std::string why = p.config_check(c); !why.empty()) s << p.name << ": " << why;
  const std::string reason = s.str();
  return reason.empty() ? Compatibility{} : no(reason);
}

Compatibility check_compatibility(const PartCapabilities& pf, const PartCapabilities& ex,
                                  const MoEConfig& c, Backend backend) {
  if (pf.kind != PartKind::prepare_finalize) return no(pf.name + " is not a PrepareAndFinalize");
  if (ex.kind != PartKind::experts) return no(ex.name + " is not an Experts");
  if (pf.format != ex.format) {
    return no(pf.name + " produces " + activation_format_name(pf.format) + " activations but " +
              ex.name + " expects " + activation_format_name(ex.format));
  }
  if (!contains(pf.backends, backend))
    return no(pf.name + " has no " + backend_name(backend) + " implementation");
  if (!contains(ex.backends, backend))
    return no(ex.name + " has no " + backend_name(backend) + " implementation");
  if (Compatibility r = check_config(c); !r) return r;
  if (Compatibility r = check_part(pf, c); !r) return r;
  if (Compatibility r = check_part(ex, c); !r) return r;
  const int ranks = std::max(pf.ranks_needed, ex.ranks_needed);
  if (ranks > 1) {
    return no(pf.name + " + " + ex.name + " need " + std::to_string(ranks) +
              " ranks; this process has 1");
  }
  return {};
}

Compatibility check_compatibility(const PartCapabilities& pf, const PartCapabilities& ex,
                                  const MoEConfig& c, Device device) {
  if (Compatibility r = check_compatibility(pf, ex, c, backend_of(device)); !r) return r;
  for (const PartCapabilities* part : {&pf, &ex}) {
    if (part->hopper_only && !hopper_device(device))
      return no(part->name + " needs an sm_90 device and a build with the sm_90a kernels; " +
                device.str() + " is not one");
  }
  return Compatibility{};
}

ModularKernel make_modular_kernel(const std::string& pf_name, const std::string& experts_name,
                                  const MoEConfig& config, SharedExpertsFn shared_experts) {
  return make_modular_kernel(pf_name, experts_name, config, Device::cpu(),
                             std::move(shared_experts));
}

ModularKernel make_modular_kernel(const std::string& pf_name, const std::string& experts_name,
                                  const MoEConfig& config, Device device,
                                  SharedExpertsFn shared_experts) {
  const Backend backend = backend_of(device);
  if (backend == Backend::cuda) {
#ifdef MODMOE_WITH_CUDA
    MODMOE_CHECK(cuda_available())
        << "make_modular_kernel: device " << device.str()
        << " was requested but no CUDA device is available (cuda_device_count() = "
        << cuda_device_count() << ")";
    MODMOE_CHECK(device.index >= 0 && device.index < cuda_device_count())
        << "make_modular_kernel: device index must be in [0, " << cuda_device_count() << "), got "
        << device.str();
#else
    MODMOE_FAIL() << "make_modular_kernel: device " << device.str()
                  << " was requested but this build has no CUDA backend";
#endif
  }
  const PrepareFinalizeEntry* pf = find_prepare_finalize(pf_name);
  MODMOE_CHECK(pf != nullptr) << "make_modular_kernel: unknown PrepareAndFinalize '" << pf_name
                              << "' (modmoe-check --list shows the registered parts)";
  const ExpertsEntry* ex = nullptr;
  std::string reasons;
  if (experts_name == "auto") {
    for (const auto& candidate : experts_registry()) {  // registered best-first
      Compatibility r = check_compatibility(pf->caps, candidate.caps, config, device);
      if (r) {
        ex = &candidate;
        break;
      }
      reasons += "\n  " + r.reason;
    }
    MODMOE_CHECK(ex != nullptr) << "make_modular_kernel: no registered Experts composes with "
                                << pf_name << " on " << backend_name(backend) << " for ["
                                << config.str() << "]:" << reasons;
  } else {
    ex = find_experts(experts_name);
    MODMOE_CHECK(ex != nullptr) << "make_modular_kernel: unknown Experts '" << experts_name
                                << "' (modmoe-check --list shows the registered parts)";
    Compatibility r = check_compatibility(pf->caps, ex->caps, config, device);
    MODMOE_CHECK(r.ok) << "make_modular_kernel: " << pf_name << " + " << experts_name
                       << " do not compose: " << r.reason;
  }
  return ModularKernel(pf->make(config, backend), ex->make(config, backend),
                       std::move(shared_experts));
}

std::string describe(const PartCapabilities& p) {
  auto join = [](const auto& items, auto name_of) {
    std::string s;
    for (const auto& i : items) s += (s.empty() ? "" : ",") + std::string(name_of(i));
    return s;
  };
  std::ostringstream s;
  s << p.name << "\n"
    << "    kind=" << (p.kind == PartKind::experts ? "experts" : "prepare_finalize")
    << " backends=" << join(p.backends, backend_name)
    << " format=" << activation_format_name(p.format)
    << "\n    dtypes=" << join(p.in_dtypes, dtype_name)
    << " quant=" << join(p.quant_schemes, quant_scheme_name)
    << " static_scale=" << (p.static_act_scale ? "yes" : "no")
    << " block_quant=" << (p.block_quant ? "yes" : "no")
    << "\n    expert_map=" << (p.expert_map ? "yes" : "no")
    << " chunking=" << (p.chunking ? "yes" : "no")
    << " graph_capturable=" << (p.graph_capturable ? "yes" : "no")
    << " ranks_needed=" << p.ranks_needed << " align(K,N)=(" << p.k_alignment << ","
    << p.n_alignment << ")";
  if (p.kind == PartKind::experts) {
    s << "\n    activations=" << join(p.activations, activation_name)
      << " layouts=" << join(p.gated_layouts, gated_layout_name)
      << " weight_and_reduce=" << weight_and_reduce_name(p.weight_and_reduce);
  }
  if (!p.summary.empty()) s << "\n    " << p.summary;
  return s.str();
}

}  // namespace modmoe
