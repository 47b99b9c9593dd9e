"""The waiting queue (vllm/v1/core/sched/request_queue.py, docs/engine.md §3),
as Numba kernels over an array. FCFS: arrival order, a preempted request goes
to the front (a ring buffer). Priority: ordered by `(priority, arrival,
request id)`, ids compared as strings, a preempted request pushed back in
that order (a binary heap).

Queue state lives in the scheduler's state record `S[0]`: `waiting_head`,
`num_waiting`, and the queued requests' tokens in `pending_prefill_tokens`
(the waiting part of the rank's pending prefill, servesim/scheduler/scheduler.py).
"""

from servesim.jit import njit


@njit
def _before(R, a, b):
    """`Request.__lt__` (vllm/v1/request.py): whether request a goes before b
    under the priority policy, by `(priority, arrival_time, request id)`, ids
    compared as strings (`request_id_rank`)."""
    pa, pb = R[a].priority, R[b].priority
    if pa != pb:
        return pa < pb
    ta, tb = R[a].arrival_time, R[b].arrival_time
    if ta != tb:
        return ta < tb
    return R[a].request_id_rank < R[b].request_id_rank


@njit
def _sift_up(R, heap, pos):
    """`PriorityRequestQueue.add_request`: its `heapq.heappush`, heap[pos]
    moved toward the root past every parent it goes before (`_before`)."""
    item = heap[pos]
    while pos > 0:
        parent = (pos - 1) // 2
        if _before(R, item, heap[parent]):
            heap[pos] = heap[parent]
            pos = parent
        else:
            break
    heap[pos] = item


@njit
def _sift_down(R, heap, pos, n):
    """`PriorityRequestQueue.pop_request`: its `heapq.heappop`, heap[pos]
    moved toward the leaves of the heap's first n entries past every child
    that goes before it."""
    item = heap[pos]
    while True:
        child = 2 * pos + 1
        if child >= n:
            break
        if child + 1 < n and _before(R, heap[child + 1], heap[child]):
            child += 1
        if _before(R, heap[child], item):
            heap[pos] = heap[child]
            pos = child
        else:
            break
    heap[pos] = item


@njit
def wq_add(R, S, wq, priority, i):
    """`FCFSRequestQueue.add_request`: request i joins the queue.

    - FCFS: at the back; priority: into the heap
      (`PriorityRequestQueue.add_request`).
    - Its tokens join the rank's `pending_prefill_tokens`.
    """
    n = S[0].num_waiting
    S[0].pending_prefill_tokens += R[i].num_tokens
    if priority:
        wq[n] = i
        S[0].num_waiting = n + 1
        _sift_up(R, wq, n)
    else:
        wq[(S[0].waiting_head + n) % len(wq)] = i
        S[0].num_waiting = n + 1


@njit
def wq_prepend(R, S, wq, priority, i):
    """`FCFSRequestQueue.prepend_request`: a preempted request goes back.

    - FCFS: at the front; priority: back in the heap
      (`PriorityRequestQueue.prepend_request`).
    - Its tokens join the rank's `pending_prefill_tokens`.
    """
    if priority:
        wq_add(R, S, wq, priority, i)
    else:
        S[0].waiting_head = (S[0].waiting_head - 1) % len(wq)
        wq[S[0].waiting_head] = i
        S[0].num_waiting += 1
        S[0].pending_prefill_tokens += R[i].num_tokens


@njit
def wq_peek(S, wq, priority):
    """`FCFSRequestQueue.peek_request`: the head of the queue, left in it
    (priority: the heap's top, `PriorityRequestQueue.peek_request`)."""
    return wq[0] if priority else wq[S[0].waiting_head]


@njit
def wq_pop(R, S, wq, priority):
    """`FCFSRequestQueue.pop_request`: take the head out of the queue.

    - Priority: the heap's top (`PriorityRequestQueue.pop_request`).
    - Its tokens leave the rank's `pending_prefill_tokens`.
    """
    if priority:
        top = wq[0]
        n = S[0].num_waiting - 1
        S[0].num_waiting = n
        if n > 0:
            wq[0] = wq[n]
            _sift_down(R, wq, 0, n)
        S[0].pending_prefill_tokens -= R[top].num_tokens
        return top
    top = wq[S[0].waiting_head]
    S[0].waiting_head = (S[0].waiting_head + 1) % len(wq)
    S[0].num_waiting -= 1
    S[0].pending_prefill_tokens -= R[top].num_tokens
    return top


@njit
def wq_remove(R, S, wq, priority, i):
    """`FCFSRequestQueue.remove_request`: take request i out from anywhere in
    the queue.

    - Priority: out of the heap (`PriorityRequestQueue.remove_request`).
    - Its tokens leave the rank's `pending_prefill_tokens`.
    """
    n = S[0].num_waiting
    if priority:
        for pos in range(n):
            if wq[pos] == i:
                n -= 1
                S[0].num_waiting = n
                if pos < n:
                    wq[pos] = wq[n]
                    _sift_down(R, wq, pos, n)
                    _sift_up(R, wq, pos)
                S[0].pending_prefill_tokens -= R[i].num_tokens
                return
        return
    cap = len(wq)
    head = S[0].waiting_head
    for k in range(n):
        if wq[(head + k) % cap] == i:
            for j in range(k, n - 1):
                wq[(head + j) % cap] = wq[(head + j + 1) % cap]
            S[0].num_waiting = n - 1
            S[0].pending_prefill_tokens -= R[i].num_tokens
            return
