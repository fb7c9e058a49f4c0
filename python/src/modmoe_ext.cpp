// modmoe._core: the nanobind extension under the Python package `modmoe`.
//
// Deliberately thin: tensors arrive as any object nanobind can import through DLPack or the
// buffer protocol (numpy arrays, torch and cupy tensors), become modmoe::Tensor views, and go
// straight to the C++ API. The friendly layer (argument normalization, output allocation with
// the caller's framework, the kernel cache, docstrings) is Python, in modmoe/__init__.py.
//
// A tensor argument is either an array or a pair (array, dtype name): the pair reinterprets the
// array's bytes as that modmoe dtype, which is how fp8 (e4m3 / e8m0) data travels — DLPack 0.6
// has no fp8 codes, so callers hand over uint8 views — and how numpy arrays of ml_dtypes'
// bfloat16 travel (as uint16 views). Missing optional tensors are None.
//
// Errors: modmoe::Error -> ValueError (the C++ message as is); an argument that is not an array
// at all -> TypeError naming the function and the argument.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "modmoe/cuda.h"
#include "modmoe/dlpack.h"
#include "modmoe/modmoe.h"
#include "modmoe/moe_gemm.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace {

using modmoe::DType;
using modmoe::Tensor;

// Read-only imports also accept read-only numpy arrays; outputs are written through the same
// pointer (the library never writes inputs), so one import kind serves both.
using Array = nb::ndarray<nb::ro>;

// Keeps the imported arrays of one call alive while the Tensor views are in use.
class ArgTensors {
 public:
  explicit ArgTensors(const char* fn) : fn_(fn) {}

  // `obj`: None (-> undefined Tensor), an array, or (array, "dtype name").
  Tensor get(const char* arg, nb::handle obj) {
    if (obj.is_none()) return Tensor();
    std::optional<DType> reinterpret_as;
    nb::handle array_obj = obj;
    if (nb::isinstance<nb::tuple>(obj)) {
      nb::tuple pair = nb::borrow<nb::tuple>(obj);
      if (pair.size() != 2 || !nb::isinstance<nb::str>(pair[1])) {
        throw nb::type_error((std::string(fn_) + ": " + arg +
                              " must be an array or a pair (array, dtype name), got a tuple of " +
                              std::to_string(pair.size()))
                                 .c_str());
      }
      array_obj = pair[0];
      reinterpret_as = modmoe::parse_dtype(nb::cast<std::string>(pair[1]));
    }
    Array array;
    if (!nb::try_cast(array_obj, array, /*convert=*/false)) {
      throw nb::type_error((std::string(fn_) + ": " + arg +
                            " must be an array (numpy, or an object with __dlpack__ such as a "
                            "torch or cupy tensor), got " +
                            nb::type_name(array_obj.type()).c_str())
                               .c_str());
    }
    arrays_.push_back(array);
    return to_tensor(arg, array, reinterpret_as);
  }

 private:
  Tensor to_tensor(const char* arg, const Array& a, std::optional<DType> reinterpret_as) {
    DLTensor dl{};
    dl.data = const_cast<void*>(a.data());
    dl.device = {static_cast<DLDeviceType>(a.device_type()), a.device_id()};
    dl.ndim = static_cast<int32_t>(a.ndim());
    const nb::dlpack::dtype t = a.dtype();
    dl.dtype = {t.code, t.bits, t.lanes};
    dl.shape = const_cast<int64_t*>(a.shape_ptr());
    dl.strides = const_cast<int64_t*>(a.stride_ptr());
    dl.byte_offset = 0;
    if (reinterpret_as) {
      const size_t bits = modmoe::dtype_size(*reinterpret_as) * 8;
      MODMOE_CHECK(t.lanes == 1 && t.bits == bits)
          << fn_ << ": " << arg << " is to be read as " << modmoe::dtype_name(*reinterpret_as)
          << ", which needs an array of " << bits / 8 << "-byte elements, got " << int(t.bits)
          << "-bit elements";
      // from_dlpack only needs a dtype of the right width; the real one is set below.
      dl.dtype = bits == 8    ? DLDataType{kDLUInt, 8, 1}
                 : bits == 16 ? DLDataType{kDLFloat, 16, 1}
                 : bits == 32 ? DLDataType{kDLFloat, 32, 1}
                              : DLDataType{kDLFloat, 64, 1};
    }
    Tensor view;
    try {
      view = modmoe::from_dlpack(dl);
    } catch (const modmoe::Error& e) {
      throw modmoe::Error(std::string(fn_) + ": " + arg + ": " + e.what());
    }
    if (!reinterpret_as) return view;
    return Tensor(view.data(), *reinterpret_as, view.shape(), view.strides(), view.device());
  }

