"""Every error path of the bindings: ValueError carrying the library's message for bad values,
TypeError for arguments of the wrong Python type."""

import ctypes

import numpy as np
import pytest

import modmoe
from reference import make_problem

E, K, N, TOPK, M = 8, 64, 32, 2, 5


@pytest.fixture
def problem(rng):
    return make_problem(rng, M=M, K=K, N=N, E=E, topk=TOPK)


@pytest.fixture
def kernel():
    return modmoe.ModularKernel(num_experts=E, hidden_size=K, intermediate_size=N, topk=TOPK,
                                dtype="fp32")  # fmt: skip


def forward(kernel, p, **changes):
    args = dict(x=p["x"], w13=p["w13"], w2=p["w2"], topk_weights=p["topk_weights"],
                topk_ids=p["topk_ids"])  # fmt: skip
    args.update(changes)
    return kernel.forward(**args)


# ---- values: ValueError with the library's message -----------------------------------------


def test_wrong_dtype(kernel, problem):
    with pytest.raises(ValueError) as e:
        forward(kernel, problem, x=problem["x"].astype(np.float64))
    assert str(e.value) == (
        "ModularKernel::forward: hidden_states must be fp32 (M, K) = (5, 64), "
        "got fp64 (5, 64) on cpu"
    )
    with pytest.raises(ValueError, match=r"topk_ids must be int32 or int64 .* got fp32"):
        forward(kernel, problem, topk_ids=problem["topk_ids"].astype(np.float32))
    with pytest.raises(ValueError, match=r"topk_weights must be fp32 .* got fp16"):
        forward(kernel, problem, topk_weights=problem["topk_weights"].astype(np.float16))
    with pytest.raises(ValueError, match=r"output must be fp32 \(M, K\) = \(5, 64\), got fp64"):
        forward(kernel, problem, out=np.empty((M, K), np.float64))


def test_unsupported_dtype_names_the_argument(kernel, problem):
    with pytest.raises(ValueError, match=r"ModularKernel.forward: w2: from_dlpack: unsupported"):
        forward(kernel, problem, w2=problem["w2"].astype(np.complex64))


def test_wrong_shape(kernel, problem):
    with pytest.raises(ValueError) as e:
        forward(kernel, problem, w13=problem["w13"][:, :5].copy())
    assert str(e.value) == (
        "ModularKernel::forward: w13 must be fp32 (E_local, 2N, K) = (8, 64, 64), "
        "got fp32 (8, 5, 64) on cpu"
    )
    with pytest.raises(ValueError, match=r"ModularKernel::forward: topk_ids .* got int32 \(5, 3\)"):
        forward(kernel, problem, topk_ids=np.zeros((M, 3), np.int32))
    message = r"fused_moe: w13 must be 3-D \(E_local, 2N, K\), got shape \(64, 64\)"
    with pytest.raises(ValueError, match=message):
        modmoe.fused_moe(problem["x"], problem["w13"][0], problem["w2"], problem["topk_weights"],
                         problem["topk_ids"])  # fmt: skip


def test_non_contiguous(kernel, problem):
    with pytest.raises(ValueError) as e:
        forward(kernel, problem, x=np.asfortranarray(problem["x"]))
    assert str(e.value) == (
        "ModularKernel::forward: hidden_states must be contiguous (row-major), got strides (1, 5) "
        "for shape (5, 64)"
    )
    with pytest.raises(ValueError, match=r"quantize_activations: x must be contiguous"):
        modmoe.quantize_fp8(np.asfortranarray(problem["x"]), "fp8-token")


def test_expert_id_out_of_range(kernel, problem):
    ids = problem["topk_ids"].copy()
    ids[2, 1] = E
    with pytest.raises(ValueError, match=r"topk_ids"):
        forward(kernel, problem, topk_ids=ids)


def test_topk_larger_than_num_experts():
    with pytest.raises(ValueError, match=r"topk must be in \[1, E=8\], got 9"):
        modmoe.ModularKernel(num_experts=8, hidden_size=K, intermediate_size=N, topk=9)
    with pytest.raises(ValueError, match=r"softmax_topk: topk must be in \[1, E=8\], got 9"):
        modmoe.select_experts(np.zeros((3, 8), np.float32), 9)
    with pytest.raises(ValueError, match=r"grouped_topk: topk must be in \[1, topk_groups"):
        modmoe.select_experts(np.zeros((3, 8), np.float32), 5, num_expert_group=4, topk_group=2)


