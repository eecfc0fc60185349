"""One ``perfhooks tune`` trial, inside the launched script: the framework seams where a knob is set, the stop
after the planned steps, and the losses and facts the trial reports.

Only ``perfhooks tune`` starts a process in trial mode (``PERFHOOKS_TUNE_TRIAL`` names the plan). In it:

- the framework writes into the trial's folder, not the user's: Lightning's ``default_root_dir`` (no checkpoint
  callback, no logger of the user's own), the HF ``output_dir`` with ``report_to="none"``, ``save_strategy="no"``
  and no hub push, accelerate's ``project_dir``; W&B is disabled by the parent;
- each knob is set where the framework takes it: ``Trainer(precision="bf16-mixed")``, ``TrainingArguments(bf16=True,
  torch_compile=True, dataloader_num_workers=N)``, ``Accelerator(mixed_precision="bf16", dynamo_backend="inductor")``,
  the ``DataLoader``'s ``num_workers`` (Lightning and accelerate build no loader of their own), the HF model's
  ``attn_implementation``, ``torch.set_float32_matmul_precision("high")``;
- training stops after ``stop_after`` optimizer steps by the framework's own stop (``trainer.should_stop``,
  ``control.should_training_stop``); an accelerate loop, which has none, exits cleanly (``SystemExit(0)``) at
  the next backward. When ``fit``/``train`` returns, the script ends there (``SystemExit(0)``): what it would do
  next (save, push, test) is not the trial's;
- each step's loss is kept as a detached tensor (no sync per step) and read once, at the end, into
  ``trial.json`` with the facts the planner needs (the loaders' workers, precision, attention, compile).
"""

from __future__ import annotations

import atexit
import dataclasses
import functools
import inspect
import json
import os
from pathlib import Path
from typing import Any

#: The environment variable that names a trial's plan (JSON: name, knobs, stop_after, folder, result).
PLAN_VARIABLE = "PERFHOOKS_TUNE_TRIAL"


class Trial:
    """A trial's plan and what it records."""

    def __init__(self, plan: dict[str, Any]) -> None:
        self.name: str = plan["name"]
        self.knobs: dict[str, Any] = dict(plan.get("knobs") or {})
        self.stop_after: int = int(plan["stop_after"])
        self.folder = Path(plan["folder"])
        self.result = Path(plan["result"])
        self.losses: dict[int, list[Any]] = {}
        self.facts: dict[str, Any] = {"loader_workers": [], "framework": None}
        self.stopped: str | None = None
        self.undo: list[Any] = []
        self._written = False

    def loss(self, step: int, value: Any) -> None:
        """Keep a micro-batch's loss (a tensor, detached; read at the end) for framework step ``step`` (1-based)."""
        detach = getattr(value, "detach", None)
        if detach is not None:
            self.losses.setdefault(step, []).append(detach())

    def write(self) -> None:
        """``trial.json``: the losses per step (the micro-batches' mean), the facts, and what stopped it."""
        if self._written:
            return
        self._written = True
        losses = {}
        for step, values in sorted(self.losses.items()):
            try:
                losses[str(step)] = sum(float(v.float().mean()) for v in values) / len(values)
            except Exception:  # a loss that is not a number: left out
                continue
        self.result.write_text(json.dumps({"name": self.name, "knobs": self.knobs, "losses": losses,
                                           "facts": self.facts, "stopped": self.stopped}))

    def end_script(self, where: str) -> None:
        """Training returned: record it and end the script here, cleanly."""
        self.stopped = self.stopped or f"{where} returned before {self.stop_after} steps"
        self.write()
        raise SystemExit(0)


