"""`servesim plan` (README "Capacity planning"): the generated space and what
it excludes, pruning, the answer (best.yaml, launch commands, the summary),
cost, sensitivity, bad input; and the grid's null and the derived KV link it
rests on. A tiny model folder and linear timing: no aiconfigurator-core."""

import csv
import json

import pytest
import yaml

from helpers import invoke, write
from servesim.capacity import plan_space as ps
from servesim.capacity.launch_commands import launch_commands
from servesim.capacity.plan import plan
from servesim.config.config import load_config
from servesim.config.slo import build_slos, evaluate, slos_from_dict
from servesim.errors import InputError

TINY = {"hidden_size": 1024, "num_attention_heads": 16, "num_key_value_heads": 4, "head_dim": 64,
        "num_hidden_layers": 8, "intermediate_size": 4096, "vocab_size": 32000, "tie_word_embeddings": False,
        "model_type": "qwen3", "max_position_embeddings": 4096}
QWEN3_32B = {"hidden_size": 5120, "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 128,
             "num_hidden_layers": 64, "intermediate_size": 25600, "vocab_size": 151936,
             "tie_word_embeddings": False, "model_type": "qwen3", "max_position_embeddings": 40960}
CONFIG = """\
workload:
  synthetic: {requests: 60, input_tokens: 1024, output_tokens: 32, arrival: poisson, rate: 20, seed: 1}
engine:
  model: tiny
  gpu: h100_sxm
  timing: {type: linear, base_ms: 4, per_token_ms: 0.02}
"""
SLOS = [("ttft_p90_ms", 100), ("tpot_p90_ms", 12)]
SMALL = {"gpus_max": 3, "max_num_seqs": [64], "max_num_batched_tokens": [2048]}


def model(tmp_path, cfg, name="tiny"):
    folder = tmp_path / name
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text(json.dumps(cfg))
    return str(folder)


def setup(tmp_path, text=CONFIG, cfg=TINY):
    model(tmp_path, cfg)
    return write(tmp_path, text)


# --------------------------------------------------------------------------- the space


def test_the_space_excludes_what_vllm_refuses_each_rule(tmp_path):
    # 12 heads: TP 8 does not split them; Qwen3-32B on one H100 holds its weights but
    # not one 40960-token request; on one L40S not even its weights
    odd = model(tmp_path, {**TINY, "num_attention_heads": 12, "num_key_value_heads": 4}, "odd")
    big = model(tmp_path, QWEN3_32B, "big")
    base = "workload: {synthetic: {requests: 2}}\nengine: {model: %s, gpu: h100_sxm, timing: {type: polynomial}}\n"
    ok, refused = ps.shapes(write(tmp_path, base % odd, "odd.yaml"), ["h100_sxm"], [64], [2048])
    assert [s.tensor_parallel_size for s in ok] == [1, 2, 4]
    assert [(s.tensor_parallel_size, r) for s, r in refused] == [
        (8, "the model's 12 attention heads must be divisible by tensor_parallel_size 8 (vLLM refuses to start)")]
    ok, refused = ps.shapes(write(tmp_path, base % big, "big.yaml"), ["h100_sxm", "l40s"], [64], [2048])
    why = {(s.gpu, s.tensor_parallel_size): r for s, r in refused}
    assert "one request of max_model_len 40960 needs" in why["h100_sxm", 1]
    assert "leaves no KV cache" in why["l40s", 1]
    assert {(s.gpu, s.tensor_parallel_size) for s in ok} >= {("h100_sxm", 2), ("h100_sxm", 8), ("l40s", 4)}
    # every generated point loads: nothing in the space vLLM would refuse
    points = ps.generate(ok, 8)
    assert points and all(q.gpus <= 8 for q in points)
    for q in points[::7]:
        from servesim.sweep.sweep import override_text

        load_config(write(tmp_path, base % big, "big.yaml"), [override_text(k, v) for k, v in q.values.items()])


