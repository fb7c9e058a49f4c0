// ModularKernel::forward: prepare -> [shared experts] -> workspaces -> apply per chunk -> finalize.
#include "modmoe/modular_kernel.h"

#include <algorithm>

#include "core/validate.h"
#include "modmoe/trace.h"

namespace modmoe {

namespace {

// Where workspace2 starts inside the one workspace allocation: a multiple of the largest
// alignment an allocator here gives (cudaMallocAsync and ArenaAllocator 256, the host 64), so
// each workspace starts as aligned as when it was an allocation of its own.
constexpr size_t kWorkspaceAlignment = 256;

bool same_layer(const MoEConfig& a, const MoEConfig& b) {
  return a.num_experts == b.num_experts && a.num_local_experts == b.num_local_experts &&
         a.hidden_size == b.hidden_size && a.intermediate_size == b.intermediate_size &&
         a.topk == b.topk && a.in_dtype == b.in_dtype && a.quant == b.quant &&
         a.activation == b.activation && a.gated_layout == b.gated_layout;
}

// Rows [start, end) of a per-row scale tensor ((M, G) per-token/group scales); a per-tensor
// scale (1-D) or an undefined one passes through unchanged.
Tensor scale_rows(const Tensor& t, int64_t start, int64_t end) {
  return (t.defined() && t.ndim() >= 2) ? t.slice(start, end) : t;
}

}  // namespace

PrepareReceiver PrepareAndFinalize::prepare_no_receive(const Context&, const PrepareArgs&) {
  MODMOE_FAIL() << name() << ": prepare_no_receive is not supported (has_prepare_no_receive() "
                << "is false); call prepare instead";
  return {};
}

ModularKernel::ModularKernel(std::shared_ptr<PrepareAndFinalize> prepare_finalize,
                             std::shared_ptr<Experts> experts, SharedExpertsFn shared_experts)
    : prepare_finalize_(std::move(prepare_finalize)),
      experts_(std::move(experts)),
      shared_experts_(std::move(shared_experts)) {
  MODMOE_CHECK(prepare_finalize_ != nullptr) << "ModularKernel: prepare_finalize must not be null";
  MODMOE_CHECK(experts_ != nullptr) << "ModularKernel: experts must not be null";
  const ActivationFormat pf_format = prepare_finalize_->activation_format();
  const auto [in_format, out_format] = experts_->activation_formats();
  MODMOE_CHECK(pf_format == in_format)
      << "ModularKernel: " << prepare_finalize_->name() << " produces "
      << activation_format_name(pf_format) << " activations but " << experts_->name()
      << " expects " << activation_format_name(in_format);
  MODMOE_CHECK(pf_format == out_format)
      << "ModularKernel: " << experts_->name() << " returns "
      << activation_format_name(out_format) << " outputs but " << prepare_finalize_->name()
      << " finalizes " << activation_format_name(pf_format) << " ones";
  MODMOE_CHECK(same_layer(prepare_finalize_->config(), experts_->config()))
      << "ModularKernel: the parts were built for different layers: "
      << prepare_finalize_->name() << " [" << prepare_finalize_->config().str() << "] vs "
      << experts_->name() << " [" << experts_->config().str() << "]";
  if (auto dtype = prepare_finalize_->topk_indices_dtype()) {
    MODMOE_CHECK(is_index_dtype(*dtype))
        << "ModularKernel: " << prepare_finalize_->name()
        << " declares a non-index topk_indices_dtype " << dtype_name(*dtype);
  }
}

void ModularKernel::forward(const Context& ctx, const ForwardArgs& args) const {
  static constexpr const char* kFn = "ModularKernel::forward";
  const MoEConfig& c = config();
  const Tensor& x = args.hidden_states;
  MODMOE_CHECK(x.defined() && x.ndim() == 2)
      << kFn << ": hidden_states must be 2-D (M, K), got " << x.describe();
  const int64_t M = x.size(0), K = c.hidden_size, topk = c.topk;
  check_tensor(kFn, "hidden_states", x, {c.in_dtype}, {M, K}, "(M, K)", ctx.device);
  check_tensor(kFn, "output", args.output, {c.in_dtype}, {M, K}, "(M, K)", ctx.device);
  MODMOE_CHECK(!args.output.overlaps(x) || args.output.data() == x.data())
      << kFn << ": output must be hidden_states itself (in place) or not overlap it, got output "
      << args.output.describe() << " at byte offset "
      << (static_cast<const char*>(args.output.data()) - static_cast<const char*>(x.data()))
      << " from hidden_states " << x.describe();
  check_tensor(kFn, "topk_weights", args.topk_weights, {DType::fp32}, {M, topk}, "(M, topk)",
               ctx.device);
  if (auto required = prepare_finalize_->topk_indices_dtype()) {
    check_tensor(kFn, "topk_ids", args.topk_ids, {*required}, {M, topk}, "(M, topk)", ctx.device);
  } else {
    check_tensor(kFn, "topk_ids", args.topk_ids, {DType::int32, DType::int64}, {M, topk},
                 "(M, topk)", ctx.device);
  }
  check_expert_weights(kFn, args.weights, c, ctx.device);
  // The output is written while routing and weights are still being read.
  for (const auto& [name, t] :
       {std::pair{"topk_weights", args.topk_weights}, std::pair{"topk_ids", args.topk_ids},
        std::pair{"expert_map", args.expert_map}, std::pair{"w13", args.weights.w13},
        std::pair{"w2", args.weights.w2}, std::pair{"w13_scale", args.weights.w13_scale},
        std::pair{"w2_scale", args.weights.w2_scale}}) {
    MODMOE_CHECK(!args.output.overlaps(t))
        << kFn << ": output must not overlap " << name << ", got output " << args.output.describe()
        << " and " << name << " " << t.describe();
  }
  if (args.expert_map.defined()) {
    MODMOE_CHECK(experts_->supports_expert_map())
        << kFn << ": " << experts_->name() << " does not support expert_map";
    check_tensor(kFn, "expert_map", args.expert_map, {DType::int32}, {c.num_experts}, "(E)",
                 ctx.device);
  } else {
    MODMOE_CHECK(c.num_local_experts == c.num_experts)
        << kFn << ": expert_map is required when the weights hold a subset of the experts "
        << "(E_local = " << c.num_local_experts << ", E = " << c.num_experts << ")";
  }
  MODMOE_CHECK(!args.apply_router_weight_on_input || topk == 1)
      << kFn << ": apply_router_weight_on_input requires topk == 1, got topk = " << topk;
  if (ctx.device.is_cpu()) {
    check_routing_values(kFn, args.topk_ids, c.num_experts, args.expert_map,
                         c.num_local_experts);
  }
  if (M == 0) return;

  // 1. Prepare (quantize + dispatch). When the dispatch can be received later, the shared
  //    experts run in between so they overlap the all-to-all.
  PrepareArgs pargs;
  pargs.a1 = x;
  pargs.topk_weights = args.topk_weights;
  pargs.topk_ids = args.topk_ids;
  pargs.num_experts = c.num_experts;
  pargs.expert_map = args.expert_map;
  pargs.apply_router_weight_on_input = args.apply_router_weight_on_input;
  pargs.weights = &args.weights;
  pargs.defer_input_quantization = c.quant.quantized() && experts_->expects_unquantized_input();
  PrepareResult prep;
  if (prepare_finalize_->has_prepare_no_receive()) {
    PrepareReceiver receive;
    {
      TraceRange range(ctx, "prepare");
      receive = prepare_finalize_->prepare_no_receive(ctx, pargs);
    }
    if (shared_experts_) {
      TraceRange range(ctx, "shared_experts");
      shared_experts_(ctx, x);
    }
    TraceRange range(ctx, "prepare_receive");
    prep = receive();
  } else {
    {
      TraceRange range(ctx, "prepare");
      prep = prepare_finalize_->prepare(ctx, pargs);
    }
    if (shared_experts_) {
      TraceRange range(ctx, "shared_experts");
      shared_experts_(ctx, x);
    }
  }

  // 2. Workspaces, sized for one chunk of tokens.
  const Tensor& a1q = prep.a1q;
  const ExpertTokensMetadata* meta = prep.expert_tokens_meta ? &*prep.expert_tokens_meta : nullptr;
  const bool standard = prepare_finalize_->activation_format() == ActivationFormat::Standard;
  const int64_t tokens = standard ? a1q.size(0) : M;
  const int64_t chunk = (standard && experts_->supports_chunking() && ctx.chunk_size > 0)
                            ? std::min(tokens, ctx.chunk_size)
                            : tokens;
  const int64_t N = c.intermediate_size, E = c.num_experts, E_local = c.num_local_experts;
  const WorkspaceShapes ws = experts_->workspace_shapes(chunk, N, K, topk, E, E_local, meta);
  const WorkspaceShapes full = experts_->workspace_shapes(tokens, N, K, topk, E, E_local, meta);
  Allocator* alloc = ctx.alloc();
  // Both workspaces in one allocation: inside a captured forward each allocation becomes an
  // allocation node and a free node, ~0.2-0.3 us each per replay on the H200 (docs/perf.md,
  // twenty-second session) — a few percent of a decode layer.
  const size_t ws_item = dtype_size(ws.workspace_dtype);
  const size_t ws13_bytes = static_cast<size_t>(shape_numel(ws.workspace13)) * ws_item;
  const size_t ws2_bytes = static_cast<size_t>(shape_numel(ws.workspace2)) * ws_item;
  const size_t ws2_offset = (ws13_bytes + kWorkspaceAlignment - 1) / kWorkspaceAlignment *
                            kWorkspaceAlignment;
  const OwnedTensor workspaces(alloc, DType::uint8,
                               {static_cast<int64_t>(ws2_bytes > 0 ? ws2_offset + ws2_bytes
                                                                   : ws13_bytes)},
                               ctx.stream);
  char* const ws_base = static_cast<char*>(workspaces.tensor().data());
  void* const ws13_data = ws13_bytes > 0 ? ws_base : nullptr;
  void* const ws2_data = ws2_bytes > 0 ? ws_base + ws2_offset : nullptr;

  // The fused output: written straight into `output` when the experts reduce themselves into
  // an (M, K) tensor of the output dtype; into workspace13 when the experts allow it and it fits;
  // else its own buffer.
  TopKWeightAndReducePtr reduce = experts_->finalize_weight_and_reduce_impl();
  Tensor fused_out;
  OwnedTensor fused_out_storage;
  const size_t fused_bytes = static_cast<size_t>(shape_numel(full.output)) * dtype_size(full.output_dtype);
  if (reduce->kind() == WeightAndReduceKind::NoOp && standard &&
      full.output == Shape{M, K} && full.output_dtype == c.in_dtype) {
    fused_out = args.output;
  } else if (experts_->workspace13_reusable_for_output() && chunk == tokens &&
             fused_bytes <= ws13_bytes) {
    fused_out = Tensor(ws13_data, full.output_dtype, full.output, ctx.device);
  } else {
    fused_out_storage = OwnedTensor(alloc, full.output_dtype, full.output, ctx.stream);
    fused_out = fused_out_storage.tensor();
  }

  // 3. Apply, one chunk of tokens at a time.
  for (int64_t start = 0; start < tokens; start += chunk) {
    const int64_t end = std::min(tokens, start + chunk);
    const WorkspaceShapes cws =
        (end - start == chunk) ? ws
                               : experts_->workspace_shapes(end - start, N, K, topk, E, E_local, meta);
    ApplyArgs a;
    a.output = standard ? fused_out.slice(start, end) : fused_out;
    a.hidden_states = standard ? a1q.slice(start, end) : a1q;
    a.a1q_scale = standard ? scale_rows(prep.a1q_scale, start, end) : prep.a1q_scale;
    a.weights = &args.weights;
    a.topk_weights = standard ? prep.topk_weights.slice(start, end) : prep.topk_weights;
    a.topk_ids = standard ? prep.topk_ids.slice(start, end) : prep.topk_ids;
    a.global_num_experts = E;
    a.expert_map = args.expert_map;
    a.workspace13 = Tensor(ws13_data, cws.workspace_dtype, cws.workspace13, ctx.device);
    a.workspace2 = Tensor(ws2_data, cws.workspace_dtype, cws.workspace2, ctx.device);
    a.expert_tokens_meta = meta;
    a.apply_router_weight_on_input = args.apply_router_weight_on_input;
    TraceRange range(ctx, "apply");
    experts_->apply(ctx, a);
  }

  // 4. Finalize: combine + the weight-and-reduce the experts asked for.
  FinalizeArgs f;
  f.output = args.output;
  f.fused_expert_output = fused_out;
  f.topk_weights = args.topk_weights;
  f.topk_ids = args.topk_ids;
  f.expert_map = args.expert_map;
  f.apply_router_weight_on_input = args.apply_router_weight_on_input;
  TraceRange range(ctx, "finalize");
  prepare_finalize_->finalize(ctx, f, *reduce);
}

}  // namespace modmoe
