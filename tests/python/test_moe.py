"""ModularKernel.forward and fused_moe on the CPU backend against the float64 numpy reference."""

import numpy as np
import pytest

import modmoe
import reference as ref
from reference import make_problem, nan_like

FP32_TOL = 1e-4  # fp32 without quantization (the C++ suite's threshold)
FP8_TOL = 0.15  # fp8 schemes against the unquantized layer (three e4m3 roundings)
MIRRORED_FP8_TOL = 1e-3  # against a reference that applies the same quantization
BF16_TOL = 1e-2


def run_kernel(kernel, p, **kwargs):
    out = nan_like(p["x"].shape)
    result = kernel.forward(p["x"], p["w13"], p["w2"], p["topk_weights"], p["topk_ids"],
                            out=out, **kwargs)  # fmt: skip
    assert result is out
    return out


@pytest.mark.parametrize("M", [1, 7, 33])
def test_silu_gated_matches_reference(rng, M):
    p = make_problem(rng, M=M, K=64, N=48, E=8, topk=2)
    kernel = modmoe.ModularKernel(num_experts=8, hidden_size=64, intermediate_size=48, topk=2,
                                  dtype="fp32")  # fmt: skip
    assert kernel.prepare_finalize == "NoEPPrepareAndFinalize"
    assert kernel.experts == "ReferenceExperts"
    out = run_kernel(kernel, p)
    expected = ref.moe(p["x"], p["w13"], p["w2"], p["topk_weights"], p["topk_ids"])
    assert ref.relative_error(out, expected) < FP32_TOL


@pytest.mark.parametrize("activation", ["silu_no_mul", "gelu_tanh_no_mul"])
def test_no_mul_activation(rng, activation):
    p = make_problem(rng, M=9, K=64, N=32, E=4, topk=2, gated=False)
    kernel = modmoe.ModularKernel(num_experts=4, hidden_size=64, intermediate_size=32, topk=2,
                                  dtype="fp32", activation=activation)  # fmt: skip
    out = run_kernel(kernel, p)
    expected = ref.moe(p["x"], p["w13"], p["w2"], p["topk_weights"], p["topk_ids"],
                       activation=activation)  # fmt: skip
    assert ref.relative_error(out, expected) < FP32_TOL


@pytest.mark.parametrize("activation,layout", [("gelu", "up_gate"), ("swigluoai", "interleaved")])
def test_other_activations_and_layouts(rng, activation, layout):
    p = make_problem(rng, M=6, K=32, N=16, E=4, topk=2)
    out = modmoe.fused_moe(p["x"], p["w13"], p["w2"], p["topk_weights"], p["topk_ids"],
                           activation=activation, gated_layout=layout)  # fmt: skip
    expected = ref.moe(p["x"], p["w13"], p["w2"], p["topk_weights"], p["topk_ids"],
                       activation=activation, layout=layout)  # fmt: skip
    assert ref.relative_error(out, expected) < FP32_TOL


def test_expert_map_skips_experts_held_elsewhere(rng):
    p = make_problem(rng, M=16, K=64, N=32, E=16, topk=4, num_local=5)
    kernel = modmoe.ModularKernel(num_experts=16, num_local_experts=5, hidden_size=64,
                                  intermediate_size=32, topk=4, dtype="fp32")  # fmt: skip
    out = run_kernel(kernel, p, expert_map=p["expert_map"])
    expected = ref.moe(p["x"], p["w13"], p["w2"], p["topk_weights"], p["topk_ids"],
                       expert_map=p["expert_map"])  # fmt: skip
    assert ref.relative_error(out, expected) < FP32_TOL
    # Not the same as ignoring the map: some pairs go to experts held elsewhere.
    assert np.any(p["expert_map"][p["topk_ids"]] < 0)


def test_apply_router_weight_on_input(rng):
    p = make_problem(rng, M=8, K=32, N=16, E=4, topk=1)
    kernel = modmoe.ModularKernel(num_experts=4, hidden_size=32, intermediate_size=16, topk=1,
                                  dtype="fp32")  # fmt: skip
    out = run_kernel(kernel, p, apply_router_weight_on_input=True)
    expected = ref.moe(p["x"], p["w13"], p["w2"], p["topk_weights"], p["topk_ids"],
                       apply_router_weight_on_input=True)  # fmt: skip
    assert ref.relative_error(out, expected) < FP32_TOL
    # The weight enters before the nonlinearity: the plain layer differs.
    plain = ref.moe(p["x"], p["w13"], p["w2"], p["topk_weights"], p["topk_ids"])
    assert ref.relative_error(plain, expected) > 1e-2