  const char* fn_;
  std::vector<Array> arrays_;
};

// An Allocator that calls back into Python: alloc(nbytes, stream) -> int address and
// free(address, nbytes, stream). The Python layer passes torch's caching allocator here for
// torch callers on CUDA, so modmoe's workspaces come from the caller's memory pool.
class PyCallbackAllocator : public modmoe::Allocator {
 public:
  PyCallbackAllocator(nb::object alloc, nb::object free, modmoe::Device device)
      : alloc_(std::move(alloc)), free_(std::move(free)), device_(device) {}

  void* allocate(size_t bytes, void* stream) override {
    nb::gil_scoped_acquire gil;
    const uintptr_t address =
        nb::cast<uintptr_t>(alloc_(bytes, reinterpret_cast<uintptr_t>(stream)));
    MODMOE_CHECK(address != 0 || bytes == 0)
        << "allocator: the Python allocator returned 0 for " << bytes << " bytes";
    return reinterpret_cast<void*>(address);
  }
  void deallocate(void* ptr, size_t bytes, void* stream) override {
    nb::gil_scoped_acquire gil;
    try {
      free_(reinterpret_cast<uintptr_t>(ptr), bytes, reinterpret_cast<uintptr_t>(stream));
    } catch (nb::python_error& e) {
      e.discard_as_unraisable("modmoe allocator free");  // called from destructors: never throw
    }
  }
  modmoe::Device device() const override { return device_; }

 private:
  nb::object alloc_, free_;
  modmoe::Device device_;
};

modmoe::Device parse_device(const std::string& type, int index) {
  if (type == "cpu") return modmoe::Device::cpu();
  if (type == "cuda") return modmoe::Device::cuda(index);
  MODMOE_FAIL() << "device must be 'cpu' or 'cuda[:N]', got '" << type << "'";
  return modmoe::Device::cpu();
}

// The Context of one call: the CPU, or a CUDA device with the caller's stream (an address) and
// optional Python allocator.
struct CallContext {
  modmoe::Context ctx;
  std::unique_ptr<PyCallbackAllocator> allocator;

  CallContext(modmoe::Device device, uintptr_t stream, nb::object alloc, nb::object free,
              std::optional<int64_t> chunk_size) {
    if (device.is_cuda()) {
      if (!alloc.is_none()) allocator = std::make_unique<PyCallbackAllocator>(alloc, free, device);
      ctx = modmoe::cuda_context(device.index, reinterpret_cast<void*>(stream), allocator.get());
    } else {
      ctx = modmoe::Context::cpu();
    }
    if (chunk_size) ctx.chunk_size = *chunk_size;
  }
};

nb::dict capabilities_dict(const modmoe::PartCapabilities& c) {
  nb::dict d;
  d["name"] = c.name;
  d["kind"] = c.kind == modmoe::PartKind::prepare_finalize ? "prepare_finalize" : "experts";
  nb::list backends;
  for (modmoe::Backend b : c.backends) backends.append(modmoe::backend_name(b));
  d["backends"] = backends;
  d["format"] = modmoe::activation_format_name(c.format);
  nb::list dtypes;
  for (DType t : c.in_dtypes) dtypes.append(modmoe::dtype_name(t));
  d["in_dtypes"] = dtypes;
  nb::list schemes;
  for (modmoe::QuantScheme s : c.quant_schemes) schemes.append(modmoe::quant_scheme_name(s));
  d["quant_schemes"] = schemes;
  d["static_act_scale"] = c.static_act_scale;
  d["block_quant"] = c.block_quant;
  d["expert_map"] = c.expert_map;
  d["chunking"] = c.chunking;
  d["graph_capturable"] = c.graph_capturable;
  d["ranks_needed"] = c.ranks_needed;
  d["k_alignment"] = c.k_alignment;
  d["n_alignment"] = c.n_alignment;
  if (c.kind == modmoe::PartKind::experts) {
    nb::list acts;
    for (modmoe::Activation a : c.activations) acts.append(modmoe::activation_name(a));
    d["activations"] = acts;
    nb::list layouts;
    for (modmoe::GatedLayout l : c.gated_layouts) layouts.append(modmoe::gated_layout_name(l));
    d["gated_layouts"] = layouts;
    d["weight_and_reduce"] = modmoe::weight_and_reduce_name(c.weight_and_reduce);
  }
  d["summary"] = c.summary;
  d["description"] = modmoe::describe(c);
  return d;
}

