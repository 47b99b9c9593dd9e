"""Config loading and validation (spec README §3, §7; docs/engine.md §8-10; fitting.md §2)."""

import json
from pathlib import Path

import attrs
import pytest

from servesim.engine.config import EngineConfig, LaunchConfig, TimingConfig
from servesim.errors import InputError
from servesim.kvcache.config import KVCacheConfig, KVOffloadingConfig
from servesim.config.config import config_from_dict, config_to_dict, load_config, read_fitted_model
from servesim.config.config_types import ClusterConfig, LengthDistribution, OutputConfig
from servesim.config.examples import EXAMPLES, bundled_trace_path, example_text
from servesim.scheduler.config import SchedulerConfig

REPO = Path(__file__).resolve().parents[1]


def _golden_dir() -> Path:
    local = REPO / "tests" / "golden" / "vllm-0.33"
    return local if local.is_dir() else REPO.parent / "shared" / "golden" / "vllm-0.33"


GOLDEN_CONFIGS = sorted(_golden_dir().glob("*/config.yaml"))

MODEL = """\
type: fitted
features: [intercept, num_prefill_requests, sum_prefill_tokens, num_decode_requests, sum_decode_kv_tokens]
coefficients_ms: [5.2, 11.8, 0.031, 0.19, 1.4e-06]
records: 12000
r2: 0.998
"""


@pytest.fixture
def write(tmp_path):
    """write(text, name="config.yaml") -> path, next to an empty trace t.jsonl."""
    (tmp_path / "t.jsonl").write_text("")

    def _write(text: str, name: str = "config.yaml") -> Path:
        path = tmp_path / name
        path.write_text(text)
        return path

    return _write


@pytest.fixture
def base(write):
    """A minimal valid config file."""
    return write("workload:\n  trace: t.jsonl\n")


def _error(path, overrides=()) -> str:
    with pytest.raises(InputError) as info:
        load_config(path, overrides)
    return str(info.value)


# ----------------------------------------------------------------------------- loading


@pytest.mark.skipif(not GOLDEN_CONFIGS, reason="golden vllm-0.33 scenarios not found")
@pytest.mark.parametrize("path", GOLDEN_CONFIGS, ids=lambda p: p.parent.name)
def test_golden_config_loads_and_round_trips(path):
    cfg = load_config(path)
    assert cfg.workload.trace == str(path.parent / "trace.jsonl")
    assert cfg.engine.timing.type == "linear"
    assert cfg.engine.kv_cache.block_size == 16
    assert config_from_dict(config_to_dict(cfg), source=cfg.source) == cfg


def test_defaults_are_vllms(base):
    cfg = load_config(base)
    assert cfg.engine == EngineConfig()
    assert cfg.engine.scheduler.max_model_len is None
    assert cfg.cluster == ClusterConfig() and cfg.output == OutputConfig()
    assert cfg.workload.trace == str(base.parent / "t.jsonl")
    assert cfg.workload.format == "mooncake"  # from the file name
    assert (cfg.workload.trace_block_size, cfg.workload.speedup, cfg.workload.limit) == (512, 1.0, None)
    assert cfg.source == str(base)


def test_flat_engine_keys_go_to_their_layer(write):
    cfg = load_config(write("""\
workload: {trace: t.jsonl}
engine:
  block_size: 64
  num_gpu_blocks: 4096
  enable_prefix_caching: false
  max_num_seqs: 8
  max_num_batched_tokens: 512
  max_model_len: 512
  enable_chunked_prefill: false
  long_prefill_token_threshold: 32
  scheduling_policy: priority
  reserve_full_isl: false
  watermark: 0
  async_scheduling: true
  detokenize_ms: 1
  launch: {decode_ms: 6.52, eager_queue_fraction: 1, max_cudagraph_capture_size: 4096}
  kv_offloading: {num_cpu_blocks: 100, bytes_per_token: 65536, d2h_gbps: 32, h2d_gbps: 16}
  timing: {type: fixed, prefill_ms: 2, decode_ms: 1}
"""))
    e = cfg.engine
    assert e.kv_cache == KVCacheConfig(64, 4096, False)
    assert e.scheduler == SchedulerConfig(8, 512, 512, False, 32, "priority", False, 0.0, True)
    assert e.launch == LaunchConfig(decode_ms=6.52, eager_queue_fraction=1.0, max_cudagraph_capture_size=4096)
    assert e.kv_offloading == KVOffloadingConfig(100, 65536, 32.0, 16.0, "offloading")
    assert e.timing == TimingConfig(type="fixed", prefill_ms=2.0, decode_ms=1.0)
    assert type(e.scheduler.watermark) is float and type(e.detokenize_ms) is float


