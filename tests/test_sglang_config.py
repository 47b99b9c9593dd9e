"""`engine.backend: sglang` (docs/sglang.md, "Config"): SGLang's server-argument
names, the other backend's keys refused with this backend's name for them,
bad values refused naming the key, exit 2 from the CLI."""

import pytest

from servesim.config.config import config_from_dict, config_to_dict
from servesim.errors import InputError
from servesim.sglang.config import SGLangConfig
from tests.helpers import invoke

TIMING = {"type": "linear", "base_ms": 3.0, "per_token_ms": 0.02}


def _config(engine, cluster=None):
    data = {"workload": {"synthetic": {"requests": 2, "input_tokens": 16, "output_tokens": 2}},
            "engine": {"backend": "sglang", "timing": TIMING, **engine}}
    if cluster is not None:
        data["cluster"] = cluster
    return config_from_dict(data, source="c.yaml")


def _error(engine, cluster=None) -> str:
    with pytest.raises(InputError) as info:
        _config(engine, cluster)
    return str(info.value)


def test_sglang_keys_are_read_with_sglang_defaults():
    cfg = _config({"max_total_tokens": 1024, "page_size": 16, "schedule_policy": "lpm",
                   "chunked_prefill_size": -1, "ignore_eos": False})
    assert cfg.engine.backend == "sglang"
    assert cfg.engine.sglang == SGLangConfig(max_total_tokens=1024, page_size=16,
                                             schedule_policy="lpm", chunked_prefill_size=-1,
                                             ignore_eos=False)
    assert not cfg.engine.sglang.chunked_prefill
    # the resolved config round-trips in the YAML layout
    assert config_from_dict(config_to_dict(cfg), source=cfg.source) == cfg


def test_slots_are_capped_by_half_the_pool():
    cfg = _config({"max_total_tokens": 64, "max_running_requests": 48}).engine.sglang
    assert cfg.max_num_reqs == 32


@pytest.mark.parametrize("key, value, sglang_name", [
    ("max_num_seqs", 8, "max_running_requests"),
    ("max_num_batched_tokens", 512, "chunked_prefill_size"),
    ("block_size", 16, "page_size"),
    ("num_gpu_blocks", 100, "max_total_tokens"),
    ("enable_prefix_caching", False, "disable_radix_cache"),
])
def test_a_vllm_key_under_sglang_names_sglangs_key(key, value, sglang_name):
    message = _error({key: value})
    assert f"engine.{key}" in message and f"SGLang calls it {sglang_name}" in message


def test_a_vllm_only_knob_under_sglang_says_sglang_has_none():
    assert "SGLang has no watermark" in _error({"watermark": 0.01})


@pytest.mark.parametrize("key, value, vllm_name", [
    ("max_running_requests", 8, "max_num_seqs"),
    ("page_size", 16, "block_size"),
    ("context_length", 4096, "max_model_len"),
])
def test_an_sglang_key_under_vllm_names_vllms_key(key, value, vllm_name):
    with pytest.raises(InputError) as info:
        config_from_dict({"workload": {"synthetic": {"requests": 1}}, "engine": {key: value}})
    message = str(info.value)
    assert f"engine.{key}" in message and f"vLLM calls it {vllm_name}" in message


def test_page_size_must_divide_max_total_tokens():
    message = _error({"max_total_tokens": 1000, "page_size": 16})
    assert "engine.max_total_tokens" in message and "multiple of engine.page_size (16)" in message


@pytest.mark.parametrize("value", [0, -2])
def test_chunked_prefill_size_zero_is_refused(value):
    message = _error({"chunked_prefill_size": value})
    assert "engine.chunked_prefill_size" in message and f"got {value}" in message


@pytest.mark.parametrize("engine, key", [
    ({"schedule_policy": "priority"}, "engine.schedule_policy"),
    ({"backend": "trtllm"}, "engine.backend"),
    ({"enable_mixed_chunk": True, "chunked_prefill_size": -1}, "engine.enable_mixed_chunk"),
    ({"timing": {"type": "aic"}}, "engine.timing"),
    ({"model": "llama-3.1-8b"}, "engine.model"),
])
def test_bad_sglang_values_name_their_key(engine, key):
    assert key in _error(engine)


