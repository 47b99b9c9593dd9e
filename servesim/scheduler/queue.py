"""The waiting queue (vllm/v1/core/sched/request_queue.py).

FCFS: a deque in arrival order; a preempted request goes to the front.
Priority: a heap on `(priority, arrival, request id)` (ids compare as strings);
a preempted request is pushed back in that order.
"""

import heapq
from collections import deque


class FCFSQueue:
    def __init__(self):
        self._queue = deque()

    def add(self, request):
        self._queue.append(request)

    def prepend(self, request):
        self._queue.appendleft(request)

    def peek(self):
        return self._queue[0]

    def pop(self):
        return self._queue.popleft()

    def remove(self, request):
        self._queue.remove(request)

    def __len__(self):
        return len(self._queue)

    def __iter__(self):
        return iter(self._queue)


class PriorityQueue:
    def __init__(self):
        self._heap = []

    def add(self, request):
        heapq.heappush(self._heap, request)

    prepend = add

    def peek(self):
        return self._heap[0]

    def pop(self):
        return heapq.heappop(self._heap)

    def remove(self, request):
        self._heap.remove(request)
        heapq.heapify(self._heap)

    def __len__(self):
        return len(self._heap)

    def __iter__(self):
        return iter(sorted(self._heap))


def make_queue(policy: str):
    return PriorityQueue() if policy == "priority" else FCFSQueue()
