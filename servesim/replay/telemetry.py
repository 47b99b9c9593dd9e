"""Telemetry: samples of every worker's ranks at fixed simulated-time ticks
(README.md, "Outputs", `telemetry.jsonl`).

Tick i is at `i · interval` ms (computed, not accumulated, so ticks do not
drift); its sample shows the state after every event at or before the tick,
and its counters (`preemptions`, `prefix_queries`, `prefix_hits`,
`tokens_scheduled`, `passes`) cover the interval since the previous sample, so
they sum to the run's totals. A final partial sample closes the run at its end.
In disaggregated mode each sample also names its worker's `pool`.
"""

_COUNTERS = ("preemptions", "prefix_queries", "prefix_hits", "tokens_scheduled", "passes")


def _counters(rank):
    s = rank.scheduler
    return (s.num_preemptions, s.prefix_cache_stats.queries, s.prefix_cache_stats.hits,
            rank.tokens_scheduled, rank.num_passes)


class Telemetry:
    def __init__(self, interval_ms: float, workers):
        self.interval = interval_ms
        self.workers = workers
        self.samples = []
        self._tick = 1
        self._last = {(w.pool, w.index, r.index): (0,) * len(_COUNTERS)
                      for w in workers for r in w.ranks}
        self._last_t = 0.0

    def next_tick(self) -> float:
        return self._tick * self.interval

    def advance(self, t: float):
        """The clock moves to `t`: take every tick strictly before it."""
        while self._tick * self.interval < t:
            self._sample(self._tick * self.interval)
            self._tick += 1

    def finish(self, end: float):
        """Take the ticks up to `end` and a final partial sample at `end`."""
        while self._tick * self.interval <= end:
            self._sample(self._tick * self.interval)
            self._tick += 1
        if end > self._last_t or not self.samples:
            self._sample(end)

    def _sample(self, t: float):
        for worker in self.workers:
            for rank in worker.ranks:
                key = (worker.pool, worker.index, rank.index)
                now = _counters(rank)
                delta = [a - b for a, b in zip(now, self._last[key])]
                self._last[key] = now
                pool = rank.pool
                sample = {"t_ms": t}
                if worker.pool is not None:
                    sample["pool"] = worker.pool
                sample.update({
                    "worker": worker.index, "dp_rank": rank.index,
                    "running": rank.scheduler.num_running,
                    "waiting": rank.scheduler.num_waiting,
                    "kv_usage": round(float(pool.usage), 6),
                    "cached_blocks": pool.num_cached_blocks(),
                    "cpu_tier_blocks": rank.cpu_tier_blocks(),
                })
                sample.update(zip(_COUNTERS, delta))
                self.samples.append(sample)
        self._last_t = t
