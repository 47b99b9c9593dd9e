"""A request's status, as vLLM's `RequestStatus` (vllm/v1/request.py):
the compiled scheduler's request table (`fast_table.py`) holds these values
in its status field; kernels compare against the members, which Numba
treats as compile-time integers."""

import enum


class RequestStatus(enum.IntEnum):
    WAITING = 0
    RUNNING = 1
    PREEMPTED = 2
    FINISHED = 3
    UNFINISHED = 5  # could never finish (outgrows the pool while alone), or taken
    # out of a livelocked rank
