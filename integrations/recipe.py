"""The recipe a run was written with, read from the framework's own objects: the knobs users copy from a large
model's recipe (micro-batch and accumulation, activation checkpointing, the evaluation batch, padding, precision).

Every integration reads its framework's objects here, once at the run's start, into one plain dict (the report's
``recipe`` section, :func:`perfhooks.rules.recipe.diagnose_recipe` reads it): the framework's state the
integrations touch lives in this module, each attribute read behind ``getattr`` (a version without it leaves the
key out). ``spell`` holds how this framework takes each fix, as a format string over the recipe's keys, so that the
rules name the user's own setting (``SFTConfig(gradient_checkpointing=False)``).

Keys (each optional): ``framework``, ``config`` (the settings' class), ``micro_batch`` (samples a micro-batch, per
device), ``accumulation`` (micro-batches a step), ``eval_batch``, ``checkpointing`` and ``checkpointing_source``,
``precision`` (``bf16``, ``fp16``, ``fp32``) and ``precision_source``, ``eval_every_steps``, ``save_every_steps``,
``save_only_model``, ``loader_workers``, ``pin_memory``, ``torch_compile``, ``pad_to_multiple_of``,
``padding_free``, ``packing``, ``max_length``, ``attention``, ``attention_dropout``, ``limit_val_batches``,
``val_check_interval``, ``num_sanity_val_steps``, ``log_every_n_steps``, ``length_grouped`` (the setting that
already batches samples of similar length, as the user wrote it), ``spell``.
"""

from __future__ import annotations

import dataclasses
from typing import Any


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _default(config: Any, name: str) -> Any:
    """The dataclass default of field ``name`` on ``config``'s class (``dataclasses.MISSING`` when none)."""
    for field in dataclasses.fields(config) if dataclasses.is_dataclass(config) else ():
        if field.name == name:
            return field.default
    return dataclasses.MISSING


def model_facts(model: Any) -> dict[str, Any]:
    """What a (Hugging Face) model says of itself: activation checkpointing on, the attention implementation and
    its dropout (from its config)."""
    facts: dict[str, Any] = {}
    # transformers 5 renamed the property (the old name warns): the new one where the class has it
    name = ("is_activation_checkpointing" if hasattr(type(model), "is_activation_checkpointing") else
            "is_gradient_checkpointing")
    checkpointing = getattr(model, name, None) if hasattr(type(model), name) else None
    if isinstance(checkpointing, bool):
        facts["checkpointing"] = checkpointing
        if checkpointing:
            facts["checkpointing_source"] = "model.gradient_checkpointing_enable()"
    elif any(getattr(module, "gradient_checkpointing", False) is True for module in _modules(model)):
        facts["checkpointing"] = True
        facts["checkpointing_source"] = "the model's gradient_checkpointing"
    config = getattr(model, "config", None)
    attention = getattr(config, "_attn_implementation", None)
    if isinstance(attention, str):
        facts["attention"] = attention
    dropout = getattr(config, "attention_dropout", getattr(config, "attn_pdrop", None))
    if isinstance(dropout, (int, float)) and not isinstance(dropout, bool):
        facts["attention_dropout"] = float(dropout)
    return facts


def _modules(model: Any) -> list[Any]:
    modules = getattr(model, "modules", None)
    try:
        return list(modules()) if callable(modules) else []
    except Exception:  # a model whose modules() is not torch's
        return []


