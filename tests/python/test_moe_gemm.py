"""modmoe.moe_gemm_groupwise on the CPU backend against numpy."""

import re

import numpy as np
import pytest

import modmoe
import reference as ref


def _silu(x):
    return x / (1.0 + np.exp(-x))


@pytest.mark.parametrize("gated", [False, True])
@pytest.mark.parametrize("layout", ["gate_up", "up_gate"])
def test_matches_numpy(gated, layout):
    rng = np.random.default_rng(3)
    E, N_b, K, rows = 3, 64, 128, 10
    a = rng.standard_normal((rows, K), dtype=np.float32)
    b = (rng.standard_normal((E, N_b, K)) / np.sqrt(K)).astype(np.float32)
    indptr = np.array([1, 4, 4, 9], dtype=np.int32)  # row 0 and row 9 belong to no expert
    import ml_dtypes

    a16, b16 = a.astype(ml_dtypes.bfloat16), b.astype(ml_dtypes.bfloat16)
    out = np.full((rows, N_b // 2 if gated else N_b), np.nan, dtype=np.float32)
    modmoe.moe_gemm_groupwise(a16, b16, indptr, gated=gated, gated_layout=layout, out=out)
    a64, b64 = a16.astype(np.float64), b16.astype(np.float64)
    for e in range(E):
        for r in range(indptr[e], indptr[e + 1]):
            h = b64[e] @ a64[r]
            if gated:
                n = N_b // 2
                gate, up = (h[:n], h[n:]) if layout == "gate_up" else (h[n:], h[:n])
                h = _silu(gate) * up
            np.testing.assert_allclose(out[r], h, rtol=2e-3, atol=2e-3)
    assert np.isnan(out[0]).all() and np.isnan(out[9]).all()


def test_gated_width_error_names_the_expected_value():
    a = np.ones((4, 128), dtype=np.float32)
    import ml_dtypes

    a16 = a.astype(ml_dtypes.bfloat16)
    b16 = np.ones((2, 1024, 128), dtype=np.float32).astype(ml_dtypes.bfloat16)
    out = np.empty((4, 1024), dtype=np.float32)
    message = r"out.size\(1\) must be b.size\(1\)/2 = 512 for gated, got 1024"
    with pytest.raises(ValueError, match=message):
        modmoe.moe_gemm_groupwise(a16, b16, np.array([0, 2, 4], dtype=np.int32), gated=True,
                                  out=out)  # fmt: skip


# ---- fp8 block scales: K- and MN-major, the fp8 gated output ---------------------------------

FP8_NAN = 0x7F  # an e4m3 NaN byte: poisons fp8 outputs


def _fp8_problem(rng, rows=11, E=3, N_b=384, K=256):
    """fp8-block a (rows, K) and b (E, N_b, K) with K-major scales, their dequantized fp64
    values, and m_indptr leaving row 0 and the last row to no expert (expert 1 is empty).
    Rows and columns get different magnitudes so every scale group has its own scale."""
    a = (rng.standard_normal((rows, K)) * rng.uniform(0.5, 4.0, (rows, 1))).astype(np.float32)
    b = (rng.standard_normal((E, N_b, K)) / np.sqrt(K)).astype(np.float32)
    b *= rng.uniform(0.25, 2.0, (E, N_b, 1)).astype(np.float32)
    a_q, a_scale = modmoe.quantize_fp8(a, "fp8-block")
    b_q, b_scale = modmoe.quantize_weights(b, "fp8-block")
    assert a_scale.shape == (rows, K // 128) and b_scale.shape == (E, -(-N_b // 128), K // 128)
    a_deq = modmoe.dequantize_fp8(a_q, a_scale, "fp8-block").astype(np.float64)
    b_deq = modmoe.dequantize_fp8(b_q, b_scale, "fp8-block").astype(np.float64)
    indptr = np.array([1, 5, 5, rows - 1], dtype=np.int32)
    return a_q, b_q, a_scale, b_scale, a_deq, b_deq, indptr


def _reference(a_deq, b_deq, indptr, gated, layout="gate_up"):
    """float64 out rows of every owned row (NaN elsewhere)."""
    n_b = b_deq.shape[1]
    out = np.full((a_deq.shape[0], n_b // 2 if gated else n_b), np.nan)
    for e in range(b_deq.shape[0]):
        rows = slice(indptr[e], indptr[e + 1])
        h = a_deq[rows] @ b_deq[e].T
        out[rows] = ref.gated(h, "silu", layout) if gated else h
    return out


@pytest.mark.parametrize("gated", [False, True])
def test_fp8_mn_major_scales_match_k_major(rng, gated):
    a_q, b_q, a_scale, b_scale, a_deq, b_deq, indptr = _fp8_problem(rng)
    rows, n_out = a_q.shape[0], b_q.shape[1] // 2 if gated else b_q.shape[1]
    out_k = np.full((rows, n_out), np.nan, np.float32)
    modmoe.moe_gemm_groupwise(a_q, b_q, indptr, a_scale, b_scale, gated=gated, out=out_k)
    expected = _reference(a_deq, b_deq, indptr, gated)
    owned = slice(indptr[0], indptr[-1])
    np.testing.assert_allclose(out_k[owned], expected[owned], rtol=1e-4, atol=1e-4)

    # MN-major: the transposes. a (K/128, rows) is not square here, b (E, K/128, ceil(N_b/128))
    # is (3, 2, 3), so reading either the K-major way cannot give the same result.
    a_scale_mn = np.ascontiguousarray(a_scale.T)
    b_scale_mn = np.ascontiguousarray(b_scale.transpose(0, 2, 1))
    out_mn = np.full((rows, n_out), np.nan, np.float32)
    returned = modmoe.moe_gemm_groupwise(a_q, b_q, indptr, a_scale_mn, b_scale_mn, gated=gated,
                                         scale_major_mode="MN", out=out_mn)  # fmt: skip
    assert returned is out_mn
    np.testing.assert_array_equal(out_mn, out_k)  # NaN rows included: untouched in both
    assert np.isnan(out_mn[0]).all() and np.isnan(out_mn[-1]).all()


def test_fp8_mn_major_needs_transposed_scales(rng):
    a_q, b_q, a_scale, b_scale, _, _, indptr = _fp8_problem(rng)
    out = np.empty((a_q.shape[0], b_q.shape[1]), np.float32)
    with pytest.raises(ValueError, match=r"a_scale .*\(K/128, total_rows\) for MN"):
        modmoe.moe_gemm_groupwise(a_q, b_q, indptr, a_scale, b_scale, scale_major_mode="MN",
                                  out=out)  # fmt: skip


@pytest.mark.parametrize("layout", ["gate_up", "up_gate"])
@pytest.mark.parametrize("scale_major_mode", ["K", "MN"])
def test_fp8_gated_out_is_the_quantized_gated_output(rng, layout, scale_major_mode):
    # N_b = 512: N_out = 256, two 128-column scale groups per row.
    a_q, b_q, a_scale, b_scale, a_deq, b_deq, indptr = _fp8_problem(rng, N_b=512)
    if scale_major_mode == "MN":
        a_scale = np.ascontiguousarray(a_scale.T)
        b_scale = np.ascontiguousarray(b_scale.transpose(0, 2, 1))
    rows, n_out = a_q.shape[0], b_q.shape[1] // 2
    args = dict(gated=True, gated_layout=layout, scale_major_mode=scale_major_mode)
    gated_fp32 = np.full((rows, n_out), np.nan, np.float32)
    modmoe.moe_gemm_groupwise(a_q, b_q, indptr, a_scale, b_scale, out=gated_fp32, **args)

    out = np.full((rows, n_out), FP8_NAN, np.uint8)
    out_scale = np.full((rows, n_out // 128), np.nan, np.float32)
    q, s = modmoe.moe_gemm_groupwise(a_q, b_q, indptr, a_scale, b_scale, out=out,
                                     out_scale=out_scale, **args)  # fmt: skip
    assert q is out and s is out_scale

    owned = slice(indptr[0], indptr[-1])
    expected_q, expected_s = modmoe.quantize_fp8(gated_fp32[owned], "fp8-block")
    np.testing.assert_array_equal(out[owned], expected_q)
    np.testing.assert_allclose(out_scale[owned], expected_s, rtol=1e-6)
    # Independently of the quantizer: the decoded output is the float64 gated GEMM within fp8's
    # rounding (3 mantissa bits).
    decoded = modmoe.dequantize_fp8(out[owned], out_scale[owned], "fp8-block")
    expected = _reference(a_deq, b_deq, indptr, True, layout)[owned]
    assert ref.relative_error(decoded, expected) < 0.05
    # Rows of no expert are not written, neither their codes nor their scales.
    for r in (0, rows - 1):
        assert (out[r] == FP8_NAN).all() and np.isnan(out_scale[r]).all()


def test_fp8_out_allocated_from_out_dtype(rng):
    a_q, b_q, a_scale, b_scale, _, _, indptr = _fp8_problem(rng, N_b=256)
    q, s = modmoe.moe_gemm_groupwise(a_q, b_q, indptr, a_scale, b_scale, gated=True,
                                     out_dtype="fp8_e4m3")  # fmt: skip
    assert q.dtype == np.uint8 and q.shape == (a_q.shape[0], 128)
    assert s.dtype == np.float32 and s.shape == (a_q.shape[0], 1)
    gated_fp32 = modmoe.moe_gemm_groupwise(a_q, b_q, indptr, a_scale, b_scale, gated=True,
                                           out_dtype="fp32")  # fmt: skip
    owned = slice(indptr[0], indptr[-1])
    expected_q, expected_s = modmoe.quantize_fp8(gated_fp32[owned], "fp8-block")
    np.testing.assert_array_equal(q[owned], expected_q)
    np.testing.assert_allclose(s[owned], expected_s, rtol=1e-6)


def test_fp8_out_as_ml_dtypes_float8(rng):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    a_q, b_q, a_scale, b_scale, _, _, indptr = _fp8_problem(rng, N_b=256)
    rows = a_q.shape[0]
    expected_q, expected_s = modmoe.moe_gemm_groupwise(
        a_q, b_q, indptr, a_scale, b_scale, gated=True, out_dtype="fp8_e4m3"
    )
    out = np.full((rows, 128), FP8_NAN, np.uint8).view(ml_dtypes.float8_e4m3fn)
    q, s = modmoe.moe_gemm_groupwise(a_q, b_q, indptr, a_scale, b_scale, gated=True, out=out)
    assert q is out and s.shape == (rows, 1)  # out_scale allocated when not given
    owned = slice(indptr[0], indptr[-1])
    np.testing.assert_array_equal(out.view(np.uint8)[owned], expected_q[owned])
    np.testing.assert_array_equal(s[owned], expected_s[owned])


# ---- MX-FP8: e4m3 with e8m0 scales per 32 along K ---------------------------------------------


def _mx_problem(rng, rows=13, E=4, N_b=96, K=160):
    """MX a (rows, K) and b (E, N_b, K) as uint8 e4m3 codes of normal draws with uint8 e8m0
    exponents (a 2^-7..2^7, b 2^-17..2^-5, drawn per 32-wide K group), their float64 values by
    the definition, and m_indptr leaving rows 0 and rows-1 to no expert (expert 2 is empty)."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    groups = K // 32
    a_q = rng.standard_normal((rows, K)).astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
    b_q = rng.standard_normal((E, N_b, K)).astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
    a_scale = rng.integers(120, 135, (rows, groups)).astype(np.uint8)
    b_scale = rng.integers(110, 123, (E, N_b, groups)).astype(np.uint8)

    def value(q, scale):
        decoded = q.view(ml_dtypes.float8_e4m3fn).astype(np.float64)
        return decoded * np.repeat(np.exp2(scale.astype(np.float64) - 127.0), 32, axis=-1)

    indptr = np.array([1, 4, 9, 9, rows - 1], dtype=np.int32)
    return a_q, b_q, a_scale, b_scale, value(a_q, a_scale), value(b_q, b_scale), indptr


def _mx_check(out, expected, indptr, rtol):
    owned = slice(indptr[0], indptr[-1])
    assert np.isfinite(out[owned]).all()
    for e in range(len(indptr) - 1):  # per expert: one wrong expert cannot hide in the average
        rows = slice(indptr[e], indptr[e + 1])
        if indptr[e + 1] > indptr[e]:
            assert ref.relative_error(out[rows], expected[rows]) < rtol, f"expert {e}"
    assert np.isnan(out[0]).all() and np.isnan(out[-1]).all()  # rows of no expert: untouched


@pytest.mark.parametrize("gated", [False, True])
@pytest.mark.parametrize("layout", ["gate_up", "up_gate", "interleaved"])
def test_mxfp8_matches_float64_with_uint8_scales(rng, gated, layout):
    a_q, b_q, a_scale, b_scale, a_val, b_val, indptr = _mx_problem(rng)
    n_out = b_q.shape[1] // 2 if gated else b_q.shape[1]
    out = np.full((a_q.shape[0], n_out), np.nan, np.float32)
    returned = modmoe.moe_gemm_groupwise(a_q, b_q, indptr, a_scale, b_scale, gated=gated,
                                         gated_layout=layout, out=out)  # fmt: skip
    assert returned is out
    _mx_check(out, _reference(a_val, b_val, indptr, gated, layout), indptr, 1e-5)


def test_mxfp8_ml_dtypes_scales_and_bf16_out(rng):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    if not hasattr(ml_dtypes, "float8_e8m0fnu"):
        pytest.skip("this ml_dtypes has no float8_e8m0fnu")
    a_q, b_q, a_scale, b_scale, a_val, b_val, indptr = _mx_problem(rng)
    expected = _reference(a_val, b_val, indptr, True)
    out = modmoe.moe_gemm_groupwise(
        a_q.view(ml_dtypes.float8_e4m3fn), b_q.view(ml_dtypes.float8_e4m3fn), indptr,
        a_scale.view(ml_dtypes.float8_e8m0fnu), b_scale.view(ml_dtypes.float8_e8m0fnu),
        gated=True,
    )  # fmt: skip
    assert out.dtype == ml_dtypes.bfloat16 and out.shape == (a_q.shape[0], b_q.shape[1] // 2)
    owned = slice(indptr[0], indptr[-1])
    assert ref.relative_error(out[owned].astype(np.float64), expected[owned]) < 1e-2


def test_mxfp8_torch_float8_e8m0fnu(rng):
    torch = pytest.importorskip("torch")
    if not hasattr(torch, "float8_e8m0fnu") or not hasattr(torch, "float8_e4m3fn"):
        pytest.skip("this torch has no float8_e8m0fnu")
    a_q, b_q, a_scale, b_scale, a_val, b_val, indptr = _mx_problem(rng)
    expected = _reference(a_val, b_val, indptr, False)
    out = torch.full((a_q.shape[0], b_q.shape[1]), float("nan"), dtype=torch.float32)
    returned = modmoe.moe_gemm_groupwise(
        torch.from_numpy(a_q).view(torch.float8_e4m3fn),
        torch.from_numpy(b_q).view(torch.float8_e4m3fn), torch.from_numpy(indptr),
        torch.from_numpy(a_scale).view(torch.float8_e8m0fnu),
        torch.from_numpy(b_scale).view(torch.float8_e8m0fnu), out=out,
    )  # fmt: skip
    assert returned is out
    _mx_check(out.numpy(), expected, indptr, 1e-5)


def test_mxfp8_takes_the_quantizers_output(rng):
    # quantize_fp8 / quantize_weights with "mxfp8" give exactly the operands the op takes.
    rows, E, N_b, K = 9, 2, 64, 96
    a = (rng.standard_normal((rows, K)) * rng.uniform(0.1, 20.0, (rows, 1))).astype(np.float32)
    b = (rng.standard_normal((E, N_b, K)) / np.sqrt(K)).astype(np.float32)
    a_q, a_scale = modmoe.quantize_fp8(a, "mxfp8")
    b_q, b_scale = modmoe.quantize_weights(b, "mxfp8")
    assert a_scale.shape == (rows, K // 32) and b_scale.shape == (E, N_b, K // 32)
    a_deq = modmoe.dequantize_fp8(a_q, a_scale, "mxfp8").astype(np.float64)
    b_deq = modmoe.dequantize_fp8(b_q, b_scale, "mxfp8").astype(np.float64)
    indptr = np.array([0, 6, rows], dtype=np.int32)
    out = modmoe.moe_gemm_groupwise(a_q, b_q, indptr, a_scale, b_scale, gated=True,
                                    out_dtype="fp32")  # fmt: skip
    expected = _reference(a_deq, b_deq, indptr, True)
    assert ref.relative_error(out, expected) < 1e-5


def test_mxfp8_errors(rng):
    a_q, b_q, a_scale, b_scale, _, _, indptr = _mx_problem(rng, N_b=256)
    rows = a_q.shape[0]
    message = r'scale_major_mode must be "K" with MX-FP8 inputs .*: MX scales are K-major only'
    with pytest.raises(ValueError, match=message):
        modmoe.moe_gemm_groupwise(a_q, b_q, indptr, a_scale, b_scale, scale_major_mode="MN")
    with pytest.raises(ValueError, match=r"out must be bf16, fp16 or fp32 with MX-FP8 inputs"):
        modmoe.moe_gemm_groupwise(a_q, b_q, indptr, a_scale, b_scale, gated=True,
                                  out_dtype="fp8_e4m3")  # fmt: skip
    b_scale_fp32 = np.ones((b_q.shape[0], 2, 2), np.float32)  # refused for its dtype first
    with pytest.raises(ValueError, match=r"a_scale and b_scale must both be e8m0 .* or both "
                                         r"fp32 .*, got a_scale e8m0"):
        modmoe.moe_gemm_groupwise(a_q, b_q, indptr, a_scale, b_scale_fp32)
    with pytest.raises(ValueError, match=r"a_scale must be e8m0 \(total_rows, K/32\) = "
                                         rf"\({rows}, 5\), got e8m0 \({rows}, 4\)"):
        modmoe.moe_gemm_groupwise(a_q, b_q, indptr, a_scale[:, :4].copy(), b_scale)


# ---- options and their errors ----------------------------------------------------------------


def _bf16_problem():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    rng = np.random.default_rng(11)
    a = rng.standard_normal((6, 128), dtype=np.float32).astype(ml_dtypes.bfloat16)
    b = rng.standard_normal((2, 64, 128), dtype=np.float32).astype(ml_dtypes.bfloat16)
    return a, b, np.array([0, 2, 6], dtype=np.int32)


def test_cuda_options_are_accepted_and_ignored_on_the_cpu():
    a, b, indptr = _bf16_problem()
    expected = modmoe.moe_gemm_groupwise(a, b, indptr, out_dtype="fp32")
    assert np.isfinite(expected).all()
    for scheduler in ("cooperative", "linear_scan", "precomputed"):
        out = np.full(expected.shape, np.nan, np.float32)
        modmoe.moe_gemm_groupwise(a, b, indptr, kernel="automatic", scheduler=scheduler, out=out)
        np.testing.assert_array_equal(out, expected)


@pytest.mark.parametrize("kernel", ["sm90", "portable"])
def test_cuda_kernel_on_the_cpu_is_refused(kernel):
    a, b, indptr = _bf16_problem()
    out = np.empty((6, 64), np.float32)
    with pytest.raises(ValueError, match=rf"kernel {kernel} needs a CUDA context, got cpu"):
        modmoe.moe_gemm_groupwise(a, b, indptr, kernel=kernel, out=out)


@pytest.mark.parametrize(
    "option,value,message",
    [
        ("kernel", "hopper",
         r"kernel must be one of 'automatic', 'portable', 'sm90', got 'hopper'"),
        ("scheduler", "round_robin",
         r"scheduler must be one of 'cooperative', 'linear_scan', 'precomputed', "
         r"got 'round_robin'"),
        ("scale_major_mode", "k", r"scale_major_mode must be one of 'K', 'MN', got 'k'"),
        ("tile", "128x999", r"tile must be one of ''.*got '128x999'"),
        ("out_dtype", "int32", r"out_dtype must be one of bf16, fp16, fp32, fp8_e4m3, got 'int32'"),
    ],
)  # fmt: skip
def test_bad_option_values(option, value, message):
    a, b, indptr = _bf16_problem()
    with pytest.raises(ValueError, match="moe_gemm_groupwise: " + message):
        modmoe.moe_gemm_groupwise(a, b, indptr, **{option: value})


@pytest.mark.parametrize("option", ["kernel", "scheduler", "scale_major_mode", "tile"])
def test_option_of_the_wrong_type(option):
    a, b, indptr = _bf16_problem()
    with pytest.raises(TypeError, match=rf"moe_gemm_groupwise: {option} must be a str, got int"):
        modmoe.moe_gemm_groupwise(a, b, indptr, **{option: 1})


def test_fp8_out_errors(rng):
    a_q, b_q, a_scale, b_scale, _, _, indptr = _fp8_problem(rng, N_b=256)
    with pytest.raises(ValueError, match=r"an fp8_e4m3 out \(quantized gated output\) needs gated"):
        modmoe.moe_gemm_groupwise(a_q, b_q, indptr, a_scale, b_scale, out_dtype="fp8_e4m3")
    with pytest.raises(ValueError, match=r"out_scale must be fp32 \(total_rows, N_out/128\)"):
        modmoe.moe_gemm_groupwise(a_q, b_q, indptr, a_scale, b_scale, gated=True,
                                  out=np.empty((11, 128), np.uint8),
                                  out_scale=np.empty((11, 2), np.float32))  # fmt: skip
    with pytest.raises(ValueError, match=r"out_scale is only for an fp8_e4m3 out"):
        modmoe.moe_gemm_groupwise(a_q, b_q, indptr, a_scale, b_scale, gated=True,
                                  out_dtype="fp32", out_scale=np.empty((11, 1), np.float32))


def test_sm90_tiles_and_availability():
    tiles = modmoe.moe_gemm_sm90_tiles()
    assert isinstance(tiles, list) and all(isinstance(t, str) for t in tiles)
    assert all(re.fullmatch(r"\d+x\d+", t) for t in tiles), tiles
    assert modmoe.moe_gemm_sm90_available("cpu") is False
    if not modmoe.has_cuda_backend:
        assert tiles == []
        assert modmoe.moe_gemm_sm90_available() is False
        assert modmoe.moe_gemm_sm90_available("cuda:1") is False
    with pytest.raises(ValueError, match=r"moe_gemm_sm90_available: device must be 'cpu', 'cuda'"):
        modmoe.moe_gemm_sm90_available("gpu")
