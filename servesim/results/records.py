"""What a simulation produces, before it is summarised or written.

Structure of arrays, one entry per workload request in workload order; the
driver fills it once at the end of a run (never per token in Python objects).
"""

from collections.abc import Sequence

import attrs
import numpy as np

STATUS_FINISHED = 0
STATUS_REJECTED = 1
STATUS_UNFINISHED = 2
STATUS_NAMES = ("finished", "rejected", "unfinished")


@attrs.define(eq=False)
class RequestRecords:
    """Per-request results. Times are in ms; NaN means "never" (e.g. a rejected
    request's times); pass indices are -1 for "never".

    `first_token_ms` / `finish_ms` are client times (engine release plus
    detokenization). `token_offsets[i]:token_offsets[i+1]` indexes
    `token_client_ms`, the client time of each token request i produced, in
    order (used for ITL).

    Disaggregated mode (servesim/replay/disaggregated.py) adds the placement
    on both pools and the KV transfer (None otherwise): `prefill_worker`,
    `prefill_dp_rank`, `decode_worker` (-1: never handed off),
    `kv_transfer_ms` (how long the decode worker waited for the prompt's KV:
    from the decision that queued the pull to its landing, 0 when nothing
    moved; NaN: never handed off) and `transferred_tokens` (-1: never handed
    off). `worker` / `dp_rank` are then the decode worker's.

    Session workloads (servesim/workload/sessions.py) add `session` (index into
    `session_ids`) and `turn` per request (None otherwise), and
    `session_truncated` per session (None: no session cut short by
    `workload.limit`).
    """

    ids: list
    arrival_ms: np.ndarray
    first_scheduled_ms: np.ndarray
    first_token_ms: np.ndarray
    finish_ms: np.ndarray
    input_length: np.ndarray
    output_length: np.ndarray
    output_tokens: np.ndarray
    num_preemptions: np.ndarray
    first_admission_cached_tokens: np.ndarray
    cpu_tier_cached_tokens: np.ndarray
    recomputed_tokens: np.ndarray
    worker: np.ndarray
    dp_rank: np.ndarray
    status: np.ndarray  # int8, STATUS_*
    first_token_pass: np.ndarray
    finish_pass: np.ndarray
    token_offsets: np.ndarray  # int64, len n + 1
    token_client_ms: np.ndarray  # float64
    prefill_worker: np.ndarray | None = None
    prefill_dp_rank: np.ndarray | None = None
    decode_worker: np.ndarray | None = None
    kv_transfer_ms: np.ndarray | None = None
    transferred_tokens: np.ndarray | None = None
    session_ids: list | None = None
    session: np.ndarray | None = None
    turn: np.ndarray | None = None
    session_truncated: np.ndarray | None = None

    # `backend: sglang` (None otherwise, docs/sglang.md): retractions (also in
    # num_preemptions), SGLang's own `cached_tokens` (the first admission's hit,
    # never recounted after a retraction) and the finish reason ("length",
    # "eos"; None: not finished)
    num_retractions: np.ndarray | None = None
    cached_tokens: np.ndarray | None = None
    finish_reason: list | None = None

    # speculative decoding (None without it): real drafts scheduled / accepted
    spec_drafted: np.ndarray | None = None
    spec_accepted: np.ndarray | None = None


@attrs.define(eq=False)
class WorkerStats:
    worker: int
    requests: int = 0
    passes: int = 0
    busy_ms: float = 0.0
    kv_usage_mean: float = 0.0
    kv_usage_max: float = 0.0
    pool: str | None = None  # disaggregated mode: "prefill" or "decode"


@attrs.define(eq=False)
class PoolStats:
    """One pool of a disaggregated run (its workers summed; KV usage averaged
    over its ranks). `data_parallel_size`: the pool's own DP width when the
    config sets one (`cluster.prefill.data_parallel_size`), else None."""

    workers: int = 0
    data_parallel_size: int | None = None
    requests: int = 0
    passes: int = 0
    busy_ms: float = 0.0
    kv_usage_mean: float = 0.0
    preemptions: int = 0
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0


@attrs.define(eq=False)
class RunStats:
    """Counters over the whole run (all workers and ranks)."""

    passes: int = 0
    preemptions: int = 0
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    preempted_prefix_cache_queries: int = 0
    preempted_prefix_cache_hits: int = 0
    cpu_tier_hit_tokens: int = 0
    # CPU tier (engine.kv_offloading; docs/engine.md §9), summed over ranks:
    # loads and stores are transfer jobs; cpu_tier_blocks_max is the largest
    # block count any one rank's tier held
    cpu_tier: bool = False  # whether the run had a CPU tier
    cpu_tier_loads: int = 0
    cpu_tier_stores: int = 0
    cpu_tier_bytes_loaded: int = 0
    cpu_tier_bytes_stored: int = 0
    cpu_tier_blocks_max: int = 0
    kv_usage_mean: float = 0.0  # time-weighted over [0, end of the last pass]
    kv_usage_max: float = 0.0
    workers: list = attrs.Factory(list)  # WorkerStats
    # disaggregated mode: {"prefill": PoolStats, "decode": PoolStats}; the
    # prefix-cache figures above are then the prefill pool's
    pools: dict | None = None
    kv_transfer_bytes: int = 0  # disaggregated mode: bytes moved over the links
    # speculative decoding: per draft position, [real drafts scheduled, accepted]
    # summed over ranks (row 0, position 0 counts the verification passes)
    spec_positions: np.ndarray | None = None
    # with engine.speculative.acceptance_profiles: summary.json's
    # `speculative.profiles` (scheduler/acceptance_profiles.py profile_summary)
    spec_profiles: dict | None = None


@attrs.define(eq=False)
class SimulationResult:
    """The driver's output. `pass_log` is a sequence of dicts in the format of
    `passes.jsonl` (README.md, "Outputs") when the pass log was asked for, else None
    (a list, or for compiled runs a `replay.pass_log.PassLog` over the
    compiled loop's buffer, which also writes its lines); `telemetry` a list
    likewise for `telemetry.jsonl`. `itl_quantiles` is itl_quantiles.json's
    dict once `metrics.summarize` has computed it (None before)."""

    records: RequestRecords
    stats: RunStats
    pass_log: Sequence | None = None
    telemetry: list | None = None
    warnings: list = attrs.Factory(list)
    itl_quantiles: dict | None = None
