"""select_experts, the fp8 quantizers and the catalog (list_parts, check_compatibility)."""

import numpy as np
import pytest

import modmoe
import reference as ref


@pytest.mark.parametrize("renormalize", [True, False])
@pytest.mark.parametrize("ids_dtype,np_ids", [("int32", np.int32), ("int64", np.int64)])
def test_softmax_topk(rng, renormalize, ids_dtype, np_ids):
    logits = rng.standard_normal((13, 16), dtype=np.float32)
    weights, ids = modmoe.select_experts(logits, 4, renormalize=renormalize, ids_dtype=ids_dtype)
    assert weights.dtype == np.float32 and weights.shape == (13, 4)
    assert ids.dtype == np_ids and ids.shape == (13, 4)
    expected_w, expected_ids = ref.softmax_topk(logits, 4, renormalize)
    np.testing.assert_array_equal(ids, expected_ids)
    np.testing.assert_allclose(weights, expected_w, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("scoring", ["sigmoid", "softmax"])
def test_grouped_topk_deepseek_style(rng, scoring):
    E, groups, kept, topk = 32, 8, 3, 6
    logits = rng.standard_normal((9, E), dtype=np.float32)
    bias = (0.1 * rng.standard_normal(E)).astype(np.float32)
    weights, ids = modmoe.select_experts(
        logits, topk, renormalize=True, num_expert_group=groups, topk_group=kept,
        scoring_func=scoring, e_score_correction_bias=bias, routed_scaling_factor=2.5,
    )  # fmt: skip
    expected_w, expected_ids = ref.grouped_topk(logits, topk, groups, kept, scoring, True, bias,
                                                2.5)  # fmt: skip
    np.testing.assert_array_equal(ids, expected_ids)
    np.testing.assert_allclose(weights, expected_w, rtol=1e-5, atol=1e-6)


def test_sigmoid_without_groups(rng):
    logits = rng.standard_normal((5, 8), dtype=np.float32)
    weights, ids = modmoe.select_experts(logits, 2, renormalize=False, scoring_func="sigmoid")
    expected_w, expected_ids = ref.grouped_topk(logits, 2, 1, 1, "sigmoid", False, None, 1.0)
    np.testing.assert_array_equal(ids, expected_ids)
    np.testing.assert_allclose(weights, expected_w, rtol=1e-5, atol=1e-6)


ACT_SCHEMES = ["fp8-tensor", "fp8-token", "fp8-block", "mxfp8"]


@pytest.mark.parametrize("scheme", ACT_SCHEMES)
def test_activation_quantize_round_trip(rng, scheme):
    x = (rng.standard_normal((9, 300)) * rng.uniform(0.1, 10.0, (9, 1))).astype(np.float32)
    q, scale = modmoe.quantize_fp8(x, scheme)
    assert q.dtype == np.uint8 and q.shape == x.shape
    assert scale.shape == modmoe.act_scale_shape(scheme, 9, 300)
    assert scale.dtype == (np.uint8 if scheme == "mxfp8" else np.float32)
    back = modmoe.dequantize_fp8(q, scale, scheme)
    assert back.dtype == np.float32 and back.shape == x.shape
    # e4m3 keeps 3 mantissa bits: each element within 2^-4 of its value (or of the group's
    # smallest step near zero).
    assert ref.relative_error(back, x) < 0.05
    if scheme == "fp8-token":  # the dynamic scale maps each row's amax to 448
        np.testing.assert_allclose(scale[:, 0], np.abs(x).max(axis=1) / 448.0, rtol=1e-6)


def test_dequantize_agrees_with_ml_dtypes_decoding(rng):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    x = rng.standard_normal((4, 256), dtype=np.float32)
    q, scale = modmoe.quantize_fp8(x, "fp8-block")
    decoded = q.view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    expected = decoded * np.repeat(scale, 128, axis=1)
    np.testing.assert_array_equal(modmoe.dequantize_fp8(q, scale, "fp8-block"), expected)


def test_static_scale_is_used_and_returned(rng):
    x = rng.standard_normal((3, 64), dtype=np.float32)
    given = np.array([0.5], np.float32)
    q, scale = modmoe.quantize_fp8(x, "fp8-tensor", scale=given)
    assert scale is given
    back = modmoe.dequantize_fp8(q, given, "fp8-tensor")
    # |x| < 4 << 448 * 0.5: no saturation, the round trip error is the rounding only.
    np.testing.assert_allclose(back, x, rtol=2**-4, atol=0.5 * 2**-9)


@pytest.mark.parametrize("scheme", ACT_SCHEMES)
def test_weight_quantize_round_trip(rng, scheme):
    w = (rng.standard_normal((3, 160, 96)) * 0.05).astype(np.float32)
    q, scale = modmoe.quantize_weights(w, scheme)
    assert q.shape == w.shape and scale.shape == modmoe.weight_scale_shape(scheme, 3, 160, 96)
    back = modmoe.dequantize_fp8(q, scale, scheme)
    assert ref.relative_error(back, w) < 0.05


def test_list_parts():
    parts = {p["name"]: p for p in modmoe.list_parts()}
    for name in ["NoEPPrepareAndFinalize", "BatchedPrepareAndFinalize", "ReferenceExperts",
                 "BatchedReferenceExperts"]:  # fmt: skip
        assert name in parts
        assert "cpu" in parts[name]["backends"]
    noep, ref_experts = parts["NoEPPrepareAndFinalize"], parts["ReferenceExperts"]
    assert noep["kind"] == "prepare_finalize" and noep["format"] == "standard"
    assert parts["BatchedPrepareAndFinalize"]["format"] == "batched"
    assert ref_experts["kind"] == "experts"
    assert set(ref_experts["in_dtypes"]) >= {"bf16", "fp16", "fp32"}
    assert set(ref_experts["quant_schemes"]) == {"none", "fp8-tensor", "fp8-token", "fp8-block",
                                                 "mxfp8"}  # fmt: skip
    assert "silu_no_mul" in ref_experts["activations"]
    assert set(ref_experts["gated_layouts"]) == {"gate_up", "up_gate", "interleaved"}
    assert ref_experts["weight_and_reduce"] == "TopKWeightAndReduceNoOp"
    assert parts["BatchedReferenceExperts"]["weight_and_reduce"] == "TopKWeightAndReduceDelegate"
    assert "activations" not in noep
    assert noep["description"].startswith("NoEPPrepareAndFinalize")


def test_check_compatibility():
    shape = dict(num_experts=8, hidden_size=64, intermediate_size=32, topk=2)
    assert modmoe.check_compatibility("NoEPPrepareAndFinalize", "ReferenceExperts", **shape) == (
        True, "")  # fmt: skip
    ok, reason = modmoe.check_compatibility("BatchedPrepareAndFinalize", "ReferenceExperts",
                                            max_num_tokens=8, **shape)  # fmt: skip
    assert not ok
    assert reason == ("BatchedPrepareAndFinalize produces batched activations but "
                      "ReferenceExperts expects standard")  # fmt: skip
    ok, reason = modmoe.check_compatibility("BatchedPrepareAndFinalize", "BatchedReferenceExperts",
                                            **shape)  # fmt: skip
    assert not ok and "max_num_tokens > 0" in reason
    ok, reason = modmoe.check_compatibility("NoEPPrepareAndFinalize", "CudaExperts", **shape)
    assert not ok and "no cpu implementation" in reason