def test_generated_points_mix_modes_and_count_gpus(tmp_path):
    config = setup(tmp_path)
    ok, _ = ps.shapes(config, ["h100_sxm"], [64], [2048])
    points = ps.generate(ok, 3)
    # aggregated TP1 x 1..3, TP2 x 1; disaggregated TP1 1+1, 1+2, 2+1, TP1 prefill + TP2 decode and
    # TP2 prefill + TP1 decode
    assert [(q.mode, q.workers, q.gpus) for q in points] == [
        ("aggregated", (1,), 1), ("aggregated", (2,), 2), ("aggregated", (1,), 2), ("disaggregated", (1, 1), 2),
        ("aggregated", (3,), 3), ("disaggregated", (1, 2), 3), ("disaggregated", (2, 1), 3),
        ("disaggregated", (1, 1), 3), ("disaggregated", (1, 1), 3)]
    assert [q.shapes[0].tensor_parallel_size for q in points[-2:]] == [1, 2]
    disagg = points[3].values
    assert disagg["cluster.workers"] is None and disagg["cluster.mode"] == "disaggregated"


# --------------------------------------------------------------------------- the answer


def hand_winner(config, points, rate, slos):
    """Every point replayed at `rate` (in this process), ranked by hand:
    meeting both SLOs with no request lost, by GPUs, then margin, then order."""
    from servesim.replay.api import run
    from servesim.sweep.sweep import override_text

    targets = dict(slos)
    ok = []
    for i, q in enumerate(points):
        summary = run(config, overrides=[*(override_text(k, v) for k, v in q.values.items()),
                                         f"workload.synthetic.rate={rate}"]).summary
        ratios = [summary["ttft_ms"]["p90"] / targets["ttft_p90_ms"], summary["tpot_ms"]["p90"] / targets["tpot_p90_ms"]]
        if max(ratios) <= 1 and summary["rejected"] == summary["unfinished"] == 0:
            ok.append((q.gpus, -(1 - max(ratios)), i))
    return points[min(ok)[2]].values


def test_plan_agrees_with_a_full_sweep_ranked_by_hand(tmp_path):
    config = setup(tmp_path)
    slos = build_slos(SLOS)
    doc = plan(config, slos, 40, tmp_path / "p", jobs=2, **SMALL)
    ok, _ = ps.shapes(config, ["h100_sxm"], [64], [2048])
    expected = hand_winner(config, ps.generate(ok, 3), 40, SLOS)
    search_doc = json.loads((tmp_path / "p" / "search.json").read_text())
    assert search_doc["points"][doc["winner"]["point"]]["values"] == expected
    assert doc["generated"] == 9 and doc["run"] + doc["skipped"] + doc["pruned"] == 9
    # every cheaper point run misses; the next cheaper is the most expensive of them
    assert doc["cheaper_missed"] and all(not r["meets"] and r["gpus"] < doc["winner"]["gpus"]
                                         for r in doc["cheaper_missed"])
    assert doc["next_cheaper"]["gpus"] == max(r["gpus"] for r in doc["cheaper_missed"])
    # best.yaml replays the winner: the same figures, and it meets the SLOs
    from servesim.replay.api import run

    report = run(str(tmp_path / "p" / "best.yaml"))
    assert evaluate(slos, report.summary)["meets"]
    assert evaluate(slos, report.summary)["metrics"] == doc["winner"]["metrics"]
    best = yaml.safe_load((tmp_path / "p" / "best.yaml").read_text())
    assert best["slo"] == {"ttft_p90_ms": 100.0, "tpot_p90_ms": 12.0} and "num_gpu_blocks" not in best["engine"]
    # resumed: nothing runs again, same answer
    again = plan(config, slos, 40, tmp_path / "p", jobs=2, **SMALL)
    assert again["winner"] == doc["winner"]
    assert all(p["resumed"] for p in json.loads((tmp_path / "p" / "search.json").read_text())["points"]
               if p["status"] == "ok")


def test_cli_plan_prints_the_answer_and_writes_launch_commands(tmp_path):
    config = setup(tmp_path)
    out = tmp_path / "o"
    result = invoke("plan", config, "--slo", "ttft_p90_ms=100", "--slo", "tpot_p90_ms=12", "--rate", "40",
                    "--gpus-max", "3", "--max-num-seqs", "64", "--max-num-batched-tokens", "2048", "-o", out,
                    "--sensitivity", "10")
    assert result.exit_code == 0, result.output
    text = result.output
    assert "space: 9 points generated on h100_sxm up to 3 GPUs" in text
    assert "best: 2 x h100_sxm TP1 seqs 64 batched 2048 (aggregated, 2 GPUs)" in text
    assert "binding SLO tpot_p90_ms" in text and "the next cheaper point, 1 x h100_sxm TP1" in text
    assert "misses ttft_p90_ms" in text
    assert "sensitivity ±10%: the answer" in text
    script = (out / "launch.sh").read_text()
    assert script.count("vllm serve") == 2 and "--tensor-parallel-size 1 --max-num-seqs 64" in script
    assert "CUDA_VISIBLE_DEVICES=1 " in script
    doc = json.loads((out / "plan.json").read_text())
    runs = doc["sensitivity"]["runs"]
    assert [(r["point"], r["factor"]) for r in runs] == [("winner", 1.1), ("winner", 0.9), ("next_cheaper", 1.1),
                                                           ("next_cheaper", 0.9)]
    assert doc["sensitivity"]["changes"] == ((not runs[0]["meets"]) or runs[3]["meets"])


