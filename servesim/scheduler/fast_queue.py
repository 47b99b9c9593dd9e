"""The waiting queue (vllm/v1/core/sched/request_queue.py, docs/engine.md §3),
as Numba kernels over an array. FCFS: arrival order, a preempted request goes
to the front (a ring buffer). Priority: ordered by `(priority, arrival,
request id)`, ids compared as strings, a preempted request pushed back in
that order (a binary heap).

Queue state lives in the scheduler's scalar array `S` at `WQ_HEAD`, `WQ_LEN`.
"""

from servesim.jit import njit
from servesim.scheduler.fast_table import ARRIVAL, ID_RANK, PRIORITY

WQ_HEAD, WQ_LEN = 0, 1


@njit
def _before(R, F, a, b):
    pa, pb = R[a, PRIORITY], R[b, PRIORITY]
    if pa != pb:
        return pa < pb
    ta, tb = F[a, ARRIVAL], F[b, ARRIVAL]
    if ta != tb:
        return ta < tb
    return R[a, ID_RANK] < R[b, ID_RANK]


@njit
def _sift_up(R, F, heap, pos):
    item = heap[pos]
    while pos > 0:
        parent = (pos - 1) // 2
        if _before(R, F, item, heap[parent]):
            heap[pos] = heap[parent]
            pos = parent
        else:
            break
    heap[pos] = item


@njit
def _sift_down(R, F, heap, pos, n):
    item = heap[pos]
    while True:
        child = 2 * pos + 1
        if child >= n:
            break
        if child + 1 < n and _before(R, F, heap[child + 1], heap[child]):
            child += 1
        if _before(R, F, heap[child], item):
            heap[pos] = heap[child]
            pos = child
        else:
            break
    heap[pos] = item


@njit
def wq_add(R, F, S, wq, priority, i):
    """A new arrival (FCFS: at the back)."""
    n = S[WQ_LEN]
    if priority:
        wq[n] = i
        S[WQ_LEN] = n + 1
        _sift_up(R, F, wq, n)
    else:
        wq[(S[WQ_HEAD] + n) % len(wq)] = i
        S[WQ_LEN] = n + 1


@njit
def wq_prepend(R, F, S, wq, priority, i):
    """A preempted request (FCFS: at the front; priority: back in the heap)."""
    if priority:
        wq_add(R, F, S, wq, priority, i)
    else:
        S[WQ_HEAD] = (S[WQ_HEAD] - 1) % len(wq)
        wq[S[WQ_HEAD]] = i
        S[WQ_LEN] += 1


@njit
def wq_peek(S, wq, priority):
    return wq[0] if priority else wq[S[WQ_HEAD]]


@njit
def wq_pop(R, F, S, wq, priority):
    if priority:
        top = wq[0]
        n = S[WQ_LEN] - 1
        S[WQ_LEN] = n
        if n > 0:
            wq[0] = wq[n]
            _sift_down(R, F, wq, 0, n)
        return top
    top = wq[S[WQ_HEAD]]
    S[WQ_HEAD] = (S[WQ_HEAD] + 1) % len(wq)
    S[WQ_LEN] -= 1
    return top


@njit
def wq_remove(R, F, S, wq, priority, i):
    """Take request i out from anywhere in the queue."""
    n = S[WQ_LEN]
    if priority:
        for pos in range(n):
            if wq[pos] == i:
                n -= 1
                S[WQ_LEN] = n
                if pos < n:
                    wq[pos] = wq[n]
                    _sift_down(R, F, wq, pos, n)
                    _sift_up(R, F, wq, pos)
                return
        return
    cap = len(wq)
    head = S[WQ_HEAD]
    for k in range(n):
        if wq[(head + k) % cap] == i:
            for j in range(k, n - 1):
                wq[(head + j) % cap] = wq[(head + j + 1) % cap]
            S[WQ_LEN] = n - 1
            return
