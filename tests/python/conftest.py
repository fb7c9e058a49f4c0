"""Shared fixtures of the Python tests (CPU backend, numpy)."""

import numpy as np
import pytest

SEED = 20240607


@pytest.fixture
def rng(request):
    """A seeded generator; the seed is printed with a failure (pytest shows captured output)."""
    seed = SEED + sum(map(ord, request.node.name))
    print(f"seed={seed}")
    return np.random.default_rng(seed)
