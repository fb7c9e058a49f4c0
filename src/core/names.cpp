// Names of the enums that users type (modmoe-check flags, Python strings) and read in errors.
#include <sstream>

#include "modmoe/activation.h"
#include "modmoe/error.h"
#include "modmoe/moe_types.h"
#include "modmoe/registry.h"
#include "modmoe/topk_weight_and_reduce.h"

namespace modmoe {

namespace {
template <typename Enum, size_t N>
Enum parse_name(const char* what, const std::string& name, const std::pair<Enum, const char*> (&table)[N]) {
  std::ostringstream options;
  for (size_t i = 0; i < N; ++i) {
    if (name == table[i].second) return table[i].first;
    options << (i ? ", " : "") << table[i].second;
  }
  MODMOE_FAIL() << "unknown " << what << " '" << name << "', expected one of " << options.str();
  return table[0].first;
}
template <typename Enum, size_t N>
const char* name_of(Enum e, const std::pair<Enum, const char*> (&table)[N]) {
  for (size_t i = 0; i < N; ++i)
    if (table[i].first == e) return table[i].second;
  return "?";
}

constexpr std::pair<Activation, const char*> kActivations[] = {
    {Activation::silu, "silu"},
    {Activation::gelu, "gelu"},
    {Activation::gelu_tanh, "gelu_tanh"},
    {Activation::swigluoai, "swigluoai"},
    {Activation::silu_no_mul, "silu_no_mul"},
    {Activation::gelu_no_mul, "gelu_no_mul"},
    {Activation::gelu_tanh_no_mul, "gelu_tanh_no_mul"},
    {Activation::swigluoai_no_mul, "swigluoai_no_mul"},
};
constexpr std::pair<GatedLayout, const char*> kLayouts[] = {
    {GatedLayout::GateUp, "gate_up"},
    {GatedLayout::UpGate, "up_gate"},
    {GatedLayout::Interleaved, "interleaved"},
};
constexpr std::pair<ActivationFormat, const char*> kFormats[] = {
    {ActivationFormat::Standard, "standard"},
    {ActivationFormat::Batched, "batched"},
};
constexpr std::pair<WeightAndReduceKind, const char*> kReduce[] = {
    {WeightAndReduceKind::NoOp, "TopKWeightAndReduceNoOp"},
    {WeightAndReduceKind::Contiguous, "TopKWeightAndReduceContiguous"},
    {WeightAndReduceKind::NaiveBatched, "TopKWeightAndReduceNaiveBatched"},
    {WeightAndReduceKind::Delegate, "TopKWeightAndReduceDelegate"},
};
constexpr std::pair<Backend, const char*> kBackends[] = {{Backend::cpu, "cpu"}, {Backend::cuda, "cuda"}};
}  // namespace

const char* activation_name(Activation a) { return name_of(a, kActivations); }
Activation parse_activation(const std::string& name) {
  return parse_name("activation", name, kActivations);
}
const char* gated_layout_name(GatedLayout l) { return name_of(l, kLayouts); }
GatedLayout parse_gated_layout(const std::string& name) {
  return parse_name("gated layout", name, kLayouts);
}
const char* activation_format_name(ActivationFormat f) { return name_of(f, kFormats); }
const char* weight_and_reduce_name(WeightAndReduceKind k) { return name_of(k, kReduce); }
const char* backend_name(Backend b) { return name_of(b, kBackends); }

std::string MoEConfig::str() const {
  std::ostringstream s;
  s << "E=" << num_experts;
  if (num_local_experts != num_experts) s << " (local " << num_local_experts << ")";
  s << " K=" << hidden_size << " N=" << intermediate_size << " topk=" << topk
    << " dtype=" << dtype_name(in_dtype) << " quant=" << quant.str()
    << " act=" << activation_name(activation) << " layout=" << gated_layout_name(gated_layout);
  if (max_num_tokens > 0) s << " max_tokens=" << max_num_tokens;
  return s.str();
}

}  // namespace modmoe