modmoe::MoEConfig make_config(int64_t num_experts, int64_t num_local_experts, int64_t hidden_size,
                              int64_t intermediate_size, int64_t topk, const std::string& dtype,
                              const std::string& quant, bool static_act_scale,
                              const std::string& activation, const std::string& gated_layout,
                              int64_t max_num_tokens) {
  modmoe::MoEConfig c;
  c.num_experts = num_experts;
  c.num_local_experts = num_local_experts;
  c.hidden_size = hidden_size;
  c.intermediate_size = intermediate_size;
  c.topk = topk;
  c.in_dtype = modmoe::parse_dtype(dtype);
  c.quant.scheme = modmoe::parse_quant_scheme(quant);
  c.quant.static_act_scale = static_act_scale;
  c.activation = modmoe::parse_activation(activation);
  c.gated_layout = modmoe::parse_gated_layout(gated_layout);
  c.max_num_tokens = max_num_tokens;
  return c;
}

// The config keywords shared by Kernel() and check_compatibility().
#define MODMOE_CONFIG_ARGS                                                                  \
  "num_experts"_a, "num_local_experts"_a, "hidden_size"_a, "intermediate_size"_a, "topk"_a, \
      "dtype"_a, "quant"_a, "static_act_scale"_a, "activation"_a, "gated_layout"_a,         \
      "max_num_tokens"_a

// A built ModularKernel and the device it runs on.
class Kernel {
 public:
  Kernel(const std::string& prepare_finalize, const std::string& experts, int64_t num_experts,
         int64_t num_local_experts, int64_t hidden_size, int64_t intermediate_size, int64_t topk,
         const std::string& dtype, const std::string& quant, bool static_act_scale,
         const std::string& activation, const std::string& gated_layout, int64_t max_num_tokens,
         const std::string& device_type, int device_index)
      : device_(parse_device(device_type, device_index)),
        kernel_(modmoe::make_modular_kernel(
            prepare_finalize, experts,
            make_config(num_experts, num_local_experts, hidden_size, intermediate_size, topk, dtype,
                        quant, static_act_scale, activation, gated_layout, max_num_tokens),
            device_)) {}

  void forward(nb::handle x, nb::handle w13, nb::handle w2, nb::handle topk_weights,
               nb::handle topk_ids, nb::handle out, nb::handle w13_scale, nb::handle w2_scale,
               nb::handle a13_scale, nb::handle a2_scale, nb::handle expert_map,
               bool apply_router_weight_on_input, std::optional<int64_t> chunk_size,
               uintptr_t stream, nb::object alloc, nb::object free) const {
    ArgTensors t("ModularKernel.forward");
    modmoe::ForwardArgs args;
    args.hidden_states = t.get("x", x);
    args.weights.w13 = t.get("w13", w13);
    args.weights.w2 = t.get("w2", w2);
    args.topk_weights = t.get("topk_weights", topk_weights);
    args.topk_ids = t.get("topk_ids", topk_ids);
    args.output = t.get("out", out);
    args.weights.w13_scale = t.get("w13_scale", w13_scale);
    args.weights.w2_scale = t.get("w2_scale", w2_scale);
    args.weights.a13_scale = t.get("a13_scale", a13_scale);
    args.weights.a2_scale = t.get("a2_scale", a2_scale);
    args.expert_map = t.get("expert_map", expert_map);
    args.apply_router_weight_on_input = apply_router_weight_on_input;
    CallContext call(device_, stream, std::move(alloc), std::move(free), chunk_size);
    // The CPU forward runs for a while: let other Python threads go (a Python allocator
    // takes the GIL back for its calls).
    nb::gil_scoped_release release;
    kernel_.forward(call.ctx, args);
  }

  std::string prepare_finalize_name() const { return kernel_.prepare_finalize().name(); }
  std::string experts_name() const { return kernel_.experts().name(); }
  std::string config_str() const { return kernel_.config().str(); }
  std::string device_str() const { return device_.str(); }

 private:
  modmoe::Device device_;
  modmoe::ModularKernel kernel_;
};

