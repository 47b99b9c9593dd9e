"""Why requests did not finish: the causes the run's warnings name.

A request is rejected at arrival when its prompt can never fit one rank
(more blocks than `num_usable_blocks`, or not shorter than `max_model_len`;
docs/engine.md §3), and taken out as unfinished when, although admitted, it
could never complete: its prompt exceeds `max_num_batched_tokens` with
chunked prefill off (no pass can ever schedule it), its prompt plus output
outgrows the pool while it runs alone, or requests kept preempting each other
without progress. These functions name the cause from the config and the
request's lengths, for the messages of `driver.py` and `disaggregated.py`.
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


def unfinished_message(engine, ids, indices, prompt, max_tokens) -> str:
    """One warning for the requests `indices` that could never finish,
    grouped by cause."""
    by_cause = {}
    for i in indices:
        by_cause.setdefault(unfinished_cause(engine, int(prompt[i]), int(max_tokens[i])), []).append(i)
    parts = [f"{cause}: {_ids_text(ids, group)}" for cause, group in by_cause.items()]
    return f"{len(indices)} request(s) could never finish ({'; '.join(parts)})"


def all_rejected_message(engine, ids, prompt) -> str:
    """The warning of a run in which every request was rejected at arrival."""
    causes = {}
    for i in range(len(ids)):
        causes.setdefault(rejected_cause(engine, int(prompt[i])), []).append(i)
    parts = [f"{cause}: {_ids_text(ids, group)}" for cause, group in causes.items()]
    return f"every request was rejected at arrival, nothing was simulated ({'; '.join(parts)})"


def all_rejected(status, rejected_code) -> bool:
    return len(status) > 0 and bool(np.all(status == rejected_code))
