#!/usr/bin/env python3
"""modmoe side by side with PyTorch MoE pipelines, in one process, on one GPU (issue 4 item 4).

    PYTHONPATH=<modmoe package> python3 bench/compare.py                  # standard shapes
    python3 bench/compare.py --models qwen3-30b-a3b --ms 1,128 --quants bf16

For each standard model shape (the table of tools/bench_models.h, duplicated below), each M and
each quant, with the same random weights, inputs and routing for everyone, it times:

  modmoe          modmoe.fused_moe on torch CUDA tensors (NoEPPrepareAndFinalize + "auto",
                  i.e. CudaExperts); bf16, or fp8-token (per-token activation scales, per-row
                  weight scales: the layout torch's rowwise fp8 GEMMs take);
  grouped_mm      bf16: stable sort of the (token, k) pairs by expert, gather, torch._grouped_mm
                  over w13, the gated activation, torch._grouped_mm over w2, top-k weighted sum;
  scaled_grouped_mm  fp8: the same with rowwise e4m3 quantization of the rows and
                  torch._scaled_grouped_mm (per-row activation scales, per-row weight scales);
  torch_loop      a per-expert loop of torch.mm (bf16) / torch._scaled_mm rowwise (fp8) over the
                  experts that received tokens. Its row counts are read on the host when the
                  problem is built, so its GEMM shapes are fixed at capture time (the generous
                  case for the loop, as in modmoe-bench's cuBLAS baseline).

Routing (softmax top-k renormalized; DeepSeek-V3: sigmoid, 8 groups keep 4, correction bias,
x2.5) is computed once per case and is an input to every pipeline, as in modmoe-bench.

Every pipeline runs once eagerly and its output is compared with modmoe's (relative error
||baseline - modmoe|| / ||modmoe||; a bf16 case above 2e-2 is a mismatch and makes the exit
status 1, an fp8 case above 6e-2 is flagged only). Then it is captured in a CUDA graph
(torch.cuda.CUDAGraph) and replayed --replays times (default 30, at least 20), each replay
between its own pair of CUDA events, the L2 overwritten before each replay outside the events
(--no-flush turns that off); the median is reported, min and max kept in the JSON. A pipeline
whose torch API is missing in the installed torch, or that fails, is skipped with the reason.

Writes bench/results/<UTC date>-<gpu>-compare.json (--json overrides) and prints a table with
the speedups (baseline time / modmoe time; > 1: modmoe faster).

Needs (GPU machine only): a CUDA GPU, torch with CUDA (2.8+ for torch._grouped_mm and
torch._scaled_grouped_mm; older torch skips those baselines), numpy, and the modmoe package
built with its CUDA backend (scripts/gpu-check's python step installs it with
pip --target; see docs/gpu.md, "Python comparison"). torch is imported only after the
arguments are parsed, so --help works anywhere.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import statistics
import sys
import traceback

# The standard MoE layer shapes: a copy of kModels in tools/bench_models.h (ARCHITECTURE.md §10).
# Keep the two in step: (name, E, topk, K, N, activation, routing).
MODELS = [
    ("mixtral-8x7b", 8, 2, 4096, 14336, "silu", "softmax_topk"),
    ("qwen3-30b-a3b", 128, 8, 2048, 768, "silu", "softmax_topk"),
    ("qwen3.5-35b-a3b", 256, 8, 2048, 512, "silu", "softmax_topk"),
    ("deepseek-v3", 256, 8, 7168, 2048, "silu", "deepseek"),
    ("gpt-oss-120b", 128, 4, 2880, 2880, "swigluoai", "softmax_topk"),
]
STANDARD_MS = [1, 16, 128, 1024, 8192]  # modmoe-bench --shapes standard
QUANTS = ["bf16", "fp8"]  # fp8 = modmoe fp8-token vs torch's rowwise fp8 GEMMs

SWIGLUOAI_ALPHA = 1.702  # include/modmoe/activation.h: kSwigluOaiAlpha, kSwigluOaiLimit
SWIGLUOAI_LIMIT = 7.0
FP8_MAX = 448.0
TOLERANCE = {"bf16": 2e-2, "fp8": 6e-2}


def parse_args(argv=None):
    names = [m[0] for m in MODELS]
    p = argparse.ArgumentParser(
        description="Time modmoe.fused_moe against torch._grouped_mm (bf16), "
        "torch._scaled_grouped_mm (fp8 rowwise) and a per-expert torch loop, all in CUDA "
        "graphs, on the standard MoE shapes (GPU machine; needs torch with CUDA and a CUDA "
        "build of modmoe on PYTHONPATH).",
        epilog=f"models: {', '.join(names)}. Output: bench/results/<date>-<gpu>-compare.json.",
    )
    p.add_argument("--models", default=",".join(names), help="comma-separated (default: all)")
    p.add_argument("--ms", default=",".join(map(str, STANDARD_MS)),
                   help="token counts, comma-separated (default: 1,16,128,1024,8192)")
    p.add_argument("--quants", default=",".join(QUANTS),
                   help="bf16 and/or fp8 (modmoe fp8-token vs rowwise torch fp8; default both)")
    p.add_argument("--baselines", default="grouped_mm,scaled_grouped_mm,torch_loop",
                   help="which torch pipelines to run (default: all three)")
    p.add_argument("--replays", type=int, default=30, help="graph replays timed (>= 20)")
    p.add_argument("--no-flush", action="store_true", help="keep the L2 between replays")
    p.add_argument("--align", type=int, default=16,
                   help="rows of each expert's group are padded to a multiple of this for "
                   "torch._scaled_grouped_mm (default 16)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", default=None, help="output path (default "
                   "bench/results/<UTC date>-<gpu>-compare.json)")
    args = p.parse_args(argv)
    args.models = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = [m for m in args.models if m not in names]
    if unknown:
        p.error(f"unknown model(s) {unknown}; known: {names}")
    args.ms = [int(m) for m in args.ms.split(",") if m.strip()]
    if not args.ms or min(args.ms) < 1:
        p.error("--ms needs token counts >= 1")
    args.quants = [q.strip() for q in args.quants.split(",") if q.strip()]
    if any(q not in QUANTS for q in args.quants):
        p.error(f"--quants takes {QUANTS}, got {args.quants}")
    args.baselines = [b.strip() for b in args.baselines.split(",") if b.strip()]
    if args.replays < 20:
        p.error(f"--replays must be >= 20 (the record needs a median of >= 20), got {args.replays}")
    return args


# ---- everything below runs with torch ----------------------------------------------------------


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        import torch
    except ImportError:
        sys.exit("bench/compare.py needs torch with CUDA (GPU machine)")
    if not torch.cuda.is_available():
        sys.exit("bench/compare.py: no CUDA device visible to torch")
    try:
        import modmoe
    except ImportError as e:
        sys.exit(f"bench/compare.py: cannot import modmoe ({e}); put the package on PYTHONPATH "
                 "(docs/gpu.md, 'Python comparison')")  # fmt: skip
    if not modmoe.cuda_available():
        sys.exit("bench/compare.py: this modmoe build has no CUDA backend (or sees no device); "
                 "build it with MODMOE_CUDA=ON")  # fmt: skip
    return Comparison(torch, modmoe, args).run()


class Comparison:
    def __init__(self, torch, modmoe, args):
        self.torch, self.modmoe, self.args = torch, modmoe, args
        self.device = torch.device("cuda", torch.cuda.current_device())
        props = torch.cuda.get_device_properties(self.device)
        self.props = props
        l2 = int(getattr(props, "L2_cache_size", 0) or 64 << 20)
        # Writing twice the L2 evicts every weight line a previous replay left there.
        self.flush_buffer = None if args.no_flush else torch.empty(
            2 * l2 // 4, dtype=torch.float32, device=self.device)  # fmt: skip
        self.missing = {}  # baseline -> why it cannot run with this torch
        if not hasattr(torch, "_grouped_mm"):
            self.missing["grouped_mm"] = f"torch {torch.__version__} has no torch._grouped_mm"
        if not hasattr(torch, "_scaled_grouped_mm"):
            self.missing["scaled_grouped_mm"] = (
                f"torch {torch.__version__} has no torch._scaled_grouped_mm")
        if not hasattr(torch, "float8_e4m3fn"):
            self.missing["fp8"] = f"torch {torch.__version__} has no float8_e4m3fn"
        elif not hasattr(torch, "_scaled_mm"):
            self.missing["torch_loop_fp8"] = f"torch {torch.__version__} has no torch._scaled_mm"
        for name, why in self.missing.items():
            print(f"note: {name} skipped: {why}")
        self.cases = []
        self.bf16_mismatches = 0

    # ---- problem ----------------------------------------------------------------------------

    def weights(self, E, K, N, generator):
        """bf16 w13 (E, 2N, K) [gate; up] and w2 (E, K, N), N(0, 1/fan_in), made per expert
        so that DeepSeek-V3's 22 GB need no fp32 temporaries of the whole tensor."""
        torch = self.torch
        w13 = torch.empty((E, 2 * N, K), dtype=torch.bfloat16, device=self.device)
        w2 = torch.empty((E, K, N), dtype=torch.bfloat16, device=self.device)
        for e in range(E):
            w13[e].copy_(torch.randn((2 * N, K), generator=generator, device=self.device)
                         / math.sqrt(K))  # fmt: skip
            w2[e].copy_(torch.randn((K, N), generator=generator, device=self.device)
                        / math.sqrt(N))  # fmt: skip
        return w13, w2

    def quantize_rows(self, w):
        """Per-row e4m3 quantization of (rows, cols) or (E, rows, cols): q, scale = amax / 448
        (fp32, shape without the last dimension) — modmoe's fp8-token weight layout and the
        rowwise scales torch's fp8 GEMMs take."""
        torch = self.torch
        amax = w.abs().amax(dim=-1).float()
        scale = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
        q = (w.float() / scale.unsqueeze(-1)).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
        return q, scale

    def quantize_weights(self, w):
        torch = self.torch
        q = torch.empty(w.shape, dtype=torch.float8_e4m3fn, device=self.device)
        scale = torch.empty(w.shape[:2], dtype=torch.float32, device=self.device)
        for e in range(w.shape[0]):
            q[e], scale[e] = self.quantize_rows(w[e])
        return q, scale

    def routing(self, model, M, generator):
        torch, modmoe = self.torch, self.modmoe
        _, E, topk, _, _, _, kind = model
        logits = torch.randn((M, E), generator=generator, device=self.device)
        if kind == "deepseek":
            bias = torch.randn((E,), generator=generator, device=self.device) * 0.1
            return modmoe.select_experts(logits, topk, renormalize=True, num_expert_group=8,
                                         topk_group=4, scoring_func="sigmoid",
                                         e_score_correction_bias=bias, routed_scaling_factor=2.5,
                                         ids_dtype="int64")  # fmt: skip
        return modmoe.select_experts(logits, topk, renormalize=True, ids_dtype="int64")

    # ---- the torch pipelines ----------------------------------------------------------------

    def activation(self, h, N, kind):
        """act(gate) * up on GEMM1's (rows, 2N) output, [gate; up] halves, in fp32."""
        torch = self.torch
        gate, up = h[:, :N].float(), h[:, N:].float()
        if kind == "swigluoai":
            gate = gate.clamp(max=SWIGLUOAI_LIMIT)
            up = up.clamp(-SWIGLUOAI_LIMIT, SWIGLUOAI_LIMIT)
            return gate * torch.sigmoid(SWIGLUOAI_ALPHA * gate) * (up + 1)
        return torch.nn.functional.silu(gate) * up

    def quantize_act(self, a):
        """Rowwise dynamic e4m3 of (rows, cols) fp32: q, scale (rows,) (zero rows: scale 1)."""
        return self.quantize_rows(a)

    def sort_pairs(self, ids, E):
        """Pairs sorted by expert (stable): order (pair index per sorted row), the token of each
        sorted row, and the end offset of each expert's rows (int32, as _grouped_mm takes)."""
        torch = self.torch
        flat = ids.reshape(-1)
        order = torch.argsort(flat, stable=True)
        counts = torch.zeros(E, dtype=torch.int32, device=self.device)
        counts.scatter_add_(0, flat, torch.ones_like(flat, dtype=torch.int32))
        return order, order // ids.shape[1], counts

    def weighted_sum(self, y_sorted, order, topk_weights):
        """Unpermute (rows back to pair order) and sum the top-k rows of each token, weighted;
        a batched GEMM (M, 1, topk) x (M, topk, K) with fp32 accumulation -> bf16 (M, K)."""
        torch = self.torch
        M, topk = topk_weights.shape
        y_pairs = torch.empty_like(y_sorted).index_copy_(0, order, y_sorted)
        out = torch.bmm(topk_weights.to(y_pairs.dtype).unsqueeze(1), y_pairs.view(M, topk, -1))
        return out.view(M, -1)

    def grouped_bf16(self, p):
        torch = self.torch
        order, token, counts = self.sort_pairs(p["ids"], p["E"])
        offs = torch.cumsum(counts, 0, dtype=torch.int32)
        xs = p["x"].index_select(0, token)
        h = torch._grouped_mm(xs, p["w13"].transpose(-2, -1), offs=offs)
        a = self.activation(h, p["N"], p["act"]).to(torch.bfloat16)
        y = torch._grouped_mm(a, p["w2"].transpose(-2, -1), offs=offs)
        return self.weighted_sum(y, order, p["topk_weights"])

    def grouped_fp8(self, p):
        """Rows of each expert start at a multiple of --align (padding rows are zero and their
        outputs unused): the fp8 grouped GEMM wants aligned groups."""
        torch = self.torch
        align = max(1, self.args.align)
        order, token, counts = self.sort_pairs(p["ids"], p["E"])
        pairs = order.numel()
        padded = (counts + (align - 1)) // align * align
        padded_end = torch.cumsum(padded, 0, dtype=torch.int32)
        start = torch.cumsum(counts, 0) - counts  # first sorted row of each expert
        expert_of_row = p["ids"].reshape(-1)[order]
        row = torch.arange(pairs, device=self.device)
        dest = (padded_end - padded).long()[expert_of_row] + (row - start[expert_of_row])
        rows = pairs + p["E"] * (align - 1)  # the most padded rows there can be
        xq, xs_scale = self.quantize_act(p["x"].index_select(0, token))
        xq_pad = torch.zeros((rows, xq.shape[1]), dtype=torch.uint8, device=self.device)
        xq_pad[dest] = xq.view(torch.uint8)
        xs_scale_pad = torch.ones(rows, dtype=torch.float32, device=self.device)
        xs_scale_pad[dest] = xs_scale
        h = torch._scaled_grouped_mm(
            xq_pad.view(torch.float8_e4m3fn), p["w13_q"].transpose(-2, -1), xs_scale_pad,
            p["w13_s"], offs=padded_end, out_dtype=torch.bfloat16)  # fmt: skip
        aq, a_scale = self.quantize_act(self.activation(h, p["N"], p["act"]))
        y = torch._scaled_grouped_mm(aq, p["w2_q"].transpose(-2, -1), a_scale, p["w2_s"],
                                     offs=padded_end, out_dtype=torch.bfloat16)  # fmt: skip
        return self.weighted_sum(y[dest], order, p["topk_weights"])

    def loop(self, p, fp8):
        """Per expert that received tokens: GEMM1, activation, GEMM2 on its slice of the sorted
        rows; segments from the host (fixed at capture)."""
        torch = self.torch
        order, token, _ = self.sort_pairs(p["ids"], p["E"])
        xs = p["x"].index_select(0, token)
        y = torch.empty((xs.shape[0], p["K"]), dtype=torch.bfloat16, device=self.device)
        if fp8:
            xq, x_scale = self.quantize_act(xs)
        for e, s, c in p["segments"]:
            if fp8:
                # cuBLAS's rowwise-scaled fp8 GEMM wants a multiple of 16 rows: pad the slice
                # with zero rows (scale 1) and drop them from the result.
                cp = -(-c // 16) * 16
                xe = torch.zeros((cp, p["K"]), dtype=xq.dtype, device=self.device)
                xe[:c] = xq[s:s + c]
                se = torch.ones((cp,), dtype=torch.float32, device=self.device)
                se[:c] = x_scale[s:s + c]
                h = torch._scaled_mm(xe, p["w13_q"][e].t(), scale_a=se.unsqueeze(1),
                                     scale_b=p["w13_s"][e].unsqueeze(0), out_dtype=torch.bfloat16)
                aq, a_scale = self.quantize_act(self.activation(h, p["N"], p["act"]))
                y[s:s + c] = torch._scaled_mm(aq, p["w2_q"][e].t(), scale_a=a_scale.unsqueeze(1),
                                              scale_b=p["w2_s"][e].unsqueeze(0),
                                              out_dtype=torch.bfloat16)[:c]  # fmt: skip
            else:
                h = torch.mm(xs[s:s + c], p["w13"][e].t())
                a = self.activation(h, p["N"], p["act"]).to(torch.bfloat16)
                torch.mm(a, p["w2"][e].t(), out=y[s:s + c])
        return self.weighted_sum(y, order, p["topk_weights"])

    def modmoe_fn(self, p, fp8):
        out = self.torch.empty_like(p["x"])
        if fp8:
            return lambda: self.modmoe.fused_moe(
                p["x"], p["w13_q"], p["w2_q"], p["topk_weights"], p["ids"],
                w13_scale=p["w13_s"], w2_scale=p["w2_s"], quant="fp8-token",
                activation=p["act"], out=out)  # fmt: skip
        return lambda: self.modmoe.fused_moe(p["x"], p["w13"], p["w2"], p["topk_weights"],
                                             p["ids"], activation=p["act"], out=out)

    # ---- timing -----------------------------------------------------------------------------

    def time_graph(self, fn):
        """Captures fn in a CUDA graph and times its replays: (stats dict, graph output)."""
        torch = self.torch
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up off the default stream, as torch advises
            fn()
            fn()
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = fn()
        graph.replay()
        torch.cuda.synchronize()
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                  for _ in range(self.args.replays)]  # fmt: skip
        for start, end in events:
            if self.flush_buffer is not None:
                self.flush_buffer.fill_(1.0)  # outside the events
            start.record()
            graph.replay()
            end.record()
        torch.cuda.synchronize()
        times = [start.elapsed_time(end) * 1e3 for start, end in events]  # ms -> us
        stats = {"time_us": statistics.median(times), "time_min_us": min(times),
                 "time_max_us": max(times), "replays": len(times)}  # fmt: skip
        return stats, out, graph

    def rel_diff(self, a, b):
        a, b = a.float(), b.float()
        return float((a - b).norm() / b.norm().clamp_min(1e-30))

    # ---- one case ---------------------------------------------------------------------------

    def run_case(self, model, quant, M, weights, gen):
        torch = self.torch
        name, E, topk, K, N, act, _ = model
        fp8 = quant == "fp8"
        topk_weights, ids = self.routing(model, M, gen)
        x = torch.randn((M, K), generator=gen, device=self.device).to(torch.bfloat16)
        p = dict(weights, x=x, ids=ids, topk_weights=topk_weights, E=E, K=K, N=N, act=act)
        counts = torch.bincount(ids.reshape(-1), minlength=E).tolist()  # host: outside graphs
        segments, s = [], 0
        for e, c in enumerate(counts):
            if c:
                segments.append((e, s, c))
            s += c
        p["segments"] = segments
        flops = 2.0 * M * topk * (2 * N * K + K * N)
        case = {"model": name, "quant": "fp8-token" if fp8 else "bf16", "M": M, "E": E,
                "topk": topk, "K": K, "N": N, "activation": act, "experts_hit": len(segments),
                "flops": flops, "baselines": {}}  # fmt: skip

        mm = self.modmoe_fn(p, fp8)
        reference = mm().clone()
        torch.cuda.synchronize()
        stats, graph_out, graph = self.time_graph(mm)
        case["modmoe"] = dict(stats, tflops=flops / stats["time_us"] / 1e6,
                              graph_vs_eager_rel_diff=self.rel_diff(graph_out, reference))
        del graph
        if not torch.isfinite(reference).all():
            case["modmoe"]["error"] = "non-finite outputs"

        pipelines = []
        if fp8:
            pipelines.append(("scaled_grouped_mm", lambda: self.grouped_fp8(p)))
            pipelines.append(("torch_loop", lambda: self.loop(p, True)))
        else:
            pipelines.append(("grouped_mm", lambda: self.grouped_bf16(p)))
            pipelines.append(("torch_loop", lambda: self.loop(p, False)))
        for base, fn in pipelines:
            if base not in self.args.baselines:
                continue
            why = self.missing.get(base) or (self.missing.get("torch_loop_fp8")
                                             if base == "torch_loop" and fp8 else None)
            if why:
                case["baselines"][base] = {"skipped": why}
                continue
            result = {}
            try:
                eager = fn()
                torch.cuda.synchronize()
                result["rel_diff"] = self.rel_diff(eager, reference)  # checked before timing
                result["matches"] = result["rel_diff"] <= TOLERANCE[quant]
                stats, graph_out, graph = self.time_graph(fn)
                result.update(stats)
                result["graph_vs_eager_rel_diff"] = self.rel_diff(graph_out, eager)
                result["speedup"] = stats["time_us"] / case["modmoe"]["time_us"]
                del graph, graph_out, eager
            except Exception as e:  # an API this torch lacks for the shape, capture failure, ...
                message = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
                result = {"skipped": message[:300]}
                if os.environ.get("MODMOE_COMPARE_TRACEBACK"):
                    traceback.print_exc()
            if not fp8 and result.get("matches") is False:
                self.bf16_mismatches += 1
            case["baselines"][base] = result
            torch.cuda.empty_cache()
        return case

    def print_row(self, case):
        cells = [f"{case['model']:<16}", f"{case['quant']:<9}", f"{case['M']:>5}",
                 f"{case['modmoe']['time_us']:>10.1f}"]  # fmt: skip
        notes = []
        for base in ("grouped_mm", "scaled_grouped_mm", "torch_loop"):
            r = case["baselines"].get(base)
            if r is None:
                continue
            if "skipped" in r:
                cells.append(f"{base}: skipped")
                notes.append(f"{base}: {r['skipped']}")
                continue
            flag = "" if r["matches"] else " MISMATCH"
            cells.append(f"{base} {r['time_us']:.1f} us x{r['speedup']:.2f} "
                         f"(rel {r['rel_diff']:.1e}{flag})")  # fmt: skip
        print("  ".join(cells), flush=True)
        for n in notes:
            print(f"    {n}")

    def run(self) -> int:
        torch, args = self.torch, self.args
        print(f"device: {self.props.name}, torch {torch.__version__} (CUDA {torch.version.cuda}), "
              f"modmoe {getattr(self.modmoe, '__version__', '?')}; {args.replays} replays, "
              f"L2 flush {'off' if args.no_flush else 'on'}")  # fmt: skip
        print("model            quant         M   modmoe_us  baselines: time, speedup = "
              "baseline / modmoe (>1: modmoe faster), rel diff vs modmoe")
        for model in (m for m in MODELS if m[0] in args.models):
            name, E, topk, K, N, act, _ = model
            gen = torch.Generator(device=self.device)
            gen.manual_seed(args.seed)
            w13, w2 = self.weights(E, K, N, gen)
            for quant in args.quants:
                if quant == "fp8" and "fp8" in self.missing:
                    continue
                weights = {"w13": w13, "w2": w2}
                if quant == "fp8":
                    w13_q, w13_s = self.quantize_weights(w13)
                    w2_q, w2_s = self.quantize_weights(w2)
                    weights.update(w13_q=w13_q, w13_s=w13_s, w2_q=w2_q, w2_s=w2_s)
                for M in args.ms:
                    try:
                        case = self.run_case(model, quant, M, weights, gen)
                    except Exception as e:  # modmoe itself failed: record it, go on
                        case = {"model": name, "quant": quant, "M": M,
                                "error": f"{type(e).__name__}: {e}"[:500], "baselines": {}}
                        print(f"{name:<16} {quant:<9} {M:>5}  ERROR {case['error']}", flush=True)
                        self.cases.append(case)
                        continue
                    self.cases.append(case)
                    self.print_row(case)
                del weights
                torch.cuda.empty_cache()
            del w13, w2
            torch.cuda.empty_cache()
        return self.write()

    def write(self) -> int:
        torch = self.torch
        now = datetime.datetime.now(datetime.timezone.utc)
        gpu = self.props.name.lower().replace("nvidia", "").strip().replace(" ", "-")
        gpu = "".join(ch for ch in gpu if ch.isalnum() or ch == "-") or "gpu"
        path = self.args.json or os.path.join(
            os.path.dirname(os.path.abspath(__file__)), "results",
            f"{now:%Y-%m-%d}-{gpu}-compare.json")  # fmt: skip
        errors = sum(1 for c in self.cases
                     if "error" in c or "error" in c.get("modmoe", {}))  # non-finite outputs
        results = {
            "tool": "modmoe-compare", "date": now.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "device": {"name": self.props.name,
                       "compute_capability": f"{self.props.major}.{self.props.minor}",
                       "sm_count": self.props.multi_processor_count,
                       "torch": torch.__version__, "cuda": torch.version.cuda},
            "settings": {"replays": self.args.replays, "flush_l2": not self.args.no_flush,
                         "seed": self.args.seed, "align_fp8_groups": self.args.align,
                         "modmoe": "fused_moe: NoEPPrepareAndFinalize + auto; fp8 = fp8-token",
                         "tolerance": TOLERANCE},
            "summary": {"cases": len(self.cases), "errors": errors,
                        "bf16_baseline_mismatches": self.bf16_mismatches},
            "cases": self.cases,
        }  # fmt: skip
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, "w") as f:
            json.dump(results, f, indent=2)
        print(f"{len(self.cases)} cases, {errors} errors, {self.bf16_mismatches} bf16 "
              f"mismatches; wrote {path}")  # fmt: skip
        return 1 if errors or self.bf16_mismatches else 0


if __name__ == "__main__":
    sys.exit(main())