def install(launcher: Any, plan_path: str) -> Trial:
    """Set the trial's seams on the launcher's post-import hooks; returns the trial (its result is written when
    the script's training ends, or at exit)."""
    trial = Trial(json.loads(Path(plan_path).read_text()))
    trial.folder.mkdir(parents=True, exist_ok=True)
    atexit.register(trial.write)
    import torch

    torch.manual_seed(0)  # the script's own seed, if it sets one, wins: every trial starts the same either way
    if trial.knobs.get("tf32"):
        torch.set_float32_matmul_precision("high")
    if trial.knobs.get("anomaly_off"):
        trial.undo.append(_anomaly_off(torch))
    if trial.knobs.get("threads"):
        trial.undo.append(_threads(torch, int(trial.knobs["threads"])))
    trial.undo.append(_loader_knobs(trial))
    launcher.hooks.add("lightning.pytorch", lambda module: trial.undo.append(_lightning(module, trial)))
    launcher.hooks.add("transformers.training_args", lambda module: trial.undo.append(_hf_arguments(module, trial)))
    launcher.hooks.add("transformers.trainer", lambda module: trial.undo.append(_hf_trainer(module, trial)))
    launcher.hooks.add("accelerate", lambda module: trial.undo.append(_accelerate(module, trial)))
    trial.undo.append(_plain_loop(trial))
    return trial


# ----------------------------------------------------------------------------- process-wide settings
def _anomaly_off(torch: Any) -> Any:
    """Anomaly detection stays off whatever the script asks (``set_detect_anomaly``, ``detect_anomaly`` and
    Lightning's ``detect_anomaly=True`` all go through ``torch.set_anomaly_enabled``); returns the undo."""
    original = torch.set_anomaly_enabled

    def set_anomaly_enabled(enabled: bool, check_nan: bool = True) -> None:
        original(False, check_nan)

    torch.set_anomaly_enabled = set_anomaly_enabled
    original(False)
    return lambda: setattr(torch, "set_anomaly_enabled", original)


def _threads(torch: Any, threads: int) -> Any:
    """The intra-op threads at ``threads`` whatever the script sets (``torch.set_num_threads``); returns the
    undo."""
    original = torch.set_num_threads
    torch.set_num_threads = lambda _count: original(threads)
    original(threads)
    return lambda: setattr(torch, "set_num_threads", original)


# ----------------------------------------------------------------------------- construction with bound arguments
def _rebuild(cls: type, change: Any) -> Any:
    """Replace ``cls.__init__`` so that ``change(arguments)`` may edit every argument by name (positional ones
    too); returns the undo."""
    original = cls.__init__
    signature = inspect.signature(original)

    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        bound = signature.bind_partial(self, *args, **kwargs)
        arguments = dict(bound.arguments)
        arguments.pop(next(iter(signature.parameters)))
        extra = arguments.pop(_var_keyword(signature), {}) if _var_keyword(signature) else {}
        change(arguments)
        original(self, **arguments, **extra)

    cls.__init__ = __init__  # type: ignore[misc]
    return lambda: setattr(cls, "__init__", original)


def _var_keyword(signature: inspect.Signature) -> str | None:
    return next((p.name for p in signature.parameters.values() if p.kind is p.VAR_KEYWORD), None)


def _wrap_method(cls: type, name: str, make: Any) -> Any:
    original = cls.__dict__[name]
    setattr(cls, name, functools.wraps(original)(make(original)))
    return lambda: setattr(cls, name, original)


# ----------------------------------------------------------------------------- the DataLoader (Lightning, accelerate)
def _loader_knobs(trial: Trial) -> Any:
    from torch.utils.data import DataLoader

    def change(arguments: dict[str, Any]) -> None:
        workers = int(arguments.get("num_workers") or 0)
        trial.facts["loader_workers"].append(workers)
        if "num_workers" in trial.knobs and workers == 0 and not trial.facts.get("hf_loaders"):
            arguments["num_workers"] = int(trial.knobs["num_workers"])
            arguments["persistent_workers"] = True
        if trial.knobs.get("pin_memory"):
            arguments["pin_memory"] = True

    return _rebuild(DataLoader, change)