def test_sensitivity_scales_speculative_acceptance_against_the_pass_times(tmp_path):
    # --sensitivity P with speculative decoding: the replay with passes P% slower
    # takes every acceptance rate (its own, a profile's) times 1 - P/100, the one
    # with passes faster times 1 + P/100, at most 1; without speculation: nothing
    from servesim.capacity.plan import scaled_acceptance

    speculative = CONFIG.replace("timing:", "speculative: {method: eagle, num_speculative_tokens: 2, "
                                 "acceptance_rates: [0.8, 0.6]}\n  timing:")
    config = setup(tmp_path, speculative)

    def rates(factor):
        overrides = scaled_acceptance(config, [], factor)
        return load_config(config, overrides).engine.speculative.acceptance_rates

    assert rates(0.9) == pytest.approx((0.72, 0.54))
    assert rates(1.3) == pytest.approx((1.0, 0.78))
    profiles = CONFIG.replace("timing:", "speculative: {method: eagle, num_speculative_tokens: 1, "
                              "acceptance_profiles: {chat: {weight: 1, acceptance_rates: [0.5]}, "
                              "code: {weight: 1, acceptance_rates: [0.9]}}}\n  timing:")
    config = write(tmp_path, profiles, "profiles.yaml")
    spec = load_config(config, scaled_acceptance(config, [], 1.2)).engine.speculative
    assert [name for name, _, _ in spec.acceptance_profiles] == ["chat", "code"]
    assert [rates for _, _, rates in spec.acceptance_profiles] == [pytest.approx((0.6,)), (1.0,)]
    plain = tmp_path / "plain"
    plain.mkdir()
    assert scaled_acceptance(setup(plain), [], 0.9) == []


def test_plan_under_sglang_searches_sglang_shapes_and_writes_its_launch_commands(tmp_path):
    # backend: sglang: the ladder sets max_running_requests / chunked_prefill_size,
    # the shapes are SGLang's (no disaggregated points: servesim's SGLang engine has
    # no PD disaggregation), the winner agrees with every point replayed by hand,
    # best.yaml replays it, and launch.sh starts SGLang servers behind its router
    config = setup(tmp_path, CONFIG.replace("engine:\n", "engine:\n  backend: sglang\n"))
    slos = build_slos(SLOS)
    ok, refused = ps.shapes(config, ["h100_sxm"], [64], [2048], backend="sglang")
    assert ok and not refused and all(s.backend == "sglang" for s in ok)
    points = ps.generate(ok, 3)
    assert {q.mode for q in points} == {"aggregated"}
    assert [(q.shapes[0].tensor_parallel_size, q.workers) for q in points] == [(1, (1,)), (1, (2,)), (2, (1,)),
                                                                               (1, (3,))]
    assert points[0].values["engine.max_running_requests"] == 64
    assert points[0].values["engine.chunked_prefill_size"] == 2048 and "engine.max_num_seqs" not in points[0].values
    doc = plan(config, slos, 60, tmp_path / "p", **SMALL)
    assert doc["backend"] == "sglang" and doc["ladder"] == {"max_running_requests": [64],
                                                             "chunked_prefill_size": [2048]}
    search_doc = json.loads((tmp_path / "p" / "search.json").read_text())
    assert search_doc["points"][doc["winner"]["point"]]["values"] == hand_winner(config, points, 60, SLOS)
    from servesim.replay.api import run

    report = run(str(tmp_path / "p" / "best.yaml"))
    assert evaluate(slos, report.summary)["metrics"] == doc["winner"]["metrics"]
    best = yaml.safe_load((tmp_path / "p" / "best.yaml").read_text())
    assert best["engine"]["backend"] == "sglang" and "max_total_tokens" not in best["engine"]  # derived again
    workers = doc["launch"]["workers"]
    assert len(workers) == best["cluster"]["workers"] == 3  # one command a worker
    tp = best["engine"]["tensor_parallel_size"]
    for w in workers:
        assert w["command"].split(" --model-path ")[0].endswith("python -m sglang.launch_server")
        assert f"--tp-size {tp} --max-running-requests 64 --chunked-prefill-size 2048" in w["command"]
        assert "--mem-fraction-static" in w["command"] and "vllm" not in w["command"]
    script = (tmp_path / "p" / "launch.sh").read_text()
    assert "one SGLang worker a line" in script and script.count("sglang.launch_server") == len(workers)
    assert "python -m sglang_router.launch_router --worker-urls http://localhost:8000" in script
    assert "--policy round_robin" in script


