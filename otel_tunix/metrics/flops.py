"""FLOPs of a model step and the peak FLOP/s of accelerators, for throughput and MFU.

Two ways to know the FLOPs of a step:

* **From a model description** (PaLM appendix B, as nanoGPT and torchtitan do): a decoder
  transformer with ``N`` parameters, ``L`` layers, ``H`` heads of size ``Q`` and sequence
  length ``T`` costs ``6N + 12·L·H·Q·T`` FLOPs per trained token (forward and backward);
  :class:`TransformerFlops`.
* **Measured** by the framework on the real step: :func:`measure_torch_flops` (torch's
  ``FlopCounterMode``) and :func:`measure_jax_flops` (XLA's ``cost_analysis`` of the compiled
  function). Both run or compile once, outside the training loop.

:data:`PEAK_FLOPS` holds dense (no sparsity) peak FLOP/s per device and dtype from the
vendors' datasheets; :func:`peak_flops` matches a device name (``torch.cuda.get_device_name``,
JAX's ``device_kind``, NVML's name) against it. An unknown device or dtype gives ``None``:
MFU is then left out, never guessed.

Framework imports stay inside the functions.
"""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Final

__all__ = [
    "PEAK_FLOPS",
    "TransformerFlops",
    "count_params",
    "detect_device_name",
    "device_key",
    "measure_jax_flops",
    "measure_torch_flops",
    "peak_flops",
]

_logger = logging.getLogger(__name__)

T: Final = 1e12
PEAK_FLOPS: Final[Mapping[str, Mapping[str, float]]] = MappingProxyType(
    {
        # NVIDIA (dense tensor-core peaks; fp32 is the non-tensor-core CUDA-core peak)
        "a100": {
            "fp32": 19.5 * T,
            "tf32": 156 * T,
            "bf16": 312 * T,
            "fp16": 312 * T,
            "int8": 624 * T,
        },
        "h100-sxm": {
            "fp32": 67 * T,
            "tf32": 494.7 * T,
            "bf16": 989.4 * T,
            "fp16": 989.4 * T,
            "fp8": 1978.9 * T,
            "int8": 1978.9 * T,
        },
        "h100-pcie": {
            "fp32": 51 * T,
            "tf32": 378 * T,
            "bf16": 756 * T,
            "fp16": 756 * T,
            "fp8": 1513 * T,
            "int8": 1513 * T,
        },
        "h100-nvl": {
            "fp32": 60 * T,
            "tf32": 417.5 * T,
            "bf16": 835 * T,
            "fp16": 835 * T,
            "fp8": 1670 * T,
            "int8": 1670 * T,
        },
        "h200": {
            "fp32": 67 * T,
            "tf32": 494.7 * T,
            "bf16": 989.4 * T,
            "fp16": 989.4 * T,
            "fp8": 1978.9 * T,
            "int8": 1978.9 * T,
        },
        "h200-nvl": {
            "fp32": 60 * T,
            "tf32": 417.5 * T,
            "bf16": 835 * T,
            "fp16": 835 * T,
            "fp8": 1670 * T,
            "int8": 1670 * T,
        },
        "b200": {
            "tf32": 1100 * T,
            "bf16": 2250 * T,
            "fp16": 2250 * T,
            "fp8": 4500 * T,
            "int8": 4500 * T,
        },
        "l40s": {
            "fp32": 91.6 * T,
            "tf32": 183 * T,
            "bf16": 362.05 * T,
            "fp16": 362.05 * T,
            "fp8": 733 * T,
            "int8": 733 * T,
        },
        # AMD
        "mi300x": {
            "fp32": 163.4 * T,
            "tf32": 653.7 * T,
            "bf16": 1307.4 * T,
            "fp16": 1307.4 * T,
            "fp8": 2614.9 * T,
            "int8": 2614.9 * T,
        },
        # Google TPU (per chip)
        "tpu-v4": {"bf16": 275 * T, "int8": 275 * T},
        "tpu-v5e": {"bf16": 197 * T, "int8": 394 * T},
        "tpu-v5p": {"bf16": 459 * T, "int8": 918 * T},
        "tpu-v6e": {"bf16": 918 * T, "int8": 1836 * T},
    }
)
"""Dense peak FLOP/s per device key and dtype (``fp32``, ``tf32``, ``bf16``, ``fp16``,
``fp8``, ``int8``). A dtype missing for a device means no reliable figure: MFU is omitted."""

