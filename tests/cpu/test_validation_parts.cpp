// Validation tests of putting a kernel together: make_modular_kernel / check_compatibility /
// check_config reject parts that do not compose (and say why), the ModularKernel constructor
// rejects mismatched or missing parts, and the batched PrepareAndFinalize its config
// (ARCHITECTURE.md §4). Shared setup and the EXPECT macros: validation_helpers.h.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <memory>
#include <stdexcept>
#include <string>

#include "cpu/prepare_finalize.h"
#include "cpu/reference_experts.h"
#include "modmoe/error.h"
#include "modmoe/modular_kernel.h"
#include "modmoe/moe_gemm.h"
#include "modmoe/registry.h"
#include "validation_helpers.h"

namespace modmoe::validation_test {
namespace {

// ---- make_modular_kernel / check_compatibility --------------------------------------------------

const PartCapabilities& pf_caps(const char* name) {
  const PrepareFinalizeEntry* entry = find_prepare_finalize(name);
  EXPECT_NE(entry, nullptr) << name << " is not registered";
  if (entry == nullptr) throw std::logic_error(std::string(name) + " is not registered");
  return entry->caps;
}

const PartCapabilities& experts_caps(const char* name) {
  const ExpertsEntry* entry = find_experts(name);
  EXPECT_NE(entry, nullptr) << name << " is not registered";
  if (entry == nullptr) throw std::logic_error(std::string(name) + " is not registered");
  return entry->caps;
}

TEST(ValidationRegistry, ValidPairsCompose) {
  MoEConfig config = small_config();
  config.max_num_tokens = 8;
  const Compatibility standard =
      check_compatibility(pf_caps(kStandardPF), experts_caps(kStandardExperts), config);
  EXPECT_TRUE(standard.ok) << standard.reason;
  const Compatibility batched =
      check_compatibility(pf_caps(kBatchedPF), experts_caps(kBatchedExperts), config);
  EXPECT_TRUE(batched.ok) << batched.reason;
  EXPECT_NO_THROW(make_modular_kernel(kStandardPF, "auto", config));
  EXPECT_NO_THROW(make_modular_kernel(kBatchedPF, "auto", config));
}

TEST(ValidationRegistry, UnknownPrepareFinalizeName) {
  EXPECT_MODMOE_ERROR(
      make_modular_kernel("NoSuchPrepareFinalize", kStandardExperts, small_config()),
      HasSubstr("make_modular_kernel: unknown PrepareAndFinalize"),
      HasSubstr("'NoSuchPrepareFinalize'"));
}

TEST(ValidationRegistry, UnknownExpertsName) {
  EXPECT_MODMOE_ERROR(make_modular_kernel(kStandardPF, "NoSuchExperts", small_config()),
                      HasSubstr("make_modular_kernel: unknown Experts"),
                      HasSubstr("'NoSuchExperts'"));
}

TEST(ValidationRegistry, IncompatibleActivationFormats) {
  MoEConfig config = small_config();
  config.max_num_tokens = 8;
  const Compatibility standard_to_batched =
      check_compatibility(pf_caps(kStandardPF), experts_caps(kBatchedExperts), config);
  EXPECT_FALSE(standard_to_batched.ok);
  EXPECT_THAT(standard_to_batched.reason,
              AllOf(HasSubstr("NoEPPrepareAndFinalize produces standard activations"),
                    HasSubstr("BatchedReferenceExperts expects batched")));
  const Compatibility batched_to_standard =
      check_compatibility(pf_caps(kBatchedPF), experts_caps(kStandardExperts), config);
  EXPECT_FALSE(batched_to_standard.ok);
  EXPECT_THAT(batched_to_standard.reason,
              AllOf(HasSubstr("BatchedPrepareAndFinalize produces batched activations"),
                    HasSubstr("ReferenceExperts expects standard")));
  EXPECT_MODMOE_ERROR(make_modular_kernel(kStandardPF, kBatchedExperts, config),
                      HasSubstr("make_modular_kernel: NoEPPrepareAndFinalize + "
                                "BatchedReferenceExperts do not compose"),
                      HasSubstr("produces standard activations but BatchedReferenceExperts "
                                "expects batched"));
}

TEST(ValidationRegistry, TopkGreaterThanNumExperts) {
  MoEConfig config = small_config();
  config.topk = 5;
  const Compatibility r =
      check_compatibility(pf_caps(kStandardPF), experts_caps(kStandardExperts), config);
  EXPECT_FALSE(r.ok);
  EXPECT_THAT(r.reason, HasSubstr("topk must be in [1, E=4], got 5"));
  EXPECT_MODMOE_ERROR(make_modular_kernel(kStandardPF, kStandardExperts, config),
                      HasSubstr("do not compose"), HasSubstr("topk must be in [1, E=4], got 5"));
}

TEST(ValidationRegistry, StaticScaleWithFp8Block) {
  const MoEConfig config = small_config({QuantScheme::fp8_block, true});
  EXPECT_THAT(check_config(config).reason,
              HasSubstr("static activation scales exist only for fp8-tensor, got "
                        "fp8-block-static"));
  EXPECT_MODMOE_ERROR(make_modular_kernel(kStandardPF, kStandardExperts, config),
                      HasSubstr("do not compose"),
                      HasSubstr("static activation scales exist only for fp8-tensor, got "
                                "fp8-block-static"));
}

TEST(ValidationRegistry, BatchedWithZeroMaxNumTokens) {
  MoEConfig config = small_config();
  config.max_num_tokens = 0;
  const Compatibility r =
      check_compatibility(pf_caps(kBatchedPF), experts_caps(kBatchedExperts), config);
  EXPECT_FALSE(r.ok);
  EXPECT_THAT(r.reason, AllOf(HasSubstr("BatchedPrepareAndFinalize is batched"),
                              HasSubstr("needs config.max_num_tokens > 0")));
  // "auto" lists why each candidate failed.
  EXPECT_MODMOE_ERROR(make_modular_kernel(kBatchedPF, "auto", config),
                      HasSubstr("make_modular_kernel: no registered Experts composes with "
                                "BatchedPrepareAndFinalize"),
                      HasSubstr("needs config.max_num_tokens > 0"));
}

TEST(ValidationRegistry, NegativeMaxNumTokens) {
  MoEConfig config = small_config();
  config.max_num_tokens = -1;
  EXPECT_THAT(check_config(config).reason, HasSubstr("max_num_tokens must be >= 0, got -1"));
}

TEST(ValidationRegistry, MoreLocalThanGlobalExperts) {
  MoEConfig config = small_config();
  config.num_local_experts = 5;
  EXPECT_MODMOE_ERROR(make_modular_kernel(kStandardPF, kStandardExperts, config),
                      HasSubstr("do not compose"),
                      HasSubstr("num_local_experts must be in [1, num_experts=4], got 5"));
}

TEST(ValidationRegistry, UnsupportedInputDType) {
  MoEConfig config = small_config();
  config.in_dtype = DType::fp64;
  EXPECT_THAT(check_config(config).reason,
              HasSubstr("in_dtype must be bf16, fp16 or fp32, got fp64"));
}

TEST(ValidationRegistry, ZeroHiddenSize) {
  MoEConfig config = small_config();
  config.hidden_size = 0;
  EXPECT_THAT(check_config(config).reason, HasSubstr("hidden_size K must be > 0, got 0"));
}

// ---- ModularKernel constructor and the batched P/F built directly -------------------------------

TEST(ValidationKernel, PartsBuiltForDifferentLayers) {
  MoEConfig other = small_config();
  other.hidden_size = 128;
  EXPECT_MODMOE_ERROR(ModularKernel(std::make_shared<cpu::NoEPPrepareAndFinalize>(small_config()),
                                    std::make_shared<cpu::ReferenceExperts>(other)),
                      HasSubstr("ModularKernel: the parts were built for different layers"),
                      HasSubstr("NoEPPrepareAndFinalize [E=4 K=96"),
                      HasSubstr("ReferenceExperts [E=4 K=128"));
}

TEST(ValidationKernel, MismatchedFormats) {
  MoEConfig config = small_config();
  config.max_num_tokens = 8;
  EXPECT_MODMOE_ERROR(ModularKernel(std::make_shared<cpu::NoEPPrepareAndFinalize>(config),
                                    std::make_shared<cpu::BatchedReferenceExperts>(config)),
                      HasSubstr("ModularKernel: NoEPPrepareAndFinalize produces standard"),
                      HasSubstr("BatchedReferenceExperts expects batched"));
}

TEST(ValidationKernel, NullParts) {
  const MoEConfig config = small_config();
  EXPECT_MODMOE_ERROR(ModularKernel(nullptr, std::make_shared<cpu::ReferenceExperts>(config)),
                      HasSubstr("ModularKernel: prepare_finalize must not be null"));
  EXPECT_MODMOE_ERROR(ModularKernel(std::make_shared<cpu::NoEPPrepareAndFinalize>(config), nullptr),
                      HasSubstr("ModularKernel: experts must not be null"));
}

TEST(ValidationKernel, BatchedPrepareFinalizeNeedsMaxNumTokens) {
  MoEConfig config = small_config();
  config.max_num_tokens = 0;
  EXPECT_MODMOE_ERROR(cpu::BatchedPrepareAndFinalize{config},
                      HasSubstr("BatchedPrepareAndFinalize: config.max_num_tokens must be > 0"),
                      HasSubstr("got 0"));
}

// Capabilities alone say the Hopper experts compose on CUDA; on a device, they need an sm_90
// one (and the sm_90a kernels), and the refusal says so (CI has no GPU: refused there).
TEST(ValidationRegistry, HopperOnlyPartsNeedAHopperDevice) {
  MoEConfig cfg = small_config();
  cfg.intermediate_size = 64;  // the Hopper experts want K and N multiples of 16
  const PartCapabilities& pf = find_prepare_finalize("NoEPPrepareAndFinalize")->caps;
  const PartCapabilities& ex = find_experts("Sm90Experts")->caps;
  ASSERT_TRUE(ex.hopper_only);
  EXPECT_TRUE(check_compatibility(pf, ex, cfg, Backend::cuda)) << "capabilities alone";
  Context on_gpu;
  on_gpu.device = Device::cuda(0);
  const Compatibility r = check_compatibility(pf, ex, cfg, Device::cuda(0));
  EXPECT_EQ(bool(r), moe_gemm_sm90_available(on_gpu));
  if (!r) EXPECT_THAT(r.reason, ::testing::HasSubstr("Sm90Experts needs an sm_90 device"));
  EXPECT_THAT(check_compatibility(pf, ex, cfg, Device::cpu()).reason,
              ::testing::HasSubstr("Sm90Experts has no cpu implementation"));
}

}  // namespace
}  // namespace modmoe::validation_test
