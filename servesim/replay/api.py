"""The Python API (README.md, "Errors and faults"): `servesim.run(config) -> Report`.

Everything the CLI does goes through here: load the config, apply overrides,
load the workload, simulate, summarise; `Report.write(dir)` writes the files.
"""

import os
import time
from pathlib import Path
from typing import TYPE_CHECKING

import attrs

from servesim.errors import InputError
from servesim.config.config_types import Config
from servesim.results.records import SimulationResult

if TYPE_CHECKING:
    from servesim.workload.workload import Workload


@attrs.define(eq=False)
class Report:
    """A finished run: `summary` (the summary.json dict), `result` (the
    per-request arrays, pass log and telemetry) and the resolved `config`."""

    summary: dict
    result: SimulationResult
    config: Config

    @property
    def records(self):
        """Per-request arrays (:class:`RequestRecords`)."""
        return self.result.records

    @property
    def pass_log(self) -> list | None:
        return self.result.pass_log

    @property
    def telemetry(self) -> list | None:
        return self.result.telemetry

    def write(self, out_dir) -> Path:
        """Write summary.json and, as the config's `output` block asks,
        requests.jsonl / passes.jsonl / telemetry.jsonl into `out_dir`."""
        from servesim.results.output import write_outputs

        out = self.config.output
        return write_outputs(
            out_dir,
            self.summary,
            self.result,
            per_request=out.per_request,
            pass_log=out.pass_log,
            telemetry=out.telemetry_interval_ms is not None,
        )


def resolve_config(config, overrides=()) -> Config:
    """A :class:`Config` from a path (str/Path), a mapping (relative paths
    against the current directory) or a Config (relative paths in overrides
    against its file's directory), with `overrides` ("dotted.key=value")
    applied."""
    from servesim.config import config as cfgmod

    overrides = tuple(overrides)
    if isinstance(config, (str, Path)):
        return cfgmod.load_config(config, overrides)
    if isinstance(config, dict):
        return cfgmod.config_from_dict(config, os.getcwd(), None, overrides)
    if isinstance(config, Config):
        if not overrides:
            return config
        base_dir = os.path.dirname(os.path.abspath(config.source)) if config.source else os.getcwd()
        data = cfgmod.config_to_dict(config)
        return cfgmod.config_from_dict(data, base_dir, config.source, overrides)
    raise TypeError(f"config must be a path, a dict or a Config, not {type(config).__name__}")


def _with_run_options(cfg: Config, limit, pass_log, telemetry_interval_ms) -> Config:
    """`cfg` with the run's `limit` / `pass_log` / `telemetry_interval_ms`
    (None keeps the config's value)."""
    if limit is not None:
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise InputError(f"limit must be a positive integer, got {limit!r}")
        cfg = attrs.evolve(cfg, workload=attrs.evolve(cfg.workload, limit=limit))
    if pass_log is not None:
        cfg = attrs.evolve(cfg, output=attrs.evolve(cfg.output, pass_log=bool(pass_log)))
    if telemetry_interval_ms is not None:
        t = telemetry_interval_ms
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not t > 0:
            raise InputError(f"telemetry_interval_ms must be a positive number, got {t!r}")
        cfg = attrs.evolve(cfg, output=attrs.evolve(cfg.output, telemetry_interval_ms=float(t)))
    return cfg


def prepare(config, overrides=(), limit=None, pass_log=None, telemetry_interval_ms=None):
    """`(config, workload, warnings)`: the resolved config with the run
    options, its loaded workload, and the warnings of the checks made before
    simulating (`preflight.check_run`). `servesim validate` and `run` both
    go through here, so validate accepts exactly what run accepts."""
    from servesim.config.preflight import check_config, check_run
    from servesim.workload.load import load_workload

    cfg = resolve_config(config, overrides)
    cfg = _with_run_options(cfg, limit, pass_log, telemetry_interval_ms)
    if isinstance(config, (str, os.PathLike)):
        from servesim.config.slo import check_config_slos

        check_config_slos(config, overrides)  # a replay ignores `slo:`, but a bad one is still bad input
    check_config(cfg)  # before a synthetic workload is generated
    workload = load_workload(cfg.workload, cfg.engine.kv_cache.block_size)
    if cfg.engine.speculative is not None:
        from servesim.config.speculative_config import check_accepted

        check_accepted(workload, cfg.engine.speculative.num_speculative_tokens)
    return cfg, workload, check_run(cfg, workload)


