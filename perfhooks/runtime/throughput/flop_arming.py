"""FLOP arming and throughput's inputs: where a step's FLOPs come from, and the dtype whose peak applies.

The count is the user's (``flops_per_step``, ``flops_per_sample``), the framework's (``note_flops``), or one step
measured with ``FlopCounterMode`` (:class:`~perfhooks.runtime.throughput.flops.FlopMeter`): the first capture window's
warm-up step is armed, the meter starts at that step's first forward and stops at its optimizer. A step of several
micro-batches is counted on its first one: the meter stops at the next fetch, and the count is scaled at the
optimizer by the step's token slots, samples or micro-batches against that micro-batch's (counting under the
dispatch mode costs more than the step itself; eight micro-batches of a small GPT took 0.25 s more).

Threading: the training thread only.
"""

from __future__ import annotations

from typing import Any

import torch

from perfhooks.analysis.peaks import find_peak
from perfhooks.config import PerfConfig
from perfhooks.events import DATA_WAIT, FORWARD, OPTIMIZER
from perfhooks.faults import FaultLog
from perfhooks.runtime.throughput import flops as flops_sources
from perfhooks.runtime.throughput.compiled_flops import compiled_wrappers, count_on_meta, hook_wrappers
from perfhooks.runtime.throughput.flops import FlopMeter, fused_attention_formulas

#: Share 0..1 of the measured step's matmul work one dtype must hold to name the run's dtype.
MEASURED_DTYPE_SHARE = 0.8


