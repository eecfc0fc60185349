"""The report helpers: strict JSON out of any figures."""

from __future__ import annotations

import json
import math

from perfhooks.report.schema import json_safe


def test_json_safe_nulls_every_non_finite_number_and_names_where() -> None:
    replaced: list[str] = []
    value = {"a": math.nan, "b": [1.0, math.inf, {"c": -math.inf}], "d": 2}
    safe = json_safe(value, replaced=replaced)
    assert safe == {"a": None, "b": [1.0, None, {"c": None}], "d": 2}
    assert replaced == ["a", "b[1]", "b[2].c"]
    json.dumps(safe, allow_nan=False)
