"""The discrete-event loop: a heap of `(time, order, seq, handler, arg)`.

Events at the same instant run by `order` (the kinds below), then in the order
they were scheduled (`seq`), so every tie is broken by a stable key, never by
hash or set order. The loop only pops and dispatches; the engine's logic lives
in the handlers.
"""

import heapq

# Same-instant order: a pass ends and its outputs are processed first; then
# requests arrive; then an engine that is free decides its next pass, so a
# synchronous engine's decision at `end(k)` sees arrivals at exactly `end(k)`
# (docs/engine.md §7, "Ties").
PASS_END = 0
ARRIVAL = 1
DECIDE = 2
# A request released by an output (a closed loop's next request, a session's
# next turn, an agent graph's dependent, sent at the release instant) exists
# only once its client has the output, so it arrives after every decision at
# that instant; an idle engine it wakes decides after every such arrival at
# it (docs/engine.md §7, "Ties").
RELEASED = 3
RELEASED_DECIDE = 4


def wake_order(order: int) -> int:
    """The order of the decision an arrival of `order` wakes an idle engine
    to: after every arrival of its kind at that instant."""
    return RELEASED_DECIDE if order == RELEASED else DECIDE


class EventLoop:
    def __init__(self):
        self._heap = []
        self.seq = 0  # the last sequence number given
        self.now = 0.0
        self.order = PASS_END  # the order of the event running

    def schedule(self, time, order, handler, arg=None):
        self.seq += 1
        heapq.heappush(self._heap, (time, order, self.seq, handler, arg))

    def push(self, time, order, seq, handler, arg=None):
        """An event whose sequence number was drawn already (`seq`, from
        `self.seq`): the compiled pass loop (engine/pass_loop.py) draws its
        events' numbers as it goes and puts the next one on the loop when it
        stops."""
        heapq.heappush(self._heap, (time, order, seq, handler, arg))

    def run(self, on_advance=None):
        """Run until no event is left. `on_advance(t)` is called whenever the
        clock is about to move forward to `t`, after every event before `t`
        has run (for telemetry samples and progress)."""
        heap = self._heap
        pop = heapq.heappop
        while heap:
            time, order, _, handler, arg = pop(heap)
            if on_advance is not None and time > self.now:
                on_advance(time)
            self.now = time
            self.order = order
            handler(arg)

    def next_time(self) -> float:
        """The time of the next event (infinity if none)."""
        return self._heap[0][0] if self._heap else float("inf")

    def next_key(self):
        """The `(time, order, seq)` key of the next event (infinity if none)."""
        return self._heap[0][:3] if self._heap else (float("inf"), 0, 0)

    def __len__(self):
        return len(self._heap)