def test_launch_commands_of_sglang_workers_behind_the_sglang_router():
    config = {"engine": {"backend": "sglang", "model": "Qwen/Qwen3-32B", "gpu": "h100_sxm",
                         "tensor_parallel_size": 4, "max_running_requests": 128, "chunked_prefill_size": 8192,
                         "page_size": 16, "schedule_policy": "lpm", "disable_overlap_schedule": True,
                         "kv_cache_dtype": "fp8_e4m3", "mem_fraction_static": 0.85},
              "cluster": {"workers": 3, "router": {"policy": "kv_router"}}}
    doc = launch_commands(config)
    assert [(w["node"], w["command"].split()[0]) for w in doc["workers"]] == [
        (0, "CUDA_VISIBLE_DEVICES=0,1,2,3"), (0, "CUDA_VISIBLE_DEVICES=4,5,6,7"), (1, "CUDA_VISIBLE_DEVICES=0,1,2,3")]
    command = doc["workers"][0]["command"]
    assert ("python -m sglang.launch_server --model-path Qwen/Qwen3-32B --tp-size 4 --max-running-requests 128 "
            "--chunked-prefill-size 8192 --mem-fraction-static 0.85 --page-size 16 --schedule-policy lpm "
            "--disable-overlap-schedule --kv-cache-dtype fp8_e4m3 --port 8000") in command
    assert doc["router"]["command"] == ("python -m sglang_router.launch_router --worker-urls http://localhost:8000 "
                                        "http://localhost:8001 http://localhost:8002 --policy cache_aware --port 8080")
    config["cluster"]["router"] = "least_prefill"
    doc = launch_commands(config)
    assert "command" not in doc["router"] and "has no policy that does the same" in doc["router"]["note"]


def test_launch_commands_of_a_disaggregated_point():
    config = {"engine": {"model": "Qwen/Qwen3-32B", "gpu": "h100_sxm", "tensor_parallel_size": 2,
                         "max_num_seqs": 256, "max_num_batched_tokens": 8192, "gpu_memory_utilization": 0.9,
                         "max_model_len": 40960, "block_size": 16, "kv_cache_dtype": "fp8"},
              "cluster": {"mode": "disaggregated", "prefill_workers": 3, "decode_workers": 1, "router": "least_loaded",
                          "decode": {"tensor_parallel_size": 4, "max_num_seqs": 64, "gpu": "h200_sxm"}}}
    doc = launch_commands(config)
    workers = doc["workers"]
    assert [(w["pool"], w["gpus"], w["gpu_type"], w["node"]) for w in workers] == [
        ("prefill", 2, "h100_sxm", 0), ("prefill", 2, "h100_sxm", 0), ("prefill", 2, "h100_sxm", 0),
        ("decode", 4, "h200_sxm", 1)]  # a worker does not straddle nodes
    for w in workers:
        assert """--kv-transfer-config '{"kv_connector":"NixlConnector","kv_role":"kv_both"}'""" in w["command"]
        assert "--kv-cache-dtype fp8" in w["command"]
    assert "--tensor-parallel-size 4 --max-num-seqs 64" in workers[3]["command"]
    assert "VLLM_NIXL_SIDE_CHANNEL_PORT=5603" in workers[3]["command"]
    assert "--prefiller-ports 8000 8001 8002 --decoder-hosts localhost --decoder-ports 8003" in doc["router"]["proxy"]


# --------------------------------------------------------------------------- pruning, cost