def transformers_recipe(args: Any, model: Any = None) -> dict[str, Any]:
    """``TrainingArguments`` (and subclasses: TRL's ``SFTConfig``) and the model, as a recipe."""
    name = type(args).__name__
    recipe: dict[str, Any] = {"framework": "transformers", "config": name}
    for key, attribute in (("micro_batch", "per_device_train_batch_size"),
                           ("eval_batch", "per_device_eval_batch_size"),
                           ("accumulation", "gradient_accumulation_steps"),
                           ("loader_workers", "dataloader_num_workers"), ("max_length", "max_length")):
        value = _int(getattr(args, attribute, None))
        if value is not None:
            recipe[key] = value
    for key, attribute in (("pin_memory", "dataloader_pin_memory"), ("torch_compile", "torch_compile"),
                           ("save_only_model", "save_only_model"), ("padding_free", "padding_free"),
                           ("packing", "packing")):
        value = getattr(args, attribute, None)
        if isinstance(value, bool):
            recipe[key] = value
    multiple = getattr(args, "pad_to_multiple_of", None)
    if _int(multiple):
        recipe["pad_to_multiple_of"] = multiple
    for key, strategy, steps in (("eval_every_steps", "eval_strategy", "eval_steps"),
                                 ("save_every_steps", "save_strategy", "save_steps")):
        kind = getattr(args, strategy, None)
        if str(getattr(kind, "value", kind)) == "steps" and isinstance(getattr(args, steps, None), (int, float)):
            recipe[key] = getattr(args, steps)
    # transformers 5 names it activation_checkpointing (gradient_checkpointing mirrors it, a deprecated alias)
    setting = "activation_checkpointing" if _default(args, "activation_checkpointing") is not dataclasses.MISSING \
        else "gradient_checkpointing"
    checkpointing = getattr(args, setting, None)
    if isinstance(checkpointing, bool):
        recipe["checkpointing"] = checkpointing
        if checkpointing:
            default = _default(args, "gradient_checkpointing") is True  # TRL's configs turn it on
            recipe["checkpointing_source"] = (f"{name}'s default (gradient_checkpointing=True)" if default else
                                              f"{name}({setting}=True)")
    grouped = length_grouping(args)
    if grouped is not None:
        recipe["length_grouped"] = grouped
    precision, source = hf_precision(args, name)
    recipe["precision"], recipe["precision_source"] = precision, source
    if model is not None:
        facts = model_facts(model)
        if facts.get("checkpointing") and not recipe.get("checkpointing"):
            recipe.update(checkpointing=True, checkpointing_source=facts["checkpointing_source"])
        recipe.update({k: v for k, v in facts.items() if k.startswith("attention")})
    precision_off = f"{name}(bf16=False)" if precision == "bf16" else f"{name}(fp16=False)"
    recipe["spell"] = {
        "micro_batch": f"{name}(per_device_train_batch_size={{micro_batch}}, gradient_accumulation_steps="
                       "{accumulation})",
        "checkpointing_off": f"{name}({setting}=False)",
        "eval_batch": f"{name}(per_device_eval_batch_size={{eval_batch}})",
        "precision_off": precision_off,
        "evaluate_less": f"{name}(eval_steps=...)",
    }
    if "pad_to_multiple_of" in recipe:
        recipe["spell"]["padding"] = f"{name}(pad_to_multiple_of=None)"
    return recipe


def length_grouping(args: Any) -> str | None:
    """The ``TrainingArguments`` setting that batches samples of similar length, as the user wrote it, or None:
    ``train_sampling_strategy="group_by_length"`` (transformers 5), ``group_by_length=True`` (4.x)."""
    if getattr(args, "train_sampling_strategy", None) == "group_by_length":
        return 'TrainingArguments(train_sampling_strategy="group_by_length")'
    if getattr(args, "group_by_length", False) is True:
        return "TrainingArguments(group_by_length=True)"
    return None


def hf_precision(args: Any, name: str) -> tuple[str, str]:
    """The run's precision and where it came from: the class's default (TRL's configs turn bf16 on unless fp16
    is set) or the script."""
    for flag in ("bf16", "fp16"):
        if getattr(args, flag, False) is True:
            default = _default(args, flag)
            if default is None and flag == "bf16":  # TRL: None, resolved to True in __post_init__
                return flag, f"{name}'s default (bf16=True unless fp16 is set), or the script's {name}(bf16=True)"
            return flag, f"{name}({flag}=True)"
    return "fp32", f"{name}(bf16=False, fp16=False)"


