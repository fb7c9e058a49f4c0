// The tracing hook (modmoe/trace.h): the ranges a CPU forward opens, their nesting and order,
// and that tracing changes nothing in the output.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "modmoe/modmoe.h"
#include "modmoe/trace.h"
#include "oracle/oracle.h"
#include "oracle/problem.h"

namespace modmoe {
namespace {

// A closed range as the recorder saw it: its parent is the innermost range open at its begin.
struct Span {
  std::string name;
  int parent = -1;  // index into spans, -1 at the top
  int depth = 0;
  double begin_us = 0, end_us = -1;
};

// Records every begin/end with steady_clock; notes the first end that does not match the
// innermost open range.
class RecordingTracer : public Tracer {
 public:
  void begin(const Context&, const char* name) override {
    Span s;
    s.name = name;
    s.parent = open_.empty() ? -1 : open_.back();
    s.depth = static_cast<int>(open_.size());
    s.begin_us = now_us();
    spans.push_back(s);
    open_.push_back(static_cast<int>(spans.size()) - 1);
  }
  void end(const Context&, const char* name) noexcept override {
    if (open_.empty() || spans[open_.back()].name != name) {
      if (mismatch.empty()) mismatch = std::string("end('") + name + "') out of order";
      return;
    }
    spans[open_.back()].end_us = now_us();
    open_.pop_back();
  }
  bool all_closed() const { return open_.empty(); }

  // Names of the children of span `parent` (-1: the top level), in begin order.
  std::vector<std::string> children(int parent) const {
    std::vector<std::string> names;
    for (const Span& s : spans)
      if (s.parent == parent) names.push_back(s.name);
    return names;
  }
  int find(const std::string& name) const {
    for (size_t i = 0; i < spans.size(); ++i)
      if (spans[i].name == name) return static_cast<int>(i);
    return -2;  // no span has it (and -2 is nobody's parent)
  }

  std::vector<Span> spans;
  std::string mismatch;

