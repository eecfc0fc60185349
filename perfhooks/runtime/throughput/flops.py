"""A training step's FLOPs: the user's count, the framework's, or one step measured with ``FlopCounterMode``.

The measurement counts what the dispatcher runs between the step's first forward and its optimizer (forward and
backward of every micro-batch), once per run, in the first capture window's warm-up step: the profiler records
nothing there, and the step is perfhooks' own work either way. For a ``torch.compile``'d model (entering a dispatch
mode would recompile its graphs) the step's forwards are counted on the original module with meta tensors
(:mod:`perfhooks.runtime.throughput.compiled_flops`). Nothing is measured without a window.
"""

from __future__ import annotations

from typing import Any

#: The report's names for where ``flops_per_step`` came from.
USER_STEP = "user: flops_per_step"
USER_SAMPLE = "user: flops_per_sample x samples per step"
COUNTER = "measured: torch.utils.flop_counter.FlopCounterMode over one training step"


#: Fused attention kernels ``FlopCounterMode`` has no formula for (torch 2.13): PyTorch's CPU flash kernel (what
#: ``scaled_dot_product_attention`` runs on the CPU with no dropout) and the overrideable fused path. Counted as
#: model FLOPs, the math path's matmuls: torch's SDPA formula forward (two matmuls), twice that backward (four; the
#: scores a flash kernel recomputes are not the model's), so that a model gets the same count, and MFU the same
#: meaning, whichever attention backend ran.
FUSED_ATTENTION = (("_scaled_dot_product_flash_attention_for_cpu", False),
                   ("_scaled_dot_product_flash_attention_for_cpu_backward", True),
                   ("_scaled_dot_product_fused_attention_overrideable", False),
                   ("_scaled_dot_product_fused_attention_overrideable_backward", True))


def fused_attention_formulas() -> dict[Any, Any]:
    """``FlopCounterMode(custom_mapping=...)`` entries for :data:`FUSED_ATTENTION` that this torch has and does not
    count itself."""
    import torch
    from torch.utils import flop_counter

    def forward(query: Any, key: Any, value: Any, *args: Any, out_shape: Any = None, **kwargs: Any) -> int:
        return flop_counter.sdpa_flop_count(query, key, value)

    def backward(grad_out: Any, query: Any, key: Any, value: Any, *args: Any, out_shape: Any = None,
                 **kwargs: Any) -> int:
        return 2 * flop_counter.sdpa_flop_count(query, key, value)

    out: dict[Any, Any] = {}
    for name, is_backward in FUSED_ATTENTION:
        packet = getattr(torch.ops.aten, name, None)
        if packet is None or packet in flop_counter.flop_registry or packet.default in flop_counter.flop_registry:
            continue
        out[packet] = backward if is_backward else forward
    return out


#: The matmul-family operators whose input dtype says what the step's matmuls ran in.
MATMUL_OPS = frozenset({"mm", "addmm", "bmm", "baddbmm", "matmul", "linear", "convolution", "_convolution",
                        "_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
                        "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_flash_attention_for_cpu"})
#: torch dtypes by the report's names.
DTYPE_NAMES = {"torch.bfloat16": "bf16", "torch.float16": "fp16", "torch.float32": "fp32",
               "torch.float8_e4m3fn": "fp8", "torch.float8_e5m2": "fp8"}


def matmul_dtype_mode() -> Any:
    """A dispatch mode that tallies, by input dtype, the elements the step's matmul-family operators produce: what
    they ran in after autocast (it sits below autocast in the dispatcher), whatever the framework's setting."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class MatmulDtypes(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.by_dtype: dict[str, float] = {}

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            out = func(*args, **(kwargs or {}))
            if func.overloadpacket.__name__ in MATMUL_OPS:
                first = next((a for a in args if hasattr(a, "dtype") and hasattr(a, "numel")), None)
                result = out[0] if isinstance(out, (tuple, list)) else out
                if first is not None and hasattr(result, "numel"):
                    name = DTYPE_NAMES.get(str(first.dtype), str(first.dtype))
                    self.by_dtype[name] = self.by_dtype.get(name, 0.0) + float(result.numel()) * first.shape[-1]
            return out

    return MatmulDtypes()


class FlopMeter:
    """Counts one step's FLOPs; every method is safe to call at any time and never raises."""

    def __init__(self) -> None:
        self.flops_per_step: float | None = None
        self.step: int | None = None
        #: Why no measurement was taken (None while one may still be).
        self.skipped: str | None = None
        #: How the count was taken, beside the counter's name (the compiled model's original module on meta).
        self.how = ""
        self._mode: Any = None
        #: Counting a compiled model's forwards on meta tensors (:meth:`add`), and their total so far.
        self.meta_counting = False
        self._meta_total = 0.0
        #: The measured step's matmul work by input dtype (``{"bf16": ...}``), and the mode that tallies it.
        self.matmul_dtypes: dict[str, float] = {}
        self._dtypes: Any = None

    @property
    def counting(self) -> bool:
        return self._mode is not None or self.meta_counting

    def start_meta(self, step: int) -> None:
        """Start a count that :meth:`add` feeds: a compiled model's forwards, counted on meta tensors."""
        if self.flops_per_step is None and not self.counting:
            self.meta_counting, self._meta_total, self.step = True, 0.0, step
            self.how = "the compiled model's original module, on meta tensors"

    def add(self, flops: float) -> None:
        if self.meta_counting:
            self._meta_total += flops

    def give_up(self, why: str) -> None:
        """A meta count failed: no count, and why."""
        self.meta_counting = False
        self.skipped = why

    def start(self, step: int) -> None:
        """Start counting (the step's first forward)."""
        if self._mode is not None or self.flops_per_step is not None:
            return
        from torch.utils.flop_counter import FlopCounterMode

        mode = FlopCounterMode(display=False, custom_mapping=fused_attention_formulas())
        mode.__enter__()
        self._mode, self.step = mode, step
        try:
            dtypes = matmul_dtype_mode()
            dtypes.__enter__()
            self._dtypes = dtypes
        except Exception:  # the FLOP count stands without the dtypes
            self._dtypes = None

    def stop(self, keep: bool = True) -> None:
        """Stop counting (the optimizer starts, the step ends, an error or the close); ``keep`` the count."""
        mode, self._mode = self._mode, None
        if self.meta_counting:
            self.meta_counting, total = False, self._meta_total
        elif mode is None:
            return
        else:
            dtypes, self._dtypes = self._dtypes, None
            if dtypes is not None:
                dtypes.__exit__(None, None, None)  # entered last, left first
                if keep:
                    self.matmul_dtypes = dict(dtypes.by_dtype)
            mode.__exit__(None, None, None)
            total = float(mode.get_total_flops())
        if keep and total > 0:
            self.flops_per_step = total
        elif keep:
            self.skipped = "the measured step ran no counted operator"
