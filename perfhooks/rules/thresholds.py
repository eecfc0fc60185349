"""When each rule fires: one frozen dataclass, validated when built."""

from __future__ import annotations

from dataclasses import dataclass, fields


@dataclass(frozen=True)
class Thresholds:
    """When each rule fires. Shares and utilizations are fractions 0..1; occupancy is percent."""

    dataloader_share: float = 0.10
    dataloader_critical_share: float = 0.25
    gpu_utilization: float = 0.60
    short_kernel_share: float = 0.50
    host_wait_share: float = 0.50
    #: ``host_bound``: share 0..1 of the step the GPU waits on the host beyond the DataLoader, kernels not tiny.
    host_bound_share: float = 0.20
    syncs_per_step: float = 1.0
    sync_time_share: float = 0.01
    misaligned_gemm_share: float = 0.01
    fp32_eligible_share: float = 0.10
    tensor_core_share: float = 0.10
    unfused_attention_share: float = 0.02
    #: Share 0..1 of the steady steps' token slots that are padding, for ``padding_waste``.
    padding_share: float = 0.20
    #: Correlation (0..1) of step time with the step's padded tokens past which variance follows the batch length.
    length_correlation: float = 0.70
    #: ``shape_churn``: a batch shape's first step at least this many times its later steps, and the extra time
    #: at least this share 0..1 of the steps' time.
    shape_churn_slowdown: float = 1.5
    shape_churn_share: float = 0.05
    #: Share 0..1 of a window that one-time start-up calls must take for ``startup_in_window``.
    startup_share: float = 0.10
    occupancy_percent: float = 15.0
    pageable_share: float = 0.50
    memcpy_share: float = 0.01
    optimizer_share: float = 0.15
    #: Share 0..1 of the steady step outside the four phases (callbacks, logging) for ``other_heavy``.
    other_share: float = 0.15
    communication_exposed_share: float = 0.05
    straggler_spread: float = 0.10
    step_p95_over_p50: float = 1.5
    warmup_slowdown: float = 3.0
    warmup_share: float = 0.05
    memory_fraction: float = 0.90
    evaluation_share: float = 0.25
    checkpoint_share: float = 0.10
    memory_growth_r2: float = 0.9
    memory_growth_share: float = 0.01
    memory_growth_bytes: float = 64 * 2**20
    recompiles_count: int = 1
    graph_breaks_count: int = 1
    #: ``shared_host``: share 0..1 of this process's CPUs that other processes used during the run.
    shared_host_share: float = 0.25
    #: ``activation_checkpointing``: the run's peak memory at most this share 0..1 of the capacity.
    checkpointing_memory_share: float = 0.5
    #: ``small_micro_batches``: micro-batches of at most this many samples, with gradient accumulation.
    small_micro_batch: int = 4

    def __post_init__(self) -> None:
        for item in fields(self):
            value = getattr(self, item.name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value or value < 0:
                raise ValueError(f"Thresholds.{item.name} must be a number >= 0, got {value!r}")
