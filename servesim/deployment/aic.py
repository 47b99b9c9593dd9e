"""The optional aiconfigurator-core package (NVIDIA, Apache-2.0): its
forward-pass model for a deployment, and what its database supports.

Everything here imports the package lazily, so servesim runs without it; a
clear InputError says how to install it when a config needs it.
"""

import importlib.util
import json
import os

from servesim.deployment.config import DeploymentConfig, fp8_kv
from servesim.errors import InputError

BACKEND = "vllm"  # the database's framework when none is named (a vLLM engine's)
INSTALL = "pip install 'servesim[aic]', or pip install '.[aic]' in a clone of servesim (needs Python >= 3.11)"


def package_version():
    """The installed aiconfigurator-core version, or None."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("aiconfigurator-core")
    except PackageNotFoundError:
        return None


def require(what: str = "engine.timing type aic"):
    if importlib.util.find_spec("aiconfigurator_core") is None:
        raise InputError(f"{what} needs the optional package aiconfigurator-core: {INSTALL}")
    import aiconfigurator_core

    return aiconfigurator_core


def _systems_dir():
    spec = importlib.util.find_spec("aiconfigurator_core")
    if spec is None:
        return None
    return os.path.join(list(spec.submodule_search_locations)[0], "systems")


def database_systems(backend: str = BACKEND) -> dict:
    """System name -> the data versions the database holds for `backend`
    (vllm or sglang; empty without the package)."""
    root = _systems_dir()
    if root is None:
        return {}
    out = {}
    for name in sorted(os.listdir(root)):
        gemm = os.path.join(root, "data", name[:-5] if name.endswith(".yaml") else name, "gemm", backend)
        if name.endswith(".yaml") and os.path.isdir(gemm):
            versions = sorted(v for v in os.listdir(gemm) if os.path.isdir(os.path.join(gemm, v)))
            if versions:
                out[name[:-5]] = versions
    return out


def backend_version(system: str, backend: str = BACKEND) -> str:
    """The database's current version of `backend`'s data for `system`
    (query_versions.yaml: the system's override, else the default)."""
    from ruamel.yaml import YAML, YAMLError

    path = os.path.join(_systems_dir(), "query_versions.yaml")
    try:
        with open(path, encoding="utf-8") as f:
            data = YAML(typ="safe").load(f)
    except (OSError, YAMLError) as e:
        raise InputError(f"{path}: cannot read the database versions: {e}") from None
    slot = (data.get("overrides") or {}).get(system, {}).get(backend) or data["defaults"][backend]
    return str(slot["current"])


def engine_config(dep: DeploymentConfig, data_parallel_size: int = 1) -> dict:
    """The package's engine config for a deployment: vLLM's parallelism mapped
    to the database's (`moe_tp_size` = TP without expert parallelism; with it,
    experts over TP x DP ranks, `moe_ep_size`), weights and KV precision
    (which select the database's GEMM, MoE and attention tables)."""
    ac = require()
    tp = dep.tensor_parallel_size
    ep = tp * data_parallel_size if dep.enable_expert_parallel else 1
    config = {
        "schema_version": ac.engine_spec_schema_version(),
        "model_name": dep.model,
        "system_name": dep.gpu,
        "backend": dep.backend,
        "backend_version": backend_version(dep.gpu, dep.backend),
        "tp_size": tp,
        "pp_size": dep.pipeline_parallel_size,
        "attention_dp_size": data_parallel_size,
        "moe_tp_size": 1 if dep.enable_expert_parallel else tp,
        "moe_ep_size": ep,
    }
    # The native config flattens the package's QuantizationConfig under its
    # Rust names (`weight_dtype`, `moe_dtype`, `kv_cache_dtype`); the Python
    # names (`gemm_quant_mode`, ...) are silently ignored there, leaving the
    # model's own precision (its config.json) in charge. As in vLLM,
    # `quantization: fp8` quantizes a 16-bit checkpoint online (per-tensor
    # fp8); a checkpoint whose config names its own quantization (e.g. fp8
    # with 128x128 blocks) keeps it, and the database reads it from there.
    from servesim.deployment.specs import load_model_spec

    if dep.quantization == "fp8" and load_model_spec(dep.model).config_quantization is None:
        config["weight_dtype"] = "fp8"
        config["moe_dtype"] = "fp8"
    if fp8_kv(dep):
        config["kv_cache_dtype"] = "fp8"
    return config


def check_supported(dep: DeploymentConfig):
    """Reject a model or GPU the database lacks, listing what it has."""
    from servesim.deployment.specs import database_models

    systems = database_systems(dep.backend)
    if dep.gpu not in systems:
        name = "SGLang" if dep.backend == "sglang" else "vLLM"
        raise InputError(f"engine.gpu: the database has no {name} data for {dep.gpu!r}; it has: "
                         + ", ".join(systems))
    if dep.model not in database_models():
        raise InputError(f"engine.model: timing type aic needs a database model, got {dep.model!r}; "
                         "the database has: " + ", ".join(database_models()))


class DirectModel:
    """Direct calls of the package's forward-pass model for one deployment."""

    def __init__(self, dep: DeploymentConfig, data_parallel_size: int = 1):
        check_supported(dep)
        require()
        import logging

        logging.getLogger("aiconfigurator_core").setLevel(logging.ERROR)
        from aiconfigurator_core.sdk.rust_engine_step import RustForwardPassPerfModel

        try:
            self.model = RustForwardPassPerfModel.from_native(engine_config(dep, data_parallel_size))
        except (ValueError, RuntimeError) as exc:
            raise InputError(f"engine: the database cannot price {dep.model} on {dep.gpu} "
                             f"(TP {dep.tensor_parallel_size}, PP {dep.pipeline_parallel_size}): {exc}") from None

        # The facade's estimate serializes through a validating JSON encoder
        # that costs ~30x the Rust call itself (~280 us vs ~8 us in 0.12.0);
        # the compiled model takes the same JSON text, here from a template.
        inner = getattr(self.model, "_inner", None)
        self._estimate = getattr(inner, "estimate_forward_pass_time_ms", None)

    def __call__(self, prefill_tokens=0, num_prefill=0, prefill_context=0, decode_requests=0,
                 decode_context=0) -> float:
        """Milliseconds of one pass with these features (requests of even size)."""
        metrics = fpm(prefill_tokens, num_prefill, prefill_context, decode_requests, decode_context)
        if self._estimate is not None:
            return float(self._estimate(metrics) or 0.0)
        return float(self.model.estimate_forward_pass_time_ms(json.loads(metrics)) or 0.0)


def _quant_modes(dep: DeploymentConfig) -> dict:
    """The package's quantization modes for `compile_engine`, as
    engine_config chooses them (None: the model's own precision)."""
    from servesim.deployment.specs import load_model_spec

    modes = {}
    if dep.quantization == "fp8" and load_model_spec(dep.model).config_quantization is None:
        modes["gemm_quant_mode"] = modes["moe_quant_mode"] = "fp8"
    if fp8_kv(dep):
        modes["kvcache_quant_mode"] = "fp8"
    return modes


HEAD_OP = "generation_logits_gemm"


def head_times(dep: DeploymentConfig, rows, data_parallel_size: int = 1) -> list:
    """Milliseconds of the model's LM head (the database's logits GEMM, one
    op of its decode step: aiconfigurator-core's `decode_step_per_op`) over
    each count of logit rows in `rows`."""
    require()
    import logging

    logging.getLogger("aiconfigurator_core").setLevel(logging.ERROR)
    from aiconfigurator_core.sdk.engine import EngineHandle

    tp = dep.tensor_parallel_size
    try:
        handle = EngineHandle.compile(
            dep.model, dep.gpu, dep.backend, backend_version=backend_version(dep.gpu, dep.backend),
            tp_size=tp,
            pp_size=dep.pipeline_parallel_size, attention_dp_size=data_parallel_size,
            moe_tp_size=1 if dep.enable_expert_parallel else tp,
            moe_ep_size=tp * data_parallel_size if dep.enable_expert_parallel else 1,
            **_quant_modes(dep))
    except (ValueError, RuntimeError) as exc:
        raise InputError(f"engine: the database cannot price {dep.model}'s LM head on "
                         f"{dep.gpu}: {exc}") from None
    out = []
    for m in rows:
        ops = {name: ms for name, ms, *_ in handle.decode_step_per_op(int(m), 64, 2)}
        if HEAD_OP not in ops:
            raise InputError(f"engine: the database's decode step of {dep.model} has no "
                             f"{HEAD_OP} op to price a drafter's LM head")
        out.append(float(ops[HEAD_OP]))
    return out


_FPM = ('{"scheduled_requests": {"num_prefill_requests": %d, "sum_prefill_tokens": %d, '
        '"sum_prefill_kv_tokens": %d, "var_prefill_length": 0.0, "num_decode_requests": %d, '
        '"sum_decode_kv_tokens": %d, "var_decode_kv_tokens": 0.0}}')


def fpm(prefill_tokens, num_prefill, prefill_context, decode_requests, decode_context) -> str:
    """One rank's forward-pass metrics in the package's (Dynamo's) schema, as
    JSON text (a template: json.dumps of the dict is ~8x slower, a tenth of
    a table build)."""
    return _FPM % (num_prefill, prefill_tokens, prefill_context, decode_requests, decode_context)


def deployment_grid(dep: DeploymentConfig) -> list:
    """The GEMM token counts the database measured for a deployment's GPU and
    backend, at the backend's current version."""
    return measured_token_grid(dep.gpu, backend_version(dep.gpu, dep.backend), dep.backend)


def timing_source(dep: DeploymentConfig) -> str:
    """Where a deployment's `aic` pass times come from, e.g.
    `aiconfigurator-core 0.12.0 (sglang 0.5.14 data)`."""
    return f"aiconfigurator-core {package_version()} ({dep.backend} {backend_version(dep.gpu, dep.backend)} data)"


def measured_token_grid(system: str, version: str, backend: str = BACKEND) -> list:
    """The token counts (GEMM `m`) the database measured on `system` with `backend`."""
    import pyarrow.parquet as pq

    path = os.path.join(_systems_dir(), "data", system, "gemm", backend, version, "gemm_perf.parquet")
    # ParquetFile reads the one file directly; pq.read_table goes through
    # pyarrow's dataset layer, whose first use costs ~0.5 s of start-up
    column = pq.ParquetFile(path).read(columns=["m"], use_threads=False).column("m")
    return sorted({int(m) for m in column.to_pylist()})