# ----------------------------------------------------------------------------- Lightning
def _lightning(module: Any, trial: Trial) -> Any:
    callback_class = module.Callback
    checkpoint_class = module.callbacks.ModelCheckpoint

    class TrialCallback(callback_class):  # type: ignore[misc, valid-type]
        def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
            loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
            trial.loss(trainer.global_step, loss)
            if trainer.global_step >= trial.stop_after and not trainer.should_stop:
                trainer.should_stop = True
                trial.stopped = f"trainer.should_stop = True after step {trainer.global_step}"

    def change(arguments: dict[str, Any]) -> None:
        trial.facts["framework"] = "lightning"
        trial.facts["precision"] = str(arguments.get("precision") or "32-true")
        trial.facts["job_steps"] = _steps(arguments.get("max_steps"))
        arguments["default_root_dir"] = str(trial.folder / "lightning")
        arguments["enable_checkpointing"] = False
        if arguments.get("logger") not in (None, True):
            arguments["logger"] = False
            trial.facts["logger_off"] = True
        callbacks = arguments.get("callbacks") or []
        callbacks = list(callbacks) if isinstance(callbacks, (list, tuple)) else [callbacks]
        arguments["callbacks"] = [c for c in callbacks if not isinstance(c, checkpoint_class)] + [TrialCallback()]
        if trial.knobs.get("bf16"):
            arguments["precision"] = "bf16-mixed"
        if trial.knobs.get("fp32"):
            arguments["precision"] = "32-true"

    undo_init = _rebuild(module.Trainer, change)

    def fit(original: Any) -> Any:
        def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
            original(self, *args, **kwargs)
            trial.end_script("Trainer.fit")
        return wrapper

    undo_fit = _wrap_method(module.Trainer, "fit", fit)
    return lambda: (undo_init(), undo_fit())


# ----------------------------------------------------------------------------- transformers
def _hf_arguments(module: Any, trial: Trial) -> Any:
    """The knobs on ``TrainingArguments`` and its subclasses (TRL's ``SFTConfig``, whose dataclass ``__init__`` is its
    own): set in ``TrainingArguments.__post_init__``, which every subclass's calls, once their own defaults are
    resolved (TRL's bf16 and checkpointing) and before transformers checks them."""

    def change(arguments: dict[str, Any]) -> None:
        trial.facts["hf_loaders"] = True
        trial.facts["config"] = arguments.get("__class__", "TrainingArguments")
        trial.facts["loader_workers"].append(int(arguments.get("dataloader_num_workers") or 0))
        trial.facts["precision"] = "bf16" if arguments.get("bf16") else "fp16" if arguments.get("fp16") else "fp32"
        trial.facts["compiled"] = bool(arguments.get("torch_compile"))
        trial.facts["job_steps"] = _steps(arguments.get("max_steps"))
        for fact, name in (("micro_batch", "per_device_train_batch_size"),
                           ("accumulation", "gradient_accumulation_steps"),
                           ("eval_batch", "per_device_eval_batch_size"), ("pad_to_multiple_of", "pad_to_multiple_of")):
            if isinstance(arguments.get(name), int):
                trial.facts[fact] = arguments[name]
        trial.facts["checkpointing"] = bool(arguments.get("activation_checkpointing")
                                            or arguments.get("gradient_checkpointing"))
        arguments["output_dir"] = str(trial.folder / "hf")
        arguments.update(report_to="none", save_strategy="no", push_to_hub=False, load_best_model_at_end=False)
        if "num_workers" in trial.knobs and not arguments.get("dataloader_num_workers"):
            arguments.update(dataloader_num_workers=int(trial.knobs["num_workers"]),
                             dataloader_persistent_workers=True)
        if trial.knobs.get("pin_memory"):
            arguments["dataloader_pin_memory"] = True
        if trial.knobs.get("bf16"):
            arguments.update(bf16=True, fp16=False)
            if trial.knobs.get("use_cpu"):  # a CPU run: TrainingArguments raises on bf16 without it
                arguments["use_cpu"] = True
        if trial.knobs.get("fp32"):
            arguments.update(bf16=False, fp16=False)
        if trial.knobs.get("compile"):
            arguments["torch_compile"] = True
        if "micro_batch" in trial.knobs:
            arguments.update(per_device_train_batch_size=int(trial.knobs["micro_batch"]),
                             gradient_accumulation_steps=int(trial.knobs["accumulation"]))
        if trial.knobs.get("checkpointing_off"):
            for name in ("activation_checkpointing", "gradient_checkpointing"):
                if name in arguments:
                    arguments[name] = False
        if trial.knobs.get("padding"):
            arguments["pad_to_multiple_of"] = None
        if "eval_batch" in trial.knobs:
            arguments["per_device_eval_batch_size"] = int(trial.knobs["eval_batch"])
        if "eval_every" in trial.knobs:  # an evaluation inside the trial's steps, to time it
            arguments.update(eval_strategy="steps", eval_steps=int(trial.knobs["eval_every"]))

    return _before_post_init(module.TrainingArguments, change)


