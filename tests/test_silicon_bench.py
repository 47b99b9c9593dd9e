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
