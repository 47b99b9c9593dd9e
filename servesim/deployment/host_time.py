"""What a named deployment's pass times leave out, and the defaults servesim
adds for it under `timing: aic` (docs/deployment.md, "Host time and the API
server"). The op database times GPU kernels; a served request also meets the
API server before the engine core (HTTP, chat template, tokenization) and,
on a synchronous engine, the host work between passes (scheduling, input
preparation, sampling, output processing), which the GPU waits for.

- The frontend: 4 ms per request and 3.6 µs per prompt token
  (`engine.frontend`).
- The host time per pass: 1.4 ms (`engine.host_ms_per_pass`), hidden under
  `async_scheduling`. The real term grows with the batch (the silicon rows
  of vLLM 0.12 show 1.3–2.1 ms at concurrency 8 and 2.9–4.0 ms at 64,
  benchmarks/RESULTS.md); no batch slope is modelled until a measurement
  independent of those rows exists.

Both values are issue 38's, with the sources it names (tenstorrent/
tt-inference-server#190, AIConfigurator's live probe and its sync-vs-async
comparison); docs/deployment.md says what each source measures and what it
does not isolate.

None of these figures is fitted to the silicon rows servesim is checked
against. Other timing types add nothing (their pass times come from a
measurement or a fit that already holds what it holds).
"""

# `engine.frontend`'s keys and `engine.host_ms_per_pass` under timing aic
AIC_FRONTEND = {"request_ms": 4.0, "tokenize_us_per_token": 3.6}
AIC_HOST_MS_PER_PASS = 1.4


def default_frontend(timing_type: str) -> dict | None:
    """`engine.frontend`'s keys when the config leaves it out (None: no delay)."""
    return dict(AIC_FRONTEND) if timing_type == "aic" else None


def default_host_ms_per_pass(timing_type: str) -> float:
    """`engine.host_ms_per_pass` when the config leaves it out."""
    return AIC_HOST_MS_PER_PASS if timing_type == "aic" else 0.0