def test_batched_prepare_finalize(rng):
    p = make_problem(rng, M=10, K=64, N=32, E=8, topk=2)
    kernel = modmoe.ModularKernel("BatchedPrepareAndFinalize", "auto", num_experts=8,
                                  hidden_size=64, intermediate_size=32, topk=2, dtype="fp32",
                                  max_num_tokens=16)  # fmt: skip
    assert kernel.experts == "BatchedReferenceExperts"
    out = run_kernel(kernel, p)
    expected = ref.moe(p["x"], p["w13"], p["w2"], p["topk_weights"], p["topk_ids"])
    assert ref.relative_error(out, expected) < FP32_TOL
    # fused_moe picks max_num_tokens = M for a batched P/F.
    out2 = modmoe.fused_moe(p["x"], p["w13"], p["w2"], p["topk_weights"], p["topk_ids"],
                            prepare_finalize="BatchedPrepareAndFinalize")  # fmt: skip
    assert ref.relative_error(out2, expected) < FP32_TOL


def test_fused_moe_allocates_caches_and_runs_in_place(rng):
    p = make_problem(rng, M=5, K=32, N=16, E=4, topk=2)
    expected = ref.moe(p["x"], p["w13"], p["w2"], p["topk_weights"], p["topk_ids"])
    modmoe._KERNEL_CACHE.clear()
    out = modmoe.fused_moe(p["x"], p["w13"], p["w2"], p["topk_weights"], p["topk_ids"])
    assert isinstance(out, np.ndarray) and out.dtype == np.float32 and out.shape == (5, 32)
    assert ref.relative_error(out, expected) < FP32_TOL
    x = p["x"].copy()
    result = modmoe.fused_moe(x, p["w13"], p["w2"], p["topk_weights"], p["topk_ids"], out=x)
    assert result is x
    np.testing.assert_array_equal(x, out)
    assert len(modmoe._KERNEL_CACHE) == 1  # the second call reused the kernel


def test_int64_ids_and_chunking_give_the_same_result(rng):
    p = make_problem(rng, M=20, K=32, N=16, E=6, topk=3)
    kernel = modmoe.ModularKernel(num_experts=6, hidden_size=32, intermediate_size=16, topk=3,
                                  dtype="fp32")  # fmt: skip
    whole = run_kernel(kernel, p)
    p64 = dict(p, topk_ids=p["topk_ids"].astype(np.int64))
    chunked = run_kernel(kernel, p64, chunk_size=3)
    np.testing.assert_allclose(chunked, whole, rtol=1e-6, atol=1e-6)


def test_fp16_inputs(rng):
    p = make_problem(rng, M=6, K=64, N=32, E=4, topk=2)
    half = {k: (v.astype(np.float16) if k in ("x", "w13", "w2") else v) for k, v in p.items()}
    out = modmoe.fused_moe(half["x"], half["w13"], half["w2"], p["topk_weights"], p["topk_ids"])
    assert out.dtype == np.float16
    expected = ref.moe(half["x"], half["w13"], half["w2"], p["topk_weights"], p["topk_ids"])
    assert ref.relative_error(out, expected) < BF16_TOL


def fake_quant(scheme, scale=None):
    """Quantize-dequantize of activations under a scheme (static when a scale is given)."""

    def apply(a):
        q, s = modmoe.quantize_fp8(np.ascontiguousarray(a, np.float32), scheme, scale=scale)
        return modmoe.dequantize_fp8(q, s, scheme)

    return apply


@pytest.mark.parametrize("scheme", ["fp8-tensor", "fp8-token", "fp8-block", "mxfp8"])
def test_fp8_weights(rng, scheme):
    p = make_problem(rng, M=8, K=256, N=128, E=4, topk=2)
    w13_q, w13_s = modmoe.quantize_weights(p["w13"], scheme)
    w2_q, w2_s = modmoe.quantize_weights(p["w2"], scheme)
    assert w13_q.dtype == np.uint8 and w13_q.shape == p["w13"].shape
    out = modmoe.fused_moe(p["x"], w13_q, w2_q, p["topk_weights"], p["topk_ids"],
                           w13_scale=w13_s, w2_scale=w2_s)  # fmt: skip
    kernel = next(iter(reversed(modmoe._KERNEL_CACHE.values())))
    assert kernel.quant == scheme  # inferred from the scales' layout
    # The reference mirrors every quantization: dequantized weights, GEMM1's input and GEMM2's
    # input quantized by the scheme (dynamic scales over all rows of the one Experts call).
    mirrored = ref.moe(modmoe.dequantize_fp8(*modmoe.quantize_fp8(p["x"], scheme), scheme),
                       modmoe.dequantize_fp8(w13_q, w13_s, scheme),
                       modmoe.dequantize_fp8(w2_q, w2_s, scheme), p["topk_weights"], p["topk_ids"],
                       quantize=fake_quant(scheme))  # fmt: skip
    assert ref.relative_error(out, mirrored) < MIRRORED_FP8_TOL
    exact = ref.moe(p["x"], p["w13"], p["w2"], p["topk_weights"], p["topk_ids"])
    assert ref.relative_error(out, exact) < FP8_TOL