_DEVICE_PATTERNS: Final[tuple[tuple[re.Pattern[str], str], ...]] = tuple(
    (re.compile(p), key)
    for p, key in (
        (r"gb200|mi300a|\bl40\b", ""),  # known devices without a figure here
        (r"h100.*nvl", "h100-nvl"),
        (r"h100.*pcie", "h100-pcie"),
        (r"h100", "h100-sxm"),
        (r"h200.*nvl", "h200-nvl"),
        (r"h200", "h200"),  # also GH200 (same Hopper GPU)
        (r"a100", "a100"),
        (r"b200", "b200"),
        (r"l40s", "l40s"),
        (r"mi300x", "mi300x"),
        (r"tpu.*v6(e| lite)|trillium", "tpu-v6e"),
        (r"tpu.*v5(e| lite|litepod)", "tpu-v5e"),
        (r"tpu.*v5p?$", "tpu-v5p"),
        (r"tpu.*v4", "tpu-v4"),
    )
)

_DTYPE_ALIASES: Final = {
    "bfloat16": "bf16",
    "float16": "fp16",
    "half": "fp16",
    "float32": "fp32",
    "float": "fp32",
    "tensorfloat32": "tf32",
    "float8": "fp8",
    "float8_e4m3fn": "fp8",
    "float8_e5m2": "fp8",
    "e4m3": "fp8",
}


def device_key(device_name: str) -> str | None:
    """The :data:`PEAK_FLOPS` key of a device name, or ``None`` when unknown.

    >>> device_key("NVIDIA H100 80GB HBM3")
    'h100-sxm'
    >>> device_key("TPU v5 lite")
    'tpu-v5e'
    """
    name = device_name.strip().lower()
    for pattern, key in _DEVICE_PATTERNS:
        if pattern.search(name):
            return key or None
    return None


def _dtype_key(dtype: Any) -> str:
    text = str(dtype).lower().rsplit(".", 1)[-1]
    return _DTYPE_ALIASES.get(text, text)


def peak_flops(device_name: str | None, dtype: Any = "bf16") -> float | None:
    """Dense peak FLOP/s of one device for ``dtype``, or ``None`` when not known.

    Args:
        device_name: E.g. ``"NVIDIA H100 80GB HBM3"``, ``"TPU v5p"``; ``None`` gives ``None``.
        dtype: ``"bf16"``, ``"fp16"``, ``"fp32"``, ``"tf32"``, ``"fp8"``, ``"int8"``, or a
            torch / numpy / JAX dtype (``torch.bfloat16``, ``jnp.float16``).
    """
    if not device_name:
        return None
    key = device_key(device_name)
    if key is None:
        return None
    return PEAK_FLOPS[key].get(_dtype_key(dtype))


def detect_device_name() -> str | None:
    """The name of the accelerator this process uses, from an already-imported framework.

    Tries torch (CUDA / ROCm device 0) and JAX (first device) only if the program imported
    them, then NVML; ``None`` when nothing is found (a CPU run).
    """
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            if torch.cuda.is_available():
                return str(torch.cuda.get_device_name(torch.cuda.current_device()))
        except Exception:  # pragma: no cover - depends on the driver; no name: try the next source
            pass
    jax = sys.modules.get("jax")
    if jax is not None:
        try:
            dev = jax.devices()[0]
            if dev.platform != "cpu":
                return str(dev.device_kind)
        except Exception:  # pragma: no cover - depends on the backend; no name: try the next source
            pass
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
        try:
            if pynvml.nvmlDeviceGetCount() > 0:
                name = pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(0))
                return name.decode() if isinstance(name, bytes) else str(name)
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # NVML without a driver or a GPU: the name is not known
        return None
    return None


