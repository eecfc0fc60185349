"""torch.compile verdicts from dynamo's own counters and callbacks (never from frame names).

- ``recompiles``: code compiled before was compiled again because its guards failed (a shape, a dtype, a
  Python value that changed). The evidence is dynamo's own reason for each.
- ``graph_breaks``: the user's model breaks into several graphs, with dynamo's reasons and the file:line of
  each break. Its cost is not priced here (it needs the time between graphs, which only a capture window on a
  GPU measures): counts only.
"""

from __future__ import annotations

from typing import Any

from perfhooks.rules.thresholds import Thresholds
from perfhooks.rules.verdicts import make

#: Dynamo's guard-failure reasons that say a mode changed, not an input: grad mode (``GLOBAL_STATE changed:
#: grad_mode``, an evaluation under ``no_grad``) and a module's ``training`` flag (``model.eval()``).
MODE_REASONS = ("grad_mode", ".training", "training ==", "GLOBAL_STATE changed")


def _mode_change(reason: str) -> bool:
    return any(marker in reason for marker in MODE_REASONS) and "size mismatch" not in reason


def _recompile_fix(reasons: list[str], mode_only: bool) -> str:
    """The fix that follows dynamo's reason: a mode change is the evaluation's; a size mismatch is a shape's."""
    if mode_only:
        return ("Expected once per mode, and bounded by dynamo's cache (torch._dynamo.config.cache_size_limit): "
                "nothing to fix unless evaluation is slow to start. To keep training's compiled code alone, evaluate "
                "the uncompiled module (model._orig_mod under torch.no_grad()), or compile the evaluation apart "
                "(eval_model = torch.compile(model) used only for evaluation). mark_dynamic does not apply: no "
                "shape changed.")
    if any("size mismatch" in reason for reason in reasons):
        return ("An input shape changes between calls. Mark the changing dimension dynamic "
                "(torch._dynamo.mark_dynamic(x, 0), or torch.compile(model, dynamic=True)), or pad inputs to a few "
                "fixed sizes; find every cause with TORCH_LOGS=recompiles.")
    return ("Something the compiled code depends on changes between calls (dynamo's reason above). Keep it fixed, "
            "or find every cause with torch.compiler.set_stance('fail_on_recompile') and TORCH_LOGS=recompiles.")


def diagnose_compile(compile: dict[str, Any] | None, run: dict[str, Any] | None,
                     t: Thresholds = Thresholds()) -> list[dict[str, Any]]:
    """Verdicts from the report's ``compile`` section and the run account (``compiling_s``, ``wall_s``)."""
    if not compile:
        return []
    out = []
    steps = compile.get("compiled_steps") or []
    recompiles = compile.get("recompiles") or {}
    if recompiles.get("count", 0) >= t.recompiles_count:
        reasons = recompiles.get("reasons") or []
        compiling_s = (run or {}).get("compiling_s", 0.0)
        wall_s = (run or {}).get("wall_s", 0.0)
        share = compiling_s / wall_s if wall_s else 0.0
        mode_only = bool(reasons) and all(_mode_change(reason) for reason in reasons)
        where = f"in steps {', '.join(map(str, steps[:10]))}" if steps else "outside the steps (an evaluation?)"
        verdict = make(
            "recompiles", "info" if mode_only else "warning", "torch.compile recompiles the same code",
            f"{recompiles['count']} recompilation(s) of code compiled before (dynamo's guard failures), {where}; "
            f"{compiling_s:.2f} s compiling in all, {share:.1%} of the run's wall time (taken out of the steps). "
            f"Dynamo's reason: {reasons[0] if reasons else 'not recorded'}"
            + (". A change of grad mode or training mode (an evaluation under no_grad, model.eval()) recompiles "
               "once per mode, and dynamo's cache bounds it" if mode_only else ""),
            share, _recompile_fix(reasons, mode_only),
            recompiles=recompiles["count"], compiling_s=compiling_s, reasons=reasons, compiled_steps=steps[:10],
            mode_change=mode_only)
        verdict["gain_basis"] = "run"
        out.append(verdict)
    breaks = compile.get("graph_breaks") or {}
    if breaks.get("count", 0) >= t.graph_breaks_count:
        sites = breaks.get("sites") or []
        reasons = [entry["reason"] for entry in breaks.get("reasons") or []]
        out.append(make(
            "graph_breaks", "info", "The compiled model breaks into several graphs",
            f"{breaks['count']} graph break(s), {compile.get('graphs', 0)} graph(s) compiled. "
            f"{'Where: ' + '; '.join(sites[:3]) if sites else 'Reasons: ' + '; '.join(reasons[:3])}. Their cost is "
            "not measured here (it needs the time between graphs in a GPU capture window): counts only",
            0.0,
            "Each break runs Python between graphs and stops the compiler from fusing across it. Remove the "
            "statement dynamo names (a print, .item(), a data-dependent branch, a call it can't trace), or move it "
            "out of forward; torch.compile(model, fullgraph=True) turns every break into an error that points at it.",
            graph_breaks=breaks["count"], graphs=compile.get("graphs", 0), sites=sites, reasons=reasons))
    return out
