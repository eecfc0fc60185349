"""Settings shared by every integration, validated when the callback is constructed."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, fields
from typing import Any

from perfhooks.capture.schedule import Schedule
from perfhooks.rules.thresholds import Thresholds

DEFAULT_SCHEDULE = Schedule()
#: The prefix of the environment variables that give settings.
ENV_PREFIX = "PERFHOOKS_"
#: The signals after which a run's report is saved as terminated, unless the ``signals`` setting says otherwise.
TERMINATING_SIGNALS = ("SIGTERM", "SIGHUP", "SIGINT")


class _Default:
    def __repr__(self) -> str:
        return "Schedule()"


#: Marks "use the default schedule" so that ``schedule=None`` can mean "no scheduled windows".
DEFAULT: Any = _Default()


def _number(name: str, value: Any, what: str) -> tuple[float | None, str]:
    """``(number, source)``: the value given, else the ``PERFHOOKS_<NAME>`` variable read as a number (an error names
    the variable and ``what`` it must be), else ``(None, name)``. The caller checks the range."""
    if value is not None:
        return value, name
    variable = ENV_PREFIX + name.upper()
    if not os.environ.get(variable):
        return None, name
    try:
        return float(os.environ[variable]), variable
    except ValueError:
        raise ValueError(f"{variable} must be {what}, got {os.environ[variable]!r}") from None


def _finite_at_least_0(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value) and value >= 0


def _seconds(name: str, value: Any, default: float) -> float:
    """A number of seconds >= 0: the value given, else the ``PERFHOOKS_<NAME>`` variable, else ``default``."""
    value, source = _number(name, value, "a number of seconds >= 0")
    if value is None:
        return default
    if not _finite_at_least_0(value):
        raise ValueError(f"{source} must be a finite number of seconds >= 0, got {value!r}")
    return float(value)


def _price(value: Any) -> float | None:
    """A price per device-hour >= 0: the value given, else ``PERFHOOKS_DEVICE_HOUR_COST``, else ``None``."""
    value, source = _number("device_hour_cost", value, "a price per device-hour >= 0 (a number)")
    if value is not None and not _finite_at_least_0(value):
        raise ValueError(f"{source} must be a finite price per device-hour >= 0, got {value!r}")
    return None if value is None else float(value)


#: The share of a step perfhooks may take by default (``overhead_budget``).
DEFAULT_OVERHEAD_BUDGET = 0.01
#: The output folder a run makes in the working folder when none is given (the plain loop, Lightning without a
#: logger, accelerate): never ``perfhooks``, which beside a script would shadow the package on the next run's
#: ``import perfhooks`` (a folder without ``__init__.py`` is a namespace package, found before an editable
#: install's finder).
DEFAULT_OUTPUT_FOLDER = "perfhooks_out"


def overhead_budget(value: Any, source: str = "overhead_budget") -> float | None:
    """The budget: a share in (0, 1], or ``None`` (every step detailed); given as a number, ``None`` or
    ``"none"``, else the ``PERFHOOKS_OVERHEAD_BUDGET`` variable, else :data:`DEFAULT_OVERHEAD_BUDGET`. An error
    names ``source``."""
    if value is DEFAULT:
        variable = ENV_PREFIX + "OVERHEAD_BUDGET"
        if not os.environ.get(variable):
            return DEFAULT_OVERHEAD_BUDGET
        value, source = os.environ[variable], variable
    if value is None:
        return None
    if isinstance(value, str):
        text = value.strip().lower()
        if text in ("none", "off", "all"):
            return None
        try:
            value = float(text)
        except ValueError:
            raise ValueError(f"{source} must be a share of the step in (0, 1] (e.g. 0.01) or none, "
                             f"got {value!r}") from None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
        raise ValueError(f"{source} must be a share of the step in (0, 1] (e.g. 0.01) or None, got {value!r}")
    return float(value)


def _console_default() -> float:
    """300 s of live lines where standard error is a file or a pipe (a SLURM log); none on a terminal."""
    import sys

    try:
        return 0.0 if sys.stderr.isatty() else 300.0
    except (AttributeError, ValueError):
        return 300.0


def signal_names(value: Any, source: str = "signals") -> tuple[str, ...]:
    """Signal names (``SIGTERM``), from a sequence, a comma-separated string, or ``PERFHOOKS_SIGNALS``; an error
    names ``source`` (the setting, the option or the variable the value came from)."""
    import signal

    if value is None:
        if ENV_PREFIX + "SIGNALS" not in os.environ:
            return TERMINATING_SIGNALS
        value, source = os.environ[ENV_PREFIX + "SIGNALS"], ENV_PREFIX + "SIGNALS"
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)):
        raise TypeError(f"{source} must be signal names or a comma-separated string, got {value!r}")
    names = []
    for item in items:
        text = str(item).strip().upper()
        if not text or text == "NONE":
            continue
        name = text if text.startswith("SIG") else f"SIG{text}"
        if name not in signal.Signals.__members__ or name in ("SIGKILL", "SIGSTOP"):
            raise ValueError(f"{source}: {item!r} is not a signal perfhooks can handle; allowed: names such as "
                             f"SIGTERM, SIGHUP, SIGINT, SIGUSR1 (not SIGKILL or SIGSTOP)")
        names.append(name)
    return tuple(dict.fromkeys(names))


@dataclass
class PerfConfig:
    """What perfhooks measures and writes. Every integration takes these as keyword arguments.

    Args:
        output_dir: folder for ``report.json`` and ``traces/``; the integration picks a default.
        schedule: a :class:`perfhooks.Schedule` for capture windows, or ``None`` for none
            (phase timing, NVTX and the on-demand trigger stay on).
        max_traces: most trace files kept per rank; the oldest are deleted first.
        max_trace_bytes: most bytes of traces kept per rank.
        window_rss_limit_bytes: a capture window stops early, saved, once the process's RSS grew by more than the
            larger of this and a quarter of its RSS before the window (torch's profiler keeps an allocation per
            event until the window ends); default 150 MiB; ``None``: no bound. The window's record says it.
        window_micro_batches: a capture window stops early, saved, after the recorded step that brings its recorded
            micro-batches to this many (a job that accumulates gradients over 8 micro-batches records one step, not
            three: each recorded micro-batch costs the job time and memory); default 8; ``None``: no bound.
        record_shapes: passed to ``torch.profiler.profile``.
        profile_memory: passed to ``torch.profiler.profile``; off by default, as in torch and its peers (it makes
            every window heavier: an event per allocation). The memory monitor and its snapshots cover memory.
        with_stack: passed to ``torch.profiler.profile``.
        nvtx: emit NVTX ranges for phases (free when no NVTX tool is attached).
        module_ranges: also emit an NVTX range per module forward (forward pre/post hooks).
        nsys_capture: call ``torch.cuda.profiler.start()/stop()`` around windows, for
            ``nsys profile --capture-range=cudaProfilerApi``. CUDA only.
        detach_cupti: let Kineto detach CUPTI when each CUDA window stops: ``TEARDOWN_CUPTI=1`` in the environment
            from the first window to the run's end, where torch deems it safe (CUDA 12.6 or newer) and the variable
            is not already set. Left attached, CUPTI slows every later step (by 41% on a host-bound GPT on an H100).
        on_demand: open a window when ``<output_dir>/TRIGGER`` appears or on SIGUSR2 (on every rank of a
            multi-rank run, over the same steps).
        on_demand_active: recorded steps in an on-demand window.
        trigger_poll_s: seconds between looks for the trigger file (and, with several ranks, at the process
            group's store for a window another rank asked for).
        console: print a summary table when training ends (rank 0).
        analyze_windows: analyse each window's trace off the training thread and add its diagnoses.
        thresholds: a :class:`perfhooks.rules.thresholds.Thresholds` for the diagnosis rules.
        memory: memory telemetry, captures near the limit and the OOM dump.
        memory_threshold: fraction 0..1 of capacity at which a capture is taken (once per crossing).
        memory_capacity_bytes: the capacity to compare with; default the device's, or on CPU the
            smallest of cgroup ``memory.max``, ``RLIMIT_AS`` and physical memory.
        memory_poll_s: seconds between memory samples (taken at phase boundaries).
        memory_history: on CUDA, record allocation history, which gives snapshots their stacks. ``None``
            (default): start it when allocated memory crosses ``memory_arm_fraction`` of capacity or the
            allocator starts retrying; ``True``: from the start; ``False``: never. A history the user
            started is never changed.
        memory_arm_fraction: fraction 0..1 of capacity at which ``memory_history=None`` starts recording;
            at most ``memory_threshold``.
        memory_history_entries: allocation events kept in that history.
        max_memory_captures: captures near the limit kept per run.
        wandb: Weights & Biases logging. ``None`` (default): log into the run the framework or
            the user already has (``WandbLogger``, ``report_to="wandb"``, the accelerate tracker,
            ``wandb.run``), else nothing. ``True``: the same, and open a run if there is none.
            ``False``: never.
        wandb_run: the run to log into (wins over the one found).
        wandb_log_every: steps between ``perf/*`` metric rows (default: the framework's own logging cadence,
            Lightning's ``log_every_n_steps`` or transformers' ``logging_steps``, else 50).
        wandb_queue: most pending W&B jobs; past it new ones are dropped (and counted).
        flops_per_step: the training FLOPs of one optimizer step (forward and backward, all micro-batches of
            this rank); wins over every other source of the count.
        flops_per_sample: the training FLOPs of one sample; times the samples of each step.
        count_flops: when neither is given and the framework has no count, measure one step's FLOPs with
            ``torch.utils.flop_counter.FlopCounterMode`` (once, in the first window's warm-up step; a step of several
            micro-batches on its first one, scaled by the step's tokens, samples or micro-batches).
        peak_flops: the device's peak FLOP/s for this run's matmul dtype, for MFU; default perfhooks' table of
            datasheet peaks (GPUs only).
        report_every_s: seconds between rewrites of ``report.json`` (and ``report.html``) while the run goes on,
            off the training thread, with ``status: "running"`` and ``updated_at``; ``0``: only at windows' ends
            and at the end. Default 60, or the ``PERFHOOKS_REPORT_EVERY_S`` variable.
        first_answer_step: the step after which the run's first answer is given: ``report.json`` written, its
            verdicts (the settings' and the recipe's, which need no trace) printed once and logged to W&B; default 6,
            before the default schedule's first window; ``None``: none before the first window or periodic report
            (nor with ``report_every_s`` 0).
        signals: the signals after which the report is saved as ``status: "terminated"`` before the handler that
            was there runs (or the signal's default action): names, or one comma-separated string
            (``"SIGTERM,SIGUSR1"`` for SLURM's ``--signal=USR1@90``); ``()`` for none. Default SIGTERM, SIGHUP
            and SIGINT, or the ``PERFHOOKS_SIGNALS`` variable.
        stall_after_s: seconds a phase may last before the run counts as stalled (its stack, the device and the
            memory are recorded, a line printed); default the larger of 120 s and 20 x the p95 step, or the
            ``PERFHOOKS_STALL_AFTER_S`` variable.
        console_every_s: seconds between two live lines on standard error (rank 0); default 300 when standard error
            is not a terminal (a SLURM log), off on a terminal, or the ``PERFHOOKS_CONSOLE_EVERY_S`` variable; 0: off.
        overhead_budget: the share of each step perfhooks may take on the training thread (default 0.01, or the
            ``PERFHOOKS_OVERHEAD_BUDGET`` variable): it times every step, and the phases of as many steps, picked
            at random, as the budget affords (never fewer than 1 in 64; a run's first 50 steps, its capture
            windows and its steps under an NVTX tool always). ``None`` (or ``"none"``): every step's phases.
            The report's ``overhead`` section says what it cost.
        device_hour_cost: the price of one device-hour (a GPU-hour; a process-hour on CPU), in the currency you
            budget in; each diagnosis' ``cost`` then gives its waste in money beside its device-hours. Default
            none, or the ``PERFHOOKS_DEVICE_HOUR_COST`` variable.
    """

    output_dir: str | os.PathLike[str] | None = None
    schedule: Schedule | None = DEFAULT
    max_traces: int = 5
    max_trace_bytes: int = 512 * 2**20
    window_rss_limit_bytes: int | None = 150 * 2**20
    window_micro_batches: int | None = 8
    record_shapes: bool = True
    profile_memory: bool = False
    with_stack: bool = False
    nvtx: bool = True
    module_ranges: bool = False
    nsys_capture: bool = False
    detach_cupti: bool = True
    on_demand: bool = True
    on_demand_active: int = 3
    trigger_poll_s: float = 1.0
    console: bool = True
    analyze_windows: bool = True
    thresholds: Any = None
    memory: bool = True
    memory_threshold: float = 0.9
    memory_capacity_bytes: int | None = None
    memory_poll_s: float = 0.05
    memory_history: bool | None = None
    memory_arm_fraction: float = 0.75
    memory_history_entries: int = 100_000
    max_memory_captures: int = 3
    wandb: bool | None = None
    wandb_run: Any = None
    wandb_log_every: int | None = None
    wandb_queue: int = 256
    flops_per_step: float | None = None
    flops_per_sample: float | None = None
    count_flops: bool = True
    peak_flops: float | None = None
    report_every_s: float | None = None
    first_answer_step: int | None = 6
    signals: tuple[str, ...] | str | None = None
    stall_after_s: float | None = None
    console_every_s: float | None = None
    device_hour_cost: float | None = None
    overhead_budget: float | None = DEFAULT

    def __post_init__(self) -> None:
        if self.schedule is DEFAULT:
            self.schedule = DEFAULT_SCHEDULE
        if self.schedule is not None and not isinstance(self.schedule, Schedule):
            raise TypeError(f"schedule must be a perfhooks.Schedule or None, got {type(self.schedule).__name__}")
        if self.output_dir is not None and not isinstance(self.output_dir, (str, os.PathLike)):
            raise TypeError(f"output_dir must be a path (str or os.PathLike) or None, "
                            f"got {type(self.output_dir).__name__}")
        for name in ("max_traces", "max_trace_bytes", "on_demand_active", "memory_history_entries",
                     "max_memory_captures", "wandb_log_every", "wandb_queue", "window_rss_limit_bytes",
                     "window_micro_batches"):
            value = getattr(self, name)
            if value is None and name in ("wandb_log_every", "window_rss_limit_bytes", "window_micro_batches"):
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")

        if self.thresholds is None:
            self.thresholds = Thresholds()
        elif not isinstance(self.thresholds, Thresholds):
            raise TypeError(f"thresholds must be a perfhooks.rules.thresholds.Thresholds or None, "
                            f"got {type(self.thresholds).__name__}")
        for name in ("flops_per_step", "flops_per_sample", "peak_flops"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                      or not math.isfinite(value) or value <= 0):
                raise ValueError(f"{name} must be a positive number or None, got {value!r}")
        if self.flops_per_step is not None and self.flops_per_sample is not None:
            raise ValueError("flops_per_step and flops_per_sample contradict each other; pass one or the other")
        for name in ("record_shapes", "profile_memory", "with_stack", "nvtx", "module_ranges",
                     "nsys_capture", "detach_cupti", "on_demand", "console", "analyze_windows", "memory",
                     "count_flops"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be True or False, got {getattr(self, name)!r}")
        if self.wandb is not None and not isinstance(self.wandb, bool):
            raise TypeError(f"wandb must be True, False or None, got {self.wandb!r}")
        if self.wandb_run is not None and not callable(getattr(self.wandb_run, "log", None)):
            raise TypeError(f"wandb_run must be a wandb Run (with a log method) or None, "
                            f"got {type(self.wandb_run).__name__}")
        if self.wandb is False and self.wandb_run is not None:
            raise ValueError("wandb=False and a wandb_run contradict each other; pass one or the other")
        threshold = self.memory_threshold
        if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not 0 < threshold <= 1:
            raise ValueError(f"memory_threshold must be a fraction in (0, 1], got {threshold!r}")
        if self.memory_history is not None and not isinstance(self.memory_history, bool):
            raise TypeError(f"memory_history must be True, False or None, got {self.memory_history!r}")
        arm = self.memory_arm_fraction
        if isinstance(arm, bool) or not isinstance(arm, (int, float)) or not 0 < arm <= threshold:
            raise ValueError(f"memory_arm_fraction must be a fraction in (0, memory_threshold={threshold}], "
                             f"got {arm!r}")
        capacity = self.memory_capacity_bytes
        if capacity is not None and (isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1):
            raise ValueError(f"memory_capacity_bytes must be an integer >= 1 or None, got {capacity!r}")
        poll = self.memory_poll_s
        if isinstance(poll, bool) or not isinstance(poll, (int, float)) or not math.isfinite(poll) or poll < 0:
            raise ValueError(f"memory_poll_s must be a finite number of seconds >= 0, got {poll!r}")
        poll = self.trigger_poll_s
        if isinstance(poll, bool) or not isinstance(poll, (int, float)) or not math.isfinite(poll) or poll <= 0:
            raise ValueError(f"trigger_poll_s must be a finite number of seconds > 0, got {poll!r}")
        self.report_every_s = _seconds("report_every_s", self.report_every_s, 60.0)
        first = self.first_answer_step
        if first is not None and (isinstance(first, bool) or not isinstance(first, int) or first < 1):
            raise ValueError(f"first_answer_step must be a step number >= 1 or None, got {first!r}")
        self.signals = signal_names(self.signals)
        stall = _seconds("stall_after_s", self.stall_after_s, 0.0)
        self.stall_after_s = stall or None  # None: the larger of 120 s and 20 x the p95 step
        self.console_every_s = _seconds("console_every_s", self.console_every_s, _console_default())
        self.device_hour_cost = _price(self.device_hour_cost)
        self.overhead_budget = overhead_budget(self.overhead_budget)

    @classmethod
    def from_kwargs(cls, owner: str, kwargs: dict[str, Any]) -> PerfConfig:
        """Build from an integration's keyword arguments; unknown names get a ``TypeError`` listing the known."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(kwargs) - known)
        if unknown:
            raise TypeError(f"{owner} got unknown argument(s) {', '.join(unknown)}; "
                            f"allowed: {', '.join(sorted(known))}")
        return cls(**kwargs)