def test_unknown_names():
    shape = dict(num_experts=E, hidden_size=K, intermediate_size=N, topk=TOPK)
    with pytest.raises(ValueError, match=r"unknown PrepareAndFinalize 'Nope'"):
        modmoe.ModularKernel("Nope", **shape)
    with pytest.raises(ValueError, match=r"unknown Experts 'Nope'"):
        modmoe.ModularKernel("NoEPPrepareAndFinalize", "Nope", **shape)
    with pytest.raises(ValueError, match=r"unknown PrepareAndFinalize 'Nope'"):
        modmoe.check_compatibility("Nope", "ReferenceExperts", **shape)
    with pytest.raises(ValueError, match=r"unknown quant scheme 'fp4'"):
        modmoe.ModularKernel(quant="fp4", **shape)
    with pytest.raises(ValueError, match=r"unknown activation 'relu'"):
        modmoe.ModularKernel(activation="relu", **shape)
    with pytest.raises(ValueError, match=r"unknown gated layout|unknown .*'sideways'"):
        modmoe.ModularKernel(gated_layout="sideways", **shape)
    with pytest.raises(ValueError, match=r"ModularKernel: dtype must be one of bf16, fp16, fp32"):
        modmoe.ModularKernel(dtype="fp7", **shape)
    with pytest.raises(ValueError, match=r"device must be 'cpu', 'cuda' or 'cuda:N'"):
        modmoe.ModularKernel(device="tpu", **shape)
    with pytest.raises(ValueError, match=r"unknown quant scheme"):
        modmoe.quantize_fp8(np.zeros((2, 32), np.float32), "int4")


def test_incompatible_pair_reason():
    with pytest.raises(ValueError) as e:
        modmoe.ModularKernel("BatchedPrepareAndFinalize", "ReferenceExperts", num_experts=E,
                             hidden_size=K, intermediate_size=N, topk=TOPK,
                             max_num_tokens=8)  # fmt: skip
    assert str(e.value) == (
        "make_modular_kernel: BatchedPrepareAndFinalize + ReferenceExperts do not compose: "
        "BatchedPrepareAndFinalize produces batched activations but ReferenceExperts expects "
        "standard"
    )
    with pytest.raises(ValueError, match=r"needs config.max_num_tokens > 0"):
        modmoe.ModularKernel("BatchedPrepareAndFinalize", "BatchedReferenceExperts",
                             num_experts=E, hidden_size=K, intermediate_size=N,
                             topk=TOPK)  # fmt: skip


def test_config_errors():
    with pytest.raises(ValueError, match=r"static activation scales exist only for fp8-tensor"):
        modmoe.ModularKernel(num_experts=E, hidden_size=K, intermediate_size=N, topk=TOPK,
                             quant="fp8-block-static")  # fmt: skip
    with pytest.raises(ValueError, match=r"quantize_activations: static_scale is only supported"):
        modmoe.quantize_fp8(np.ones((2, 128), np.float32), "fp8-block",
                            scale=np.ones(1, np.float32))  # fmt: skip
    with pytest.raises(ValueError, match=r"select_experts: ids_dtype must be int32 or int64"):
        modmoe.select_experts(np.zeros((2, 8), np.float32), 2, ids_dtype="fp32")
    with pytest.raises(ValueError, match=r"num_expert_group and topk_group go together"):
        modmoe.select_experts(np.zeros((2, 8), np.float32), 2, num_expert_group=2)
    with pytest.raises(ValueError, match=r"scoring_func must be 'softmax' or 'sigmoid'"):
        modmoe.select_experts(np.zeros((2, 8), np.float32), 2, scoring_func="relu")


def test_quantized_kernel_refuses_float_weights(rng, problem):
    kernel = modmoe.ModularKernel(num_experts=E, hidden_size=K, intermediate_size=N, topk=TOPK,
                                  dtype="fp32", quant="fp8-token")  # fmt: skip
    _, w13_s = modmoe.quantize_weights(problem["w13"], "fp8-token")
    w2_q, w2_s = modmoe.quantize_weights(problem["w2"], "fp8-token")
    with pytest.raises(ValueError, match=r"w13 must be fp8_e4m3 .* got fp32"):
        forward(kernel, problem, w2=w2_q, w13_scale=w13_s, w2_scale=w2_s)


def test_byte_reinterpretation_needs_one_byte_elements(problem):
    from modmoe import _core

    with pytest.raises(ValueError, match=r"q is to be read as fp8_e4m3, which needs an array of "
                                         r"1-byte elements, got 32-bit"):  # fmt: skip
        _core.dequantize_weights((problem["w13"], "fp8_e4m3"), np.ones(E, np.float32),
                                 "fp8-tensor", np.empty_like(problem["w13"]))  # fmt: skip


def test_cuda_without_backend():
    if modmoe.has_cuda_backend:
        pytest.skip("this build has the CUDA backend")
    with pytest.raises(ValueError, match=r"this build has no CUDA backend"):
        modmoe.ModularKernel(num_experts=E, hidden_size=K, intermediate_size=N, topk=TOPK,
                             device="cuda")  # fmt: skip


# ---- wrong device: a DLPack producer that claims CUDA memory ----------------------------------


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int), ("device_id", ctypes.c_int)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _DLDevice),
        ("ndim", ctypes.c_int),
        ("dtype", _DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class _DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p),
                ("deleter", ctypes.c_void_p)]  # fmt: skip


