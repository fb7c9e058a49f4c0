"""Drop-in test (issue 4 item 3): a Qwen3-MoE-style sparse MoE block in plain torch, and the same
block whose expert computation is replaced by one modmoe.fused_moe call, must agree.

The torch block follows Hugging Face's Qwen3MoeSparseMoeBlock: a bias-free router linear,
softmax in fp32, top-k, the k weights renormalized (norm_topk_prob), and per expert a gated MLP
down(silu(gate(x)) * up(x)) whose outputs are summed with the routing weights. The modmoe block
keeps the router and hands the experts to modmoe: w13 (E, 2N, K) stacks [gate; up] of every
expert (modmoe's "gate_up" layout), w2 (E, K, N) stacks the down projections.

Runs with torch CPU tensors (modmoe's CPU backend, through DLPack) and, on a GPU machine with a
CUDA build of modmoe, with CUDA tensors. Skipped where torch is not installed.
"""

import pytest

import modmoe

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

SEED = 20240607


class Qwen3MoeExpert(nn.Module):
    """One expert: down_proj(silu(gate_proj(x)) * up_proj(x)), as Qwen3MoeMLP."""

    def __init__(self, hidden_size, intermediate_size):
        super().__init__()
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Qwen3MoeBlock(nn.Module):
    """The pure-torch sparse MoE block: router, softmax top-k renormalized, expert loop."""

    def __init__(self, hidden_size, intermediate_size, num_experts, top_k):
        super().__init__()
        self.num_experts, self.top_k = num_experts, top_k
        self.gate = nn.Linear(hidden_size, num_experts, bias=False)
        self.experts = nn.ModuleList(
            Qwen3MoeExpert(hidden_size, intermediate_size) for _ in range(num_experts)
        )

    def route(self, x):
        """(topk_weights fp32 (M, k), topk_ids int64 (M, k)) from x (M, K)."""
        probs = F.softmax(self.gate(x), dim=-1, dtype=torch.float32)
        weights, ids = torch.topk(probs, self.top_k, dim=-1)
        return weights / weights.sum(dim=-1, keepdim=True), ids

    def forward(self, x):
        weights, ids = self.route(x)
        out = torch.zeros_like(x, dtype=torch.float32)
        for e, expert in enumerate(self.experts):
            token, slot = torch.where(ids == e)
            if token.numel() == 0:
                continue
            y = expert(x[token]).float() * weights[token, slot, None]
            out.index_add_(0, token, y)
        return out.to(x.dtype)


class Qwen3MoeBlockModmoe(nn.Module):
    """The same block with the experts computed by modmoe.fused_moe (no gradients)."""

    def __init__(self, block: Qwen3MoeBlock):
        super().__init__()
        self.block = block  # shares the router (and its weights)
        with torch.no_grad():
            self.w13 = torch.stack(
                [torch.cat([e.gate_proj.weight, e.up_proj.weight], dim=0) for e in block.experts]
            ).contiguous()  # (E, 2N, K): [gate; up]
            self.w2 = torch.stack([e.down_proj.weight for e in block.experts]).contiguous()

    @torch.no_grad()
    def forward(self, x, out=None):
        weights, ids = self.block.route(x)
        return modmoe.fused_moe(x, self.w13, self.w2, weights.contiguous(), ids.contiguous(),
                                activation="silu", gated_layout="gate_up", out=out)  # fmt: skip


def build(device, dtype, hidden_size, intermediate_size, num_experts, top_k, seed):
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        block = Qwen3MoeBlock(hidden_size, intermediate_size, num_experts, top_k)
        x = torch.randn(37, hidden_size)
    return block.to(device=device, dtype=dtype).eval(), x


def relative_error(a, b):
    a, b = a.float(), b.float()
    return float((a - b).norm() / b.norm())


DEVICES = [
    "cpu",
    pytest.param(
        "cuda",
        marks=pytest.mark.skipif(
            not (torch.cuda.is_available() and modmoe.cuda_available()),
            reason="needs a CUDA device and a modmoe build with the CUDA backend",
        ),
    ),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("M", [1, 37])
def test_dropin_matches_torch_block(device, M):
    # K and N are multiples of 16 (the CUDA experts' alignment); E and k like a small Qwen3.
    seed = SEED + M
    print(f"seed={seed}")
    block, x = build(device, torch.bfloat16, hidden_size=256, intermediate_size=128,
                     num_experts=16, top_k=4, seed=seed)  # fmt: skip
    x = x[:M].to(device=device, dtype=torch.bfloat16).contiguous()
    dropin = Qwen3MoeBlockModmoe(block)
    assert dropin.w13.shape == (16, 256, 256) and dropin.w2.shape == (16, 256, 128)

    with torch.no_grad():
        expected = block(x)
        out = torch.full_like(x, float("nan"))  # poisoned: every element must be written
        got = dropin(x, out=out)
        if device == "cuda":
            torch.cuda.synchronize()

    assert got is out and got.dtype == torch.bfloat16 and got.shape == x.shape
    assert got.device.type == device
    assert torch.isfinite(got).all(), "modmoe left non-finite values in out"
    assert expected.float().norm() > 0
    err = relative_error(got, expected)
    assert err < 2e-2, f"modmoe vs the torch block: relative error {err:.3e} (seed {seed})"


@pytest.mark.parametrize("device", DEVICES)
def test_dropin_detects_a_wrong_layout(device):
    # The comparison can fail: the same weights stacked as [up; gate] but declared gate_up must
    # disagree with the torch block.
    seed = SEED + 1000
    print(f"seed={seed}")
    block, x = build(device, torch.bfloat16, hidden_size=256, intermediate_size=128,
                     num_experts=16, top_k=4, seed=seed)  # fmt: skip
    x = x.to(device=device, dtype=torch.bfloat16).contiguous()
    dropin = Qwen3MoeBlockModmoe(block)
    N = 128
    swapped = torch.cat([dropin.w13[:, N:], dropin.w13[:, :N]], dim=1).contiguous()
    with torch.no_grad():
        expected = block(x)
        weights, ids = block.route(x)
        wrong = modmoe.fused_moe(x, swapped, dropin.w2, weights.contiguous(), ids.contiguous())
        right = modmoe.fused_moe(x, swapped, dropin.w2, weights.contiguous(), ids.contiguous(),
                                 gated_layout="up_gate")  # fmt: skip
    assert relative_error(wrong, expected) > 0.2
    assert relative_error(right, expected) < 2e-2