def _before_post_init(cls: type, change: Any) -> Any:
    """Wrap ``cls.__post_init__`` so that ``change(fields)`` may edit the instance's fields (a dict of them, written
    back where changed) before it runs; returns the undo."""
    original = cls.__dict__["__post_init__"]

    @functools.wraps(original)
    def __post_init__(self: Any, *args: Any, **kwargs: Any) -> None:
        fields = {field.name: getattr(self, field.name) for field in dataclasses.fields(self)}
        fields["__class__"] = type(self).__name__  # the class the user built (TRL's SFTConfig), for the fix's words
        change(fields)
        fields.pop("__class__")
        for name, value in fields.items():
            if getattr(self, name) is not value:
                setattr(self, name, value)
        original(self, *args, **kwargs)

    cls.__post_init__ = __post_init__  # type: ignore[attr-defined]
    return lambda: setattr(cls, "__post_init__", original)


def _hf_trainer(module: Any, trial: Trial) -> Any:
    from transformers import TrainerCallback

    class TrialTrainerCallback(TrainerCallback):
        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if state.global_step >= trial.stop_after and not control.should_training_stop:
                control.should_training_stop = True
                trial.stopped = f"control.should_training_stop = True after step {state.global_step}"

    def model_seam(arguments: dict[str, Any]) -> None:
        trial.facts["framework"] = "transformers"
        config = getattr(arguments.get("model"), "config", None)
        implementation = getattr(config, "_attn_implementation", None)
        trial.facts["attn_implementation"] = implementation
        if trial.knobs.get("sdpa") and implementation == "eager":
            arguments["model"].set_attn_implementation("sdpa")
        callbacks = list(arguments.get("callbacks") or [])
        arguments["callbacks"] = [*callbacks, TrialTrainerCallback()]

    undo_init = _rebuild(module.Trainer, model_seam)

    def training_step(original: Any) -> Any:
        def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
            loss = original(self, *args, **kwargs)
            trial.loss(self.state.global_step + 1, loss)
            return loss
        return wrapper

    undo_step = _wrap_method(module.Trainer, "training_step", training_step)

    def train(original: Any) -> Any:
        def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
            original(self, *args, **kwargs)
            trial.end_script("Trainer.train")
        return wrapper

    # outermost: perfhooks' own wrapper of train (installed when its callback is made) hears a clean return
    undo_train: list[Any] = []
    undo_init_outer = _after_first_construction(module.Trainer, lambda: undo_train.append(
        _wrap_method(module.Trainer, "train", train)))

    def undo() -> None:
        for step in (*undo_train, undo_step, undo_init_outer, undo_init):
            step()
    return undo


def _after_first_construction(cls: type, then: Any) -> Any:
    """Run ``then()`` once, after the first ``cls(...)`` is built (after every other construction hook)."""
    original = cls.__init__
    done: list[bool] = []

    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        if not done:
            done.append(True)
            then()

    cls.__init__ = __init__  # type: ignore[misc]
    return lambda: setattr(cls, "__init__", original)