// MoeGemmOptions' enums from their Python names. The Python layer checks the names first (with
// the list of allowed values); these checks keep direct callers of _core honest too.
modmoe::MoeGemmKernel parse_moe_gemm_kernel(const std::string& name) {
  if (name == "automatic") return modmoe::MoeGemmKernel::automatic;
  if (name == "portable") return modmoe::MoeGemmKernel::portable;
  if (name == "sm90") return modmoe::MoeGemmKernel::sm90;
  MODMOE_FAIL() << "moe_gemm_groupwise: kernel must be one of 'automatic', 'portable', 'sm90', "
                << "got '" << name << "'";
  return modmoe::MoeGemmKernel::automatic;
}

modmoe::MoeGemmScheduler parse_moe_gemm_scheduler(const std::string& name) {
  if (name == "cooperative") return modmoe::MoeGemmScheduler::cooperative;
  if (name == "linear_scan") return modmoe::MoeGemmScheduler::linear_scan;
  if (name == "precomputed") return modmoe::MoeGemmScheduler::precomputed;
  MODMOE_FAIL() << "moe_gemm_groupwise: scheduler must be one of 'cooperative', 'linear_scan', "
                << "'precomputed', got '" << name << "'";
  return modmoe::MoeGemmScheduler::cooperative;
}

modmoe::Device device_of(const Tensor& t) { return t.defined() ? t.device() : modmoe::Device(); }

}  // namespace

NB_MODULE(_core, m) {
  m.doc() = "modmoe C++ core (see the modmoe package for the documented API)";

  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const modmoe::Error& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    }
  });

  m.def("cuda_available", &modmoe::cuda_available);
  m.def("cuda_device_count", &modmoe::cuda_device_count);
  m.attr("has_cuda_backend") =
#ifdef MODMOE_WITH_CUDA
      true;
#else
      false;
