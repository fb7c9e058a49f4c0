// ModularKernel::forward on the CPU parts: each finalize path, chunking, expert_map,
// apply_router_weight_on_input, shared experts ordering, in-place output, workspaces and the
// allocator, determinism.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "cpu/prepare_finalize.h"
#include "cpu/reference_experts.h"
#include "modmoe/modmoe.h"
#include "modmoe/numeric.h"
#include "oracle/oracle.h"
#include "oracle/problem.h"

namespace modmoe {
namespace {

testing::ProblemSpec spec_for(int64_t M, int64_t topk, int64_t E, int64_t K, int64_t N,
                              DType dtype = DType::fp32, QuantScheme scheme = QuantScheme::none) {
  return testing::simple_spec(M, topk, E, K, N, dtype, scheme);
}

ForwardArgs args_for(const testing::Problem& p) { return p.forward_args(); }

oracle::ErrorReport check_against_oracle(const testing::Problem& p, const Tensor& out,
                                         int64_t chunk_size = 0) {
  oracle::OracleInputs in = p.oracle_inputs();
  in.chunk_size = chunk_size;
  return oracle::compare(out, oracle::moe_forward(in), p.topk_ids, p.expert_map);
}

using testing::bytes_of;

TEST(ModularKernel, NoOpExpertsWriteTheOutputDirectly) {
  testing::Problem p = testing::make_problem(spec_for(33, 4, 16, 128, 96));
  auto cfg = p.spec.config;
  ModularKernel k(std::make_shared<cpu::NoEPPrepareAndFinalize>(cfg),
                  std::make_shared<cpu::ReferenceExperts>(cfg));
  EXPECT_EQ(k.experts().finalize_weight_and_reduce_impl()->kind(), WeightAndReduceKind::NoOp);
  k.forward(Context::cpu(), args_for(p));
  const auto err = check_against_oracle(p, p.output);
  EXPECT_TRUE(err.passed(1e-4)) << err.str();
}

TEST(ModularKernel, DelegateBecomesContiguousInNoEPFinalize) {
  testing::Problem p = testing::make_problem(spec_for(33, 4, 16, 128, 96));
  auto cfg = p.spec.config;
  auto experts = std::make_shared<cpu::ReferenceExperts>(cfg, /*reduce_in_experts=*/false);
  EXPECT_EQ(experts->finalize_weight_and_reduce_impl()->kind(), WeightAndReduceKind::Delegate);
  ModularKernel k(std::make_shared<cpu::NoEPPrepareAndFinalize>(cfg), experts);
  k.forward(Context::cpu(), args_for(p));
  const auto err = check_against_oracle(p, p.output);
  EXPECT_TRUE(err.passed(1e-4)) << err.str();
}

TEST(ModularKernel, DelegateBecomesNaiveBatchedInBatchedFinalize) {
  testing::Problem p = testing::make_problem(spec_for(40, 2, 8, 128, 64, DType::bf16));
  auto cfg = p.spec.config;
  ModularKernel k(std::make_shared<cpu::BatchedPrepareAndFinalize>(cfg),
                  std::make_shared<cpu::BatchedReferenceExperts>(cfg));
  k.forward(Context::cpu(), args_for(p));
  const auto err = check_against_oracle(p, p.output);
  EXPECT_TRUE(err.passed(1e-2)) << err.str();
}

// Chunks change how many rows each expert sees per GEMM, and the CPU GEMM sums small groups
// (<= 4 rows) in another order than large ones, so chunked results agree to rounding, not bits.
TEST(ModularKernel, ChunkingGivesTheSameResults) {
  testing::Problem p = testing::make_problem(spec_for(50, 3, 8, 128, 64));
  auto cfg = p.spec.config;
  ModularKernel k(std::make_shared<cpu::NoEPPrepareAndFinalize>(cfg),
                  std::make_shared<cpu::ReferenceExperts>(cfg));
  std::vector<float> reference;
  for (int64_t chunk : {0, 50, 17, 7, 1}) {
    testing::poison(p.output);
    Context ctx = Context::cpu();
    ctx.chunk_size = chunk;
    k.forward(ctx, args_for(p));
    EXPECT_TRUE(check_against_oracle(p, p.output).passed(1e-4)) << "chunk_size " << chunk;
    const float* out = p.output.data_ptr<float>();
    if (reference.empty()) {
      reference.assign(out, out + 50 * 128);
      continue;
    }
    for (int64_t i = 0; i < 50 * 128; ++i)
      ASSERT_NEAR(out[i], reference[i], 1e-5f * (1.0f + std::fabs(reference[i])))
          << "chunk_size " << chunk << " element " << i;
  }
}

TEST(ModularKernel, ChunkingWorksForTheContiguousPathToo) {
  testing::Problem p = testing::make_problem(spec_for(50, 3, 8, 128, 64));
  auto cfg = p.spec.config;
  ModularKernel k(std::make_shared<cpu::NoEPPrepareAndFinalize>(cfg),
                  std::make_shared<cpu::ReferenceExperts>(cfg, false));
  Context ctx = Context::cpu();
  ctx.chunk_size = 16;
  k.forward(ctx, args_for(p));
  EXPECT_TRUE(check_against_oracle(p, p.output).passed(1e-4));
}

TEST(ModularKernel, ExpertMapSkipsNonLocalExpertsInEveryPair) {
  for (bool batched : {false, true}) {
    testing::ProblemSpec s = spec_for(64, 2, 32, 128, 64);
    s.config.num_local_experts = 5;  // few local experts: many tokens route nowhere here
    s.use_expert_map = true;
    testing::Problem p = testing::make_problem(s);
    ModularKernel k = make_modular_kernel(
        batched ? "BatchedPrepareAndFinalize" : "NoEPPrepareAndFinalize",
        batched ? "BatchedReferenceExperts" : "ReferenceExperts", p.spec.config);
    k.forward(Context::cpu(), args_for(p));
    const auto err = check_against_oracle(p, p.output);
    EXPECT_TRUE(err.passed(1e-4)) << (batched ? "batched: " : "standard: ") << err.str();

    // A token none of whose experts is local gets exactly zero.
    const int32_t* map = p.expert_map.data_ptr<int32_t>();
    int checked = 0;
    for (int64_t t = 0; t < s.M; ++t) {
      bool any_local = false;
      for (int64_t j = 0; j < 2; ++j)
        any_local |= map[load_index(p.topk_ids.tensor().data(), p.topk_ids.tensor().dtype(), t * 2 + j)] >= 0;
      if (any_local) continue;
      ++checked;
      for (int64_t i = 0; i < 128; ++i) ASSERT_EQ(p.output.data_ptr<float>()[t * 128 + i], 0.0f);
    }
    EXPECT_GT(checked, 0) << "the problem should contain tokens with no local expert";
  }
}

TEST(ModularKernel, ApplyRouterWeightOnInput) {
  for (QuantScheme scheme : {QuantScheme::none, QuantScheme::fp8_token}) {
    testing::ProblemSpec s = spec_for(20, 1, 8, 128, 64, DType::bf16, scheme);
    s.apply_router_weight_on_input = true;
    testing::Problem p = testing::make_problem(s);
    ModularKernel k = make_modular_kernel("NoEPPrepareAndFinalize", "ReferenceExperts", p.spec.config);
    k.forward(Context::cpu(), args_for(p));
    const auto err = check_against_oracle(p, p.output);
    EXPECT_TRUE(err.passed(3e-2)) << quant_scheme_name(scheme) << ": " << err.str();
    // Without the flag the result must differ (the weights are not all 1).
    testing::Problem q = testing::make_problem(s);
    ForwardArgs a = args_for(q);
    a.apply_router_weight_on_input = false;
    k.forward(Context::cpu(), a);
    EXPECT_GT(check_against_oracle(p, q.output).rel_error, 0.05);
  }
}

// A P/F that wraps another and logs its calls, to see where the shared experts run.
class LoggingPF final : public PrepareAndFinalize {
 public:
  LoggingPF(std::shared_ptr<PrepareAndFinalize> inner, std::vector<std::string>* log)
      : PrepareAndFinalize(inner->config()), inner_(std::move(inner)), log_(log) {}
  std::string name() const override { return "Logging" + inner_->name(); }
  ActivationFormat activation_format() const override { return inner_->activation_format(); }
  std::optional<int64_t> max_num_tokens_per_rank() const override {
    return inner_->max_num_tokens_per_rank();
  }
  int num_dispatchers() const override { return inner_->num_dispatchers(); }
  bool output_is_reduced() const override { return inner_->output_is_reduced(); }
  bool has_prepare_no_receive() const override { return inner_->has_prepare_no_receive(); }
  PrepareResult prepare(const Context& c, const PrepareArgs& a) override {
    log_->push_back("prepare");
    return inner_->prepare(c, a);
  }
  PrepareReceiver prepare_no_receive(const Context& c, const PrepareArgs& a) override {
    log_->push_back("prepare_no_receive");
    PrepareReceiver r = inner_->prepare_no_receive(c, a);
    return [r, this]() {
      log_->push_back("receive");
      return r();
    };
  }
  void finalize(const Context& c, const FinalizeArgs& f, const TopKWeightAndReduce& w) override {
    log_->push_back("finalize");
    inner_->finalize(c, f, w);
  }

