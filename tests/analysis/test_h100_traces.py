"""Real H100 traces recorded for this project (``tests/data/PROVENANCE.md``, h100/)."""

from pathlib import Path

from perfhooks.offline.analyze import analyze_paths

H100 = Path(__file__).resolve().parents[1] / "data" / "traces" / "h100"


def test_attention_written_by_hand_is_found_from_its_backward_softmax_on_a_cuda_trace() -> None:
    """The trace has the backward's ``_softmax_backward_data`` on [8, 16, 1024, 1024] beside the ``bmm``s, and the
    host ran ahead of the device's steps: the verdict is priced by the device time those operators launched."""
    result = analyze_paths([str(H100 / "fp32_handwritten_attention.pt.trace.json.gz")])
    verdicts = {d["id"]: d for d in result["diagnoses"]}
    assert {"unfused_attention", "fp32_matmul"} <= set(verdicts)
    assert verdicts["unfused_attention"]["severity"] == "warning"
    assert result["metrics"]["attention"]["unfused"] > 0.5 * result["metrics"]["step_us"] * result["metrics"]["steps"]
