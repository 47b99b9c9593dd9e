"""Requests that can never finish are taken out as `unfinished`, so that a run
always ends and the requests behind them still run (docs/engine.md §3: never
looped on forever). vLLM itself would hang on these."""

from helpers import make_config, make_workload, run_result

def statuses(result):
    from servesim.results.records import STATUS_NAMES
    return [STATUS_NAMES[s] for s in result.records.status]


def test_preempted_request_that_outgrew_the_pool_does_not_block_the_queue():
    # block_size 4, 8 blocks: 7 usable = 28 tokens. Y (8 tokens, prefix ids
    # [7]) and X (28 tokens, same first trace block) arrive at 0.
    # Pass 0: Y admitted (2 blocks), X hits Y's 2 blocks and takes the 5 left:
    #         all 7 used; X's prompt completes, it samples (29 tokens).
    # Pass 1: Y decodes into a new block: none free, so the last running
    #         request, X, is preempted. X now needs ceil(29/4) = 8 > 7 blocks:
    #         it can never be admitted again, and is taken out as unfinished
    #         when it reaches the head of the queue.
    # Z (4 tokens, 2 out) arrives at 5 and is no longer stuck behind X.
    rows = [{"id": "Y", "t": 0, "P": 8, "O": 5, "hash_ids": [7]},
            {"id": "X", "t": 0, "P": 28, "O": 10, "hash_ids": [7, 8]},
            {"id": "Z", "t": 5, "P": 4, "O": 2, "hash_ids": [9]}]
    config = make_config(block_size=4, num_gpu_blocks=8, max_num_seqs=4,
                         max_num_batched_tokens=64,
                         timing={"type": "linear", "base_ms": 1.0, "per_token_ms": 0.0})
    result = run_result(config, make_workload(rows))
    assert statuses(result) == ["finished", "unfinished", "finished"]
    assert result.records.output_tokens.tolist() == [5, 1, 2]


def test_requests_preempting_each_other_forever_are_taken_out():
    # Priority scheduling, two 1-priority prompts of 177 and 200 tokens at 0,
    # prefilled 24 tokens a pass (long_prefill_token_threshold) into 17 usable
    # blocks of 16: together they do not fit. Among equal (priority, arrival)
    # the victim is the earliest in `running` (vLLM's max()), which is always
    # the one that has run longer: passes 0-4 grow both to 5 blocks... then
    # r1 (earliest) is preempted when r2 needs a block, r1 resumes behind r2,
    # r2 is preempted when r1 needs one, and so on: no prompt ever completes.
    # After LIVELOCK_PREEMPTIONS (1000) preemptions without a sampled token,
    # the next decision takes both out; r0 finished in pass 0.
    rows = [{"id": "r0", "t": 0, "P": 1, "O": 1, "priority": 0},
            {"id": "r1", "t": 0, "P": 177, "O": 1, "priority": 1},
            {"id": "r2", "t": 0, "P": 200, "O": 1, "priority": 1}]
    config = make_config(block_size=16, num_gpu_blocks=18, max_num_seqs=4,
                         max_num_batched_tokens=512, max_model_len=512,
                         enable_prefix_caching=False, enable_chunked_prefill=False,
                         long_prefill_token_threshold=24, scheduling_policy="priority",
                         reserve_full_isl=False)
    result = run_result(config, make_workload(rows))
    assert statuses(result) == ["finished", "unfinished", "unfinished"]
    assert result.stats.preemptions == 1001


def test_validate_foresees_the_requests_a_run_will_lose(tmp_path):
    # block_size 16, 8 blocks: 7 usable = 112 tokens; max_model_len 120.
    # a runs; b's prompt is not shorter than max_model_len (rejected at
    # arrival, as vLLM answers it with an error); c's 96 + 20 tokens
    # outgrow the 7 blocks (never finishes): validate warns of b and c, and
    # the run loses exactly them.
    import json

    from helpers import invoke

    rows = [("a", 16, 4), ("b", 120, 4), ("c", 96, 20)]
    (tmp_path / "t.jsonl").write_text("".join(
        json.dumps({"request_id": r, "timestamp": 0, "input_length": p, "output_length": o,
                    "hash_ids": list(range(10 * i, 10 * i + -(-p // 16)))}) + "\n"
        for i, (r, p, o) in enumerate(rows)))
    config = tmp_path / "c.yaml"
    config.write_text(f"workload: {{trace: {tmp_path / 't.jsonl'}, trace_block_size: 16}}\n"
                      "engine: {block_size: 16, num_gpu_blocks: 8, max_model_len: 120,\n"
                      "         timing: {type: fixed, prefill_ms: 10.0, decode_ms: 5.0}}\n")
    result = invoke("validate", config)
    assert result.exit_code == 0, result.output
    assert ("warning: 2 of 3 requests will be rejected at arrival or can never finish (prompt not "
            "shorter than max_model_len (120): b; prompt plus output outgrows the KV cache "
            "(7 usable blocks): c)") in result.output
    ran = invoke("run", config, "-q", "-o", tmp_path / "out")
    assert ran.exit_code == 0, ran.output
    status = {json.loads(line)["id"]: json.loads(line)["status"]
              for line in (tmp_path / "out" / "requests.jsonl").read_text().splitlines()}
    assert status == {"a": "finished", "b": "rejected", "c": "unfinished"}
    assert "could never finish (prompt plus output outgrows the KV cache (7 usable blocks): c)" in ran.output
    # nothing lost, nothing foreseen
    quiet = invoke("validate", config, "--set", "engine.num_gpu_blocks=64", "--set", "engine.max_model_len=null")
    assert quiet.exit_code == 0 and "warning" not in quiet.output