@dataclass(frozen=True, slots=True)
class TransformerFlops:
    """FLOPs of a decoder-only transformer per token: ``6N + 12·L·H·Q·T`` when training.

    Attributes:
        n_params: ``N``: parameters in matmuls. Count the token embedding only if it is
            tied to the output head (nanoGPT's convention); position embeddings never.
        n_layers: ``L``.
        n_heads: ``H``: attention (query) heads.
        head_dim: ``Q``: size of one head.
        seq_len: ``T``: tokens per sequence (the attention context).
    """

    n_params: int
    n_layers: int
    n_heads: int
    head_dim: int
    seq_len: int

    def per_token(self, *, training: bool = True) -> float:
        """FLOPs per token: ``6N + 12·L·H·Q·T`` training; a third of it, forward only."""
        fwd_bwd = 6.0 * self.n_params + 12.0 * self.n_layers * self.n_heads * self.head_dim * (
            self.seq_len
        )
        return fwd_bwd if training else fwd_bwd / 3.0

    @classmethod
    def from_config(cls, config: Any, n_params: int, seq_len: int | None = None) -> Any:
        """From a Hugging Face ``PretrainedConfig`` (or any object with the same fields).

        Reads ``num_hidden_layers`` / ``n_layer``, ``num_attention_heads`` / ``n_head``,
        ``head_dim`` (else ``hidden_size // heads``) and ``max_position_embeddings`` /
        ``n_positions`` when ``seq_len`` is not given.
        """

        def first(*names: str) -> Any:
            for n in names:
                v = getattr(config, n, None)
                if v is not None:
                    return v
            raise ValueError(f"config has none of {names}")

        layers = int(first("num_hidden_layers", "n_layer", "num_layers"))
        heads = int(first("num_attention_heads", "n_head", "num_heads"))
        head_dim = getattr(config, "head_dim", None) or (
            int(first("hidden_size", "n_embd", "d_model")) // heads
        )
        t = seq_len or int(first("max_position_embeddings", "n_positions", "n_ctx"))
        return cls(int(n_params), layers, heads, int(head_dim), t)


def count_params(model: Any, *, exclude: Callable[[str], bool] | None = None) -> int:
    """Number of parameters of a torch module or of a JAX / numpy pytree of arrays.

    Args:
        model: ``torch.nn.Module`` (its ``named_parameters()``, shared ones counted once) or
            a pytree (dict / list / tuple of arrays, a flax ``nnx.State``...).
        exclude: Called with a parameter's name (torch only); ``True`` skips it, e.g.
            ``lambda n: "wpe" in n`` for position embeddings.
    """
    named = getattr(model, "named_parameters", None)
    if callable(named):
        return sum(int(p.numel()) for name, p in named() if exclude is None or not exclude(name))
    jax = sys.modules.get("jax")
    if jax is not None:
        leaves = jax.tree_util.tree_leaves(model)
    else:
        leaves = _tree_leaves(model)
    return sum(int(getattr(leaf, "size", 0)) for leaf in leaves)


def _tree_leaves(tree: Any) -> list[Any]:
    if isinstance(tree, Mapping):
        return [x for v in tree.values() for x in _tree_leaves(v)]
    if isinstance(tree, list | tuple):
        return [x for v in tree for x in _tree_leaves(v)]
    return [tree]


def measure_torch_flops(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> float:
    """FLOPs of one call of ``fn`` as counted by ``torch.utils.flop_counter.FlopCounterMode``.

    Call it once with a representative batch, outside the timed loop; a ``fn`` that runs
    ``loss.backward()`` is counted with its backward pass. Counts matmul-like ops
    (``mm``, ``bmm``, ``addmm``, convolutions, scaled-dot-product attention), the ones MFU
    is about.

    Raises:
        ImportError: torch is not installed (``pip install 'otel-tunix[torch]'``).
    """
    try:
        from torch.utils.flop_counter import FlopCounterMode
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError(
            "measure_torch_flops needs torch: pip install 'otel-tunix[torch]'"
        ) from exc
    counter = FlopCounterMode(display=False)
    with counter:
        fn(*args, **kwargs)
    return float(counter.get_total_flops())


def measure_jax_flops(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> float:
    """FLOPs of ``fn(*args, **kwargs)`` from XLA's ``cost_analysis`` of the compiled function.

    ``fn`` may already be ``jax.jit``-ed. It is lowered and compiled, not run.

    Raises:
        ImportError: JAX is not installed.
        ValueError: the backend reports no ``flops`` figure.
    """
    try:
        import jax
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError("measure_jax_flops needs JAX: pip install 'otel-tunix[jax]'") from exc
    jitted = fn if hasattr(fn, "lower") else jax.jit(fn)
    compiled = jitted.lower(*args, **kwargs).compile()
    cost = compiled.cost_analysis()
    if isinstance(cost, list | tuple):  # older JAX: one dict per computation
        total = sum(float(c.get("flops", 0.0)) for c in cost if c)
        has = any(c and "flops" in c for c in cost)
    else:
        total = float((cost or {}).get("flops", 0.0))
        has = bool(cost) and "flops" in cost
    if not has:
        raise ValueError("XLA cost_analysis reported no 'flops' for this function")
    return total