def test_format_from_file_name(write, tmp_path):
    (tmp_path / "a.csv").write_text("")
    assert load_config(write("workload: {trace: a.csv}\n")).workload.format == "azure"
    (tmp_path / "a.txt").write_text("")
    assert "workload.format" in _error(write("workload: {trace: a.txt}\n"))


def test_synthetic_lengths(write):
    cfg = load_config(write("""\
workload:
  synthetic:
    input_tokens: {distribution: lognormal, mean: 7.0, sigma: 0.5}
    output_tokens: {distribution: zipf, a: 1.5, max: 900}
engine: {block_size: 16}
"""))
    syn = cfg.workload.synthetic
    assert syn.input_tokens == LengthDistribution("lognormal", mean=7.0, sigma=0.5, min=1, max=0)
    assert syn.output_tokens == LengthDistribution("zipf", a=1.5, min=1, max=900)
    assert (syn.requests, syn.arrival, syn.seed, syn.rate) == (100, "burst", 42, None)
    cfg = load_config(write("workload: {synthetic: {input_tokens: 300, output_tokens: {distribution: uniform, min: 2, max: 9}}}\n"))
    assert cfg.workload.synthetic.input_tokens == LengthDistribution(value=300)
    assert cfg.workload.synthetic.output_tokens == LengthDistribution("uniform", min=2, max=9)


def test_fitted_timing_reads_the_model_relative_to_the_config(write, tmp_path):
    (tmp_path / "models").mkdir()
    write(MODEL, "models/m.yaml")
    cfg = load_config(write("workload: {trace: t.jsonl}\nengine:\n  timing: {type: fitted, model: models/m.yaml}\n"))
    assert cfg.engine.timing.model == str(tmp_path / "models" / "m.yaml")
    assert cfg.engine.timing.coefficients_ms == (5.2, 11.8, 0.031, 0.19, 1.4e-06)
    assert read_fitted_model(cfg.engine.timing.model) == cfg.engine.timing.coefficients_ms


@pytest.mark.parametrize(
    "model, key",
    [
        (MODEL.replace("type: fitted", "type: linear"), "type"),
        (MODEL.replace("intercept, ", ""), "features"),
        (MODEL.replace("5.2, ", ""), "coefficients_ms"),
        (MODEL.replace("5.2", ".nan"), "coefficients_ms"),
        (MODEL.replace("5.2", "'x'"), "coefficients_ms"),
        ("- 1\n", "mapping"),
    ],
)
def test_bad_fitted_model_is_named(write, model, key):
    path = write(model, "m.yaml")
    message = _error(write("workload: {trace: t.jsonl}\nengine: {timing: {type: fitted, model: m.yaml}}\n"))
    assert str(path) in message and key in message


def test_missing_fitted_model(base):
    message = _error(base, ["engine.timing={type: fitted, model: nope.yaml}"])
    assert "engine.timing.model" in message and "nope.yaml" in message


# ----------------------------------------------------------------------------- errors with lines


@pytest.mark.parametrize(
    "text, where",
    [
        ("workload: {trace: t.jsonl}\nengine:\n  block_size: 16\n  num_gpu_blocs: 4\n", "config.yaml:4: engine.num_gpu_blocs"),
        ("workload: {trace: t.jsonl}\nengine:\n  block_size: 1.5\n", "config.yaml:3: engine.block_size"),
        ("workload: {trace: t.jsonl}\nengine:\n  timing:\n    type: fixed\n    prefill_ms: -1\n    decode_ms: 1\n",
         "config.yaml:5: engine.timing.prefill_ms"),
        ("workload: {trace: t.jsonl}\nengine:\n  timing:\n    type: fixed\n    prefill_ms: 1\n", "config.yaml:3: engine.timing.decode_ms"),
        ("workload: {trace: t.jsonl}\ncluster:\n  workers: 0\n", "config.yaml:3: cluster.workers"),
        ("workload: {trace: missing.jsonl}\n", "config.yaml:1: workload.trace"),
        ("workload:\n  trace: t.jsonl\n  speedup: 0\n", "config.yaml:3: workload.speedup"),
        ("\nworkload: {trace: t.jsonl}\noutputs: {}\n", "config.yaml:3: outputs"),
    ],
)
def test_error_names_file_line_and_key(write, text, where):
    assert where in _error(write(text))


