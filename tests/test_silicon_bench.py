"""benchmarks/silicon.py: the benchmark it replays for a silicon row (no
aiconfigurator-core needed: only the config it builds is checked)."""

import importlib.util
import os

import pytest

_PATH = os.path.join(os.path.dirname(__file__), os.pardir, "benchmarks", "silicon.py")


@pytest.fixture(scope="module")
def silicon():
    spec = importlib.util.spec_from_file_location("silicon_bench", _PATH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _row(**kw):
    row = {"id": "r", "backend": "vllm", "mode": "agg", "model_path": "Qwen/Qwen3-32B",
           "system": "h100_sxm", "precision": "", "isl": "1024", "osl": "128", "batch_size": "8",
           "tp_size": "2", "pp_size": "1", "attention_dp_size": "", "moe_tp_size": "1",
           "moe_ep_size": "1", "silicon_data_source": "source_file=Qwen_Qwen3-32B.csv; silicon_concurrency=8"}
    row.update(kw)
    return row


_DYNAMO = ("source_file=/x/aic-auto-gap-analysis/data/h100_sxm/vllm/0.12.0/qwen3_32b.csv; gtl_job_id=1; "
           "gtl_task_id=2; measured=2026-01-25; image=nvcr.io/nvidia/ai-dynamo/vllm-runtime:0.8.0; "
           "dynamo_version=0.8.0")


def test_a_dynamo_node_row_is_replicas_sharing_its_concurrency(silicon):
    # one 8-GPU node: TP 2 -> 4 replicas behind a round-robin router, the
    # row's 48 clients over all of them
    cfg = silicon.row_config(_row(precision="fp8", tp_size="2", batch_size="48", isl="4000",
                                  osl="1000", silicon_data_source=_DYNAMO))
    assert cfg["cluster"] == {"workers": 4, "router": "round_robin"}
    assert cfg["workload"]["synthetic"]["concurrency"] == 48
    assert silicon.row_config(_row(tp_size="8", silicon_data_source=_DYNAMO))["cluster"]["workers"] == 1
    assert silicon.row_config(_row(tp_size="1", silicon_data_source=_DYNAMO))["cluster"]["workers"] == 8


def test_other_rows_are_one_engine(silicon):
    assert silicon.row_config(_row())["cluster"]["workers"] == 1
    llama = _row(model_path="meta-llama/Llama-3.1-70B", precision="fp8",
                 silicon_data_source="source_file=2026-04-06.csv; model=Llama-3.1-70B; silicon_concurrency=8")
    assert silicon.row_config(llama)["cluster"]["workers"] == 1


def test_max_num_seqs_is_vllms_default_for_the_gpu(silicon):
    # vLLM's OpenAI server: 1024 sequences on a >= 70 GiB GPU that is not an
    # A100, 256 otherwise; a row with more clients raises it to them
    assert silicon.row_config(_row())["engine"]["max_num_seqs"] == 1024
    assert silicon.row_config(_row(system="h200_sxm"))["engine"]["max_num_seqs"] == 1024
    assert silicon.row_config(_row(system="a100_sxm"))["engine"]["max_num_seqs"] == 256
    assert silicon.row_config(_row(system="l40s"))["engine"]["max_num_seqs"] == 256
    assert silicon.row_config(_row(system="l40s", batch_size="512"))["engine"]["max_num_seqs"] == 512


_INFERENCEX = "source_file=2026-04-06.csv; model=Llama-3.1-70B; silicon_concurrency=16"


def test_an_inferencex_row_runs_its_servers_flags_and_a_gap_row_both_ways(silicon):
    llama = _row(model_path="meta-llama/Llama-3.1-70B", precision="fp8", batch_size="16",
                 silicon_data_source=_INFERENCEX)
    assert silicon.source(llama) == "inferencex"
    engine = silicon.row_config(llama)["engine"]
    # async scheduling, an fp8 KV cache, as many sequences as clients, no prefix caching
    assert (engine["async_scheduling"], engine["kv_cache_dtype"], engine["max_num_seqs"],
            engine["enable_prefix_caching"], engine["max_num_batched_tokens"]) == (
        True, "fp8", 16, False, 8192)
    assert silicon.protocols_of(llama) == ["benchmark_serving"]
    gap = _row(silicon_data_source="source_file=/x/aic-auto-gap-analysis/data/h100_sxm/vllm/"
                                   "0.12.0/Qwen_Qwen3-32B.csv; silicon_concurrency=8")
    assert silicon.source(gap) == "gap_analysis"
    assert silicon.source(_row()) == "other"
    assert "async_scheduling" not in silicon.row_config(gap)["engine"]
    assert silicon.protocols_of(gap) == ["benchmark_serving", "genai_perf"]
    assert silicon.protocols_of(gap, "genai_perf") == ["genai_perf"]
    assert silicon.source(_row(silicon_data_source=_DYNAMO)) == "dynamo"


def test_kv_bound_rows_and_the_gap_rows_between_their_two_replays(silicon):
    assert silicon.kv_bound(_row(isl="8192", silicon_ttft_ms="6518.3"))
    assert not silicon.kv_bound(_row(isl="8192", silicon_ttft_ms="4999"))
    assert not silicon.kv_bound(_row(isl="16384", silicon_ttft_ms="9000"))

    def line(protocol, ttft, measured=100.0, row="a"):
        return {"id": row, "source": "gap_analysis", "protocol": protocol,
                "servesim_ttft_ms": ttft, "silicon_ttft_ms": measured}

    results = [line("benchmark_serving", 90), line("genai_perf", 120),
               line("benchmark_serving", 90, row="b"), line("genai_perf", 95, row="b")]
    assert silicon.ttft_between(results) == (1, 2)
    assert silicon.ttft_between(results[:1]) is None  # a row replayed one way only
