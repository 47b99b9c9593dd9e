"""What one `schedule()` call decided (vllm/v1/core/sched/output.py)."""

KIND_NEW = "new"
KIND_RESUMED = "resumed"
KIND_RUNNING = "running"


class ScheduledRequest:
    """One request's share of a pass. `cached` is its prefix hit at admission
    (0 for `running`); `samples` is True when the pass completes all its known
    tokens and so samples one (False for a partial prefill chunk)."""

    __slots__ = ("request", "num_tokens", "cached", "kind", "samples")

    def __init__(self, request, num_tokens, cached, kind):
        self.request = request
        self.num_tokens = num_tokens
        self.cached = cached
        self.kind = kind
        self.samples = False


class SchedulerOutput:
    """`scheduled` in vLLM's order (running requests in running-list order,
    then admissions); `preempted` requests preempted while scheduling;
    `free_blocks_after_schedule` counts free G1 blocks right after it; the
    pricing features are sums over `scheduled`.

    With a CPU tier (docs/engine.md §9) it also carries the transfers it
    decided: `loads` queued at admission and `preemption_stores` (`simple_cpu`),
    both going out at the decision instant; `stores`, the store jobs of blocks
    full after this pass (`offloading`), going out at the pass end; and
    `new_blocks`, the G1 blocks the scheduled requests took from the free
    queue in this pass (the pass writes them)."""

    __slots__ = ("scheduled", "preempted", "free_blocks_after_schedule",
                 "prefill_tokens", "num_prefill_requests", "decode_requests",
                 "decode_context", "total_tokens", "prefill_context",
                 "loads", "preemption_stores", "stores", "new_blocks")

    def __init__(self):
        self.scheduled = []
        self.preempted = []
        self.free_blocks_after_schedule = 0
        self.prefill_tokens = 0
        self.num_prefill_requests = 0
        self.decode_requests = 0
        self.decode_context = 0
        self.prefill_context = 0  # computed tokens before the pass of prefill requests
        self.total_tokens = 0
        self.loads = []
        self.preemption_stores = []
        self.stores = []
        self.new_blocks = []

    spec_tokens = 0  # the reference scheduler has no speculative decoding

    @property
    def num_scheduled(self) -> int:
        return len(self.scheduled)

    @property
    def num_preempted(self) -> int:
        return len(self.preempted)
