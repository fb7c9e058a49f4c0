"""modmoe: Mixture-of-Experts layers built as a vLLM-style *modular kernel*, from Python.

Tensors cross into the C++ library through DLPack without copies: numpy arrays run on the CPU
backend, torch or cupy tensors on the device they live on. Shapes (the names used throughout):

    M   tokens                  K   hidden size           N   intermediate size per expert
    E   global experts          E_local  experts held here (w13.shape[0])
    x             (M, K)             bf16 / fp16 / fp32
    w13           (E_local, 2N, K)   gated activations; (E_local, N, K) for the *_no_mul ones
    w2            (E_local, K, N)
    topk_weights  (M, topk)          fp32
    topk_ids      (M, topk)          int32 / int64, global expert ids in [0, E)
    expert_map    (E,)               int32, global id -> local id, -1 = not held here
    out           (M, K)             the dtype of x

dtypes: numpy has no bfloat16, so numpy callers use fp32 or fp16, or bf16 through ml_dtypes'
``bfloat16`` arrays; torch bf16 tensors work as they are. fp8 (e4m3) data travels as uint8
arrays holding the raw bytes (numpy outputs are uint8), as ml_dtypes ``float8_e4m3fn`` arrays,
or as torch ``float8_e4m3fn`` tensors; MX scales (e8m0) likewise as uint8 or
``float8_e8m0fnu``.

Errors: bad values (dtype, shape, device, contiguity, incompatible parts, ...) raise ValueError
carrying the library's message ("<function>: <argument> must be <expected>, got <actual>");
arguments of the wrong Python type raise TypeError.

See docs/python.md for the full guide.
"""

from __future__ import annotations

import collections
import numbers
from typing import Any, Optional, Tuple

import numpy as np

from . import _core

__all__ = [
    "ModularKernel",
    "check_compatibility",
    "cuda_available",
    "dequantize_fp8",
    "fused_moe",
    "has_cuda_backend",
    "list_parts",
    "moe_gemm_groupwise",
    "moe_gemm_sm90_available",
    "moe_gemm_sm90_tiles",
    "quantize_fp8",
    "quantize_weights",
    "select_experts",
    "weight_scale_shape",
    "act_scale_shape",
]

__version__ = "0.1.0"

#: True when this build of the package contains the CUDA backend.
has_cuda_backend: bool = bool(_core.has_cuda_backend)


def cuda_available() -> bool:
    """True when this build has the CUDA backend and a CUDA device is visible."""
    return bool(_core.cuda_available())


# ---- dtypes ------------------------------------------------------------------------------------

# Spellings of numpy / torch / ml_dtypes / modmoe dtypes -> modmoe dtype names.
_DTYPE_ALIASES = {
    "bf16": "bf16", "bfloat16": "bf16",
    "fp16": "fp16", "float16": "fp16", "half": "fp16",
    "fp32": "fp32", "float32": "fp32", "float": "fp32",
    "fp64": "fp64", "float64": "fp64", "double": "fp64",
    "fp8_e4m3": "fp8_e4m3", "float8_e4m3fn": "fp8_e4m3",
    "fp8_e5m2": "fp8_e5m2", "float8_e5m2": "fp8_e5m2",
    "e8m0": "e8m0", "float8_e8m0fnu": "e8m0",
    "int8": "int8", "int32": "int32", "int64": "int64", "uint8": "uint8",
}  # fmt: skip

# dtypes numpy lacks: carried as same-width unsigned views plus the real name.
_NUMPY_VIEW = {"bf16": np.uint16, "fp8_e4m3": np.uint8, "fp8_e5m2": np.uint8, "e8m0": np.uint8}


def _dtype_name(dtype: Any, fn: str = "modmoe", arg: str = "dtype") -> str:
    """The modmoe name of a dtype given as a string, numpy dtype or torch dtype."""
    if isinstance(dtype, str):
        text = dtype
    elif dtype is None:
        raise TypeError(f"{fn}: {arg} must be a dtype name such as 'bf16' or 'fp32', got None")
    else:
        try:
            text = np.dtype(dtype).name if not _is_torch_dtype(dtype) else str(dtype)
        except TypeError:
            text = str(dtype)
    text = text.replace("torch.", "")
    if text not in _DTYPE_ALIASES:
        raise ValueError(
            f"{fn}: {arg} must be one of bf16, fp16, fp32 (or another modmoe dtype), "
            f"got {dtype!r}"
        )
    return _DTYPE_ALIASES[text]


def _is_torch_dtype(dtype: Any) -> bool:
    return type(dtype).__module__ == "torch" and type(dtype).__name__ == "dtype"


def _framework(a: Any) -> str:
    """'numpy', 'torch', 'cupy' or 'other'."""
    if isinstance(a, np.ndarray):
        return "numpy"
    module = type(a).__module__ or ""
    if module.startswith("torch"):
        return "torch"
    if module.startswith("cupy"):
        return "cupy"
    return "other"


def _array_dtype(a: Any) -> Optional[str]:
    """The modmoe name of an array's dtype, or None when modmoe has no such dtype."""
    return _DTYPE_ALIASES.get(str(a.dtype).replace("torch.", ""))


def _is_array(a: Any) -> bool:
    return hasattr(a, "__dlpack__") or hasattr(a, "__array_interface__")


def _require_array(fn: str, arg: str, a: Any) -> None:
    if not _is_array(a) or not hasattr(a, "shape"):
        raise TypeError(
            f"{fn}: {arg} must be an array (numpy, or an object with __dlpack__ such as a torch "
            f"or cupy tensor), got {type(a).__name__}"
        )


