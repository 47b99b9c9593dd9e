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

The rule is one kernel, `launch_end_ms`, over the parameter array of
`launch_params` (made by the engine core, engine/core.py), used by the
compiled pass loop (engine/pass_loop.py).
"""

import numpy as np

from servesim.engine.config import LaunchConfig
from servesim.jit import njit

# launch parameters: [on, capture size, decode_ms, piecewise_ms, eager_ms, eager_queue_fraction]
L_ON, L_CAPTURE, L_DECODE, L_PIECEWISE, L_EAGER, L_FRACTION = range(6)


def launch_params(launch: LaunchConfig | None) -> np.ndarray:
    """`engine.launch` as the kernel's parameter array (all zeros: no launch)."""
    params = np.zeros(6, dtype=np.float64)
    if launch is not None:
        params[:] = (1.0, launch.max_cudagraph_capture_size, launch.decode_ms,
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