# ----------------------------------------------------------------------------- accelerate
def _accelerate(module: Any, trial: Trial) -> Any:
    steps = [0]

    def change(arguments: dict[str, Any]) -> None:
        if trial.facts.get("framework") == "transformers":  # a transformers Trainer's own Accelerator
            return
        trial.facts["framework"] = "accelerate"
        trial.facts["precision"] = str(arguments.get("mixed_precision") or "no")
        trial.facts["compiled"] = bool(arguments.get("dynamo_backend") or arguments.get("dynamo_plugin"))
        folder = str(trial.folder / "accelerate")  # the job's own folders are left alone
        if arguments.get("project_dir") is not None:
            arguments["project_dir"] = folder
        project = arguments.get("project_config")
        if dataclasses.is_dataclass(project) and not isinstance(project, type):  # a copy: the job's is not touched
            arguments["project_config"] = dataclasses.replace(project, project_dir=folder, logging_dir=folder)
        if trial.knobs.get("bf16"):
            arguments["mixed_precision"] = "bf16"
        if trial.knobs.get("fp32"):
            arguments["mixed_precision"] = "no"
        if trial.knobs.get("compile"):
            arguments["dynamo_backend"] = "inductor"

    undo_init = _rebuild(module.Accelerator, change)

    def backward(original: Any) -> Any:
        def wrapper(self: Any, loss: Any, *args: Any, **kwargs: Any) -> Any:
            if trial.facts.get("framework") != "accelerate":
                return original(self, loss, *args, **kwargs)
            if steps[0] >= trial.stop_after:
                trial.stopped = f"the script ended cleanly (SystemExit(0)) after step {steps[0]}"
                trial.write()
                raise SystemExit(0)
            trial.loss(steps[0] + 1, loss)
            result = original(self, loss, *args, **kwargs)
            if getattr(self, "sync_gradients", True):
                steps[0] += 1
            return result
        return wrapper

    undo_backward = _wrap_method(module.Accelerator, "backward", backward)
    return lambda: (undo_init(), undo_backward())


def _steps(value: Any) -> int | None:
    """A ``max_steps`` argument as the job's length: None when unset (-1, 0, None) or not a number."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


# ----------------------------------------------------------------------------- a plain loop (perfhooks.profile)
def _plain_loop(trial: Trial) -> Any:
    """A ``perfhooks.profile`` loop: its framework is ``pytorch``, and it stops at the first fetch after the planned
    steps (its session closed first, so that its report is a completed run's, then ``SystemExit(0)``). Its losses
    are not seen (the loop computes them itself)."""
    from perfhooks.runtime.loops import plain_loop

    loop_class, wait_class = plain_loop.ProfiledLoop, plain_loop.DataWait
    original_init, original_enter = loop_class.__init__, wait_class.__enter__

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original_init(self, *args, **kwargs)
        if trial.facts.get("framework") is None:
            trial.facts["framework"] = "pytorch"

    def __enter__(self: Any) -> None:
        loop = self.loop
        step = getattr(loop.engine, "step", 0)
        if not loop._closed and step >= trial.stop_after:
            trial.stopped = f"the loop ended cleanly (SystemExit(0)) after step {step}"
            loop.close()
            trial.write()
            raise SystemExit(0)
        original_enter(self)

    loop_class.__init__ = __init__  # type: ignore[method-assign]
    wait_class.__enter__ = __enter__  # type: ignore[method-assign]

    def undo() -> None:
        loop_class.__init__ = original_init  # type: ignore[method-assign]
        wait_class.__enter__ = original_enter  # type: ignore[method-assign]

    return undo


def plan_from_environment() -> str | None:
    """The plan's path when this process is a ``perfhooks tune`` trial."""
    return os.environ.get(PLAN_VARIABLE) or None