def _shape(a: Any) -> Tuple[int, ...]:
    return tuple(int(d) for d in a.shape)


def _device(fn: str, arg: str, a: Any) -> Tuple[str, int]:
    """('cpu', 0) or ('cuda', index) of an array, from its DLPack device."""
    if not hasattr(a, "__dlpack_device__"):
        return ("cpu", 0)
    kind, index = a.__dlpack_device__()
    kind = int(kind)
    if kind in (1, 3):  # kDLCPU, kDLCUDAHost
        return ("cpu", 0)
    if kind in (2, 13):  # kDLCUDA, kDLCUDAManaged
        return ("cuda", int(index))
    raise ValueError(f"{fn}: {arg} must be on the CPU or a CUDA device, got DLPack device {kind}")


def _arg(fn: str, arg: str, a: Any, byte_dtype: Optional[str] = None) -> Any:
    """What the C++ side gets for one tensor argument: None, the array, or (view, dtype name).

    byte_dtype: the modmoe dtype a uint8 array stands for in this position (fp8_e4m3 for
    quantized data, e8m0 for MX scales).
    """
    if a is None:
        return None
    if getattr(a, "requires_grad", False):
        raise ValueError(
            f"{fn}: {arg} must not require grad (modmoe computes no gradients; pass "
            f"{arg}.detach()), got a tensor with requires_grad=True"
        )
    if not hasattr(a, "dtype") or not _is_array(a):
        return a  # the C++ side raises TypeError naming fn and arg
    name = _array_dtype(a)
    framework = _framework(a)
    if name in _NUMPY_VIEW and framework != "torch" and str(a.dtype) != "uint8":
        # ml_dtypes arrays (numpy) cannot be exported through DLPack: send their bytes.
        return (a.view(_NUMPY_VIEW[name]), name)
    if framework == "torch" and name in ("fp8_e4m3", "fp8_e5m2", "e8m0"):
        import torch

        return (a.view(torch.uint8), name)
    if name == "uint8" and byte_dtype is not None:
        return (a, byte_dtype)
    return a


def _empty(fn: str, like: Any, shape: Tuple[int, ...], dtype: str) -> Any:
    """An uninitialized output of the framework and device of `like`."""
    framework = _framework(like)
    shape = tuple(max(int(d), 0) for d in shape)
    if framework == "torch":
        import torch

        torch_names = {
            "bf16": "bfloat16", "fp16": "float16", "fp32": "float32", "fp64": "float64",
            "fp8_e4m3": "float8_e4m3fn", "fp8_e5m2": "float8_e5m2", "e8m0": "float8_e8m0fnu",
            "int8": "int8", "int32": "int32", "int64": "int64", "uint8": "uint8",
        }  # fmt: skip
        torch_dtype = getattr(torch, torch_names[dtype], torch.uint8)  # old torch: raw bytes
        return torch.empty(shape, dtype=torch_dtype, device=like.device)
    if framework in ("numpy", "cupy"):
        xp = np
        if framework == "cupy":
            import cupy as xp  # type: ignore[no-redef]
        if dtype == "bf16":
            try:
                import ml_dtypes
            except ImportError:
                raise ValueError(
                    f"{fn}: a bf16 output needs ml_dtypes (pip install ml_dtypes) or torch "
                    f"tensors; pass out= or use fp32/fp16"
                ) from None
            if framework == "cupy":
                raise ValueError(f"{fn}: cupy has no bfloat16: pass out=")
            return np.empty(shape, dtype=ml_dtypes.bfloat16)
        np_dtype = _NUMPY_VIEW.get(dtype) or {"fp16": np.float16, "fp32": np.float32,
                                              "fp64": np.float64, "int8": np.int8,
                                              "int32": np.int32, "int64": np.int64,
                                              "uint8": np.uint8}[dtype]  # fmt: skip
        return xp.empty(shape, dtype=np_dtype)
    raise TypeError(
        f"{fn}: cannot allocate the output like a {type(like).__name__} (numpy, torch and cupy "
        f"are known): pass out="
    )


def _stream(fn: str, like: Any, device: Tuple[str, int], stream: Any) -> int:
    """The CUDA stream of a call as an address: the given one, else the caller framework's
    current stream. 0 on the CPU."""
    if stream is not None:
        if isinstance(stream, numbers.Integral):
            return int(stream)
        for attribute in ("cuda_stream", "ptr"):  # torch.cuda.Stream, cupy.cuda.Stream
            if hasattr(stream, attribute):
                return int(getattr(stream, attribute))
        raise TypeError(
            f"{fn}: stream must be an int (cudaStream_t address), a torch.cuda.Stream or a "
            f"cupy stream, got {type(stream).__name__}"
        )
    if device[0] != "cuda":
        return 0
    framework = _framework(like)
    if framework == "torch":
        import torch

        return int(torch.cuda.current_stream(device[1]).cuda_stream)
    if framework == "cupy":
        import cupy

        return int(cupy.cuda.get_current_stream().ptr)
    return 0


def _allocator(like: Any, device: Tuple[str, int]) -> Tuple[Any, Any]:
    """(alloc, free) callbacks for the workspaces: torch's caching allocator for torch callers
    on CUDA, else (None, None) (modmoe's default device pool)."""
    if device[0] != "cuda" or _framework(like) != "torch":
        return None, None
    import torch

    index = device[1]

    def alloc(nbytes: int, stream: int) -> int:
        if nbytes == 0:
            return 0
        return int(torch.cuda.caching_allocator_alloc(nbytes, index, stream))

    def free(address: int, nbytes: int, stream: int) -> None:
        if address:
            torch.cuda.caching_allocator_delete(address)

    return alloc, free