#endif

  m.def("list_parts", [] {
    nb::list parts;
    for (const auto& p : modmoe::prepare_finalize_registry())
      parts.append(capabilities_dict(p.caps));
    for (const auto& e : modmoe::experts_registry()) parts.append(capabilities_dict(e.caps));
    return parts;
  });

  m.def(
      "check_compatibility",
      [](const std::string& pf, const std::string& experts, int64_t num_experts,
         int64_t num_local_experts, int64_t hidden_size, int64_t intermediate_size, int64_t topk,
         const std::string& dtype, const std::string& quant, bool static_act_scale,
         const std::string& activation, const std::string& gated_layout, int64_t max_num_tokens,
         const std::string& backend) {
        const modmoe::PrepareFinalizeEntry* p = modmoe::find_prepare_finalize(pf);
        MODMOE_CHECK(p != nullptr) << "check_compatibility: unknown PrepareAndFinalize '" << pf
                                   << "' (modmoe.list_parts() shows the registered parts)";
        const modmoe::ExpertsEntry* e = modmoe::find_experts(experts);
        MODMOE_CHECK(e != nullptr) << "check_compatibility: unknown Experts '" << experts
                                   << "' (modmoe.list_parts() shows the registered parts)";
        MODMOE_CHECK(backend == "cpu" || backend == "cuda")
            << "check_compatibility: backend must be 'cpu' or 'cuda', got '" << backend << "'";
        const modmoe::Compatibility c = modmoe::check_compatibility(
            p->caps, e->caps,
            make_config(num_experts, num_local_experts, hidden_size, intermediate_size, topk, dtype,
                        quant, static_act_scale, activation, gated_layout, max_num_tokens),
            backend == "cuda" ? modmoe::Backend::cuda : modmoe::Backend::cpu);
        return std::make_pair(c.ok, c.reason);
      },
      "prepare_finalize"_a, "experts"_a, MODMOE_CONFIG_ARGS, "backend"_a);

  nb::class_<Kernel>(m, "Kernel")
      .def(nb::init<const std::string&, const std::string&, int64_t, int64_t, int64_t, int64_t,
                    int64_t, const std::string&, const std::string&, bool, const std::string&,
                    const std::string&, int64_t, const std::string&, int>(),
           "prepare_finalize"_a, "experts"_a, MODMOE_CONFIG_ARGS, "device_type"_a, "device_index"_a)
      .def("forward", &Kernel::forward, "x"_a.none(), "w13"_a.none(), "w2"_a.none(),
           "topk_weights"_a.none(), "topk_ids"_a.none(), "out"_a.none(), "w13_scale"_a.none(),
           "w2_scale"_a.none(), "a13_scale"_a.none(), "a2_scale"_a.none(), "expert_map"_a.none(),
           "apply_router_weight_on_input"_a, "chunk_size"_a.none(), "stream"_a, "alloc"_a.none(),
           "free"_a.none())
      .def_prop_ro("prepare_finalize", &Kernel::prepare_finalize_name)
      .def_prop_ro("experts", &Kernel::experts_name)
      .def_prop_ro("config", &Kernel::config_str)
      .def_prop_ro("device", &Kernel::device_str);

  // ---- routing ----
  m.def(
      "softmax_topk",
      [](nb::handle logits, int64_t topk, bool renormalize, nb::handle weights, nb::handle ids,
         uintptr_t stream) {
        ArgTensors t("select_experts");
        const Tensor l = t.get("router_logits", logits);
        const Tensor w = t.get("topk_weights", weights), i = t.get("topk_ids", ids);
        CallContext call(device_of(l), stream, nb::none(), nb::none(), std::nullopt);
        nb::gil_scoped_release release;
        modmoe::softmax_topk(call.ctx, l, topk, renormalize, w, i);
      },
      "router_logits"_a.none(), "topk"_a, "renormalize"_a, "topk_weights"_a.none(),
      "topk_ids"_a.none(), "stream"_a);

  m.def(
      "grouped_topk",
      [](nb::handle logits, nb::handle bias, int64_t topk, int64_t num_groups, int64_t topk_groups,
         const std::string& scoring, bool renormalize, float routed_scaling_factor,
         nb::handle weights, nb::handle ids, uintptr_t stream) {
        ArgTensors t("select_experts");
        const Tensor l = t.get("router_logits", logits);
        const Tensor b = t.get("e_score_correction_bias", bias);
        const Tensor w = t.get("topk_weights", weights), i = t.get("topk_ids", ids);
        modmoe::GroupedTopKParams params;
        params.num_groups = num_groups;
        params.topk_groups = topk_groups;
        MODMOE_CHECK(scoring == "softmax" || scoring == "sigmoid")
            << "select_experts: scoring_func must be 'softmax' or 'sigmoid', got '" << scoring
            << "'";
        params.scoring =
            scoring == "softmax" ? modmoe::ScoringFunc::softmax : modmoe::ScoringFunc::sigmoid;
        params.renormalize = renormalize;
        params.routed_scaling_factor = routed_scaling_factor;
        CallContext call(device_of(l), stream, nb::none(), nb::none(), std::nullopt);
        nb::gil_scoped_release release;
        modmoe::grouped_topk(call.ctx, l, b, topk, params, w, i);
      },
      "router_logits"_a.none(), "bias"_a.none(), "topk"_a, "num_groups"_a, "topk_groups"_a,
      "scoring"_a, "renormalize"_a, "routed_scaling_factor"_a, "topk_weights"_a.none(),
      "topk_ids"_a.none(), "stream"_a);

  // ---- quantization ----
  m.def("parse_quant_scheme", [](const std::string& name) {
    return std::string(modmoe::quant_scheme_name(modmoe::parse_quant_scheme(name)));
  });
  m.def("scale_dtype", [](const std::string& scheme) {
    return std::string(modmoe::dtype_name(modmoe::scale_dtype(modmoe::parse_quant_scheme(scheme))));
  });
  m.def("act_scale_shape", [](const std::string& scheme, int64_t M, int64_t K) {
    return modmoe::act_scale_shape(modmoe::parse_quant_scheme(scheme), M, K);
  });
  m.def("weight_scale_shape", [](const std::string& scheme, int64_t E, int64_t N, int64_t K) {
    return modmoe::weight_scale_shape(modmoe::parse_quant_scheme(scheme), E, N, K);
  });

  m.def(
      "quantize_activations",
      [](nb::handle x, const std::string& scheme, bool static_scale, nb::handle q, nb::handle scale,
         uintptr_t stream) {
        ArgTensors t("quantize_fp8");
        const Tensor xt = t.get("x", x), qt = t.get("q", q), st = t.get("scale", scale);
        const modmoe::QuantScheme s = modmoe::parse_quant_scheme(scheme);
        CallContext call(device_of(xt), stream, nb::none(), nb::none(), std::nullopt);
        nb::gil_scoped_release release;
        modmoe::quantize_activations(call.ctx, xt, s, static_scale, qt, st);
      },
      "x"_a.none(), "scheme"_a, "static_scale"_a, "q"_a.none(), "scale"_a.none(), "stream"_a);

  m.def(
      "dequantize_activations",
      [](nb::handle q, nb::handle scale, const std::string& scheme, nb::handle out,
         uintptr_t stream) {
        ArgTensors t("dequantize_fp8");
        const Tensor qt = t.get("q", q), st = t.get("scale", scale), ot = t.get("out", out);
        const modmoe::QuantScheme s = modmoe::parse_quant_scheme(scheme);
        CallContext call(device_of(qt), stream, nb::none(), nb::none(), std::nullopt);
        nb::gil_scoped_release release;
        modmoe::dequantize_activations(call.ctx, qt, st, s, ot);
      },
      "q"_a.none(), "scale"_a.none(), "scheme"_a, "out"_a.none(), "stream"_a);

  m.def(
      "quantize_weights",
      [](nb::handle w, const std::string& scheme, nb::handle q, nb::handle scale) {
        ArgTensors t("quantize_weights");
        const Tensor wt = t.get("w", w), qt = t.get("q", q), st = t.get("scale", scale);
        const modmoe::QuantScheme s = modmoe::parse_quant_scheme(scheme);
        CallContext call(device_of(wt), 0, nb::none(), nb::none(), std::nullopt);
        nb::gil_scoped_release release;
        modmoe::quantize_weights(call.ctx, wt, s, qt, st);
      },
      "w"_a.none(), "scheme"_a, "q"_a.none(), "scale"_a.none());

  m.def(
      "dequantize_weights",
      [](nb::handle q, nb::handle scale, const std::string& scheme, nb::handle out) {
        ArgTensors t("dequantize_fp8");
        const Tensor qt = t.get("q", q), st = t.get("scale", scale), ot = t.get("out", out);
        const modmoe::QuantScheme s = modmoe::parse_quant_scheme(scheme);
        CallContext call(device_of(qt), 0, nb::none(), nb::none(), std::nullopt);
        nb::gil_scoped_release release;
        modmoe::dequantize_weights(call.ctx, qt, st, s, ot);
      },
      "q"_a.none(), "scale"_a.none(), "scheme"_a, "out"_a.none());

  m.def(
      "moe_gemm_groupwise",
      [](nb::handle a, nb::handle b, nb::handle a_scale, nb::handle b_scale, nb::handle m_indptr,
         nb::handle out, nb::handle out_scale, bool gated, const std::string& gated_layout,
         const std::string& activation, const std::string& scale_major_mode,
         const std::string& kernel, const std::string& scheduler, const std::string& tile,
         uintptr_t stream) {
        ArgTensors t("moe_gemm_groupwise");
        const Tensor at = t.get("a", a), bt = t.get("b", b), ast = t.get("a_scale", a_scale),
                     bst = t.get("b_scale", b_scale), mt = t.get("m_indptr", m_indptr),
                     ot = t.get("out", out);
        modmoe::MoeGemmOptions o;
        o.gated = gated;
        o.gated_layout = modmoe::parse_gated_layout(gated_layout);
        o.activation = modmoe::parse_activation(activation);
        o.scale_major_mode = scale_major_mode;
        o.out_scale = t.get("out_scale", out_scale);
        o.kernel = parse_moe_gemm_kernel(kernel);
        o.scheduler = parse_moe_gemm_scheduler(scheduler);
        o.tile = tile;
        CallContext call(device_of(at), stream, nb::none(), nb::none(), std::nullopt);
        nb::gil_scoped_release release;
        modmoe::moe_gemm_groupwise(call.ctx, at, bt, ast, bst, mt, ot, o);
      },
      "a"_a.none(), "b"_a.none(), "a_scale"_a.none(), "b_scale"_a.none(), "m_indptr"_a.none(),
      "out"_a.none(), "out_scale"_a.none(), "gated"_a, "gated_layout"_a, "activation"_a,
      "scale_major_mode"_a, "kernel"_a, "scheduler"_a, "tile"_a, "stream"_a);

  m.def("moe_gemm_sm90_tiles", &modmoe::moe_gemm_sm90_tiles);
  m.def(
      "moe_gemm_sm90_available",
      [](const std::string& device_type, int device_index) {
        // Only the device is read: no CUDA context (and no stream) is needed to ask, so a build
        // without the backend answers false instead of failing in cuda_context().
        modmoe::Context ctx;
        ctx.device = parse_device(device_type, device_index);
        return modmoe::moe_gemm_sm90_available(ctx);
      },
      "device_type"_a, "device_index"_a);
}
