"""Rules on the run account: evaluation and checkpoint time against training time."""

from __future__ import annotations

from typing import Any

from perfhooks.rules.recipe import evaluation_batch_fix
from perfhooks.rules.thresholds import Thresholds
from perfhooks.rules.verdicts import make, pct

#: The run-account rules: (id, seconds key, count key, threshold field, what a usual fix saves of the share (an
#: estimate, said in the evidence), title, what, fix). The ceiling is the whole share: evaluating less often and on
#: fewer batches, or saving less often, can take all of it away.
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


def diagnose_run(run: dict[str, Any] | None, t: Thresholds = Thresholds(), recipe: dict[str, Any] | None = None,
                 stats: Any = None) -> list[dict[str, Any]]:
    """Rules on the run account: evaluation and checkpoint writes as shares of the run's wall time; where the
    recipe's evaluation batch is smaller than a training step's samples, ``evaluation_heavy`` names it first.

    The gain is a ceiling on the run's wall time: the whole share, which no fix of the kind can exceed; the
    evidence gives the usual fix's estimate beside it (evaluating half as often saves about half; writing in the
    background about 90%).
    """
    if not run or not run.get("wall_s"):
        return []
    out = []
    wall = run["wall_s"]
    for rule_id, seconds, count, threshold, usual, title, what, fix in RUN_RULES:
        share = run[seconds] / wall
        limit = getattr(t, threshold)
        if share >= limit:
            if rule_id == "evaluation_heavy":
                fix = _evaluation_fix(recipe, stats, fix)
            estimate = ("evaluating half as often saves about half of that" if rule_id == "evaluation_heavy" else
                        "writing in the background saves most of that")
            verdict = make(rule_id, "warning", title,
                           f"{run[count]} {what} took {run[seconds]:.2f} s, {pct(share)} of the {wall:.2f} s run "
                           f"(the most fixing it saves; {estimate}, {pct(share * usual)} of the run, an estimate); "
                           f"threshold {pct(limit)}", share, fix,
                           **{f"{seconds[:-2]}_share": share, "usual_fix_saves": round(share * usual, 4)})
            verdict["gain_basis"] = "run"
            out.append(verdict)
    return out


def _evaluation_fix(recipe: dict[str, Any] | None, stats: Any, fix: str) -> str:
    """``evaluation_heavy``'s fix, with the evaluation batch first where it is smaller than a training step's
    samples (evaluation keeps no activations for a backward: it fits at least as many)."""
    sizes = evaluation_batch_fix(recipe, stats)
    if sizes is None:
        return fix
    evaluation, step = sizes
    spelled = (((recipe or {}).get("spell") or {}).get("eval_batch") or "an evaluation batch of {eval_batch}")
    return (f"Evaluate in batches of {step}, not {evaluation}: {spelled.format(eval_batch=step)} (evaluation keeps "
            f"no activations for a backward, so it fits a training step's samples); then, if it is still a large "
            f"share, e" + fix[1:])