def test_unknown_key_suggests_the_close_one(write):
    message = _error(write("workload: {trace: t.jsonl}\nengine:\n  num_gpu_blocs: 4\n"))
    assert message.endswith("/config.yaml:3: engine.num_gpu_blocs: unknown key (did you mean 'num_gpu_blocks'?)")


def test_unknown_key_without_close_match_lists_the_accepted(base):
    message = _error(base, ["cluster.zzz=1"])
    assert "cluster.zzz: unknown key (accepted: workers, data_parallel_size, router)" in message


def test_bad_files(write, tmp_path):
    assert "not found" in _error(tmp_path / "nope.yaml")
    assert "config.yaml:2: invalid YAML" in _error(write("workload:\n\ttrace: t.jsonl\n"))
    assert "config.yaml:2: invalid YAML" in _error(write("a: 1\na: 2\n"))  # duplicate key
    assert "mapping" in _error(write("- 1\n- 2\n"))
    assert "mapping" in _error(write(""))
    assert "workload" in _error(write("engine: {}\n"))


# ----------------------------------------------------------------------------- errors by key

CASES = [
    # (overrides, key path in the message, a fragment of the message)
    (["engine.block_size=0"], "engine.block_size", ">= 1"),
    (["engine.num_gpu_blocks=1"], "engine.num_gpu_blocks", ">= 2"),
    (["engine.num_gpu_blocks=4096.5"], "engine.num_gpu_blocks", "integer"),
    (["engine.num_gpu_blocks=true"], "engine.num_gpu_blocks", "integer"),
    (["engine.max_num_seqs=0"], "engine.max_num_seqs", ">= 1"),
    (["engine.max_num_batched_tokens=0"], "engine.max_num_batched_tokens", ">= 1"),
    (["engine.max_num_seqs=512", "engine.max_num_batched_tokens=256"], "engine.max_num_batched_tokens", "max_num_seqs"),
    (["engine.max_model_len=0"], "engine.max_model_len", "or null"),
    (["engine.enable_chunked_prefill=false", "engine.max_model_len=9000"], "engine.max_num_batched_tokens", "max_model_len"),
    (["engine.long_prefill_token_threshold=-1"], "engine.long_prefill_token_threshold", ">= 0"),
    (["engine.watermark=1.0"], "engine.watermark", "< 1"),
    (["engine.watermark=.nan"], "engine.watermark", "number"),
    (["engine.detokenize_ms=-0.1"], "engine.detokenize_ms", ">= 0"),
    (["engine.enable_prefix_caching=1"], "engine.enable_prefix_caching", "true or false"),
    (["engine.async_scheduling=yes"], "engine.async_scheduling", "true or false"),
    (["engine.scheduling_policy=fcsf"], "engine.scheduling_policy", "did you mean 'fcfs'"),
    (["engine.timing={type: quadratic}"], "engine.timing.type", "fixed, linear, polynomial, fitted"),
    (["engine.timing={type: fixed, prefill_ms: 1}"], "engine.timing.decode_ms", "missing"),
    (["engine.timing={type: fixed, prefill_ms: 1, decode_ms: 1, base_ms: 1}"], "engine.timing.base_ms", "not a parameter of type 'fixed'"),
    (["engine.timing={type: linear, base_ms: 1, per_token_ms: -1}"], "engine.timing.per_token_ms", ">= 0"),
    (["engine.timing={type: polynomial, prefill_ms: 1}"], "engine.timing.prefill_ms", "its parameters: none"),
    (["engine.timing={type: fitted}"], "engine.timing.model", "missing"),
    (["engine.timing=polynomial"], "engine.timing", "mapping"),
    (["engine.launch={}"], "engine.launch", "async_scheduling: true"),
    (["engine.launch={}", "engine.async_scheduling=true", "cluster.data_parallel_size=2"], "engine.launch", "data_parallel_size: 1"),
    (["engine.launch={eager_ms: -1}", "engine.async_scheduling=true"], "engine.launch.eager_ms", ">= 0"),
    (["engine.launch={eager_queue_fraction: 1.5}", "engine.async_scheduling=true"], "engine.launch.eager_queue_fraction", "<= 1"),
    (["engine.launch={max_cudagraph_capture_size: 0}", "engine.async_scheduling=true"], "engine.launch.max_cudagraph_capture_size", ">= 1"),
    (["engine.launch={decode_msx: 1}", "engine.async_scheduling=true"], "engine.launch.decode_msx", "did you mean 'decode_ms'"),
    (["engine.kv_offloading={num_cpu_blocks: 8}"], "engine.kv_offloading.bytes_per_token", "missing"),
    (["engine.kv_offloading={num_cpu_blocks: 0, bytes_per_token: 1, d2h_gbps: 1, h2d_gbps: 1}"], "engine.kv_offloading.num_cpu_blocks", ">= 1"),
    (["engine.kv_offloading={num_cpu_blocks: 8, bytes_per_token: 1, d2h_gbps: 1, h2d_gbps: 0}"], "engine.kv_offloading.h2d_gbps", "> 0"),
    (["engine.kv_offloading={num_cpu_blocks: 8, bytes_per_token: 1, d2h_gbps: 1, h2d_gbps: 1, connector: lmcache}"],
     "engine.kv_offloading.connector", "offloading, simple_cpu"),
    (["cluster.workers=0"], "cluster.workers", ">= 1"),
    (["cluster.data_parallel_size=0"], "cluster.data_parallel_size", ">= 1"),
    (["cluster.router=random"], "cluster.router", "round_robin, least_loaded, least_prefill, kv_router"),
    (["cluster.router={policy: kv_router, overlap_score_weight: -1}"],
     "cluster.router.overlap_score_weight", ">= 0"),
    (["cluster.router={policy: kv_router, router_temperature: -0.5}"],
     "cluster.router.router_temperature", ">= 0"),
    (["cluster.router={policy: kv_router, seed: 1.5}"], "cluster.router.seed", "integer"),
    (["cluster.router={policy: kv_router, kv_event_lag_ms: -5}"], "cluster.router.kv_event_lag_ms",
     ">= 0"),
    (["cluster.router={policy: least_loaded, router_temperature: 1}"],
     "cluster.router.router_temperature", "knob of policy kv_router"),
    (["cluster.router={policy: kv_router, overlap_weight: 1}"], "cluster.router.overlap_weight",
     "did you mean 'overlap_score_weight'"),
    (["cluster.router={overlap_score_weight: 1}"], "cluster.router.policy", "missing"),
    (["cluster.router={policy: weighted, scorers: {load: 1}}"], "cluster.router.scorers.load",
     "prefix_cache, queue_depth, kv_usage"),
    (["cluster.router={policy: weighted, scorers: {queue_depth: -1}}"],
     "cluster.router.scorers.queue_depth", ">= 0"),
    (["cluster.router={policy: weighted, scorers: {prefix_cache: 0, queue_depth: 0, kv_usage: 0}}"],
     "cluster.router.scorers", "every scorer weight 0"),
    (["cluster.router={policy: kv_router, scorers: {kv_usage: 1}}"], "cluster.router.scorers",
     "knob of policy weighted"),
    (["output.telemetry_interval_ms=0"], "output.telemetry_interval_ms", "> 0 or null"),
    (["output.pass_log=null"], "output.pass_log", "true or false"),
    (["workload.format=sharegpt"], "workload.format", "mooncake, azure"),
    (["workload.trace_block_size=0"], "workload.trace_block_size", ">= 1"),
    (["workload.limit=0"], "workload.limit", ">= 1 or null"),
    (["workload.speedup=-2"], "workload.speedup", "> 0"),
    (["workload.concurrency=0"], "workload.concurrency", ">= 1 or null"),
    (["workload.trace=null"], "workload", "exactly one"),
    (["workload.synthetic={}"], "workload", "exactly one"),
    (["workload.trace=null", "workload.synthetic={requests: 0}"], "workload.synthetic.requests", ">= 1"),
    (["workload.trace=null", "workload.synthetic={arrival: poisson}"], "workload.synthetic.rate", "rate"),
    (["workload.trace=null", "workload.synthetic={arrival: constant, rate: 0}"], "workload.synthetic.rate", "> 0"),
    (["workload.trace=null", "workload.synthetic={arrival: gamma}"], "workload.synthetic.arrival", "burst, poisson, constant"),
    (["workload.trace=null", "workload.synthetic={shared_prefix_tokens: 24}"], "workload.synthetic.shared_prefix_tokens", "multiple"),
    (["workload.trace=null", "workload.synthetic={shared_prefix_tokens: -16}"], "workload.synthetic.shared_prefix_tokens", ">= 0"),
    (["workload.trace=null", "workload.synthetic={concurrency: 2}", "workload.concurrency=2"], "workload.concurrency", "not both"),
    (["workload.trace=null", "workload.synthetic={input_tokens: 0}"], "workload.synthetic.input_tokens", ">= 1"),
    (["workload.trace=null", "workload.synthetic={input_tokens: 1.5}"], "workload.synthetic.input_tokens", "distribution"),
    (["workload.trace=null", "workload.synthetic={input_tokens: {min: 1}}"], "workload.synthetic.input_tokens.distribution", "missing"),
    (["workload.trace=null", "workload.synthetic={input_tokens: {distribution: normal}}"],
     "workload.synthetic.input_tokens.distribution", "uniform"),
    (["workload.trace=null", "workload.synthetic={input_tokens: {distribution: uniform, min: 5, max: 4}}"],
     "workload.synthetic.input_tokens.max", ">= 5"),
    (["workload.trace=null", "workload.synthetic={output_tokens: {distribution: zipf, a: 1, max: 9}}"],
     "workload.synthetic.output_tokens.a", "> 1"),
    (["workload.trace=null", "workload.synthetic={output_tokens: {distribution: zipf, a: 2}}"],
     "workload.synthetic.output_tokens.max", "missing"),
    (["workload.trace=null", "workload.synthetic={output_tokens: {distribution: lognormal, mean: 2, sigma: -1}}"],
     "workload.synthetic.output_tokens.sigma", ">= 0"),
    (["workload.trace=null", "workload.synthetic={output_tokens: {distribution: uniform, min: 1, max: 2, sigma: 1}}"],
     "workload.synthetic.output_tokens.sigma", "not a parameter of distribution 'uniform'"),
    (["engine.num_gpu_blocs=4"], "engine.num_gpu_blocs", "did you mean 'num_gpu_blocks'"),
    (["foo.bar=1"], "foo", "unknown key"),
]