 private:
  std::shared_ptr<PrepareAndFinalize> inner_;
  std::vector<std::string>* log_;
};

TEST(ModularKernel, SharedExpertsRunBetweenDispatchAndReceive) {
  testing::Problem p = testing::make_problem(spec_for(9, 2, 8, 128, 64));
  const auto cfg = p.spec.config;
  for (bool no_receive : {true, false}) {
    std::vector<std::string> log;
    std::shared_ptr<PrepareAndFinalize> inner;
    std::shared_ptr<Experts> experts;
    if (no_receive) {
      inner = std::make_shared<cpu::NoEPPrepareAndFinalize>(cfg);
      experts = std::make_shared<cpu::ReferenceExperts>(cfg);
    } else {
      inner = std::make_shared<cpu::BatchedPrepareAndFinalize>(cfg);
      experts = std::make_shared<cpu::BatchedReferenceExperts>(cfg);
    }
    ASSERT_EQ(inner->has_prepare_no_receive(), no_receive);
    // The shared expert here: a plain scaled copy of the input, checked below.
    OwnedTensor shared_out = host_tensor(DType::fp32, {9, 128});
    ModularKernel k(std::make_shared<LoggingPF>(inner, &log), experts,
                    [&](const Context&, const Tensor& x) {
                      log.push_back("shared");
                      for (int64_t i = 0; i < x.numel(); ++i)
                        shared_out.data_ptr<float>()[i] = 2.0f * x.data_ptr<float>()[i];
                    });
    k.forward(Context::cpu(), args_for(p));
    const std::vector<std::string> expected =
        no_receive ? std::vector<std::string>{"prepare_no_receive", "shared", "receive", "finalize"}
                   : std::vector<std::string>{"prepare", "shared", "finalize"};
    EXPECT_EQ(log, expected);
    EXPECT_EQ(shared_out.data_ptr<float>()[5], 2.0f * p.hidden_states.data_ptr<float>()[5]);
    EXPECT_TRUE(check_against_oracle(p, p.output).passed(1e-4));
  }
}

// Experts that quantize their own input (Experts::expects_unquantized_input): the reference
// experts behind a front that records what the prepare handed over and quantizes it itself when
// it came unquantized, as the CPU NoEP prepare would have.
class SelfQuantizingExperts final : public Experts {
 public:
  SelfQuantizingExperts(const MoEConfig& c, bool expects_unquantized, std::vector<DType>* seen)
      : Experts(c), inner_(c), expects_unquantized_(expects_unquantized), seen_(seen) {}
  std::string name() const override { return "SelfQuantizingExperts"; }
  std::pair<ActivationFormat, ActivationFormat> activation_formats() const override {
    return inner_.activation_formats();
  }
  bool supports_expert_map() const override { return true; }
  bool supports_chunking() const override { return true; }
  WorkspaceShapes workspace_shapes(int64_t M, int64_t N, int64_t K, int64_t topk, int64_t E,
                                   int64_t E_local, const ExpertTokensMetadata* meta) const override {
    return inner_.workspace_shapes(M, N, K, topk, E, E_local, meta);
  }
  TopKWeightAndReducePtr finalize_weight_and_reduce_impl() const override {
    return inner_.finalize_weight_and_reduce_impl();
  }
  bool expects_unquantized_input() const override { return expects_unquantized_; }
  void apply(const Context& ctx, const ApplyArgs& a) override {
    seen_->push_back(a.hidden_states.dtype());
    const QuantConfig& q = config().quant;
    if (!q.quantized() || a.hidden_states.dtype() != config().in_dtype) return inner_.apply(ctx, a);
    EXPECT_FALSE(a.a1q_scale.defined()) << "unquantized rows come with no scale";
    const int64_t M = a.hidden_states.size(0), K = a.hidden_states.size(1);
    OwnedTensor codes = host_tensor(quantized_dtype(q.scheme), {M, K});
    OwnedTensor scale = host_tensor(scale_dtype(q.scheme), act_scale_shape(q.scheme, M, K));
    quantize_activations(ctx, a.hidden_states, q.scheme, false, codes, scale);
    ApplyArgs quantized = a;
    quantized.hidden_states = codes;
    quantized.a1q_scale = scale;
    inner_.apply(ctx, quantized);
  }

