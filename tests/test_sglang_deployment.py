"""SGLang deployments (docs/sglang.md, "Deployments"): the deployment keys
under `backend: sglang`, `max_total_tokens` derived as SGLang 0.5.23 derives
it and worked out by hand, SGLang's start-up refusals naming the key (exit 2
from the CLI), and `timing: aic` priced from the database's SGLang data.
Tests that call aiconfigurator-core itself skip when it is absent."""

import pytest

from servesim.config.config import config_from_dict, config_to_dict
from servesim.errors import InputError
from tests.helpers import invoke
from tests.test_deployment import QWEN3_32B, model_dir, needs_aic

H200 = 151397597184  # the GPU spec's memory (servesim/deployment/gpus.py)
RUNTIME_TP2 = 3758096384 + 358612992  # CUDA context etc. + NCCL at TP 2
WEIGHTS_TP2 = 32_762_101_760  # Qwen3-32B's per GPU at TP 2 (test_deployment's by-hand sum)
CELL_TP2 = 64 * (8 // 2) * 128 * 2 * 2  # layers x KV heads/GPU x head dim x (K, V) x bytes
QWEN3 = {**QWEN3_32B, "max_position_embeddings": 40960}


def sglang_config(engine, requests=4):
    return config_from_dict({"workload": {"synthetic": {"requests": requests}},
                             "engine": {"backend": "sglang", **engine}}, source="c.yaml")


def qwen3(tmp_path, name="m", **engine):
    return {"model": model_dir(tmp_path, QWEN3, name), "gpu": "h200_sxm",
            "tensor_parallel_size": 2, **engine}


def test_max_total_tokens_qwen3_32b_h200_tp2_by_hand(tmp_path, monkeypatch):
    from helpers import without_aic

    without_aic(monkeypatch)  # the capacity needs no aiconfigurator-core
    cfg = sglang_config(qwen3(tmp_path))
    # mem_fraction_static's default: the GPU's 144384 MiB less SGLang's
    # reserve of 512 + 1.5 x the 8192-token chunk + TP 2 / 8 GiB + 2 x the
    # 256-batch decode graph + 8 x the 58 prefill graphs of up to 8192 tokens
    gpu_mem = H200 / (1 << 20)
    assert gpu_mem == 144384
    reserved = 512 + 1.5 * 8192 + 2 / 8 * 1024 + 2 * 256 + 8 * 58
    assert reserved == 14032
    fraction = round((gpu_mem - reserved) / gpu_mem, 3)
    assert fraction == 0.903
    # the pool: the memory free before the weights, less the weights and
    # the share outside mem_fraction_static, over the bytes of a token
    pre = H200 - RUNTIME_TP2
    rest = int(pre - WEIGHTS_TP2 - pre * (1 - fraction))
    expected = rest // CELL_TP2
    assert expected == 764713
    engine = cfg.engine
    assert engine.sglang.max_total_tokens == expected
    assert engine.deployment.mem_fraction_static == fraction
    assert engine.deployment.derived_num_gpu_blocks
    # context_length: the model's (max_position_embeddings); the request
    # slots: 512 per context length the pool holds, within 2048 and 4096
    assert engine.sglang.context_length == 40960
    assert engine.sglang.max_running_requests == 4096
    assert engine.sglang.chunked_prefill_size == 8192
    # the resolved config reads back as the same engine
    again = config_from_dict(config_to_dict(cfg), source=cfg.source)
    assert again.engine == engine


def test_a_given_mem_fraction_static_and_page_size(tmp_path):
    cfg = sglang_config(qwen3(tmp_path, mem_fraction_static=0.8, page_size=64))
    pre = H200 - RUNTIME_TP2
    rest = int(pre - WEIGHTS_TP2 - pre * (1 - 0.8))
    assert cfg.engine.sglang.max_total_tokens == rest // CELL_TP2 // 64 * 64


def test_a_given_max_total_tokens_caps_the_derived_pool(tmp_path):
    small = sglang_config(qwen3(tmp_path, max_total_tokens=50000)).engine
    assert small.sglang.max_total_tokens == 50000 and not small.deployment.derived_num_gpu_blocks
    # SGLang warns and takes the profiled value when the given one is larger
    large = sglang_config(qwen3(tmp_path, "n", max_total_tokens=2_000_000)).engine
    assert large.sglang.max_total_tokens == 764713 and large.deployment.derived_num_gpu_blocks


def test_chunked_prefill_size_defaults_by_the_gpus_memory(tmp_path):
    cfg = sglang_config({"model": model_dir(tmp_path, QWEN3), "gpu": "b200_sxm",
                         "tensor_parallel_size": 2})
    assert cfg.engine.sglang.chunked_prefill_size == 16384  # 180 GiB: SGLang's B200 tier
    cfg = sglang_config(qwen3(tmp_path, "n", chunked_prefill_size=4096))
    assert cfg.engine.sglang.chunked_prefill_size == 4096


def test_fp8_kv_halves_the_cell(tmp_path):
    cfg = sglang_config(qwen3(tmp_path, kv_cache_dtype="fp8_e4m3", mem_fraction_static=0.9))
    pre = H200 - RUNTIME_TP2
    rest = int(pre - WEIGHTS_TP2 - pre * (1 - 0.9))
    assert cfg.engine.sglang.max_total_tokens == rest // (CELL_TP2 // 2)


@pytest.mark.parametrize("key, value, names", [
    ("gpu_memory_utilization", 0.9, "SGLang calls it mem_fraction_static"),
    ("pipeline_parallel_size", 2, "pipeline parallelism is not supported with backend: sglang"),
    ("enable_expert_parallel", True, "expert parallelism is not supported with backend: sglang"),
    ("kv_cache_dtype", "fp8", "one of auto, bf16, bfloat16, fp8_e4m3"),
])
def test_a_deployment_key_sglang_lacks_is_refused_naming_it(tmp_path, key, value, names):
    with pytest.raises(InputError) as info:
        sglang_config(qwen3(tmp_path, **{key: value}))
    assert f"engine.{key}" in str(info.value) and names in str(info.value)


def test_mem_fraction_static_under_vllm_names_vllms_key(tmp_path):
    with pytest.raises(InputError) as info:
        config_from_dict({"workload": {"synthetic": {"requests": 1}},
                          "engine": {"model": model_dir(tmp_path, QWEN3), "gpu": "h200_sxm",
                                     "mem_fraction_static": 0.8}})
    assert "engine.mem_fraction_static" in str(info.value)
    assert "vLLM calls it gpu_memory_utilization" in str(info.value)


def _cli(tmp_path, engine: str, monkeypatch=None):
    folder = model_dir(tmp_path, QWEN3)
    config = tmp_path / "c.yaml"
    config.write_text("workload: {synthetic: {requests: 4}}\n"
                      f"engine: {{backend: sglang, model: {folder}, gpu: h200_sxm, "
                      f"tensor_parallel_size: 2, {engine}}}\n")
    result = invoke("run", config, "-o", tmp_path / "out", "-q")
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and not (tmp_path / "out").exists()
    return result.output


@pytest.mark.parametrize("value", [0, 1, 1.2, -0.1, "high"])
def test_mem_fraction_static_outside_0_1_exits_2(tmp_path, value):
    output = _cli(tmp_path, f"mem_fraction_static: {value}")
    assert "engine.mem_fraction_static" in output


def test_weights_beyond_mem_fraction_static_exit_2_naming_the_least_fraction(tmp_path):
    # 30.51 GiB of weights in 137.17 GiB free: SGLang names 0.223
    output = _cli(tmp_path, "mem_fraction_static: 0.2")
    assert "engine.mem_fraction_static" in output and "above 0.223" in output


def test_a_pool_short_of_one_context_length_request_exits_2(tmp_path):
    # 0.25 of 137.17 GiB less the weights leaves ~3.8 GiB: 31k tokens < 40960
    output = _cli(tmp_path, "mem_fraction_static: 0.25")
    assert "engine.context_length" in output and "the largest context_length that fits is" in output


def test_a_context_length_beyond_the_models_exits_2(tmp_path, monkeypatch):
    monkeypatch.delenv("SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN", raising=False)
    output = _cli(tmp_path, "context_length: 50000")
    assert "engine.context_length" in output and "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN" in output
    monkeypatch.setenv("SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN", "1")
    assert sglang_config(qwen3(tmp_path, "n", context_length=50000)).engine.sglang.context_length == 50000


def test_a_multimodal_model_needs_a_given_mem_fraction_static(tmp_path):
    vlm = {**QWEN3, "vision_config": {"depth": 27, "hidden_size": 1152}}
    with pytest.raises(InputError, match=r"engine.mem_fraction_static: required with .*multimodal"):
        sglang_config({"model": model_dir(tmp_path, vlm), "gpu": "h200_sxm", "tensor_parallel_size": 2})
    cfg = sglang_config({"model": model_dir(tmp_path, vlm, "n"), "gpu": "h200_sxm",
                         "tensor_parallel_size": 2, "mem_fraction_static": 0.8})
    assert cfg.engine.deployment.mem_fraction_static == 0.8


def test_aic_with_a_calibration_under_sglang_reads_its_factors(tmp_path):
    cal = tmp_path / "cal.yaml"
    cal.write_text("type: aic_calibration\nfactors: {prefill: 1.1, decode: 0.95, mixed: 1.02}\n")
    cfg = sglang_config(qwen3(tmp_path, timing={"type": "aic", "calibration": str(cal)}))
    assert cfg.engine.timing.calibration_factors == (1.1, 0.95, 1.02)
    assert config_to_dict(cfg)["engine"]["timing"] == {"type": "aic", "calibration": str(cal)}


def test_timing_aic_requires_a_deployment():
    with pytest.raises(InputError, match=r"engine.timing: type aic requires a deployment"):
        sglang_config({"timing": {"type": "aic"}})


# ---------------------------------------------------------------- aic


@needs_aic
def test_sglang_passes_are_priced_from_the_databases_sglang_data(tmp_path, monkeypatch):
    """Every pass of an SGLang run with timing aic (extend, decode, mixed
    chunks with a cached prefix) against a direct call of the database's
    SGLang model with that pass's features; the direct model is built here
    from the package's own names, so the run's is the SGLang one."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    import json

    import aiconfigurator_core as ac
    from aiconfigurator_core.sdk.rust_engine_step import RustForwardPassPerfModel

    from servesim.deployment import aic
    from servesim.replay import sglang as replay_sglang
    from servesim.replay.api import run

    priced = []
    call = replay_sglang.PassCost.__call__

    def spy(self, batch):
        ms = call(self, batch)
        features = (sum(r.tokens for r in batch.rows), len(batch.rows),
                    sum(r.prefix for r in batch.rows), len(batch.decode),
                    sum(r.seq_len for r in batch.decode))
        priced.append((features, ms))
        return ms

    monkeypatch.setattr(replay_sglang.PassCost, "__call__", spy)
    engine = {"backend": "sglang", "model": "Qwen/Qwen3-32B", "gpu": "h200_sxm",
              "tensor_parallel_size": 2, "chunked_prefill_size": 2048, "max_prefill_tokens": 4096,
              "max_running_requests": 32, "context_length": 4096, "enable_mixed_chunk": True,
              "timing": {"type": "aic"}}
    workload = {"synthetic": {"requests": 60, "input_tokens": {"distribution": "uniform", "min": 100, "max": 3000},
                              "output_tokens": 40, "arrival": "poisson", "rate": 20, "seed": 5,
                              "shared_prefix_tokens": 64}}
    report = run({"workload": workload, "engine": engine})
    version = aic.backend_version("h200_sxm", "sglang")
    assert report.summary["deployment"]["timing_source"] == \
        f"aiconfigurator-core {aic.package_version()} (sglang {version} data)"
    native = RustForwardPassPerfModel.from_native({
        "schema_version": ac.engine_spec_schema_version(), "model_name": "Qwen/Qwen3-32B",
        "system_name": "h200_sxm", "backend": "sglang", "backend_version": version, "tp_size": 2,
        "pp_size": 1, "attention_dp_size": 1, "moe_tp_size": 2, "moe_ep_size": 1})
    kinds = set()
    errors = []
    for features, ms in priced:
        kinds.add((features[0] > 0, features[3] > 0))
        direct = native.estimate_forward_pass_time_ms(json.loads(aic.fpm(*features)))
        errors.append(abs(ms / direct - 1) * 100)
    assert kinds == {(True, False), (False, True), (True, True)}  # extend, decode, mixed
    assert any(features[2] > 0 for features, _ in priced)  # extends after a cached prefix
    errors.sort()
    assert errors[len(errors) // 2] <= 1.0
    assert errors[int(len(errors) * 0.99)] <= 2.0, errors[-5:]


@needs_aic
def test_sglang_and_vllm_tables_are_cached_apart(tmp_path, monkeypatch):
    from servesim.deployment import aic_tables

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    dep = sglang_config({"model": "Qwen/Qwen3-32B", "gpu": "h200_sxm", "tensor_parallel_size": 2,
                         "timing": {"type": "aic"}}).engine.deployment
    limits = {"max_num_batched_tokens": 8192, "max_num_seqs": 256, "max_model_len": 40960}
    import attrs

    vllm = attrs.evolve(dep, backend="vllm", mem_fraction_static=None)
    assert aic_tables.cache_key(dep, limits, 1, "0.12.0") != aic_tables.cache_key(vllm, limits, 1, "0.12.0")
