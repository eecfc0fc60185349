"""Trace analysis: parse a Kineto trace once into a :class:`Trace`, then run small analyzers on it.

    from perfhooks.analysis import load_trace, analyze_trace
    trace = load_trace("rank0.step10.pt.trace.json.gz")
    result = analyze_trace(trace)        # metrics + ranked diagnoses
"""

from perfhooks.analysis.trace import Trace, TraceError, load_trace

__all__ = ["Trace", "TraceError", "load_trace"]