 private:
  cpu::ReferenceExperts inner_;
  bool expects_unquantized_;
  std::vector<DType>* seen_;
};

// The NoEP prepare skips its quantization only for experts that ask for it, and only with a
// quantized scheme; the result is the same bytes either way (also chunked: the a1q_scale of an
// unquantized chunk is undefined, not sliced).
TEST(ModularKernel, PrepareLeavesTheQuantizationToExpertsThatAskForIt) {
  for (QuantScheme scheme : {QuantScheme::fp8_block, QuantScheme::fp8_token, QuantScheme::none}) {
    for (int64_t chunk : {0, 7}) {
      testing::Problem p =
          testing::make_problem(spec_for(23, 2, 8, 256, 128, DType::bf16, scheme));
      const MoEConfig& cfg = p.spec.config;
      Context ctx = Context::cpu();
      ctx.chunk_size = chunk;
      std::vector<DType> seen_quantizing, seen_deferring;
      ModularKernel quantizing(std::make_shared<cpu::NoEPPrepareAndFinalize>(cfg),
                               std::make_shared<SelfQuantizingExperts>(cfg, false, &seen_quantizing));
      ModularKernel deferring(std::make_shared<cpu::NoEPPrepareAndFinalize>(cfg),
                              std::make_shared<SelfQuantizingExperts>(cfg, true, &seen_deferring));
      quantizing.forward(ctx, args_for(p));
      const std::vector<uint8_t> expected = bytes_of(p.output);
      testing::poison(p.output);
      deferring.forward(ctx, args_for(p));
      const std::string what = std::string(quant_scheme_name(scheme)) + ", chunk " +
                               std::to_string(chunk);
      EXPECT_EQ(bytes_of(p.output), expected) << what;
      const DType prepared = scheme == QuantScheme::none ? DType::bf16 : DType::fp8_e4m3;
      ASSERT_FALSE(seen_deferring.empty()) << what;
      for (DType d : seen_quantizing) EXPECT_EQ(d, prepared) << what;
      for (DType d : seen_deferring) EXPECT_EQ(d, DType::bf16) << what;
      EXPECT_TRUE(check_against_oracle(p, p.output, chunk).passed(3e-2)) << what;
    }
  }
}

TEST(ModularKernel, InPlaceOutputMatchesOutOfPlace) {
  for (QuantScheme scheme : {QuantScheme::none, QuantScheme::fp8_block}) {
    testing::Problem p = testing::make_problem(spec_for(37, 4, 16, 256, 128, DType::bf16, scheme));
    ModularKernel k = make_modular_kernel("NoEPPrepareAndFinalize", "ReferenceExperts", p.spec.config);
    Context ctx = Context::cpu();
    ctx.chunk_size = 10;  // chunks must not read rows an earlier chunk overwrote
    k.forward(ctx, args_for(p));
    const std::vector<uint8_t> expected = bytes_of(p.output);
    ForwardArgs a = args_for(p);
    a.output = p.hidden_states;  // in place
    k.forward(ctx, a);
    EXPECT_EQ(bytes_of(p.hidden_states), expected) << quant_scheme_name(scheme);
  }
}

TEST(ModularKernel, DeterministicAcrossThreadCounts) {
  testing::Problem p = testing::make_problem(spec_for(64, 8, 32, 256, 128, DType::bf16, QuantScheme::fp8_block));
  for (const char* pf : {"NoEPPrepareAndFinalize", "BatchedPrepareAndFinalize"}) {
    ModularKernel k = make_modular_kernel(pf, "auto", p.spec.config);
    const int threads = omp_get_max_threads();
    omp_set_num_threads(1);
    k.forward(Context::cpu(), args_for(p));
    const std::vector<uint8_t> one = bytes_of(p.output);
    omp_set_num_threads(std::max(2, threads));
    testing::poison(p.output);
    k.forward(Context::cpu(), args_for(p));
    omp_set_num_threads(threads);
    EXPECT_EQ(bytes_of(p.output), one) << pf;
  }
}

// Counts what forward allocates through the Context's allocator.
class CountingAllocator final : public Allocator {
 public:
  void* allocate(size_t bytes, void* stream) override {
    live_ += bytes;
    peak_ = std::max(peak_, live_);
    ++count_;
    return host_allocator()->allocate(bytes, stream);
  }
  void deallocate(void* p, size_t bytes, void* stream) override {
    live_ -= bytes;
    host_allocator()->deallocate(p, bytes, stream);
  }
  Device device() const override { return Device::cpu(); }
  size_t live_ = 0, peak_ = 0, count_ = 0;
};

TEST(ModularKernel, WorkspacesComeFromTheContextAllocatorAndAreBoundedByChunks) {
  testing::Problem p = testing::make_problem(spec_for(256, 8, 16, 128, 128));
  ModularKernel k = make_modular_kernel("NoEPPrepareAndFinalize", "ReferenceExperts", p.spec.config);
  size_t peak_full = 0;
  for (int64_t chunk : {0, 32}) {
    CountingAllocator alloc;
    Context ctx = Context::cpu();
    ctx.allocator = &alloc;
    ctx.chunk_size = chunk;
    k.forward(ctx, args_for(p));
    // One allocation holds both workspaces (a captured forward gets one allocation node and
    // one free node for them), workspace2 from the next multiple of 256 bytes.
    EXPECT_EQ(alloc.count_, 1u) << "chunk " << chunk;  // no quantization: nothing else
    EXPECT_EQ(alloc.live_, 0u) << "forward leaked workspace memory";
    const WorkspaceShapes ws = k.experts().workspace_shapes(chunk ? chunk : 256, 128, 128, 8, 16, 16, nullptr);
    const size_t ws13 = shape_numel(ws.workspace13) * sizeof(float);
    const size_t declared = (ws13 + 255) / 256 * 256 + shape_numel(ws.workspace2) * sizeof(float);
    EXPECT_EQ(alloc.peak_, declared) << "chunk " << chunk;
    if (chunk == 0) peak_full = alloc.peak_;
    else EXPECT_LE(alloc.peak_ * 7, peak_full) << "chunking must bound the workspaces";
  }
}

TEST(ModularKernel, WorkspaceShapesOfTheCpuExperts) {
  MoEConfig c = spec_for(10, 4, 8, 256, 96).config;
  c.max_num_tokens = 12;
  const WorkspaceShapes std_ws = cpu::ReferenceExperts(c).workspace_shapes(10, 96, 256, 4, 8, 8, nullptr);
  EXPECT_EQ(std_ws.workspace13, (Shape{40, 256}));  // rows x max(2N=192, K=256)
  EXPECT_EQ(std_ws.workspace2, (Shape{40, 256}));
  EXPECT_EQ(std_ws.output, (Shape{10, 256}));
  const WorkspaceShapes delegate_ws = cpu::ReferenceExperts(c, false).workspace_shapes(10, 96, 256, 4, 8, 8, nullptr);
  EXPECT_EQ(delegate_ws.output, (Shape{10, 4, 256}));
  const WorkspaceShapes b = cpu::BatchedReferenceExperts(c).workspace_shapes(10, 96, 256, 4, 8, 8, nullptr);
  EXPECT_EQ(b.output, (Shape{8, 12, 256}));
  EXPECT_EQ(b.workspace13, (Shape{96, 256}));
}

TEST(BatchedPrepareAndFinalize, ScattersInTokenOrderAndPoisonsUnusedRows) {
  testing::Problem p = testing::make_problem(spec_for(12, 2, 4, 128, 64));
  MoEConfig cfg = p.spec.config;
  cfg.max_num_tokens = 16;
  cpu::BatchedPrepareAndFinalize pf(cfg);
  PrepareArgs a;
  a.a1 = p.hidden_states;
  a.topk_weights = p.topk_weights;
  a.topk_ids = p.topk_ids;
  a.num_experts = 4;
  PrepareResult r = pf.prepare(Context::cpu(), a);
  ASSERT_TRUE(r.expert_tokens_meta.has_value());
  EXPECT_EQ(r.a1q.shape(), (Shape{4, 16, 128}));
  const int32_t* n = r.expert_tokens_meta->expert_num_tokens.data_ptr<int32_t>();
  std::vector<int> slot(4, 0);
  int64_t total = 0;
  for (int64_t t = 0; t < 12; ++t) {
    for (int64_t k = 0; k < 2; ++k) {
      const int64_t e = load_index(p.topk_ids.tensor().data(), p.topk_ids.tensor().dtype(), t * 2 + k);
      const float* row = r.a1q.data_ptr<float>() + (e * 16 + slot[e]++) * 128;
      EXPECT_EQ(std::memcmp(row, p.hidden_states.data_ptr<float>() + t * 128, 128 * sizeof(float)), 0);
    }
  }
  for (int64_t e = 0; e < 4; ++e) {
    EXPECT_EQ(n[e], slot[e]);
    total += n[e];
    for (int64_t i = n[e]; i < 16; ++i)
      EXPECT_TRUE(std::isnan(r.a1q.data_ptr<float>()[(e * 16 + i) * 128])) << "expert " << e << " row " << i;
  }
  EXPECT_EQ(total, 24);
}

TEST(ModularKernel, PartsForDifferentLayersDoNotCompose) {
  MoEConfig a = spec_for(4, 2, 8, 128, 64).config, b = a;
  b.intermediate_size = 128;
  try {
    ModularKernel k(std::make_shared<cpu::NoEPPrepareAndFinalize>(a),
                    std::make_shared<cpu::ReferenceExperts>(b));
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("different layers"), std::string::npos) << e.what();
  }
}

TEST(ModularKernel, EmptyBatchIsANoOp) {
  testing::Problem p = testing::make_problem(spec_for(3, 2, 8, 128, 64));
  ForwardArgs a = args_for(p);
  a.hidden_states = p.hidden_states.tensor().slice(0, 0);
  a.output = p.output.tensor().slice(0, 0);
  a.topk_ids = p.topk_ids.tensor().slice(0, 0);
  a.topk_weights = p.topk_weights.tensor().slice(0, 0);
  for (const char* pf : {"NoEPPrepareAndFinalize", "BatchedPrepareAndFinalize"}) {
    ModularKernel k = make_modular_kernel(pf, "auto", p.spec.config);
    EXPECT_NO_THROW(k.forward(Context::cpu(), a)) << pf;
  }
}

}  // namespace
}  // namespace modmoe