def lightning_recipe(trainer: Any, module: Any) -> dict[str, Any]:
    """A Lightning ``Trainer`` and its ``LightningModule`` (with the loaders built for the fit) as a recipe."""
    recipe: dict[str, Any] = {"framework": "lightning", "config": "Trainer"}
    accumulation = _int(getattr(trainer, "accumulate_grad_batches", None))
    if accumulation:
        recipe["accumulation"] = accumulation
    precision = str(getattr(trainer, "precision", "32-true"))
    recipe["precision"] = "bf16" if precision.startswith("bf16") else "fp16" if precision.startswith("16") else "fp32"
    recipe["precision_source"] = f"Trainer(precision={precision!r})"
    for key in ("val_check_interval", "limit_val_batches", "num_sanity_val_steps", "log_every_n_steps"):
        value = getattr(trainer, key, None)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            recipe[key] = value
    train = _loader_batch(getattr(trainer, "train_dataloader", None))
    if train is not None:
        recipe["micro_batch"] = train
    loaders = getattr(trainer, "val_dataloaders", None)
    evaluation = _loader_batch(loaders[0] if isinstance(loaders, (list, tuple)) and loaders else loaders)
    if evaluation is not None:
        recipe["eval_batch"] = evaluation
    workers = getattr(getattr(trainer, "train_dataloader", None), "num_workers", None)
    if _int(workers) is not None:
        recipe["loader_workers"] = workers
    recipe.update(model_facts(module))  # an HF model inside: its layers' gradient_checkpointing flags
    recipe["spell"] = {
        "micro_batch": "DataLoader(batch_size={micro_batch}) with Trainer(accumulate_grad_batches={accumulation})",
        "checkpointing_off": "model.gradient_checkpointing_disable() (or drop torch.utils.checkpoint from the "
                             "module's forward)",
        "eval_batch": "DataLoader(val_set, batch_size={eval_batch}) for validation",
        "precision_off": 'Trainer(precision="32-true")',
        "evaluate_less": "Trainer(val_check_interval=..., limit_val_batches=...)",
    }
    return recipe


def _loader_batch(loader: Any) -> int | None:
    """A DataLoader's samples per batch (its ``batch_size``, or its batch sampler's)."""
    size = _int(getattr(loader, "batch_size", None))
    if size is None:
        size = _int(getattr(getattr(loader, "batch_sampler", None), "batch_size", None))
    return size


def accelerate_recipe(accelerator: Any, models: list[Any]) -> dict[str, Any]:
    """An ``Accelerator`` and its models as a recipe (the micro-batch's samples are the engine's own count: which
    prepared loader trains is known only once it does)."""
    recipe: dict[str, Any] = {"framework": "accelerate", "config": "Accelerator"}
    accumulation = _int(getattr(accelerator, "gradient_accumulation_steps", None))
    if accumulation:
        recipe["accumulation"] = accumulation
    mixed = str(getattr(accelerator, "mixed_precision", "no") or "no")
    recipe["precision"] = {"bf16": "bf16", "fp16": "fp16", "fp8": "fp8"}.get(mixed, "fp32")
    recipe["precision_source"] = f"Accelerator(mixed_precision={mixed!r})"
    for model in models:
        recipe.update(model_facts(model))
    recipe["spell"] = {
        "micro_batch": "DataLoader(batch_size={micro_batch}) with Accelerator(gradient_accumulation_steps="
                       "{accumulation})",
        "checkpointing_off": "model.gradient_checkpointing_disable() (or drop torch.utils.checkpoint)",
        "eval_batch": "DataLoader(eval_set, batch_size={eval_batch})",
        "precision_off": 'Accelerator(mixed_precision="no")',
        "evaluate_less": "run the evaluation loop every N steps",
    }
    return recipe