def test_a_tp_whose_lone_prefill_misses_the_ttft_target_is_pruned(tmp_path):
    # a 1024-token prompt alone takes 4 + 0.02 x 1024 = 24.48 ms: TTFT p90 <= 20 ms is out of reach
    config = setup(tmp_path)
    doc = plan(config, build_slos([("ttft_p90_ms", 20)]), 40, tmp_path / "p", **SMALL)
    assert doc["winner"] is None and doc["run"] == 0 and doc["pruned_by"]["ttft"] == 9
    assert "a request alone already takes ttft_p90 24.5 ms (target 20)" in doc["pruned_points"][0]["why"]
    result = invoke("plan", config, "--slo", "ttft_p90_ms=20", "--rate", "40", "--gpus-max", "3",
                    "--max-num-seqs", "64", "--max-num-batched-tokens", "2048", "-o", tmp_path / "cli")
    assert result.exit_code == 1 and "every generated point was pruned" in result.output


def test_an_overloaded_prefill_is_pruned_and_agrees_with_no_prune(tmp_path):
    # 400 req/s of prompts needing 20.46 ms of work each (24.48 ms alone less one pass's 4.02 ms) keep
    # 8.2 GPUs busy: on 3 the backlog after the 0.15 s of arrivals, (8.2 / 3 - 1) x 0.9 x 0.15 s, exceeds
    # 100 ms for the last tenth of the requests, and worse on fewer: every point is pruned before a replay
    config = setup(tmp_path)
    slos = build_slos(SLOS)
    doc = plan(config, slos, 400, tmp_path / "p", **SMALL)
    assert doc["pruned_by"]["prefill_load"] == 9 and doc["winner"] is None
    full = plan(config, slos, 400, tmp_path / "full", prune=False, **SMALL)
    assert full["pruned"] == 0 and full["winner"] is None and full["run"] == 9


def test_cost_ranks_by_dollars_per_hour_across_gpu_types(tmp_path):
    # linear timing prices both GPUs alike: the cheaper per hour wins, and its $ per million tokens is said
    config = setup(tmp_path)
    slos = build_slos(SLOS)
    prices = {"h100_sxm": 4.0, "h200_sxm": 3.0}
    doc = plan(config, slos, 40, tmp_path / "p", gpus=["h100_sxm", "h200_sxm"], prices=prices,
               **{**SMALL, "gpus_max": 2})
    win = doc["winner"]
    assert win["deployment"].endswith("h200_sxm TP1 seqs 64 batched 2048") and win["dollars_per_hour"] == 6.0
    assert doc["cost"]["dollars_per_million_tokens"] > 0
    with open(tmp_path / "p" / "search.csv") as f:
        assert "dollars_per_hour" in next(csv.reader(f))
    # mixed types per pool are in the space
    ok, _ = ps.shapes(config, ["h100_sxm", "h200_sxm"], [64], [2048])
    assert any(q.mode == "disaggregated" and len(q.gpu_counts) == 2 for q in ps.generate(ok, 3))


# --------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("args, needle", [
    (["--gpu", "h100_pcie"], "--gpu: unknown GPU 'h100_pcie'"),
    (["--slo", "ttfx_p90_ms=5"], "ttfx_p90_ms"),
    (["--gpus-max", "-2"], "--gpus-max: must be a positive number of GPUs, got -2"),
    (["--cost", "h100_sxm=-1"], "--cost h100_sxm: the price must be a finite number >= 0"),
    (["--cost", "a100_pcie=1"], "--cost a100_pcie: unknown GPU"),
    (["--gpu", "h100_sxm,h200_sxm", "--cost", "h100_sxm=2"], "--cost: no price for h200_sxm"),
    (["--sensitivity", "-5"], "--sensitivity: must be a percentage"),
    (["--max-num-seqs", "0"], "--max-num-seqs: must be positive integers"),
])
def test_plan_bad_input_exits_2_naming_it(tmp_path, args, needle):
    config = setup(tmp_path)
    result = invoke("plan", config, "--slo", "ttft_p90_ms=100", "--rate", "40", "-o", tmp_path / "o", *args)
    assert result.exit_code == 2, result.output
    assert needle in result.output and "Traceback" not in result.output
    assert not (tmp_path / "o").exists()


def test_gpus_max_below_the_smallest_deployment(tmp_path):
    big = CONFIG.replace("model: tiny", "model: big")
    model(tmp_path, QWEN3_32B, "big")
    config = write(tmp_path, big)
    result = invoke("plan", config, "--slo", "ttft_p90_ms=100", "--rate", "1", "--gpus-max", "1", "-o", tmp_path / "o")
    assert result.exit_code == 2, result.output
    assert "--gpus-max 1: below the smallest deployment vLLM would start (2 GPUs: one worker of h100_sxm TP2" \
        in result.output