def test_fp8_tensor_static_activation_scales(rng):
    p = make_problem(rng, M=8, K=128, N=64, E=4, topk=2)
    w13_q, w13_s = modmoe.quantize_weights(p["w13"], "fp8-tensor")
    w2_q, w2_s = modmoe.quantize_weights(p["w2"], "fp8-tensor")
    a13 = np.array([np.abs(p["x"]).max() / 448.0], np.float32)
    a2 = np.array([0.02], np.float32)
    kernel = modmoe.ModularKernel(num_experts=4, hidden_size=128, intermediate_size=64, topk=2,
                                  dtype="fp32", quant="fp8-tensor-static")  # fmt: skip
    assert kernel.static_act_scale
    out = run_kernel(kernel, dict(p, w13=w13_q, w2=w2_q), w13_scale=w13_s, w2_scale=w2_s,
                     a13_scale=a13, a2_scale=a2)  # fmt: skip
    mirrored = ref.moe(fake_quant("fp8-tensor", a13)(p["x"]),
                       modmoe.dequantize_fp8(w13_q, w13_s, "fp8-tensor"),
                       modmoe.dequantize_fp8(w2_q, w2_s, "fp8-tensor"), p["topk_weights"],
                       p["topk_ids"], quantize=fake_quant("fp8-tensor", a2))  # fmt: skip
    assert ref.relative_error(out, mirrored) < MIRRORED_FP8_TOL
    # The static scales are used: another scale (not a power of two apart) gives another result.
    other = run_kernel(kernel, dict(p, w13=w13_q, w2=w2_q), w13_scale=w13_s, w2_scale=w2_s,
                       a13_scale=a13, a2_scale=a2 * 3)  # fmt: skip
    assert ref.relative_error(other, out) > 1e-3


def test_bf16_through_ml_dtypes(rng):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    bf16 = ml_dtypes.bfloat16
    p = make_problem(rng, M=6, K=64, N=32, E=4, topk=2)
    x, w13, w2 = (p[k].astype(bf16) for k in ("x", "w13", "w2"))
    out = modmoe.fused_moe(x, w13, w2, p["topk_weights"], p["topk_ids"])
    assert out.dtype == bf16 and out.shape == (6, 64)
    expected = ref.moe(x.astype(np.float32), w13.astype(np.float32), w2.astype(np.float32),
                       p["topk_weights"], p["topk_ids"])  # fmt: skip
    assert ref.relative_error(out.astype(np.float32), expected) < BF16_TOL


def test_fp8_weights_as_ml_dtypes_float8(rng):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    p = make_problem(rng, M=4, K=128, N=128, E=2, topk=1)
    w13_q, w13_s = modmoe.quantize_weights(p["w13"], "fp8-block")
    w2_q, w2_s = modmoe.quantize_weights(p["w2"], "fp8-block")
    as_bytes = modmoe.fused_moe(p["x"], w13_q, w2_q, p["topk_weights"], p["topk_ids"],
                                w13_scale=w13_s, w2_scale=w2_s)  # fmt: skip
    f8 = ml_dtypes.float8_e4m3fn
    as_f8 = modmoe.fused_moe(p["x"], w13_q.view(f8), w2_q.view(f8), p["topk_weights"],
                             p["topk_ids"], w13_scale=w13_s, w2_scale=w2_s)  # fmt: skip
    np.testing.assert_array_equal(as_bytes, as_f8)


def test_read_only_inputs_are_accepted(rng):
    p = make_problem(rng, M=3, K=32, N=16, E=4, topk=2)
    for key in ("x", "w13", "w2", "topk_weights", "topk_ids"):
        p[key].setflags(write=False)
    out = modmoe.fused_moe(p["x"], p["w13"], p["w2"], p["topk_weights"], p["topk_ids"])
    expected = ref.moe(p["x"], p["w13"], p["w2"], p["topk_weights"], p["topk_ids"])
    assert ref.relative_error(out, expected) < FP32_TOL
