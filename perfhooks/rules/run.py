"""Rules on the run account: evaluation and checkpoint time against training time."""

from __future__ import annotations

from typing import Any

from perfhooks.rules.thresholds import Thresholds
from perfhooks.rules.verdicts import make, pct

#: The run-account rules: (id, seconds key, count key, threshold field, gain per share, title, what, fix).
RUN_RULES = (
    ("evaluation_heavy", "evaluation_s", "evaluations", "evaluation_share", 0.5,
     "Evaluation takes a large share of the run", "evaluation(s)",
     "Evaluate less often or on fewer batches: Lightning Trainer(val_check_interval=..., limit_val_batches=...); "
     "transformers TrainingArguments(eval_steps=..., eval_strategy=...); in a hand-written loop, run the "
     "evaluation loop every N steps."),
    ("checkpoint_heavy", "checkpointing_s", "checkpoints", "checkpoint_share", 0.9,
     "Writing checkpoints takes a large share of the run", "checkpoint write(s), with training stopped,",
     "Save less often (Lightning ModelCheckpoint(every_n_train_steps=...), transformers "
     "TrainingArguments(save_steps=...)), or write in the background: Lightning "
     "Trainer(plugins=[AsyncCheckpointIO()]), torch.distributed.checkpoint.async_save."),
)


def diagnose_run(run: dict[str, Any] | None, t: Thresholds = Thresholds()) -> list[dict[str, Any]]:
    """Rules on the run account: evaluation and checkpoint writes as shares of the run's wall time.

    The gain is a share of wall time: evaluating half as often, or writing checkpoints in the background.
    """
    if not run or not run.get("wall_s"):
        return []
    out = []
    wall = run["wall_s"]
    for rule_id, seconds, count, threshold, gain, title, what, fix in RUN_RULES:
        share = run[seconds] / wall
        limit = getattr(t, threshold)
        if share >= limit:
            verdict = make(rule_id, "warning", title,
                           f"{run[count]} {what} took {run[seconds]:.2f} s, {pct(share)} of the {wall:.2f} s run; "
                           f"threshold {pct(limit)}", share * gain, fix, **{f"{seconds[:-2]}_share": share})
            verdict["gain_basis"] = "run"
            out.append(verdict)
    return out
