"""torch callers: CPU tensors (bf16 included) and, on a GPU machine with the CUDA backend, CUDA
tensors on the caller's stream. Skipped where torch (or CUDA) is missing."""

import numpy as np
import pytest

import modmoe
import reference as ref
from reference import make_problem

torch = pytest.importorskip("torch")

needs_cuda = pytest.mark.skipif(
    not (torch.cuda.is_available() and modmoe.cuda_available()),
    reason="needs a CUDA device and a modmoe build with the CUDA backend",
)


def to_torch(p, device, dtype):
    t = {k: torch.from_numpy(v) for k, v in p.items() if v is not None}
    for k in ("x", "w13", "w2"):
        t[k] = t[k].to(dtype)
    return {k: v.to(device) for k, v in t.items()}


def reference_of(t):
    return ref.moe(*(t[k].float().cpu().numpy() for k in ("x", "w13", "w2")),
                   t["topk_weights"].cpu().numpy(), t["topk_ids"].cpu().numpy())  # fmt: skip


def test_cpu_bf16_tensors(rng):
    t = to_torch(make_problem(rng, M=6, K=64, N=32, E=4, topk=2), "cpu", torch.bfloat16)
    out = modmoe.fused_moe(t["x"], t["w13"], t["w2"], t["topk_weights"], t["topk_ids"])
    assert isinstance(out, torch.Tensor) and out.dtype == torch.bfloat16 and out.shape == (6, 64)
    assert ref.relative_error(out.float().numpy(), reference_of(t)) < 1e-2


def test_requires_grad_is_refused(rng):
    t = to_torch(make_problem(rng, M=2, K=32, N=16, E=4, topk=2), "cpu", torch.float32)
    x = t["x"].clone().requires_grad_(True)
    with pytest.raises(ValueError, match=r"fused_moe|x must not require grad"):
        modmoe.fused_moe(x, t["w13"], t["w2"], t["topk_weights"], t["topk_ids"])


@needs_cuda
@pytest.mark.parametrize("M", [1, 64])
def test_cuda_bf16_forward(rng, M):
    t = to_torch(make_problem(rng, M=M, K=256, N=128, E=8, topk=2), "cuda", torch.bfloat16)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        out = modmoe.fused_moe(t["x"], t["w13"], t["w2"], t["topk_weights"], t["topk_ids"])
    stream.synchronize()
    assert out.is_cuda and out.dtype == torch.bfloat16
    assert ref.relative_error(out.float().cpu().numpy(), reference_of(t)) < 1e-2


@needs_cuda
def test_cuda_routing_and_quantization_match_cpu(rng):
    logits = rng.standard_normal((33, 64), dtype=np.float32)
    w_cpu, ids_cpu = modmoe.select_experts(logits, 8)
    w_gpu, ids_gpu = modmoe.select_experts(torch.from_numpy(logits).cuda(), 8)
    np.testing.assert_array_equal(ids_gpu.cpu().numpy(), ids_cpu)
    np.testing.assert_allclose(w_gpu.cpu().numpy(), w_cpu, rtol=1e-5, atol=1e-6)
    x = rng.standard_normal((17, 256), dtype=np.float32)
    q_cpu, s_cpu = modmoe.quantize_fp8(x, "fp8-block")
    q_gpu, s_gpu = modmoe.quantize_fp8(torch.from_numpy(x).cuda(), "fp8-block")
    np.testing.assert_array_equal(q_gpu.view(torch.uint8).cpu().numpy(), q_cpu)
    np.testing.assert_allclose(s_gpu.cpu().numpy(), s_cpu, rtol=1e-6)


@needs_cuda
def test_cuda_wrong_device_input(rng):
    t = to_torch(make_problem(rng, M=4, K=256, N=128, E=8, topk=2), "cuda", torch.bfloat16)
    with pytest.raises(ValueError, match=r"w2 must be on cuda:0, got bf16 \(8, 256, 128\) on cpu"):
        modmoe.fused_moe(t["x"], t["w13"], t["w2"].cpu(), t["topk_weights"], t["topk_ids"])
