"""The load a capacity search varies, read from the workload it is given:

- a trace replayed open loop: `workload.speedup` (arrivals divided by it);
- a synthetic workload with `arrival: poisson | constant`:
  `workload.synthetic.rate` (requests per second);
- synthetic sessions started at a rate:
  `workload.synthetic.sessions.sessions_per_second` (sessions per second);
- a closed loop (`workload.concurrency` or `workload.synthetic.concurrency`):
  that number of requests in flight (an integer).

A burst (every request, or every session, at 0) has no load to vary and is
an input error.
"""

import attrs

from servesim.errors import InputError


@attrs.frozen
class Load:
    key: str  # the dotted config key a probe sets
    kind: str  # speedup | rate | sessions | concurrency
    start: float | int  # the config's own value
    integer: bool

    @property
    def unit(self) -> str:
        return {"speedup": "x trace speed", "rate": "req/s", "sessions": "sessions/s",
                "concurrency": "requests in flight"}[self.kind]

    def value(self, x):
        """A load value as the config takes it: an int for a concurrency,
        else a float rounded to 6 significant digits (so probes print and
        pass through `--set` exactly)."""
        return int(x) if self.integer else float(f"{float(x):.6g}")

    def override(self, x) -> str:
        return f"{self.key}={self.value(x)!r}"

    def to_dict(self) -> dict:
        return {"key": self.key, "kind": self.kind, "unit": self.unit, "start": self.start}


def load_of(cfg) -> Load:
    """The load knob of a resolved :class:`Config`."""
    w = cfg.workload
    s = w.synthetic
    if w.concurrency is not None:
        return Load("workload.concurrency", "concurrency", w.concurrency, True)
    if s is not None and s.concurrency is not None:
        return Load("workload.synthetic.concurrency", "concurrency", s.concurrency, True)
    if s is None:
        return Load("workload.speedup", "speedup", w.speedup, False)
    if s.sessions is not None:
        if s.sessions.sessions_per_second is None:
            raise InputError(f"{cfg.source or 'config'}: workload.synthetic.sessions: sessions that all "
                             "start at 0 have no load to vary; give sessions_per_second, or a closed loop "
                             "with workload.concurrency")
        return Load("workload.synthetic.sessions.sessions_per_second", "sessions",
                    s.sessions.sessions_per_second, False)
    if s.arrival == "burst":
        raise InputError(f"{cfg.source or 'config'}: workload.synthetic.arrival: a burst (every request "
                         "at 0) has no load to vary; use arrival: poisson or constant with a rate, or a "
                         "closed loop with concurrency")
    return Load("workload.synthetic.rate", "rate", s.rate, False)


def check_grid_keys(load: Load, keys, source: str) -> None:
    """A grid must not set the load the search varies."""
    for key in keys:
        if key == load.key or key.startswith(load.key + "."):
            raise InputError(f"{source}: {key}: the grid may not set the load the search varies "
                             f"({load.key}); give it with --rate")