@pytest.mark.parametrize("overrides, key, fragment", CASES, ids=lambda v: v if isinstance(v, str) else None)
def test_invalid_value_is_an_input_error_naming_the_key(base, overrides, key, fragment):
    message = _error(base, overrides)
    assert f"--set {key}:" in message or f": {key}:" in message
    assert fragment in message


# ----------------------------------------------------------------------------- overrides


def test_overrides_are_yaml_typed_and_replace_blocks(write):
    path = write("workload: {trace: t.jsonl}\nengine:\n  timing: {type: linear, base_ms: 1, per_token_ms: 1}\n")
    cfg = load_config(path, ["engine.num_gpu_blocks=4096", "engine.timing={type: fixed, prefill_ms: 1, decode_ms: 1}",
                             "engine.max_model_len=2048", "output.pass_log=true"])
    assert cfg.engine.kv_cache.num_gpu_blocks == 4096
    assert cfg.engine.timing == TimingConfig(type="fixed", prefill_ms=1.0, decode_ms=1.0)
    assert cfg.engine.scheduler.max_model_len == 2048 and cfg.output.pass_log is True
    cfg = load_config(path, ["workload.trace=null", "workload.synthetic.requests=7"])
    assert cfg.workload.synthetic.requests == 7 and cfg.workload.trace is None


