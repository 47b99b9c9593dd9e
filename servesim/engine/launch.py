"""Launch timing (docs/engine.md §8, `engine.launch`).

Launching a pass costs CPU time by its kind, from the pass's scheduled tokens
(cache hits excluded) against `max_cudagraph_capture_size`:

- decode (no prompt tokens, tokens <= capture size): `decided + decode_ms`;
- piecewise (any prompt tokens — prefill or recompute —, tokens <= capture
  size): `decided + piecewise_ms`;
- eager (tokens > capture size): also not before the GPU has run
  `eager_queue_fraction` of the pass:
  `max(decided + eager_ms, gpu_start + eager_queue_fraction · duration)`;

and a launch never ends after its pass. Without `launch` a launch costs nothing
(`launch_end = decided`).
"""

from servesim.engine.config import LaunchConfig

DECODE, PIECEWISE, EAGER = "decode", "piecewise", "eager"


def pass_kind(total_tokens: int, prefill_tokens: int, capture_size: int) -> str:
    if total_tokens > capture_size:
        return EAGER
    return PIECEWISE if prefill_tokens > 0 else DECODE


def launch_end(launch: LaunchConfig | None, total_tokens: int, prefill_tokens: int,
               decided: float, gpu_start: float, end: float) -> float:
    if launch is None:
        return decided
    kind = pass_kind(total_tokens, prefill_tokens, launch.max_cudagraph_capture_size)
    if kind == DECODE:
        t = decided + launch.decode_ms
    elif kind == PIECEWISE:
        t = decided + launch.piecewise_ms
    else:
        t = max(decided + launch.eager_ms,
                gpu_start + launch.eager_queue_fraction * (end - gpu_start))
    return min(t, end)