def test_plan_needs_a_named_deployment(tmp_path):
    config = write(tmp_path, "workload: {synthetic: {requests: 2, arrival: poisson, rate: 1}}\n")
    result = invoke("plan", config, "--slo", "ttft_p90_ms=100", "--rate", "1", "-o", tmp_path / "o")
    assert result.exit_code == 2 and "needs a named deployment (engine.model and engine.gpu" in result.output


# --------------------------------------------------------------------------- grids and the KV link


def test_a_grid_null_unsets_a_key_so_one_grid_mixes_modes(tmp_path):
    from servesim.capacity.search import search

    config = setup(tmp_path, CONFIG + "cluster: {workers: 2}\n")
    grid = write(tmp_path, "points:\n  - {cluster.workers: 1}\n  - {cluster.mode: disaggregated, cluster.workers: null, "
                           "cluster.prefill_workers: 1, cluster.decode_workers: 1, cluster.kv_transfer: {latency_ms: 0}}\n",
                 "g.yaml")
    doc = search(config, grid, build_slos(SLOS), tmp_path / "s", rate=10, skip=False)
    assert [p["status"] for p in doc["points"]] == ["ok", "ok"] and [p["gpus"] for p in doc["points"]] == [1, 2]
    summary = json.loads((tmp_path / "s" / doc["points"][1]["dir"] / "summary.json").read_text())
    assert summary["config"]["cluster"]["mode"] == "disaggregated" and "workers" not in summary["config"]["cluster"]
    # `--set KEY=!unset` is the same removal
    cfg = load_config(config, ["cluster.workers=!unset"])
    assert cfg.cluster.workers == 1


def test_the_kv_link_is_derived_from_the_model_and_the_prefill_gpu(tmp_path):
    config = setup(tmp_path, CONFIG + "cluster: {mode: disaggregated, kv_transfer: {latency_ms: 0.05}}\n")
    cfg = load_config(config, ["engine.tensor_parallel_size=2", "engine.gpu=a100_sxm"])
    # 8 layers x 4 KV heads / TP 2 x head dim 64 x K and V x 2 bytes; DGX A100's 200 Gb/s per GPU
    assert cfg.cluster.kv_transfer.bytes_per_token == 8 * 2 * 64 * 2 * 2
    assert cfg.cluster.kv_transfer.bandwidth_gbps == 25.0
    cfg = load_config(config, ["engine.kv_cache_dtype=fp8", "cluster.kv_transfer={bandwidth_gbps: 10}"])
    assert cfg.cluster.kv_transfer.bytes_per_token == 8 * 4 * 64 * 2 and cfg.cluster.kv_transfer.bandwidth_gbps == 10
    with pytest.raises(InputError, match="bytes_per_token.*required|required key"):
        load_config(write(tmp_path, "workload: {synthetic: {requests: 2}}\ncluster: {mode: disaggregated, "
                                    "kv_transfer: {latency_ms: 0}}\n", "plain.yaml"))


def test_slos_round_trip_for_workers():
    slos = build_slos(SLOS)
    assert slos_from_dict(slos.to_dict()) == slos


def test_search_writes_its_winner_as_best_yaml_and_launch_commands(tmp_path):
    from servesim.replay.api import run

    config = setup(tmp_path)
    grid = write(tmp_path, "cluster.workers: [1, 2]\n", "g.yaml")
    out = tmp_path / "s"
    result = invoke("search", config, "--grid", grid, "--slo", "ttft_p90_ms=100", "--slo", "tpot_p90_ms=12",
                    "--rate", "40", "-o", out)
    assert result.exit_code == 0, result.output
    assert f"the winner as a config: {out}/best.yaml" in result.output
    assert "  why: binding SLO tpot_p90_ms" in result.output
    assert "the next cheaper point, 0 (cluster.workers=1, 1 GPU(s)), misses ttft_p90_ms" in result.output
    doc = json.loads((out / "search.json").read_text())
    win = doc["points"][doc["winner"]]
    assert win["values"] == {"cluster.workers": 2}
    replayed = evaluate(build_slos(SLOS), run(str(out / "best.yaml")).summary)
    assert replayed["meets"] and replayed["metrics"] == win["metrics"]
    assert (out / "launch.sh").read_text().count("vllm serve") == 2
