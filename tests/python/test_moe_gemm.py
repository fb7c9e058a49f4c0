"""modmoe.moe_gemm_groupwise on the CPU backend against numpy."""

import numpy as np
import pytest

import modmoe


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
    with pytest.raises(ValueError, match=r"out.size\(1\) must be b.size\(1\)/2 = 512 for gated, got 1024"):
        modmoe.moe_gemm_groupwise(a16, b16, np.array([0, 2, 4], dtype=np.int32), gated=True, out=out)