 private:
  static double now_us() {
    return std::chrono::duration<double, std::micro>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }
  std::vector<int> open_;
};

testing::ProblemSpec spec_for(int64_t M, DType dtype, QuantScheme scheme) {
  return testing::simple_spec(M, 2, 8, 128, 64, dtype, scheme, /*seed=*/11);
}

ForwardArgs args_for(const testing::Problem& p) { return p.forward_args(); }

using testing::bytes_of;

// Every span closed, inside its parent in time, with a non-negative duration; siblings in
// begin order do not overlap.
void expect_well_formed(const RecordingTracer& t) {
  EXPECT_TRUE(t.mismatch.empty()) << t.mismatch;
  EXPECT_TRUE(t.all_closed());
  for (size_t i = 0; i < t.spans.size(); ++i) {
    const Span& s = t.spans[i];
    ASSERT_GE(s.end_us, s.begin_us) << s.name << " (span " << i << ")";
    if (s.parent >= 0) {
      const Span& p = t.spans[s.parent];
      EXPECT_GE(s.begin_us, p.begin_us) << s.name << " begins before its parent " << p.name;
      EXPECT_LE(s.end_us, p.end_us) << s.name << " ends after its parent " << p.name;
      EXPECT_EQ(s.depth, p.depth + 1) << s.name;
    }
    for (size_t j = i + 1; j < t.spans.size(); ++j) {
      if (t.spans[j].parent == s.parent) {
        EXPECT_GE(t.spans[j].begin_us, s.end_us) << t.spans[j].name << " overlaps " << s.name;
        break;
      }
    }
  }
}

// Runs the pair on the problem twice, without and with `tracer`, and checks the outputs are
// bitwise equal (tracing must not change the forward).
void run_traced(const std::string& pf, const std::string& experts, const testing::Problem& p,
                Context ctx, RecordingTracer& tracer) {
  SCOPED_TRACE(pf + " + " + experts + " " + p.spec.str());
  const ModularKernel k = make_modular_kernel(pf, experts, p.spec.config);
  testing::poison(p.output);
  k.forward(ctx, args_for(p));
  const std::vector<uint8_t> untraced = bytes_of(p.output);
  testing::poison(p.output);
  ctx.tracer = &tracer;
  k.forward(ctx, args_for(p));
  EXPECT_EQ(bytes_of(p.output), untraced) << "the traced forward wrote a different output";
  expect_well_formed(tracer);
}

using Names = std::vector<std::string>;

TEST(Trace, StandardPairStagesQuantized) {
  const testing::Problem p =
      testing::make_problem(spec_for(33, DType::bf16, QuantScheme::fp8_block));
  RecordingTracer t;
  run_traced("NoEPPrepareAndFinalize", "ReferenceExperts", p, Context::cpu(), t);
  const Names top = t.children(-1);
  ASSERT_GE(top.size(), 3u);
  EXPECT_EQ(top.front(), "prepare");
  EXPECT_EQ(top.back(), "finalize");
  EXPECT_EQ(top[top.size() - 2], "apply");
  EXPECT_EQ(t.children(t.find("prepare")), Names({"quantize"}));
  EXPECT_EQ(t.children(t.find("apply")),
            Names({"permute", "gather", "gemm1", "activation", "quantize2", "gemm2", "reduce"}));
}

TEST(Trace, UnquantizedForwardHasNoQuantizeStages) {
  const testing::Problem p = testing::make_problem(spec_for(20, DType::fp32, QuantScheme::none));
  RecordingTracer t;
  run_traced("NoEPPrepareAndFinalize", "ReferenceExperts", p, Context::cpu(), t);
  EXPECT_TRUE(t.children(t.find("prepare")).empty());
  EXPECT_EQ(t.children(t.find("apply")),
            Names({"permute", "gather", "gemm1", "activation", "gemm2", "reduce"}));
}

TEST(Trace, BatchedPairStages) {
  const testing::Problem p =
      testing::make_problem(spec_for(20, DType::fp32, QuantScheme::fp8_tensor));
  RecordingTracer t;
  run_traced("BatchedPrepareAndFinalize", "BatchedReferenceExperts", p, Context::cpu(), t);
  EXPECT_EQ(t.children(-1), Names({"prepare", "apply", "finalize"}));
  EXPECT_EQ(t.children(t.find("prepare")), Names({"quantize", "dispatch"}));
  EXPECT_EQ(t.children(t.find("apply")),
            Names({"gather", "gemm1", "activation", "quantize2", "gemm2", "scatter"}));
}

TEST(Trace, OneApplyRangePerChunk) {
  const testing::Problem p = testing::make_problem(spec_for(50, DType::fp32, QuantScheme::none));
  Context ctx = Context::cpu();
  ctx.chunk_size = 16;  // 50 tokens: chunks of 16, 16, 16, 2
  RecordingTracer t;
  run_traced("NoEPPrepareAndFinalize", "ReferenceExperts", p, ctx, t);
  int applies = 0;
  for (size_t i = 0; i < t.spans.size(); ++i) {
    if (t.spans[i].name != "apply") continue;
    ++applies;
    EXPECT_EQ(t.spans[i].depth, 0);
    EXPECT_EQ(t.children(static_cast<int>(i)),
              Names({"permute", "gather", "gemm1", "activation", "gemm2", "reduce"}))
        << "each chunk's apply holds its own stages";
  }
  EXPECT_EQ(applies, 4);
}

TEST(Trace, RangeClosesOnceAndOnUnwind) {
  RecordingTracer t;
  Context ctx = Context::cpu();
  ctx.tracer = &t;
  try {
    TraceRange outer(ctx, "outer");
    TraceRange early(ctx, "early");
    early.close();
    early.close();  // a second close is a no-op
    TraceRange inner(ctx, "inner");
    throw std::runtime_error("stage failed");
  } catch (const std::runtime_error&) {
  }
  expect_well_formed(t);
  EXPECT_EQ(t.children(-1), Names({"outer"}));
  EXPECT_EQ(t.children(t.find("outer")), Names({"early", "inner"}));

  // Without a tracer a range does nothing (and needs none).
  Context quiet = Context::cpu();
  { TraceRange r(quiet, "ignored"); }
  EXPECT_EQ(t.spans.size(), 3u);
}

}  // namespace
}  // namespace modmoe
