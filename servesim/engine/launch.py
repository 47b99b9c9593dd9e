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

Host time (`engine.host_ms_per_pass`, docs/engine.md §8): the CPU work of a
pass before the GPU can run it (vLLM's `schedule()`, input preparation,
sampling and output processing around `execute_model`): a pass starts on the
GPU no earlier than `decided + host_ms_per_pass` (`host_ready_ms`), and not
before the pass in flight ends. A synchronous engine decides pass k+1 at
`end(k)`, so each pass waits the whole host time; an asynchronous one decides
it while pass k runs, so the host time hides under pass k and shows only where
it is longer.

The rules are two kernels, `launch_end_ms` and `host_ready_ms`, over the
parameter array of `launch_params` (made by the engine core, engine/core.py),
used by the compiled pass loop (engine/pass_loop.py).
"""

import numpy as np

from servesim.engine.config import LaunchConfig
from servesim.jit import njit

# launch parameters: [on, capture size, decode_ms, piecewise_ms, eager_ms,
# eager_queue_fraction, host_ms_per_pass]
L_ON, L_CAPTURE, L_DECODE, L_PIECEWISE, L_EAGER, L_FRACTION, L_HOST = range(7)


def launch_params(launch: LaunchConfig | None, host_ms_per_pass: float = 0.0) -> np.ndarray:
    """`engine.launch` and `engine.host_ms_per_pass` as the kernels'
    parameter array (all zeros: no launch, no host time)."""
    params = np.zeros(7, dtype=np.float64)
    params[L_HOST] = host_ms_per_pass
    if launch is not None:
        params[:L_HOST] = (1.0, launch.max_cudagraph_capture_size, launch.decode_ms,
                     launch.piecewise_ms, launch.eager_ms, launch.eager_queue_fraction)
    return params


@njit
def launch_end_ms(params, total_tokens, prefill_tokens, decided, gpu_start, end):
    """The instant a pass's launch ends, by its kind (module docstring)."""
    if params[L_ON] == 0.0:
        return decided
    if total_tokens > params[L_CAPTURE]:  # eager
        t = max(decided + params[L_EAGER],
                gpu_start + params[L_FRACTION] * (end - gpu_start))
    elif prefill_tokens > 0:  # piecewise
        t = decided + params[L_PIECEWISE]
    else:  # decode
        t = decided + params[L_DECODE]
    return min(t, end)


@njit
def host_ready_ms(params, decided):
    """The instant the host is done with a pass decided at `decided`: the
    GPU may start it then, not earlier (module docstring)."""
    return decided + params[L_HOST]
