"""The attrs classes of the top-level YAML blocks (`workload`, `cluster`,
`output`) and of the whole resolved config. Parsing and validation live in
`servesim.config.config`."""

import attrs

from servesim.engine.config import EngineConfig, KVTransferConfig, RouterConfig, router_config


@attrs.frozen
class LengthDistribution:
    """`input_tokens` / `output_tokens` of a synthetic workload.

    distribution: constant (value), uniform (min, max), lognormal (mean, sigma
    of the underlying normal, clipped to [min, max]), zipf (a, clipped to
    [min, max]).
    """

    distribution: str = "constant"
    value: int = 0
    min: int = 1
    max: int = 0
    mean: float = 0.0
    sigma: float = 0.0
    a: float = 0.0


@attrs.frozen
class SessionsConfig:
    """`workload.synthetic.sessions`: `count` chat sessions of `turns` turns;
    each turn adds `new_input_tokens` to the previous prompt and output and
    asks for `output_tokens`; a later turn arrives `think_time` ms (a number,
    or a LengthDistribution drawn per turn) after the previous turn's last
    token. The first `shared_prefix_ratio` of a first prompt's blocks is
    shared by the sessions of one of `prefix_groups` groups (0: one group).
    Sessions start at `sessions_per_second` (Poisson, or `arrival: constant`),
    all at 0 without it, or in a closed loop with `concurrency`."""

    count: int = 100
    turns: int = 4
    new_input_tokens: LengthDistribution = attrs.Factory(lambda: LengthDistribution(value=512))
    output_tokens: LengthDistribution = attrs.Factory(lambda: LengthDistribution(value=128))
    think_time: object = 0.0  # ms: a float, or a LengthDistribution
    sessions_per_second: float | None = None
    shared_prefix_ratio: float = 0.0
    prefix_groups: int = 0


@attrs.frozen
class SyntheticConfig:
    requests: int = 100
    input_tokens: LengthDistribution = attrs.Factory(lambda: LengthDistribution(value=1024))
    output_tokens: LengthDistribution = attrs.Factory(lambda: LengthDistribution(value=128))
    arrival: str = "burst"  # burst | poisson | constant
    rate: float | None = None  # requests/s for poisson and constant
    concurrency: int | None = None
    shared_prefix_tokens: int = 0
    seed: int = 42
    sessions: SessionsConfig | None = None


@attrs.frozen
class WorkloadConfig:
    trace: str | None = None  # absolute path (resolved relative to the config file)
    format: str | None = None  # mooncake | azure; None: from the file name
    trace_block_size: int = 512
    limit: int | None = None
    speedup: float = 1.0
    concurrency: int | None = None
    synthetic: SyntheticConfig | None = None


@attrs.frozen
class ClusterConfig:
    """`cluster`. Aggregated (the default): `workers` engines, each running
    prompts and decodes. Disaggregated: `prefill_workers` and `decode_workers`
    engines whose configs (`prefill`, `decode`) are `engine:` with the pool's
    overrides, resolved; prompts' KV moves over `kv_transfer` links
    (servesim/engine/kv_handoff.py). `router` applies to every pool (it picks the
    prefill worker at arrival and the decode worker at handoff);
    `data_parallel_size` too, unless a pool sets its own
    (`prefill_data_parallel_size`, `decode_data_parallel_size`: the YAML's
    `cluster.prefill.data_parallel_size` / `cluster.decode.data_parallel_size`;
    None: `data_parallel_size`)."""

    workers: int = 1
    data_parallel_size: int = 1
    router: RouterConfig = attrs.field(factory=RouterConfig, converter=router_config)
    mode: str = "aggregated"  # aggregated | disaggregated
    prefill_workers: int = 0
    decode_workers: int = 0
    prefill: EngineConfig | None = None
    decode: EngineConfig | None = None
    kv_transfer: KVTransferConfig | None = None
    prefill_data_parallel_size: int | None = None
    decode_data_parallel_size: int | None = None

    @property
    def disaggregated(self) -> bool:
        return self.mode == "disaggregated"

    def pool_data_parallel_size(self, pool: str) -> int:
        """The DP ranks of each worker of `pool` ("prefill" or "decode")."""
        width = getattr(self, f"{pool}_data_parallel_size")
        return self.data_parallel_size if width is None else width

    def data_parallel_widths(self) -> list:
        """`[(config key, DP width)]` of each pool (aggregated: the one
        `cluster.data_parallel_size`; disaggregated: prefill, then decode,
        each named by the key its width comes from), for messages such as a
        pinned `dp_rank` out of range."""
        if not self.disaggregated:
            return [("cluster.data_parallel_size", self.data_parallel_size)]
        return [(f"cluster.{pool}.data_parallel_size"
                 if getattr(self, f"{pool}_data_parallel_size") is not None
                 else "cluster.data_parallel_size", self.pool_data_parallel_size(pool))
                for pool in ("prefill", "decode")]


@attrs.frozen
class OutputConfig:
    per_request: bool = True
    pass_log: bool = False
    telemetry_interval_ms: float | None = None


@attrs.frozen
class Config:
    workload: WorkloadConfig
    engine: EngineConfig = attrs.Factory(EngineConfig)
    cluster: ClusterConfig = attrs.Factory(ClusterConfig)
    output: OutputConfig = attrs.Factory(OutputConfig)
    source: str | None = None  # the config file's path, for messages