@pytest.mark.parametrize("override", ["engine.num_gpu_blocks", "=4", "engine..x=1", "engine.timing={type: [", "engine.block_size.x=1"])
def test_malformed_override(base, override):
    assert "--set" in _error(base, [override])


# ----------------------------------------------------------------------------- dicts and round trips


def test_config_from_dict_resolves_paths_and_keeps_input(tmp_path):
    (tmp_path / "t.jsonl").write_text("")
    data = {"workload": {"trace": "t.jsonl"}, "engine": {"block_size": 32}}
    cfg = config_from_dict(data, base_dir=str(tmp_path))
    assert cfg.workload.trace == str(tmp_path / "t.jsonl") and cfg.engine.kv_cache.block_size == 32
    assert data == {"workload": {"trace": "t.jsonl"}, "engine": {"block_size": 32}}
    with pytest.raises(InputError, match=r"^engine\.block_size: must be an integer >= 1, got 0$"):
        config_from_dict({"workload": {"trace": "t.jsonl"}, "engine": {"block_size": 0}}, base_dir=str(tmp_path))


def test_round_trip_of_every_block(write, tmp_path):
    write(MODEL, "m.yaml")
    full = load_config(write("""\
workload:
  synthetic:
    requests: 10
    input_tokens: {distribution: lognormal, mean: 6, sigma: 1, min: 64, max: 4096}
    output_tokens: {distribution: zipf, a: 2, max: 100}
    arrival: constant
    rate: 2
    concurrency: 4
    shared_prefix_tokens: 64
engine:
  async_scheduling: true
  max_model_len: 8192
  launch: {decode_ms: 1, piecewise_ms: 2, eager_ms: 3, eager_queue_fraction: 0.5}
  frontend: {request_ms: 4, tokenize_us_per_token: 3.5}
  kv_offloading: {num_cpu_blocks: 100, bytes_per_token: 2, d2h_gbps: 3, h2d_gbps: 4, connector: simple_cpu}
  timing: {type: fitted, model: m.yaml}
cluster: {workers: 3, router: kv_aware}
output: {telemetry_interval_ms: 250}
"""))
    lognormal = load_config(write("workload: {synthetic: {input_tokens: {distribution: lognormal, mean: 6, sigma: 1}}}\n"))
    for cfg in (full, lognormal):
        data = config_to_dict(cfg)
        assert json.loads(json.dumps(data)) == data
        assert list(data) == ["workload", "engine", "cluster", "output"]
        assert config_from_dict(data, source=cfg.source) == cfg
    assert config_to_dict(lognormal)["workload"]["synthetic"]["input_tokens"]["max"] is None
    assert config_to_dict(full)["engine"]["timing"] == {"type": "fitted", "model": str(tmp_path / "m.yaml")}


