"""The waiting queue's order (`SchedulePolicy.calc_priority`; docs/sglang.md,
"Waiting queue")."""

from servesim.sglang.config import (IN_BATCH_PREFIX_CACHING_CHECK_THRESHOLD,
                                    IN_BATCH_PREFIX_CACHING_DEPRIORITIZE_THRESHOLD,
                                    WAITING_PREFIX_REFRESH_EVERY, WAITING_PREFIX_REFRESH_MAX,
                                    WAITING_QUEUE_PREFIX_MATCH_MAX)
from servesim.sglang.radix_cache import common_prefix


class SchedulePolicy:
    """fcfs keeps the queue's order; lpm sorts it by the cached prefix each
    prefill attempt. With the radix cache disabled lpm is fcfs
    (`_validate_and_adjust_policy`)."""

    def __init__(self, policy: str, tree):
        self.tree = tree
        self.policy = "fcfs" if tree.disable else policy
        self.fcfs_calls = 0

    def calc_priority(self, waiting: list):
        """Reorder `waiting` in place. lpm over at most 128 requests matches
        each against the tree and stable-sorts by `-matched`, deprioritized
        requests last; a longer queue is treated as fcfs, whose every 32nd
        call refreshes the waiting prefixes' LRU stamps."""
        policy = self.policy
        if policy == "lpm" and len(waiting) > WAITING_QUEUE_PREFIX_MATCH_MAX:
            policy = "fcfs"
        if policy == "fcfs":
            if not self.tree.disable and waiting:
                self.fcfs_calls += 1
                if self.fcfs_calls % WAITING_PREFIX_REFRESH_EVERY == 1:
                    self._touch_waiting_prefixes(waiting)
            return
        deprioritized = self._compute_prefix_matches(waiting)
        self._sort_by_longest_prefix(waiting, deprioritized)

    def _touch_waiting_prefixes(self, waiting: list):
        """Match the first 128 waiting requests, last one first: their cached
        prefixes get fresh LRU stamps (`SGLANG_ENABLE_WAITING_PREFIX_REFRESH`)."""
        refreshed = reversed(waiting[:WAITING_PREFIX_REFRESH_MAX])
        self.tree.match_prefixes([req.fill for req in refreshed])

    def _compute_prefix_matches(self, waiting: list) -> set:
        """Each request's `matched = min(hit, len(fill) - 1)` into `req.prefix`;
        the in-batch check: a request with a hit of at most 32 tokens that
        shares 32 or more with one checked before it in this pass is
        deprioritized, else its fill joins the scratch set."""
        deprioritized = set()
        scratch = []
        for req in waiting:
            fill = req.fill
            hit, _ = self.tree.match_prefix(fill)
            req.prefix = min(hit, len(fill) - 1)
            if hit <= IN_BATCH_PREFIX_CACHING_CHECK_THRESHOLD:
                if _longest_common_prefix(fill, scratch) >= IN_BATCH_PREFIX_CACHING_DEPRIORITIZE_THRESHOLD:
                    deprioritized.add(req.index)
                else:
                    scratch.append(fill)
        return deprioritized

    @staticmethod
    def _sort_by_longest_prefix(waiting: list, deprioritized: set):
        """Stable sort by `-matched`, deprioritized requests last."""
        waiting.sort(key=lambda r: float("inf") if r.index in deprioritized else -r.prefix)


def _longest_common_prefix(fill, others) -> int:
    """The longest prefix `fill` shares with any of `others` (int64 arrays)."""
    return max((common_prefix(fill, other) for other in others), default=0)