def run(
    config,
    *,
    overrides=(),
    limit=None,
    pass_log=None,
    telemetry_interval_ms=None,
    progress=None,
    on_start=None,
    baseline=False,
) -> Report:
    """Replay a workload through the simulated deployment and summarise it.

    config: a YAML path, a mapping (paths relative to the current directory)
    or a :class:`Config`; `overrides` are `dotted.key=value` strings (YAML
    values). `limit`, `pass_log` and `telemetry_interval_ms` override the
    config's (`workload.limit`, `output.*`) when not None. `progress`, if
    given, is called now and then as
    `progress(sim_time_ms, requests_done, requests_total)`. `on_start()`, if
    given, is called once the config and workload are loaded and checked,
    just before simulating. With `baseline`
    (speculative decoding only) the workload is also run without
    `engine.speculative`, and the summary's `speculative` block gets the
    plain run's TPOT and the speedup.
    Raises :class:`InputError` on bad input.
    """
    from servesim.results.metrics import summarize
    from servesim.config import config as cfgmod

    start = time.perf_counter()
    cfg, workload, warnings = prepare(config, overrides, limit, pass_log, telemetry_interval_ms)
    callback = None
    if progress is not None:
        total = len(workload)

        def callback(sim_time_ms, requests_done):
            progress(sim_time_ms, requests_done, total)

    if baseline and cfg.engine.speculative is None:
        raise InputError("--baseline: compares against a run without speculative decoding, "
                         "so it needs engine.speculative")
    if on_start is not None:
        on_start()
    result = simulate(cfg, workload, progress=callback)
    result.warnings[:0] = warnings
    wall_time_s = time.perf_counter() - start
    summary = summarize(result, cfgmod.config_to_dict(cfg), wall_time_s)
    if baseline:
        from servesim.results.metrics import with_baseline

        plain = attrs.evolve(cfg, engine=attrs.evolve(cfg.engine, speculative=None),
                             output=attrs.evolve(cfg.output, pass_log=False,
                                                 telemetry_interval_ms=None))
        plain_result = simulate(plain, workload)
        summary = with_baseline(summary, plain_result)
        # the baseline's own warnings (its TPOT is over its finished requests)
        result.warnings.extend(f"--baseline (the run without engine.speculative): {w}"
                               for w in plain_result.warnings if w not in result.warnings)
    if cfg.engine.deployment is not None:
        from servesim.deployment.summary import deployment_summary

        summary["deployment"] = deployment_summary(cfg.engine, cfg.cluster.data_parallel_size)
    return Report(summary=summary, result=result, config=cfg)


def simulate(config: Config, workload: "Workload", progress=None) -> SimulationResult:
    """Replay `workload` under `config`. `progress(sim_time_ms, requests_done)`
    is called now and then when given."""
    return make_replay(config, workload, progress).run()


def make_replay(config: Config, workload: "Workload", progress=None):
    """The replay of `config`: aggregated workers (servesim/replay/driver.py
    `Replay`), or disaggregated prefill and decode pools
    (servesim/replay/disaggregated.py); an SGLang worker with
    `engine.backend: sglang` (servesim/replay/sglang.py)."""
    if config.engine.sglang is not None:
        from servesim.replay.sglang import SGLangReplay

        return SGLangReplay(config, workload, progress)
    if config.cluster.disaggregated:
        if workload.sessions is not None:
            from servesim.errors import InputError

            raise InputError("workload: sessions and agent graphs need cluster.mode: aggregated "
                             "(a turn's arrival follows its predecessor's finish on one pool)")
        from servesim.replay.disaggregated import DisaggregatedReplay

        return DisaggregatedReplay(config, workload, progress)
    from servesim.replay.driver import Replay

    return Replay(config, workload, progress)
