"""The Python API (spec README §5): `servesim.run(config) -> Report`.

Everything the CLI does goes through here: load the config, apply overrides,
load the workload, simulate, summarise; `Report.write(dir)` writes the files.
"""

import os
import time
from pathlib import Path

import attrs

from servesim.errors import InputError
from servesim.replay.config_types import Config
from servesim.replay.records import SimulationResult


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
        from servesim.replay.output import write_outputs

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
    from servesim.replay import config as cfgmod

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


def run(
    config,
    *,
    overrides=(),
    limit=None,
    pass_log=None,
    telemetry_interval_ms=None,
    progress=None,
) -> Report:
    """Replay a workload through the simulated deployment and summarise it.

    config: a YAML path, a mapping (paths relative to the current directory)
    or a :class:`Config`; `overrides` are `dotted.key=value` strings (YAML
    values). `limit`, `pass_log` and `telemetry_interval_ms` override the
    config's (`workload.limit`, `output.*`) when not None. `progress`, if
    given, is called now and then as
    `progress(sim_time_ms, requests_done, requests_total)`.
    Raises :class:`InputError` on bad input.
    """
    from servesim.replay.driver import simulate
    from servesim.replay.metrics import summarize
    from servesim.replay import config as cfgmod
    from servesim.replay.workload import load_workload

    start = time.perf_counter()
    cfg = resolve_config(config, overrides)
    cfg = _with_run_options(cfg, limit, pass_log, telemetry_interval_ms)
    workload = load_workload(cfg.workload, cfg.engine.kv_cache.block_size)
    callback = None
    if progress is not None:
        total = len(workload)

        def callback(sim_time_ms, requests_done):
            progress(sim_time_ms, requests_done, total)

    result = simulate(cfg, workload, progress=callback)
    wall_time_s = time.perf_counter() - start
    summary = summarize(result, cfgmod.config_to_dict(cfg), wall_time_s)
    if cfg.engine.deployment is not None:
        from servesim.deployment.summary import deployment_summary

        summary["deployment"] = deployment_summary(cfg.engine, cfg.cluster.data_parallel_size)
    return Report(summary=summary, result=result, config=cfg)