class FlopArming:
    """Arms, runs and stops the one-step FLOP measurement; says where the run's FLOPs per step come from."""

    def __init__(self, config: PerfConfig, faults: FaultLog) -> None:
        self.config = config
        self.faults = faults
        self.meter = FlopMeter()
        #: The framework's count of one step's FLOPs and its source, and the run's matmul dtype and its source.
        self.framework_flops: tuple[float, str] | None = None
        self.precision: tuple[str, str] | None = None
        #: ``precision`` is what a step ran in (autocast seen at a forward), not a setting.
        self.precision_ran = False
        #: A step's FLOPs may still be measured in this run (nothing the user set gives the count).
        self.may_count = config.count_flops and not (config.flops_per_step or config.flops_per_sample)
        #: Armed for the next forward, or counting: the tracker tells this part of phase starts only then.
        self.watching = False
        self._armed = False
        #: Tokens of the step whose FLOPs were measured (0: not counted): the count scales with the tokens.
        self.measured_tokens = 0
        #: A compiled model's wrappers are hooked (its step is counted on meta tensors); a module is compiled in
        #: place (no wrapper to hook); the armed step of a meta count, waiting for its first forward.
        self.compiled_hooked = self.compiled_in_place = False
        self._meta_armed: int | None = None
        #: The step's fetches when the count started; then, once its first micro-batch is counted, that
        #: micro-batch's (micro-batches, samples, token slots), until the step's optimizer scales the count.
        self._fetches_at_start = 0
        self._first: tuple[int, int, int] | None = None

    def watch_compiled(self, model: torch.nn.Module, add_handle: Any) -> bool:
        """Hook ``model``'s compiled wrappers for a meta count (:mod:`compiled_flops`); whether any module of it is
        compiled."""
        wrappers, in_place = compiled_wrappers(model)
        if wrappers and self.may_count:
            hook_wrappers(wrappers, self._compiled_forward, add_handle)
            self.compiled_hooked = True
        self.compiled_in_place = self.compiled_in_place or in_place
        return bool(wrappers) or in_place

    def _compiled_forward(self, original: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """A compiled wrapper's forward starts (training thread): in the armed step, its original's FLOPs."""
        meter = self.meter
        if self._meta_armed is None and not meter.meta_counting:
            return
        if not (original.training and torch.is_grad_enabled()):  # an evaluation's forward
            return
        if self._meta_armed is not None:
            meter.start_meta(self._meta_armed)
            self._meta_armed = None
        try:
            meter.add(count_on_meta(original, args, kwargs, fused_attention_formulas()))
        except Exception as error:
            meter.give_up(f"the compiled model's original module did not run on meta tensors "
                          f"({type(error).__name__}: {str(error)[:200]}); pass flops_per_step")
            self.watching = False


    def note_precision(self, dtype: str, source: str, ran: bool = False) -> None:
        """The matmul dtype: a framework's setting, or (``ran``) what a step ran in, which no setting overrides."""
        if ran or not self.precision_ran:
            self.precision = (dtype, source)
            self.precision_ran = self.precision_ran or ran

    def note_flops(self, per_step: float, source: str) -> None:
        if per_step > 0:
            self.framework_flops = (float(per_step), source)

    def arm(self, compiled: bool, step: int = 0) -> None:
        """The first capture window's warm-up step (``step``) opens: count its FLOPs (once per run). A compiled
        model (``compiled``: a dispatch mode would recompile its graphs) is counted on meta tensors when its
        wrappers are hooked, else not."""
        self.may_count = False
        if compiled and self.compiled_hooked and not self.compiled_in_place:
            self._meta_armed, self.watching = step, True
            return
        if compiled:
            self.meter.skipped = ("the model is torch.compile'd (counting would recompile its graphs); pass "
                                  "flops_per_step")
            return
        self._armed = self.watching = True

    def phase_opening(self, step: int, phase: str, record: Any = None) -> None:
        """A phase of the counted step opens; ``record``: the step's :class:`~perfhooks.runtime.step.steps.StepRecord`
        (its fetches, samples and tokens so far)."""
        meter = self.meter
        if self._armed and phase == FORWARD:
            self._armed = False
            meter.start(step)
            self._fetches_at_start = record.micro_batches if record is not None else 0
        elif (phase == DATA_WAIT and record is not None and self._first is None and meter.counting
              and not meter.meta_counting):  # the next micro-batch's fetch: the first one is counted
            first = (max(1, record.micro_batches - self._fetches_at_start), record.samples, token_slots(record))
            try:
                meter.stop(True)
            except Exception as error:
                self.faults.report("flop_count", error)
            if meter.flops_per_step is not None:
                self._first = first
            else:
                self.stop()
        elif phase == OPTIMIZER and (meter.counting or self._first is not None):
            self.stop(record=record)

    def stop(self, keep: bool = True, record: Any = None, micro_batches: int = 0) -> None:
        """Stop counting; ``keep`` the count (False: an evaluation or an error cut the step). A count of the step's
        first micro-batch is scaled by ``record``'s token slots, samples or micro-batches (the step's), else by
        ``micro_batches``; with neither it is not kept (the next warm-up counts again)."""
        self._armed = self.watching = False
        self._meta_armed = None
        first, self._first = self._first, None
        try:
            self.meter.stop(keep)
            if first is not None:
                self._scale(first, keep, record, micro_batches)
        except Exception as error:
            self.faults.report("flop_count", error)
        if self.meter.flops_per_step is None and self.meter.skipped is None:  # cut short: the next warm-up tries
            self.may_count = True

    def _scale(self, first: tuple[int, int, int], keep: bool, record: Any, micro_batches: int) -> None:
        """The first micro-batch's count, as the step's: times the step's token slots (or samples, or
        micro-batches) over that micro-batch's."""
        meter = self.meter
        counted, samples, slots = first
        factor, by = None, ""
        if keep and record is not None:
            if slots and token_slots(record):
                factor, by = token_slots(record) / slots, "token slots"
            elif samples and record.samples:
                factor, by = record.samples / samples, "samples"
            elif record.micro_batches:
                factor, by = record.micro_batches / counted, "micro-batches"
        elif keep and micro_batches:
            factor, by = micro_batches / counted, "micro-batches"
        if factor is None or meter.flops_per_step is None:
            meter.flops_per_step = None
            return
        meter.flops_per_step *= factor
        meter.how = f"its first micro-batch counted, times {factor:.4g} by the step's {by}"

    def _measured_dtype(self) -> tuple[str, str] | None:
        """The dtype most of the measured step's matmul work ran in (at least :data:`MEASURED_DTYPE_SHARE` of it),
        with its source; None without a measured step. fp32 on CUDA may use TF32: the framework's or torch's
        setting says so, not this."""
        found = _share(self.meter.matmul_dtypes)
        if found is None or found[1] < MEASURED_DTYPE_SHARE or found[0] not in ("bf16", "fp16", "fp8", "fp32"):
            return None
        return found[0], (f"the measured step's matmuls ran in {found[0]} ({found[1]:.0%} of their work, "
                          f"step {self.meter.step})")

    def flops(self, steps: int, samples: int, tokens: int = 0) -> dict[str, Any]:
        """FLOPs per step and their source: the user's, the framework's, the measured step's; else why none.
        ``steps`` and ``samples``: the run's so far (for ``flops_per_sample``)."""
        config = self.config
        if config.flops_per_step:
            return {"per_step": float(config.flops_per_step), "source": flops_sources.USER_STEP}
        if config.flops_per_sample:
            if steps and samples:
                return {"per_step": config.flops_per_sample * (samples / steps), "source": flops_sources.USER_SAMPLE}
            return {"missing": "flops_per_sample was given but no batch's samples were seen"}
        # one definition across frameworks: the measured count first; the framework's own (HF's total_flos,
        # 6 x parameters x tokens) is reported beside it under its own name
        beside = ({"framework_per_step": self.framework_flops[0], "framework_source": self.framework_flops[1]}
                  if self.framework_flops is not None else {})
        meter = self.meter
        if meter.flops_per_step is not None:
            source = f"{flops_sources.COUNTER} (step {meter.step}{', ' + meter.how if meter.how else ''})"
            per_step = meter.flops_per_step
            if self.measured_tokens and tokens and steps:  # a step's FLOPs follow its tokens (padding, lengths)
                per_step *= tokens / steps / self.measured_tokens
                source += (f", scaled by the run's {tokens / steps:.0f} token slots per step (padding included: "
                           f"the model runs on it) against the measured step's {self.measured_tokens}")
            return {"per_step": per_step, "source": source, **beside}
        if self.framework_flops is not None:
            return {"per_step": self.framework_flops[0], "source": self.framework_flops[1], **beside}
        if meter.skipped:
            return {"missing": meter.skipped}
        if not config.count_flops:
            return {"missing": "count_flops=False and no flops_per_step or flops_per_sample given"}
        return {"missing": "no capture window's warm-up step ran to measure one (the schedule); pass flops_per_step"}

    def matmul_dtype(self, cuda: bool) -> tuple[str, str]:
        """The dtype whose peak applies: what a step ran in (autocast at the forward; else the measured step's
        matmuls, when most of their work ran in one dtype), else the framework's precision, else TF32 where
        float32 matmuls may use it on CUDA, else FP32."""
        measured = self._measured_dtype()
        tf32 = cuda and torch.get_float32_matmul_precision() != "highest"
        if measured is not None and measured[0] == "fp32" and tf32:
            measured = ("tf32", f"{measured[1]}, which torch.get_float32_matmul_precision() "
                                f"{torch.get_float32_matmul_precision()!r} lets use TF32")
        if self.precision is not None and (self.precision_ran or measured is None
                                           or measured[0] == self.precision[0]):
            return self.precision
        if measured is not None and (self.precision is not None or measured[0] not in ("fp32", "tf32")):
            return measured  # what the step ran in, over a setting it contradicts (or with none)
        if tf32:
            return "tf32", f"torch.get_float32_matmul_precision() is {torch.get_float32_matmul_precision()!r}"
        return "fp32", "no mixed precision setting seen"


def token_slots(record: Any) -> int:
    """A step record's token slots (padding included where a mask was read), else its tokens."""
    return record.padded_tokens or record.tokens


def _share(by_dtype: dict[str, float]) -> tuple[str, float] | None:
    total = sum(by_dtype.values())
    if not total:
        return None
    name = max(by_dtype, key=lambda key: by_dtype[key])
    return name, by_dtype[name] / total


def device_peak(device: dict[str, Any], dtype: str) -> tuple[float, str] | None:
    """The device's dense peak for ``dtype`` from perfhooks' table: ``(FLOP/s, its source)``, or None."""
    peak = find_peak(device.get("name")) if device.get("type") == "cuda" else None
    value = peak.tflops.get(dtype) if peak is not None else None
    if not value:
        return None
    return value * 1e12, f"{peak.source} ({peak.device}, {dtype}, dense)"  # type: ignore[union-attr]
