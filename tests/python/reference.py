"""float64 numpy references for the Python tests: the MoE layer and the routers.

Written from the definitions in docs/formats.md and docs/modular-kernel.md, independently of
the C++ oracle, so a binding that passes arguments in the wrong place cannot agree with it.
"""

import numpy as np


def activation_gate(name, g):
    base = name.replace("_no_mul", "")
    if base == "silu":
        return g / (1.0 + np.exp(-g))
    if base == "gelu":
        from math import erf

        return 0.5 * g * (1.0 + np.vectorize(erf)(g / np.sqrt(2.0)))
    if base == "gelu_tanh":
        c = np.sqrt(2.0 / np.pi)
        return 0.5 * g * (1.0 + np.tanh(c * (g + 0.044715 * g**3)))
    if base == "swigluoai":
        x = np.minimum(g, 7.0)
        return x / (1.0 + np.exp(-1.702 * x))
    raise ValueError(name)


def gated(h, activation="silu", layout="gate_up"):
    """act(gate) * up of GEMM1 outputs h (T, 2N), or act(h) for the *_no_mul forms."""
    if activation.endswith("_no_mul"):
        return activation_gate(activation, h)
    n = h.shape[1] // 2
    if layout == "gate_up":
        gate, up = h[:, :n], h[:, n:]
    elif layout == "up_gate":
        up, gate = h[:, :n], h[:, n:]
    else:  # interleaved
        gate, up = h[:, 0::2], h[:, 1::2]
    if activation == "swigluoai":
        up = np.clip(up, -7.0, 7.0) + 1.0
    return activation_gate(activation, gate) * up


def moe(x, w13, w2, topk_weights, topk_ids, activation="silu", layout="gate_up",
        expert_map=None, apply_router_weight_on_input=False, quantize=None):  # fmt: skip
    """out[t] = sum_k w[t, k] * w2[e] @ act(w13[e] @ x[t]), e = the local expert of
    topk_ids[t, k]; float64 (M, K).

    quantize: optional function applied to GEMM2's input, all (token, k) pairs at once as one
    (pairs, N) matrix in token-major order (a quantize-dequantize, to mirror fp8 schemes).
    """
    x = np.asarray(x, np.float64)
    w13 = np.asarray(w13, np.float64)
    w2 = np.asarray(w2, np.float64)
    weights = np.asarray(topk_weights, np.float64)
    pairs = []  # (token, local expert, weight)
    for t in range(x.shape[0]):
        for k in range(topk_ids.shape[1]):
            e = int(topk_ids[t, k])
            local = e if expert_map is None else int(expert_map[e])
            if local >= 0:
                pairs.append((t, local, 1.0 if apply_router_weight_on_input else weights[t, k]))
    rows = np.array([x[t] for t, _, _ in pairs]).reshape(len(pairs), x.shape[1])
    if apply_router_weight_on_input:
        # Applied before the experts and rounded back to the input dtype (fp32 here).
        scaled = rows * np.array([weights[t, 0] for t, _, _ in pairs])[:, None]
        rows = scaled.astype(np.float32).astype(np.float64)
    a = np.stack([gated(rows[i : i + 1] @ w13[e].T, activation, layout)[0]
                  for i, (_, e, _) in enumerate(pairs)]) if pairs else None  # fmt: skip
    out = np.zeros_like(x)
    if a is None:
        return out
    if quantize is not None:
        a = np.asarray(quantize(a.astype(np.float32)), np.float64)
    for i, (t, e, weight) in enumerate(pairs):
        out[t] += weight * (w2[e] @ a[i])
    return out


def relative_error(actual, expected):
    actual = np.asarray(actual, np.float64)
    expected = np.asarray(expected, np.float64)
    assert np.all(np.isfinite(actual)), "output has NaN/inf"
    return np.linalg.norm(actual - expected) / max(np.linalg.norm(expected), 1e-30)


def topk_lowest_index(scores, topk):
    """Indices of the topk largest scores per row, ties to the lower index."""
    order = np.argsort(-scores, axis=1, kind="stable")
    return order[:, :topk]


def softmax_topk(logits, topk, renormalize):
    logits = np.asarray(logits, np.float64)
    p = np.exp(logits - logits.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    ids = topk_lowest_index(p, topk)
    w = np.take_along_axis(p, ids, axis=1)
    if renormalize:
        w /= w.sum(axis=1, keepdims=True)
    return w, ids


def grouped_topk(logits, topk, num_groups, topk_groups, scoring, renormalize, bias, scale):
    """DeepSeek-V3 routing (router.h)."""
    logits = np.asarray(logits, np.float64)
    if scoring == "sigmoid":
        s = 1.0 / (1.0 + np.exp(-logits))
    else:
        s = np.exp(logits - logits.max(axis=1, keepdims=True))
        s /= s.sum(axis=1, keepdims=True)
    biased = s + (0.0 if bias is None else np.asarray(bias, np.float64))
    M, E = s.shape
    per_group = E // num_groups
    grouped = biased.reshape(M, num_groups, per_group)
    top2 = -np.sort(-grouped, axis=2)[:, :, : min(2, per_group)]
    group_scores = top2.sum(axis=2)
    kept = topk_lowest_index(group_scores, topk_groups)
    mask = np.zeros((M, num_groups), bool)
    np.put_along_axis(mask, kept, True, axis=1)
    masked = np.where(np.repeat(mask, per_group, axis=1), biased, -np.inf)
    ids = topk_lowest_index(masked, topk)
    w = np.take_along_axis(s, ids, axis=1)
    if renormalize:
        w /= w.sum(axis=1, keepdims=True)
    return w * scale, ids


def make_problem(rng, M=7, K=64, N=32, E=8, topk=2, gated=True, num_local=None):
    """Random fp32 MoE inputs (weights scaled so the output stays O(1)), routing included.

    With num_local < E: an expert_map holding num_local of the E experts in random order.
    """
    x = rng.standard_normal((M, K), dtype=np.float32)
    E_local = E if num_local is None else num_local
    rows = 2 * N if gated else N
    w13 = (rng.standard_normal((E_local, rows, K)) / np.sqrt(K)).astype(np.float32)
    w2 = (rng.standard_normal((E_local, K, N)) / np.sqrt(N)).astype(np.float32)
    logits = rng.standard_normal((M, E), dtype=np.float32)
    topk_ids = np.stack([rng.choice(E, size=topk, replace=False) for _ in range(M)])
    topk_ids = topk_ids.astype(np.int32)
    topk_weights = rng.uniform(0.1, 1.0, size=(M, topk)).astype(np.float32)
    expert_map = None
    if num_local is not None:
        expert_map = np.full(E, -1, np.int32)
        held = rng.choice(E, size=num_local, replace=False)
        expert_map[held] = rng.permutation(num_local).astype(np.int32)
    return dict(x=x, w13=w13, w2=w2, logits=logits, topk_ids=topk_ids,
                topk_weights=topk_weights, expert_map=expert_map)  # fmt: skip


def nan_like(shape, dtype=np.float32):
    """A poisoned output: a kernel that skips a row leaves NaN there."""
    return np.full(shape, np.nan, dtype=dtype)