def _int(fn: str, arg: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{fn}: {arg} must be an int, got {type(value).__name__}")
    return int(value)


def _str(fn: str, arg: str, value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{fn}: {arg} must be a str, got {type(value).__name__}")
    return value


def _parse_device(fn: str, device: Any) -> Tuple[str, int]:
    text = str(device)  # also torch.device
    if text == "cpu":
        return ("cpu", 0)
    if text == "cuda":
        return ("cuda", 0)
    if text.startswith("cuda:") and text[5:].isdigit():
        return ("cuda", int(text[5:]))
    raise ValueError(f"{fn}: device must be 'cpu', 'cuda' or 'cuda:N', got {device!r}")


def _split_quant(fn: str, quant: str, static_act_scale: Optional[bool]) -> Tuple[str, bool]:
    """'fp8-tensor-static' -> ('fp8-tensor', True); the scheme name is checked by the library."""
    quant = _str(fn, "quant", quant)
    static = quant.endswith("-static")
    if static:
        quant = quant[: -len("-static")]
    if static_act_scale is not None:
        static = static or bool(static_act_scale)
    return quant, static


# ---- the catalog -------------------------------------------------------------------------------


def list_parts() -> list:
    """Every registered part with its capabilities, as dicts.

    Keys: name, kind ('prepare_finalize' | 'experts'), backends (['cpu', 'cuda']), format
    ('standard' | 'batched'), in_dtypes, quant_schemes, static_act_scale, block_quant,
    expert_map, chunking, graph_capturable, ranks_needed, k_alignment, n_alignment, summary,
    description (the line `modmoe-check --list` prints); Experts also have activations,
    gated_layouts and weight_and_reduce.
    """
    return list(_core.list_parts())


def check_compatibility(
    prepare_finalize: str,
    experts: str,
    *,
    num_experts: int,
    hidden_size: int,
    intermediate_size: int,
    topk: int,
    dtype: Any = "bf16",
    quant: str = "none",
    activation: str = "silu",
    gated_layout: str = "gate_up",
    max_num_tokens: int = 0,
    num_local_experts: Optional[int] = None,
    static_act_scale: Optional[bool] = None,
    backend: str = "cpu",
) -> Tuple[bool, str]:
    """Whether two registered parts compose for a layer: (ok, reason); reason is '' when ok.

    Reads capabilities only (builds nothing). Unknown part names raise ValueError.
    """
    fn = "check_compatibility"
    scheme, static = _split_quant(fn, quant, static_act_scale)
    ok, reason = _core.check_compatibility(
        _str(fn, "prepare_finalize", prepare_finalize), _str(fn, "experts", experts),
        _int(fn, "num_experts", num_experts),
        _int(fn, "num_local_experts",
             num_experts if num_local_experts is None else num_local_experts),
        _int(fn, "hidden_size", hidden_size), _int(fn, "intermediate_size", intermediate_size),
        _int(fn, "topk", topk), _dtype_name(dtype, fn), scheme, static,
        _str(fn, "activation", activation), _str(fn, "gated_layout", gated_layout),
        _int(fn, "max_num_tokens", max_num_tokens), _str(fn, "backend", backend),
    )  # fmt: skip
    return bool(ok), str(reason)


# ---- the modular kernel ------------------------------------------------------------------------


class ModularKernel:
    """A MoE layer composed of a PrepareAndFinalize and an Experts part, chosen by name.

    ``ModularKernel(prepare_finalize="NoEPPrepareAndFinalize", experts="auto", *, num_experts,
    hidden_size, intermediate_size, topk, dtype="bf16", quant="none", activation="silu",
    gated_layout="gate_up", max_num_tokens=0, num_local_experts=None, device="cpu")``

    - ``experts="auto"`` takes the first registered Experts that composes with the P/F.
    - ``hidden_size`` is K, ``intermediate_size`` is N (w13 is (E_local, 2N, K) for gated
      activations, (E_local, N, K) for ``*_no_mul``; w2 is (E_local, K, N)).
    - ``dtype``: the dtype of x and out: "bf16", "fp16" or "fp32" (numpy/torch dtypes work).
    - ``quant``: "none", "fp8-tensor", "fp8-tensor-static" (static activation scales a13_scale /
      a2_scale are given to forward), "fp8-token", "fp8-block" (128 blocks) or "mxfp8".
    - ``activation``: silu, gelu, gelu_tanh, swigluoai and their ``_no_mul`` forms.
    - ``gated_layout``: "gate_up" (vLLM's [w1; w3]), "up_gate" or "interleaved".
    - ``max_num_tokens``: tokens one forward may carry; needed (> 0) by batched parts.
    - ``num_local_experts``: E_local < E with an expert_map (defaults to num_experts).
    - ``device``: "cpu", "cuda", "cuda:N" (or a torch.device).

    Raises ValueError with the reason when the parts are unknown or do not compose.
    """

    def __init__(
        self,
        prepare_finalize: str = "NoEPPrepareAndFinalize",
        experts: str = "auto",
        *,
        num_experts: int,
        hidden_size: int,
        intermediate_size: int,
        topk: int,
        dtype: Any = "bf16",
        quant: str = "none",
        activation: str = "silu",
        gated_layout: str = "gate_up",
        max_num_tokens: int = 0,
        num_local_experts: Optional[int] = None,
        device: Any = "cpu",
        static_act_scale: Optional[bool] = None,
    ) -> None:
        fn = "ModularKernel"
        self.dtype = _dtype_name(dtype, fn)
        self.quant, self.static_act_scale = _split_quant(fn, quant, static_act_scale)
        self.num_experts = _int(fn, "num_experts", num_experts)
        self.num_local_experts = _int(
            fn, "num_local_experts", num_experts if num_local_experts is None else num_local_experts
        )
        self.hidden_size = _int(fn, "hidden_size", hidden_size)
        self.intermediate_size = _int(fn, "intermediate_size", intermediate_size)
        self.topk = _int(fn, "topk", topk)
        self.activation = _str(fn, "activation", activation)
        self.gated_layout = _str(fn, "gated_layout", gated_layout)
        self.max_num_tokens = _int(fn, "max_num_tokens", max_num_tokens)
        self.device = _parse_device(fn, device)
        self._kernel = _core.Kernel(
            _str(fn, "prepare_finalize", prepare_finalize), _str(fn, "experts", experts),
            self.num_experts, self.num_local_experts, self.hidden_size, self.intermediate_size,
            self.topk, self.dtype, self.quant, self.static_act_scale, self.activation,
            self.gated_layout, self.max_num_tokens, self.device[0], self.device[1],
        )  # fmt: skip

    @property
    def prepare_finalize(self) -> str:
        """The registered name of the PrepareAndFinalize part."""
        return self._kernel.prepare_finalize

    @property
    def experts(self) -> str:
        """The registered name of the Experts part (what "auto" picked)."""
        return self._kernel.experts

    @property
    def config(self) -> str:
        """The layer configuration, e.g. '[E=8 K=256 N=128 topk=2 dtype=fp32 ...]'."""
        return self._kernel.config

    def __repr__(self) -> str:
        device = self.device[0] if self.device[0] == "cpu" else f"cuda:{self.device[1]}"
        return (
            f"ModularKernel({self.prepare_finalize} + {self.experts}, {self.config}, "
            f"device={device})"
        )

    def forward(
        self,
        x: Any,
        w13: Any,
        w2: Any,
        topk_weights: Any,
        topk_ids: Any,
        w13_scale: Any = None,
        w2_scale: Any = None,
        a13_scale: Any = None,
        a2_scale: Any = None,
        expert_map: Any = None,
        apply_router_weight_on_input: bool = False,
        out: Any = None,
        chunk_size: Optional[int] = None,
        stream: Any = None,
    ) -> Any:
        """Runs the layer: out[t] = sum_k topk_weights[t, k] * expert_{topk_ids[t, k]}(x[t]).

        Shapes (M tokens; K, N, E, E_local, topk from the kernel's configuration):

        - x (M, K) in the kernel's dtype; out (M, K) in that dtype, allocated like x (numpy on
          the CPU, torch/cupy on their device) when None; out may be x itself (in place).
        - w13 (E_local, 2N, K) gated / (E_local, N, K) ``*_no_mul``; w2 (E_local, K, N): the
          kernel's dtype, or fp8 e4m3 (uint8 bytes, ml_dtypes or torch float8) when quantized.
        - topk_weights fp32 (M, topk); topk_ids int32/int64 (M, topk), global ids.
        - w13_scale / w2_scale: weight scales of the scheme (``weight_scale_shape``): fp8-tensor
          fp32 (E_local,), fp8-token fp32 (E_local, rows), fp8-block fp32 (E_local,
          ceil(rows/128), ceil(cols/128)), mxfp8 e8m0 (E_local, rows, ceil(cols/32)).
        - a13_scale / a2_scale: fp32 (1,) static activation scales (fp8-tensor-static only).
        - expert_map: int32 (E,), global -> local expert id, -1 = not held here.
        - apply_router_weight_on_input: scale x by the weight before the experts (topk == 1).
        - chunk_size: tokens per Experts call (default 32768; <= 0: no chunking).
        - stream: CUDA only: an int address, torch.cuda.Stream or cupy stream; default: the
          caller framework's current stream.

        All arrays must be contiguous and on the kernel's device. Returns out.
        """
        fn = "ModularKernel.forward"
        _require_array(fn, "x", x)
        if out is None:
            M = _shape(x)[0] if len(_shape(x)) >= 1 else 0
            out = _empty(fn, x, (M, self.hidden_size), self.dtype)
        fp8 = "fp8_e4m3" if self.quant != "none" else None
        scale = "e8m0" if self.quant == "mxfp8" else None
        device = _device(fn, "x", x)
        alloc, free = _allocator(x, device)
        self._kernel.forward(
            _arg(fn, "x", x), _arg(fn, "w13", w13, fp8), _arg(fn, "w2", w2, fp8),
            _arg(fn, "topk_weights", topk_weights), _arg(fn, "topk_ids", topk_ids),
            _arg(fn, "out", out), _arg(fn, "w13_scale", w13_scale, scale),
            _arg(fn, "w2_scale", w2_scale, scale), _arg(fn, "a13_scale", a13_scale),
            _arg(fn, "a2_scale", a2_scale), _arg(fn, "expert_map", expert_map),
            bool(apply_router_weight_on_input),
            None if chunk_size is None else _int(fn, "chunk_size", chunk_size),
            _stream(fn, x, device, stream), alloc, free,
        )  # fmt: skip
        return out

    __call__ = forward


# ---- functional entry points -------------------------------------------------------------------

_KERNEL_CACHE: "collections.OrderedDict[tuple, ModularKernel]" = collections.OrderedDict()
_KERNEL_CACHE_SIZE = 64


def _infer_quant(fn: str, w13_scale: Any, a13_scale: Any) -> str:
    """The scheme that the weight scales' layout implies (see weight_scale_shape)."""
    if w13_scale is None:
        return "none"
    _require_array(fn, "w13_scale", w13_scale)
    ndim = len(_shape(w13_scale))
    if ndim == 1:
        return "fp8-tensor-static" if a13_scale is not None else "fp8-tensor"
    if ndim == 2:
        return "fp8-token"
    if ndim == 3:
        return "fp8-block" if _array_dtype(w13_scale) == "fp32" else "mxfp8"
    raise ValueError(
        f"{fn}: w13_scale must be 1-D (fp8-tensor), 2-D (fp8-token) or 3-D (fp8-block, mxfp8), "
        f"got shape {_shape(w13_scale)}; or pass quant="
    )


def _require_ndim(fn: str, arg: str, a: Any, ndim: int, dims: str) -> Tuple[int, ...]:
    _require_array(fn, arg, a)
    shape = _shape(a)
    if len(shape) != ndim:
        raise ValueError(f"{fn}: {arg} must be {ndim}-D {dims}, got shape {shape}")
    return shape


def fused_moe(
    x: Any,
    w13: Any,
    w2: Any,
    topk_weights: Any,
    topk_ids: Any,
    *,
    w13_scale: Any = None,
    w2_scale: Any = None,
    a13_scale: Any = None,
    a2_scale: Any = None,
    expert_map: Any = None,
    apply_router_weight_on_input: bool = False,
    activation: str = "silu",
    gated_layout: str = "gate_up",
    quant: Optional[str] = None,
    prepare_finalize: str = "NoEPPrepareAndFinalize",
    experts: str = "auto",
    max_num_tokens: Optional[int] = None,
    out: Any = None,
    chunk_size: Optional[int] = None,
    stream: Any = None,
) -> Any:
    """The MoE layer in one call: builds (and caches) a ModularKernel for the shapes, runs it.

    Shapes as in ``ModularKernel.forward``; the configuration is read off the arguments:
    dtype = x.dtype, K = x.shape[1], N = w2.shape[2], E_local = w13.shape[0],
    E = expert_map.shape[0] (else E_local), topk = topk_ids.shape[1], device = x's device.
    ``quant=None`` infers the scheme from w13_scale: None -> "none", 1-D -> "fp8-tensor"
    ("fp8-tensor-static" when a13_scale is given), 2-D -> "fp8-token", 3-D fp32 ->
    "fp8-block", 3-D e8m0/uint8 -> "mxfp8". Batched P/Fs get max_num_tokens = M unless given.

    Returns out, (M, K) in x's dtype (allocated like x when None).
    """
    fn = "fused_moe"
    x_shape = _require_ndim(fn, "x", x, 2, "(M, K)")
    w13_shape = _require_ndim(fn, "w13", w13, 3, "(E_local, 2N, K)")
    w2_shape = _require_ndim(fn, "w2", w2, 3, "(E_local, K, N)")
    ids_shape = _require_ndim(fn, "topk_ids", topk_ids, 2, "(M, topk)")
    num_experts = w13_shape[0]
    if expert_map is not None:
        num_experts = _require_ndim(fn, "expert_map", expert_map, 1, "(E,)")[0]
    if quant is None:
        quant = _infer_quant(fn, w13_scale, a13_scale)
    dtype = _array_dtype(x)
    if dtype is None:
        raise ValueError(f"{fn}: x must be bf16, fp16 or fp32 (M, K), got dtype {x.dtype}")
    if max_num_tokens is None:
        max_num_tokens = x_shape[0] if "Batched" in prepare_finalize else 0
    device = _device(fn, "x", x)
    key = (
        prepare_finalize, experts, num_experts, w13_shape[0], x_shape[1], w2_shape[2],
        ids_shape[1], dtype, quant, activation, gated_layout, max_num_tokens, device,
    )  # fmt: skip
    kernel = _KERNEL_CACHE.get(key)
    if kernel is None:
        kernel = ModularKernel(
            prepare_finalize, experts, num_experts=num_experts, num_local_experts=w13_shape[0],
            hidden_size=x_shape[1], intermediate_size=w2_shape[2], topk=ids_shape[1],
            dtype=dtype, quant=quant, activation=activation, gated_layout=gated_layout,
            max_num_tokens=max_num_tokens, device=f"{device[0]}:{device[1]}"
            if device[0] == "cuda" else "cpu",
        )  # fmt: skip
        _KERNEL_CACHE[key] = kernel
        while len(_KERNEL_CACHE) > _KERNEL_CACHE_SIZE:
            _KERNEL_CACHE.popitem(last=False)
    else:
        _KERNEL_CACHE.move_to_end(key)
    return kernel.forward(
        x, w13, w2, topk_weights, topk_ids, w13_scale=w13_scale, w2_scale=w2_scale,
        a13_scale=a13_scale, a2_scale=a2_scale, expert_map=expert_map,
        apply_router_weight_on_input=apply_router_weight_on_input, out=out,
        chunk_size=chunk_size, stream=stream,
    )  # fmt: skip


def select_experts(
    router_logits: Any,
    topk: int,
    renormalize: bool = True,
    num_expert_group: Optional[int] = None,
    topk_group: Optional[int] = None,
    scoring_func: str = "softmax",
    e_score_correction_bias: Any = None,
    routed_scaling_factor: float = 1.0,
    ids_dtype: Any = "int32",
    stream: Any = None,
) -> Tuple[Any, Any]:
    """Routing: router_logits (M, E) bf16/fp16/fp32 -> (topk_weights fp32 (M, topk),
    topk_ids int32/int64 (M, topk)), allocated like router_logits.

    Without groups, bias or scaling and with softmax scoring: softmax over E, top-k, weights
    divided by their sum when ``renormalize`` (Mixtral / Qwen / gpt-oss). Otherwise DeepSeek-V3
    grouped top-k: scores s = scoring_func(logits); selection uses s + e_score_correction_bias
    (fp32 (E,)); the E experts form ``num_expert_group`` groups (default 1), a group scores
    the sum of its two best biased scores, the best ``topk_group`` groups are kept (default 1)
    and the top-k biased scores among their experts chosen; weights are the unbiased s of the
    chosen experts, renormalized if asked, times routed_scaling_factor. Ties go to the lower
    expert index.
    """
    fn = "select_experts"
    shape = _require_ndim(fn, "router_logits", router_logits, 2, "(M, E)")
    topk = _int(fn, "topk", topk)
    ids_name = _dtype_name(ids_dtype, fn, "ids_dtype")
    if ids_name not in ("int32", "int64"):
        raise ValueError(f"{fn}: ids_dtype must be int32 or int64, got {ids_dtype!r}")
    scoring_func = _str(fn, "scoring_func", scoring_func)
    if scoring_func not in ("softmax", "sigmoid"):
        raise ValueError(f"{fn}: scoring_func must be 'softmax' or 'sigmoid', got {scoring_func!r}")
    if (num_expert_group is None) != (topk_group is None):
        raise ValueError(
            f"{fn}: num_expert_group and topk_group go together, got num_expert_group="
            f"{num_expert_group}, topk_group={topk_group}"
        )
    weights = _empty(fn, router_logits, (shape[0], topk), "fp32")
    ids = _empty(fn, router_logits, (shape[0], topk), ids_name)
    device = _device(fn, "router_logits", router_logits)
    cuda_stream = _stream(fn, router_logits, device, stream)
    plain = (
        num_expert_group is None
        and scoring_func == "softmax"
        and e_score_correction_bias is None
        and routed_scaling_factor == 1.0
    )
    if plain:
        _core.softmax_topk(
            _arg(fn, "router_logits", router_logits), topk, bool(renormalize),
            _arg(fn, "topk_weights", weights), _arg(fn, "topk_ids", ids), cuda_stream,
        )  # fmt: skip
    else:
        groups = 1 if num_expert_group is None else _int(fn, "num_expert_group", num_expert_group)
        kept = 1 if topk_group is None else _int(fn, "topk_group", topk_group)
        _core.grouped_topk(
            _arg(fn, "router_logits", router_logits),
            _arg(fn, "e_score_correction_bias", e_score_correction_bias), topk, groups, kept,
            scoring_func, bool(renormalize), float(routed_scaling_factor),
            _arg(fn, "topk_weights", weights), _arg(fn, "topk_ids", ids), cuda_stream,
        )  # fmt: skip
    return weights, ids


# ---- quantization ------------------------------------------------------------------------------


def act_scale_shape(scheme: str, M: int, K: int) -> Tuple[int, ...]:
    """Shape of the activation scales of x (M, K) under a scheme: fp8-tensor (1,), fp8-token
    (M, 1), fp8-block (M, ceil(K/128)), mxfp8 (M, ceil(K/32))."""
    return tuple(_core.act_scale_shape(_str("act_scale_shape", "scheme", scheme), M, K))


def weight_scale_shape(scheme: str, E: int, N: int, K: int) -> Tuple[int, ...]:
    """Shape of the scales of weights (E, N, K) under a scheme: fp8-tensor (E,), fp8-token
    (E, N), fp8-block (E, ceil(N/128), ceil(K/128)), mxfp8 (E, N, ceil(K/32))."""
    return tuple(_core.weight_scale_shape(_str("weight_scale_shape", "scheme", scheme), E, N, K))


def quantize_fp8(
    x: Any, scheme: str = "fp8-token", scale: Any = None, stream: Any = None
) -> Tuple[Any, Any]:
    """Quantizes activations x (M, K) bf16/fp16/fp32 to fp8 e4m3: returns (q, scale).

    q (M, K): uint8 e4m3 bytes for numpy (``q.view(ml_dtypes.float8_e4m3fn)`` shows values),
    torch.float8_e4m3fn for torch. scale (``act_scale_shape``): fp32, or e8m0 for mxfp8
    (uint8 for numpy). Schemes: fp8-tensor, fp8-token, fp8-block, mxfp8. Dynamic scales map a
    group's largest magnitude to 448. With ``scale`` given (fp8-tensor only: fp32 (1,)), the
    scale is static: it is used, not computed, and returned as is.
    """
    fn = "quantize_fp8"
    shape = _require_ndim(fn, "x", x, 2, "(M, K) (quantize_weights takes (E, N, K) weights)")
    scheme = _core.parse_quant_scheme(_str(fn, "scheme", scheme))
    q = _empty(fn, x, shape, "fp8_e4m3")
    static = scale is not None
    if not static:
        scale = _empty(fn, x, act_scale_shape(scheme, *shape), _core.scale_dtype(scheme))
    device = _device(fn, "x", x)
    _core.quantize_activations(
        _arg(fn, "x", x), scheme, static, _arg(fn, "q", q, "fp8_e4m3"),
        _arg(fn, "scale", scale, "e8m0" if scheme == "mxfp8" else None),
        _stream(fn, x, device, stream),
    )  # fmt: skip
    return q, scale


def quantize_weights(w: Any, scheme: str) -> Tuple[Any, Any]:
    """Quantizes expert weights w (E, N, K) bf16/fp16/fp32 to fp8 e4m3 (CPU): (q, scale).

    q (E, N, K) as in quantize_fp8; scale (``weight_scale_shape``): fp8-tensor fp32 (E,),
    fp8-token fp32 (E, N), fp8-block fp32 (E, ceil(N/128), ceil(K/128)) of 128x128 blocks,
    mxfp8 e8m0 (E, N, ceil(K/32)).
    """
    fn = "quantize_weights"
    shape = _require_ndim(fn, "w", w, 3, "(E, N, K)")
    scheme = _core.parse_quant_scheme(_str(fn, "scheme", scheme))
    q = _empty(fn, w, shape, "fp8_e4m3")
    scale = _empty(fn, w, weight_scale_shape(scheme, *shape), _core.scale_dtype(scheme))
    _core.quantize_weights(
        _arg(fn, "w", w), scheme, _arg(fn, "q", q, "fp8_e4m3"),
        _arg(fn, "scale", scale, "e8m0" if scheme == "mxfp8" else None),
    )  # fmt: skip
    return q, scale


def dequantize_fp8(
    q: Any,
    scale: Any,
    scheme: str = "fp8-token",
    dtype: Any = "fp32",
    out: Any = None,
    stream: Any = None,
) -> Any:
    """out = q * scale (per group of the scheme), in ``dtype`` (bf16/fp16/fp32).

    q (M, K) activations with ``act_scale_shape`` scales, or q (E, N, K) weights with
    ``weight_scale_shape`` scales (weights: CPU only). q is fp8 e4m3 (uint8 bytes, ml_dtypes or
    torch float8); scale fp32, or e8m0 (uint8) for mxfp8. Returns out (allocated like q).
    """
    fn = "dequantize_fp8"
    _require_array(fn, "q", q)
    scheme = _core.parse_quant_scheme(_str(fn, "scheme", scheme))
    shape = _shape(q)
    if len(shape) not in (2, 3):
        raise ValueError(f"{fn}: q must be 2-D (M, K) or 3-D (E, N, K), got shape {shape}")
    if out is None:
        out = _empty(fn, q, shape, _dtype_name(dtype, fn))
    scale_arg = _arg(fn, "scale", scale, "e8m0" if scheme == "mxfp8" else None)
    if len(shape) == 2:
        device = _device(fn, "q", q)
        _core.dequantize_activations(
            _arg(fn, "q", q, "fp8_e4m3"), scale_arg, scheme, _arg(fn, "out", out),
            _stream(fn, q, device, stream),
        )  # fmt: skip
    else:
        _core.dequantize_weights(
            _arg(fn, "q", q, "fp8_e4m3"), scale_arg, scheme, _arg(fn, "out", out)
        )
    return out


_MOE_GEMM_KERNELS = ("automatic", "portable", "sm90")
_MOE_GEMM_SCHEDULERS = ("cooperative", "linear_scan", "precomputed")
_MOE_GEMM_SCALE_MAJOR_MODES = ("K", "MN")
_MOE_GEMM_OUT_DTYPES = ("bf16", "fp16", "fp32", "fp8_e4m3")


def _one_of(fn: str, arg: str, value: Any, allowed: Tuple[str, ...]) -> str:
    """value, a str that must be one of allowed; ValueError listing them otherwise."""
    value = _str(fn, arg, value)
    if value not in allowed:
        choices = ", ".join(repr(v) for v in allowed)
        raise ValueError(f"{fn}: {arg} must be one of {choices}, got {value!r}")
    return value


def moe_gemm_sm90_tiles() -> list:
    """The Hopper kernel's tile shapes, "BMxBN" (rows of ``a`` x rows of ``b`` per CTA tile;
    gated tiles hold BN/2 gate and BN/2 up rows): the values ``moe_gemm_groupwise(tile=...)``
    takes besides "". Empty in a build without the sm_90a kernels (e.g. a CPU-only build)."""
    return [str(t) for t in _core.moe_gemm_sm90_tiles()]


def moe_gemm_sm90_available(device: Any = "cuda") -> bool:
    """Whether ``device`` ("cpu", "cuda", "cuda:N" or a torch.device) can run the Hopper
    kernel of ``moe_gemm_groupwise``: a CUDA device of compute capability 9.0 and a build with
    the sm_90a kernels. False on the CPU, in a build without the CUDA backend, and without a
    device."""
    fn = "moe_gemm_sm90_available"
    device_type, index = _parse_device(fn, device)
    return bool(_core.moe_gemm_sm90_available(device_type, index))


def moe_gemm_groupwise(
    a: Any,
    b: Any,
    m_indptr: Any,
    a_scale: Any = None,
    b_scale: Any = None,
    *,
    gated: bool = False,
    gated_layout: str = "gate_up",
    activation: str = "silu",
    scale_major_mode: str = "K",
    out: Any = None,
    out_dtype: Any = "bf16",
    out_scale: Any = None,
    kernel: str = "automatic",
    scheduler: str = "cooperative",
    tile: str = "",
    stream: Any = None,
) -> Any:
    """Grouped GEMM over experts: out[rows of e] = a[rows of e] @ b[e].T.

    Inputs: a (total_rows, K) and b (E, N_b, K), both bf16, or both fp8 e4m3 (uint8 bytes,
    ml_dtypes or torch float8) with scales whose dtype picks the scheme. fp32 block scales of
    granularity (1, 128, 128) (K a multiple of 128), laid out by ``scale_major_mode``:

    - "K" (default): a_scale (total_rows, K/128), b_scale (E, ceil(N_b/128), K/128);
    - "MN": the transposes, a_scale (K/128, total_rows), b_scale (E, K/128, ceil(N_b/128)).

    Or MX-FP8: e8m0 scales (torch.float8_e8m0fnu, ml_dtypes float8_e8m0fnu, or uint8 bytes as
    ``quantize_fp8(x, "mxfp8")`` returns them for numpy), one power of two 2^(v-127) per 32
    elements along K (K a multiple of 32): a_scale (total_rows, K/32), b_scale (E, N_b, K/32),
    "K"-major only, with a bf16, fp16 or fp32 out.

    m_indptr (E+1) int32 on the same device: expert e owns rows [m_indptr[e], m_indptr[e+1]);
    experts may be empty and rows outside every expert are left untouched. With ``gated``
    (FlashInfer's is_gated) N_out = N_b / 2 and out = act(gate) * up, the halves of b's rows
    ordered by ``gated_layout`` ("gate_up", "up_gate" (FlashInfer), "interleaved"); otherwise
    N_out = N_b. N_out must be a multiple of 16.

    Output: out (total_rows, N_out) in ``out_dtype`` ("bf16", "fp16", "fp32", or "fp8_e4m3";
    numpy/torch dtypes work too), allocated like ``a`` unless given; returns out. An fp8 out
    (gated only, N_out a multiple of 128) is act(gate) * up quantized per row and 128 columns,
    the fp8-block operand GEMM2 takes: out fp8 e4m3 (total_rows, N_out) (uint8 bytes for numpy,
    also ml_dtypes or torch float8_e4m3fn; a uint8 ``out`` means fp8) with ``out_scale`` fp32
    (total_rows, N_out/128), allocated like ``a`` unless given; then returns (out, out_scale).

    CUDA options (on the CPU ``kernel`` must be "automatic"; scheduler and tile are ignored):

    - ``kernel``: "automatic" (the Hopper kernel when ``moe_gemm_sm90_available()`` and the
      arguments allow it, the portable one otherwise), "portable" (mma.sync, sm80+; fp8 from
      sm89) or "sm90" (the Hopper kernel, an error where it cannot run). "MN" scales and an fp8
      out need the Hopper kernel.
    - ``scheduler`` (Hopper kernel): "cooperative", "linear_scan" or "precomputed".
    - ``tile`` (Hopper kernel): "" (the heuristic) or one of ``moe_gemm_sm90_tiles()`` (checked
      on every backend: a build without Hopper tiles takes only "").

    Unknown names raise ValueError listing the allowed values; the rest of the contract and its
    messages are those of the C++ ``modmoe::moe_gemm_groupwise`` (include/modmoe/moe_gemm.h).
    """
    fn = "moe_gemm_groupwise"
    a_shape = _require_ndim(fn, "a", a, 2, "(total_rows, K)")
    b_shape = _require_ndim(fn, "b", b, 3, "(E, N_b, K)")
    scale_major_mode = _one_of(fn, "scale_major_mode", scale_major_mode,
                               _MOE_GEMM_SCALE_MAJOR_MODES)  # fmt: skip
    kernel = _one_of(fn, "kernel", kernel, _MOE_GEMM_KERNELS)
    scheduler = _one_of(fn, "scheduler", scheduler, _MOE_GEMM_SCHEDULERS)
    tile = _str(fn, "tile", tile)
    if tile:
        tiles = moe_gemm_sm90_tiles()
        if tile not in tiles:
            allowed = ", ".join(repr(t) for t in [""] + tiles)
            if not tiles:
                allowed += " (this build has no Hopper kernel tiles)"
            raise ValueError(f"{fn}: tile must be one of {allowed}, got {tile!r}")
    n_out = b_shape[1] // 2 if gated else b_shape[1]
    if out is None:
        dtype = _dtype_name(out_dtype, fn, "out_dtype")
        if dtype not in _MOE_GEMM_OUT_DTYPES:
            choices = ", ".join(_MOE_GEMM_OUT_DTYPES)
            raise ValueError(f"{fn}: out_dtype must be one of {choices}, got {out_dtype!r}")
        out = _empty(fn, a, (a_shape[0], n_out), dtype)
    else:
        _require_array(fn, "out", out)
    # uint8 is not an output dtype of its own: a uint8 out holds fp8 e4m3 bytes.
    fp8_out = _array_dtype(out) in ("fp8_e4m3", "uint8")
    if fp8_out and out_scale is None:
        out_scale = _empty(fn, a, (a_shape[0], n_out // 128), "fp32")
    fp8_in = "fp8_e4m3" if a_scale is not None or b_scale is not None else None
    # Scales: block scales are fp32, so a uint8 a_scale / b_scale can only hold e8m0 (MX) bytes.
    device = _device(fn, "a", a)
    _core.moe_gemm_groupwise(
        _arg(fn, "a", a, fp8_in), _arg(fn, "b", b, fp8_in),
        _arg(fn, "a_scale", a_scale, "e8m0"), _arg(fn, "b_scale", b_scale, "e8m0"),
        _arg(fn, "m_indptr", m_indptr),
        _arg(fn, "out", out, "fp8_e4m3"), _arg(fn, "out_scale", out_scale), bool(gated),
        _str(fn, "gated_layout", gated_layout), _str(fn, "activation", activation),
        scale_major_mode, kernel, scheduler, tile, _stream(fn, a, device, stream),
    )  # fmt: skip
    return (out, out_scale) if fp8_out else out
