"""The waste ledger: what each diagnosis cost the run, in device-hours (GPU-hours on GPUs, process-hours on CPU),
and in money where a price per device-hour is set.

A diagnosis' ``cost.device_hours`` is its ``estimated_gain`` (a ceiling, fraction 0..1) times the hours it is a
share of, times the devices: the run's training time (the steps' host time, ``run.training_s``) for a gain of the
step, its wall time (``run.wall_s``) for a gain of the run (``gain_basis: "run"``). One process drives one device,
so a rank's report counts one; a merged report sums its ranks' costs (each rank's own gain and time), so a verdict
that fired on one rank of two costs that rank's hours only.
"""

from __future__ import annotations

from typing import Any

from perfhooks.rules.verdicts import gain_phrase

#: Digits kept in device-hour figures (3.6 ms of one device is 1e-6 h).
DIGITS = 6


def unit(device: dict[str, Any] | None) -> str:
    """``GPU-hours`` on an accelerator, ``process-hours`` on CPU (or where the device is unknown)."""
    kind = (device or {}).get("type")
    return "GPU-hours" if kind in ("cuda", "rocm", "gpu") else "process-hours" if kind in (None, "cpu") \
        else f"{kind}-hours"


def ledger(run: dict[str, Any] | None, device: dict[str, Any] | None, device_hour_cost: float | None,
           devices: int = 1) -> dict[str, Any] | None:
    """The report's ``ledger`` section: the device-hours the run's training and wall time took, their unit and
    price (``None`` where not set). ``None`` before the run account has a first step."""
    if not run:
        return None
    return {"unit": unit(device), "devices": devices,
            "training_device_hours": round(float(run.get("training_s") or 0.0) / 3600 * devices, DIGITS),
            "wall_device_hours": round(float(run.get("wall_s") or 0.0) / 3600 * devices, DIGITS),
            "device_hour_cost": device_hour_cost}


def price(diagnosis: dict[str, Any], section: dict[str, Any] | None) -> dict[str, Any]:
    """``diagnosis`` with its ``cost`` (a new dict; no cost without a ledger): ``device_hours`` (its waste),
    ``of_device_hours`` (the hours its gain is a share of), ``unit``, and ``money`` where a price is set."""
    if not section:
        return diagnosis
    basis = section["wall_device_hours"] if diagnosis.get("gain_basis") == "run" \
        else section["training_device_hours"]
    wasted = float(diagnosis.get("estimated_gain") or 0.0) * basis
    return {**diagnosis, "cost": _cost(wasted, basis, section)}


def _cost(wasted: float, basis: float, section: dict[str, Any]) -> dict[str, Any]:
    cost: dict[str, Any] = {"device_hours": round(wasted, DIGITS), "of_device_hours": round(basis, DIGITS),
                            "unit": section["unit"]}
    if section.get("device_hour_cost") is not None:
        cost["money"] = round(wasted * float(section["device_hour_cost"]), 4)
    return cost


def merged_ledger(sections: list[dict[str, Any] | None]) -> dict[str, Any] | None:
    """The run's ledger from its ranks' ledgers: hours summed, unit and price the first rank's."""
    present = [s for s in sections if s]
    if not present:
        return None
    return {"unit": present[0]["unit"], "devices": sum(int(s.get("devices") or 1) for s in present),
            "training_device_hours": round(sum(s["training_device_hours"] for s in present), DIGITS),
            "wall_device_hours": round(sum(s["wall_device_hours"] for s in present), DIGITS),
            "device_hour_cost": present[0].get("device_hour_cost")}


def price_merged(diagnosis: dict[str, Any], rank_costs: list[dict[str, Any]], section: dict[str, Any] | None
                 ) -> dict[str, Any]:
    """A merged report's diagnosis priced over its ranks: the sum of the costs each rank gave the same verdict
    (``rank_costs``: each rank's ``{id: cost}``); a verdict of the ranks together (a straggler, a stall) is its
    gain times the run's summed hours."""
    if not section:
        return diagnosis
    own = [costs[diagnosis["id"]] for costs in rank_costs if diagnosis["id"] in costs]
    if not own:
        return price(diagnosis, section)
    basis = section["wall_device_hours"] if diagnosis.get("gain_basis") == "run" \
        else section["training_device_hours"]
    return {**diagnosis, "cost": _cost(sum(float(c["device_hours"]) for c in own), basis, section)}


def cost_phrase(diagnosis: dict[str, Any]) -> str:
    """``about 128 of 412 GPU-hours`` (and ``, 320.00 at 2.5 a GPU-hour`` with a price); empty without a cost,
    and on the CPU without a price (a share of a laptop's process-hours says nothing the gain does not)."""
    cost = diagnosis.get("cost")
    if not cost or not cost.get("of_device_hours"):
        return ""
    if cost.get("unit") == "process-hours" and cost.get("money") is None:
        return ""
    hours, of = float(cost["device_hours"]), float(cost["of_device_hours"])
    text = f"about {_hours(hours)} of {_hours(of)} {cost['unit']}"
    if cost.get("money") is not None:
        text += f" ({cost['money']:,.2f} in device cost)"
    return text


def _hours(value: float) -> str:
    """Hours at a precision that shows a short run's figures (``0.0031``) and a long one's (``128``)."""
    if value >= 10:
        return f"{value:,.0f}"
    if value >= 0.1:
        return f"{value:.2f}"
    return f"{value:.2g}" if value > 0 else "0"


def worth_phrase(diagnosis: dict[str, Any]) -> str:
    """What fixing it is worth, for the views: ``saves at most 31% of the step, about 128 of 412 GPU-hours``
    (the gain alone without a cost; empty for a verdict that saves nothing by itself)."""
    gain = gain_phrase(diagnosis)
    cost = cost_phrase(diagnosis) if gain else ""
    return f"{gain}, {cost}" if cost else gain