@pytest.mark.parametrize("cluster, key", [
    ({"workers": 2, "router": {"policy": "kv_router", "kv_event_lag_ms": 100}},
     "cluster.router.kv_event_lag_ms"),
    ({"data_parallel_size": 2}, "cluster.data_parallel_size"),
])
def test_what_sglang_mode_does_not_simulate_is_refused(cluster, key):
    assert key in _error({}, cluster)


def test_cli_exits_2_naming_the_key(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("workload: {synthetic: {requests: 1}}\n"
                    "engine: {backend: sglang, max_num_seqs: 4}\n")
    result = invoke("run", path, "-o", tmp_path / "out", "-q")
    assert result.exit_code == 2
    assert "engine.max_num_seqs" in result.output and "max_running_requests" in result.output
    assert "Traceback" not in result.output
    assert not (tmp_path / "out").exists()


def test_a_max_new_tokens_below_output_length_names_the_line(tmp_path):
    from servesim.workload.load import load_workload

    trace = tmp_path / "t.jsonl"
    trace.write_text('{"timestamp": 0, "input_length": 16, "output_length": 4, "hash_ids": [1]}\n'
                     '{"timestamp": 1, "input_length": 16, "output_length": 4, "hash_ids": [1], '
                     '"max_new_tokens": 3}\n')
    cfg = config_from_dict({"workload": {"trace": str(trace), "trace_block_size": 16},
                            "engine": {"backend": "sglang"}})
    with pytest.raises(InputError, match=r"t.jsonl:2: max_new_tokens must be an integer >= "
                                         r"output_length \(4\), got 3"):
        load_workload(cfg.workload, 16)


def test_the_cli_writes_sglangs_pass_log_and_request_fields(tmp_path):
    import json
    import shutil
    from pathlib import Path

    case = Path(__file__).parent / "golden" / "sglang-0.5.23" / "03-radix-lpm"
    for name in ("config.yaml", "trace.jsonl"):
        shutil.copy(case / name, tmp_path / name)
    result = invoke("run", tmp_path / "config.yaml", "-o", tmp_path / "out", "-q", "--pass-log")
    assert result.exit_code == 0, result.output
    with open(tmp_path / "out" / "passes.jsonl") as f:
        got = [json.loads(line) for line in f]
    with open(case / "expected" / "passes.jsonl") as f:
        expected = [json.loads(line) for line in f]
    assert [list(p) for p in got] == [list(p) for p in expected]  # the recordings' keys, in order
    assert [p["scheduled"] for p in got] == [p["scheduled"] for p in expected]
    with open(tmp_path / "out" / "requests.jsonl") as f:
        rows = [json.loads(line) for line in f]
    with open(case / "expected" / "requests.jsonl") as f:
        want = [json.loads(line) for line in f]
    assert [(r["num_retractions"], r["cached_tokens"], r["finish_reason"]) for r in rows] == \
        [(r["num_retractions"], r["cached_tokens"], r["finish_reason"]) for r in want]


@pytest.mark.parametrize("key, value, feature", [
    ("enable_dp_attention", True, "DP attention"),
    ("enable_hierarchical_cache", True, "the hierarchical cache"),
    ("kv_offloading", {"num_cpu_blocks": 8}, "a CPU tier"),
    ("speculative_algorithm", "EAGLE", "speculative decoding"),
    ("speculative", {"method": "eagle", "num_speculative_tokens": 2}, "speculative decoding"),
    ("lora_paths", ["a"], "LoRA"),
    ("disaggregation_mode", "prefill", "PD disaggregation"),
])
def test_features_sglang_lacks_here_are_refused_naming_the_key(key, value, feature):
    message = _error({key: value})
    assert f"engine.{key}" in message and f"{feature}" in message
    assert "is not supported with backend: sglang" in message
