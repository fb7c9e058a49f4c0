// The catalog of parts: every PrepareAndFinalize and Experts with its capabilities, and the
// one function that says whether a (P/F, Experts, config) triple composes — and why not.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "modmoe/modular_kernel.h"

namespace modmoe {

enum class Backend : uint8_t { cpu, cuda };
enum class PartKind : uint8_t { prepare_finalize, experts };
const char* backend_name(Backend b);

// Capabilities are data: the checker, the combinations test and `modmoe-check --list` read
// them; nothing needs to construct a part to know what it supports.
struct PartCapabilities {
  std::string name;
  PartKind kind = PartKind::experts;
  std::vector<Backend> backends;  // a part may exist on several backends under one name
  ActivationFormat format = ActivationFormat::Standard;  // P/F output = Experts input format
  std::vector<DType> in_dtypes;                          // hidden-state dtypes
  std::vector<QuantScheme> quant_schemes;                // activation/weight schemes
  bool static_act_scale = false;           // accepts static activation scales (fp8_tensor)
  bool block_quant = false;                // fp8 128-block or MX-32 scales
  bool expert_map = false;                 // handles expert_map (EP-style local subsets)
  bool chunking = false;                   // may run on token chunks
  bool graph_capturable = false;           // CUDA-graph capturable forward
  int ranks_needed = 1;                    // processes a forward needs (EP parts: > 1)
  int64_t k_alignment = 1;                 // hidden size K must be a multiple of this
  int64_t n_alignment = 1;                 // intermediate size N must be a multiple of this
  std::vector<Activation> activations;     // Experts only
  std::vector<GatedLayout> gated_layouts;  // Experts only
  WeightAndReduceKind weight_and_reduce = WeightAndReduceKind::Delegate;  // Experts only
  // Runs only on sm_90 devices of a build with the sm_90a kernels: "auto" skips it elsewhere
  // (make_modular_kernel asks the device; check_compatibility stays a pure function).
  bool hopper_only = false;
  // Constraints a table cannot say (e.g. alignment that depends on the scheme): "" when the
  // part supports the config, else why not. Optional.
  std::function<std::string(const MoEConfig&)> config_check;
  std::string summary;
};

// Factories build the part for one of caps.backends.
struct PrepareFinalizeEntry {
  PartCapabilities caps;
  std::function<std::shared_ptr<PrepareAndFinalize>(const MoEConfig&, Backend)> make;
};
struct ExpertsEntry {
  PartCapabilities caps;
  std::function<std::shared_ptr<Experts>(const MoEConfig&, Backend)> make;
};

// The backend that runs on `device`.
inline Backend backend_of(Device device) { return device.is_cuda() ? Backend::cuda : Backend::cpu; }

const std::vector<PrepareFinalizeEntry>& prepare_finalize_registry();
const std::vector<ExpertsEntry>& experts_registry();
const PrepareFinalizeEntry* find_prepare_finalize(const std::string& name);  // nullptr if none
const ExpertsEntry* find_experts(const std::string& name);

struct Compatibility {
  bool ok = true;
  std::string reason;  // empty when ok
  explicit operator bool() const { return ok; }
};

// Whether the layer config itself is well-formed (sizes > 0, topk <= E, schemes with dtypes).
Compatibility check_config(const MoEConfig& config);
// Whether one part supports `config` on its own.
Compatibility check_part(const PartCapabilities& part, const MoEConfig& config);
// Whether P/F and Experts compose for `config` on `backend`: formats agree, both exist on the
// backend, both support the config, ranks available. Pure: reads capabilities only (whether a
// CUDA device is present is checked when a kernel is built, not here).
Compatibility check_compatibility(const PartCapabilities& prepare_finalize,
                                  const PartCapabilities& experts, const MoEConfig& config,
                                  Backend backend = Backend::cpu);
// The same on one device: check_compatibility on the device's backend, then what the device
// itself must have (a hopper_only part needs an sm_90 device and a build with the sm_90a
// kernels). make_modular_kernel decides with this one; so do the checker and the tests.
Compatibility check_compatibility(const PartCapabilities& prepare_finalize,
                                  const PartCapabilities& experts, const MoEConfig& config,
                                  Device device);

// Builds the kernel from registered names; experts = "auto" picks the best compatible experts
// for the P/F and config. Throws Error carrying the compatibility reason.
// `device` picks the backend (Device::cpu() unless given); the kernel's forward must then be
// called with a Context on that device.
ModularKernel make_modular_kernel(const std::string& prepare_finalize, const std::string& experts,
                                  const MoEConfig& config, SharedExpertsFn shared_experts = {});
ModularKernel make_modular_kernel(const std::string& prepare_finalize, const std::string& experts,
                                  const MoEConfig& config, Device device,
                                  SharedExpertsFn shared_experts = {});

// One line per capability, for `modmoe-check --list`.
std::string describe(const PartCapabilities& part);

}  // namespace modmoe
