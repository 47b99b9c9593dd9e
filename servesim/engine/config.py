"""Configuration of a simulated vLLM engine: the `engine:` block of the YAML."""

import attrs

from servesim.deployment.config import DeploymentConfig
from servesim.scheduler.speculative import SpeculativeConfig
from servesim.kvcache.config import KVCacheConfig, KVOffloadingConfig
from servesim.scheduler.config import SchedulerConfig
from servesim.sglang.config import SGLangConfig


@attrs.frozen
class TimingConfig:
    """Pass pricing (docs/engine.md §10).

    type fixed: prefill_ms, decode_ms.
    type linear: base_ms, per_token_ms, per_request_ms, per_context_token_ms.
    type polynomial: no parameters.
    type fitted: model (path, resolved relative to the config file) and
    coefficients_ms (the model file's five coefficients, six with
    sum_draft_tokens, read at load time),
    model_capture_size (the `max_cudagraph_capture_size` its records were
    corrected with, from its metadata, or None) and model_fit_on ("launch_stall",
    "window" or "records": whether the fit moved launches back to their own
    passes; servesim/config/fitted_checks.py).
    type aic: pass times from aiconfigurator-core's database for the engine's
    deployment (docs/deployment.md); calibration (optional path) and
    calibration_factors (prefill, decode, mixed multipliers, read at load time).
    """

    type: str = "polynomial"
    prefill_ms: float = 0.0
    decode_ms: float = 0.0
    base_ms: float = 0.0
    per_token_ms: float = 0.0
    per_request_ms: float = 0.0
    per_context_token_ms: float = 0.0
    model: str | None = None
    coefficients_ms: tuple = ()
    model_capture_size: int | None = None
    model_fit_on: str | None = None
    calibration: str | None = None
    calibration_factors: tuple = ()


@attrs.frozen
class LaunchConfig:
    """`engine.launch` (docs/engine.md §8)."""

    decode_ms: float = 0.0
    piecewise_ms: float = 0.0
    eager_ms: float = 0.0
    eager_queue_fraction: float = 0.0
    max_cudagraph_capture_size: int = 512


@attrs.frozen
class FrontendConfig:
    """`engine.frontend`: the API server in front of the engine core
    (docs/engine.md §8, "Frontend"). A request the client sends at `t`
    reaches the engine at `t + request_ms + tokenize_us_per_token · P / 1000`
    (P: its prompt tokens): HTTP handling, the chat template and
    tokenization, which vLLM's API server does before it hands the request
    to the engine core."""

    request_ms: float = 0.0
    tokenize_us_per_token: float = 0.0

    def delay_ms(self, num_prompt_tokens):
        """The frontend's delay of each request (ms), by its prompt tokens
        (an array or an int)."""
        return self.request_ms + self.tokenize_us_per_token * num_prompt_tokens / 1000.0


@attrs.frozen
class EngineConfig:
    kv_cache: KVCacheConfig = attrs.Factory(KVCacheConfig)
    scheduler: SchedulerConfig = attrs.Factory(SchedulerConfig)
    timing: TimingConfig = attrs.Factory(TimingConfig)
    launch: LaunchConfig | None = None
    detokenize_ms: float = 0.0
    frontend: FrontendConfig | None = None  # None: requests reach the engine when sent
    host_ms_per_pass: float = 0.0  # CPU work before each pass's GPU start (engine/launch.py)
    kv_offloading: KVOffloadingConfig | None = None
    speculative: SpeculativeConfig | None = None
    deployment: DeploymentConfig | None = None  # engine.model, engine.gpu, ... (docs/deployment.md)
    # `backend: sglang` (docs/sglang.md): SGLang's server arguments; the vLLM
    # blocks above then keep their defaults and are not used
    sglang: SGLangConfig | None = None

    @property
    def backend(self) -> str:
        return "vllm" if self.sglang is None else "sglang"


@attrs.frozen
class KVTransferConfig:
    """`cluster.kv_transfer`: the link a prefill worker sends KV over to the
    decode workers (disaggregated mode; servesim/engine/kv_handoff.py).

    Moving `n` tokens takes `latency_ms + n · bytes_per_token / (bandwidth_gbps
    · 1e9)` s, in ms; the bytes occupy the link, the latency does not."""

    bytes_per_token: int
    bandwidth_gbps: float
    latency_ms: float = 0.0


@attrs.frozen
class RouterConfig:
    """`cluster.router`: the policy (servesim/engine/routing.py), given as
    its name or as a mapping with `policy` and the policy's knobs —
    `kv_router`'s under NVIDIA Dynamo's names: `overlap_score_weight`,
    `router_temperature`, `seed` (the router's generator: ties and the
    softmax draw) and `kv_event_lag_ms` (how late the ranks' KV events
    reach the router; 0: it sees the prefix caches as they are); `weighted`'s under `scorers` (`prefix_cache`,
    `queue_depth`, `kv_usage`: the weights of the gateways' scorers) and
    `seed`. `kv_aware` reads as `kv_router` with its defaults
    (servesim/config/router_config.py)."""

    policy: str = "round_robin"
    overlap_score_weight: float = 1.0
    router_temperature: float = 0.0
    seed: int = 0
    kv_event_lag_ms: float = 0.0
    prefix_cache: float = 1.0  # `weighted`'s scorers' weights (`scorers:` in the YAML)
    queue_depth: float = 1.0
    kv_usage: float = 1.0


def router_config(router) -> RouterConfig:
    """`router` as a RouterConfig: a policy's name (an alias read as what it
    stands for) is that policy with its defaults."""
    if isinstance(router, RouterConfig):
        return router
    return RouterConfig(policy={"kv_aware": "kv_router"}.get(router, router))