class FakeCudaArray:
    """Host memory that presents itself through DLPack as living on cuda:0. The library must
    refuse it before touching the data (it only reads the device field)."""

    def __init__(self, array):
        self._array = np.ascontiguousarray(array)
        self.shape = self._array.shape
        self.dtype = self._array.dtype
        self._shape = (ctypes.c_int64 * self._array.ndim)(*self.shape)
        code = {"f": 2, "i": 0, "u": 1}[self.dtype.kind]
        self._managed = _DLManagedTensor()
        t = self._managed.dl_tensor
        t.data = self._array.ctypes.data
        t.device = _DLDevice(2, 0)  # kDLCUDA
        t.ndim = self._array.ndim
        t.dtype = _DLDataType(code, self.dtype.itemsize * 8, 1)
        t.shape = self._shape
        t.strides = None

    def __dlpack_device__(self):
        return (2, 0)

    def __dlpack__(self, **kwargs):
        new_capsule = ctypes.pythonapi.PyCapsule_New
        new_capsule.restype = ctypes.py_object
        new_capsule.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
        return new_capsule(ctypes.addressof(self._managed), b"dltensor", None)


def test_wrong_device(kernel, problem):
    with pytest.raises(ValueError) as e:
        forward(kernel, problem, w2=FakeCudaArray(problem["w2"]))
    assert str(e.value) == (
        "ModularKernel::forward: w2 must be on cpu, got fp32 (8, 64, 32) on cuda:0"
    )
    message = r"hidden_states must be on cpu, got fp32 \(5, 64\) on cuda:0"
    with pytest.raises(ValueError, match=message):
        forward(kernel, problem, x=FakeCudaArray(problem["x"]), out=np.empty((M, K), np.float32))


# ---- Python types: TypeError ---------------------------------------------------------------


def test_not_an_array(kernel, problem):
    with pytest.raises(TypeError) as e:
        forward(kernel, problem, x=[[1.0] * K] * M)
    assert str(e.value) == (
        "ModularKernel.forward: x must be an array (numpy, or an object with __dlpack__ such as a "
        "torch or cupy tensor), got list"
    )
    with pytest.raises(TypeError, match=r"ModularKernel.forward: w13 must be an array .* got str"):
        forward(kernel, problem, w13="weights")
    with pytest.raises(TypeError, match=r"ModularKernel.forward: expert_map must be an array"):
        forward(kernel, problem, expert_map=3)
    with pytest.raises(TypeError, match=r"select_experts: router_logits must be an array"):
        modmoe.select_experts({"logits": 1}, 2)
    with pytest.raises(TypeError, match=r"quantize_fp8: x must be an array"):
        modmoe.quantize_fp8(None)


def test_wrong_argument_types():
    with pytest.raises(TypeError, match=r"ModularKernel: num_experts must be an int, got float"):
        modmoe.ModularKernel(num_experts=8.0, hidden_size=K, intermediate_size=N, topk=TOPK)
    with pytest.raises(TypeError, match=r"ModularKernel: topk must be an int, got bool"):
        modmoe.ModularKernel(num_experts=8, hidden_size=K, intermediate_size=N, topk=True)
    with pytest.raises(TypeError, match=r"ModularKernel: activation must be a str, got int"):
        modmoe.ModularKernel(num_experts=8, hidden_size=K, intermediate_size=N, topk=TOPK,
                             activation=1)  # fmt: skip
    with pytest.raises(TypeError, match=r"select_experts: topk must be an int, got str"):
        modmoe.select_experts(np.zeros((2, 8), np.float32), "2")


def test_array_without_known_framework_needs_out(kernel, problem):
    class Wrapped:  # exposes __dlpack__ but is no framework modmoe can allocate with
        def __init__(self, a):
            self._a, self.shape, self.dtype = a, a.shape, a.dtype

        def __dlpack__(self, **kwargs):
            return self._a.__dlpack__(**kwargs)

        def __dlpack_device__(self):
            return self._a.__dlpack_device__()

    with pytest.raises(TypeError, match=r"cannot allocate the output like a Wrapped .* pass out="):
        forward(kernel, problem, x=Wrapped(problem["x"]))
    out = np.full((M, K), np.nan, np.float32)
    forward(kernel, problem, x=Wrapped(problem["x"]), out=out)
    expected = forward(kernel, problem)
    np.testing.assert_array_equal(out, expected)


def test_requires_grad_is_refused(kernel, problem):
    class GradArray(np.ndarray):  # the attribute torch tensors carry
        requires_grad = True

    with pytest.raises(ValueError) as e:
        forward(kernel, problem, x=problem["x"].view(GradArray))
    assert str(e.value) == (
        "ModularKernel.forward: x must not require grad (modmoe computes no gradients; pass "
        "x.detach()), got a tensor with requires_grad=True"
    )