def test_frontend_is_a_mapping_of_non_negative_delays_given_once_for_the_cluster(base):
    assert load_config(base).engine.frontend is None  # no frontend: none in the resolved config
    assert "frontend" not in config_to_dict(load_config(base))["engine"]
    cfg = load_config(base, ["engine.frontend.request_ms=4"])
    assert (cfg.engine.frontend.request_ms, cfg.engine.frontend.tokenize_us_per_token) == (4, 0)
    assert _error(base, ["engine.frontend.request_ms=-1"]).endswith(
        "engine.frontend.request_ms: must be a number >= 0, got -1")
    assert "engine.frontend.tokenise_us_per_token: unknown key" in _error(
        base, ["engine.frontend.tokenise_us_per_token=1"])
    assert ("cluster.prefill.frontend: the API server is in front of the whole cluster: set "
            "engine.frontend instead") in _error(
        base, ["cluster.mode=disaggregated", "cluster.prefill.frontend.request_ms=1"])


def test_host_ms_per_pass_is_a_non_negative_number_kept_out_of_the_resolved_config_at_0(base):
    assert load_config(base).engine.host_ms_per_pass == 0
    assert "host_ms_per_pass" not in config_to_dict(load_config(base))["engine"]
    cfg = load_config(base, ["engine.host_ms_per_pass=1.4"])
    assert config_to_dict(cfg)["engine"]["host_ms_per_pass"] == 1.4
    assert config_from_dict(config_to_dict(cfg), source=cfg.source) == cfg
    assert _error(base, ["engine.host_ms_per_pass=-1"]).endswith(
        "engine.host_ms_per_pass: must be a number >= 0, got -1")


# ----------------------------------------------------------------------------- examples


@pytest.mark.parametrize("name", list(EXAMPLES))
def test_example_loads(tmp_path, name):
    path = tmp_path / "example.yaml"
    path.write_text(example_text(name))
    cfg = load_config(path)
    assert config_from_dict(config_to_dict(cfg), source=cfg.source) == cfg
    if cfg.workload.trace is not None:
        assert cfg.workload.trace == bundled_trace_path() and Path(cfg.workload.trace).is_file()


def test_mooncake_example_is_the_spec_benchmark_setup(tmp_path):
    path = tmp_path / "example.yaml"
    path.write_text(example_text("mooncake"))
    cfg = load_config(path)
    assert (cfg.engine.kv_cache.block_size, cfg.engine.kv_cache.num_gpu_blocks) == (64, 16384)
    assert cfg.engine.timing.type == "polynomial"
    repo_example = load_config(REPO / "examples" / "mooncake.yaml")
    assert Path(repo_example.workload.trace).is_file()

    def without_paths(c):
        return attrs.evolve(c, source=None, workload=attrs.evolve(c.workload, trace=None))

    assert without_paths(repo_example) == without_paths(cfg)


def test_unknown_example_lists_the_names():
    with pytest.raises(InputError, match="mooncake, synthetic, cpu-tier, launch"):
        example_text("mooncak")
