"""Why requests did not finish: the causes the run's warnings name.

A request is rejected at arrival when its prompt can never fit one rank
(more blocks than `num_usable_blocks`, or not shorter than `max_model_len`;
docs/engine.md §3), and taken out as unfinished when, although admitted, it
could never complete: its prompt exceeds `max_num_batched_tokens` with
chunked prefill off (no pass can ever schedule it), its prompt plus output
outgrows the pool while it runs alone, or requests kept preempting each other
without progress. These functions name the cause from the config and the
request's lengths, for the messages of `driver.py` and `disaggregated.py`,
and foresee them for `servesim validate` (`foreseen_losses`).
"""

import numpy as np


def _ids_text(ids, indices) -> str:
    shown = ", ".join(str(ids[i]) for i in indices[:5])
    return shown + (f" and {len(indices) - 5} more" if len(indices) > 5 else "")


def unfinished_cause(engine, prompt: int, max_tokens: int) -> str:
    """The cause of one request that could never finish on `engine`."""
    sched, kv = engine.scheduler, engine.kv_cache
    if not sched.enable_chunked_prefill and prompt > sched.max_num_batched_tokens:
        return (f"prompt longer than max_num_batched_tokens ({sched.max_num_batched_tokens}) "
                f"with chunked prefill off")
    if -(-(prompt + max_tokens) // kv.block_size) > kv.num_usable_blocks:
        return f"prompt plus output outgrows the KV cache ({kv.num_usable_blocks} usable blocks)"
    return "requests preempted each other without progress"


def rejected_cause(engine, prompt: int) -> str:
    """Why a prompt was rejected at arrival on `engine`."""
    kv, max_model_len = engine.kv_cache, engine.scheduler.max_model_len
    if max_model_len is not None and prompt >= max_model_len:
        return f"prompt not shorter than max_model_len ({max_model_len})"
    return f"prompt needs more KV blocks than a rank holds ({kv.num_usable_blocks} usable blocks)"


def _by_cause(ids, indices, cause_of) -> str:
    """`cause: ids; cause: ids` of the requests `indices`, grouped by `cause_of(i)`."""
    groups = {}
    for i in indices:
        groups.setdefault(cause_of(i), []).append(i)
    return "; ".join(f"{cause}: {_ids_text(ids, group)}" for cause, group in groups.items())


def unfinished_message(engine, ids, indices, prompt, max_tokens) -> str:
    """One warning for the requests `indices` that could never finish,
    grouped by cause."""
    causes = _by_cause(ids, indices, lambda i: unfinished_cause(engine, int(prompt[i]), int(max_tokens[i])))
    return f"{len(indices)} request(s) could never finish ({causes})"


def all_rejected_message(engine, ids, prompt) -> str:
    """The warning of a run in which every request was rejected at arrival."""
    causes = _by_cause(ids, range(len(ids)), lambda i: rejected_cause(engine, int(prompt[i])))
    return f"every request was rejected at arrival, nothing was simulated ({causes})"


def all_rejected(status, rejected_code) -> bool:
    return len(status) > 0 and bool(np.all(status == rejected_code))


def foreseen_losses(cfg, workload) -> list:
    """`servesim validate`'s warnings for the requests a run will lose, seen
    from the config and the lengths alone (the causes above, on the pool
    that admits them): prompts rejected at
    arrival (vLLM answers such a request with an error and serves on), and
    requests that can never finish (a prompt over `max_num_batched_tokens`
    with chunked prefill off, or a prompt plus output the KV cache cannot
    hold). `run` warns of the same after simulating."""
    engine = cfg.cluster.prefill if cfg.cluster.disaggregated else cfg.engine
    sched, kv = engine.scheduler, engine.kv_cache
    prompt = workload.input_length.astype(np.int64)
    max_tokens = workload.output_length.astype(np.int64)
    if sched.max_model_len is not None:
        max_tokens = np.maximum(np.minimum(max_tokens, sched.max_model_len - prompt), 0)
    usable = kv.num_gpu_blocks - 1
    rejected = -(-prompt // kv.block_size) > usable
    if sched.max_model_len is not None:
        rejected |= prompt >= sched.max_model_len
    stuck = ~rejected & (-(-(prompt + max_tokens) // kv.block_size) > usable)
    if not sched.enable_chunked_prefill:
        stuck |= ~rejected & (prompt > sched.max_num_batched_tokens)
    n = len(workload)
    lost = int(rejected.sum()) + int(stuck.sum())
    if not lost:
        return []
    ids = workload.request_ids
    head = "every request" if lost == n else f"{lost} of {n} requests"
    causes = "; ".join(filter(None, (
        _by_cause(ids, np.flatnonzero(rejected).tolist(), lambda i: rejected_cause(engine, int(prompt[i]))),
        _by_cause(ids, np.flatnonzero(stuck).tolist(),
                  lambda i: unfinished_cause(engine, int(prompt[i]), int(max_tokens[i]))))))
    return [f"{head} will be rejected at arrival or can never finish ({causes})"]
