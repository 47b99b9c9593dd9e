"""Where a sweep's points run: local worker processes or Ray tasks.

An executor is a generator `executor(fn, tasks, jobs=, address=)` over
`tasks`, a list of `(index, args)`: it runs `fn(*args)` for each task, each in
a process other than the caller's, and yields `(index, result)` as tasks
complete (in completion order). A task whose worker dies yields a failed
result instead of raising, so the other tasks go on.

- `local`: a `concurrent.futures.ProcessPoolExecutor` of `jobs` processes
  (default 1) started with "forkserver" (or "spawn" where there is none):
  never plain fork, which is unsafe after Numba or threads are loaded. A
  worker runs one point at a time on one thread, so it counts Numba's
  references with plain adds, as the `servesim run` command does
  (servesim/jit.py `single_thread_refcounts`).
- `ray`: one Ray task per point (`num_cpus=1`), on the cluster at `address`
  (`ray.init(address=...)`; at most `jobs` in flight when given) or on a local
  instance with `jobs` CPUs. The config, its trace and the output folder must
  be on a filesystem the Ray workers share. Connecting to `address` gives up
  after 30 s. The debug mode (`--check`) goes with each task. Ray is an
  optional extra, imported only here.

On Ctrl-C (KeyboardInterrupt in the caller) both stop at once: no task
starts any more, local workers are terminated, Ray tasks cancelled.
"""

import logging
import multiprocessing
import threading
import time
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

from servesim.errors import InputError

RAY_HINT = "pip install 'servesim[ray]'"
RAY_CONNECT_TIMEOUT_S = 30.0
POLL_S = 0.2  # how often a wait wakes up, so Ctrl-C is seen at once


def _crashed(exc: BaseException) -> dict:
    return {"status": "failed", "error": f"worker crashed: {type(exc).__name__}: {exc}", "summary": None}


def _start_method() -> str:
    methods = multiprocessing.get_all_start_methods()
    return "forkserver" if "forkserver" in methods else "spawn"


def _single_threaded_worker():
    """A local worker's initializer: its kernels run on its one thread, and
    its warnings print as the CLI's do, each once (servesim/errors.py)."""
    from servesim import jit
    from servesim.errors import show_warnings_as_lines

    jit.single_thread_refcounts()
    show_warnings_as_lines()


def _stop_now(pool):
    """Cancel what has not started, terminate the workers, and wait for the
    pool's manager thread to end.

    The wait matters: at interpreter exit, concurrent.futures wakes every
    manager thread still registered, and if one is closing its wake-up pipe
    at that moment the write fails with EBADF and a traceback is printed
    after our own message (CPython 3.11's `_python_exit` takes no lock).
    Once the thread has ended, its pipe is marked closed and the wake-up is
    a no-op. The pool drops its reference to the thread in `shutdown`, so
    it is taken first.
    """
    processes = list((pool._processes or {}).values())
    manager = pool._executor_manager_thread
    pool.shutdown(wait=False, cancel_futures=True)
    for process in processes:
        process.terminate()
    for process in processes:
        process.join(timeout=1.0)
    if manager is not None:
        manager.join(timeout=2.0)


def local_executor(fn, tasks, jobs=None, address=None):
    """Run the tasks in a pool of `jobs` worker processes."""
    if address is not None:
        raise InputError("--ray-address applies only to --executor ray")
    jobs = max(1, min(jobs or 1, len(tasks)))
    context = multiprocessing.get_context(_start_method())
    pool = ProcessPoolExecutor(max_workers=jobs, mp_context=context,
                               initializer=_single_threaded_worker)
    try:
        futures = {pool.submit(fn, *args): index for index, args in tasks}
        pending = set(futures)
        while pending:
            done, pending = wait(pending, timeout=POLL_S, return_when=FIRST_COMPLETED)
            for future in sorted(done, key=futures.get):
                try:
                    result = future.result()
                except Exception as exc:  # e.g. BrokenProcessPool: a worker died
                    result = _crashed(exc)
                yield futures[future], result
    except BaseException:  # e.g. Ctrl-C: start nothing more, stop what runs
        _stop_now(pool)
        raise
    pool.shutdown(wait=True)


def import_ray():
    try:
        import ray
    except ImportError:
        raise InputError(f"--executor ray needs Ray, which is not installed: {RAY_HINT}") from None
    return ray


def connect(init, address, timeout_s=RAY_CONNECT_TIMEOUT_S):
    """Run `init()` (ray.init on `address`) in a thread, so that an
    unreachable cluster fails after `timeout_s` with an InputError and Ctrl-C
    works meanwhile (the main thread only waits)."""
    outcome = {}

    def target():
        try:
            init()
            outcome["ok"] = True
        except BaseException as exc:  # reported in the main thread
            outcome["error"] = exc

    thread = threading.Thread(target=target, name="ray-connect", daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout_s
    while thread.is_alive() and time.monotonic() < deadline:
        thread.join(POLL_S)
    if thread.is_alive():
        raise InputError(f"--ray-address {address}: cannot connect to Ray within {timeout_s:g} s "
                         f"(is the cluster up and the address right?)")
    exc = outcome.get("error")
    if exc is not None:
        raise InputError(f"--ray-address {address}: cannot connect to Ray: {type(exc).__name__}: {exc}") from None


def _task_env():
    """A Ray task's runtime environment: the debug mode (`--check`,
    SERVESIM_CHECK) travels with it, since a cluster's workers do not share
    the caller's environment."""
    from servesim.scheduler import check

    return {"env_vars": {"SERVESIM_CHECK": "1"}} if check.enabled() else None


def ray_executor(fn, tasks, jobs=None, address=None, timeout_s=RAY_CONNECT_TIMEOUT_S):
    """Run each task as a Ray task, on the cluster at `address` or on a local
    Ray instance with `jobs` CPUs (default 1). A Ray instance this function
    started is shut down at the end; one already initialised is reused."""
    ray = import_ray()
    started = False
    if not ray.is_initialized():
        options = {"include_dashboard": False, "logging_level": logging.ERROR, "log_to_driver": False}
        if address:
            connect(lambda: ray.init(address=address, **options), address, timeout_s)
        else:
            ray.init(num_cpus=jobs or 1, **options)
        started = True
    in_flight = {}
    try:
        remote = ray.remote(num_cpus=1, max_retries=0, runtime_env=_task_env())(fn)
        limit = jobs if address and jobs else len(tasks)
        queue = list(tasks)
        while queue or in_flight:
            while queue and len(in_flight) < limit:
                index, args = queue.pop(0)
                in_flight[remote.remote(*args)] = index
            done, _ = ray.wait(list(in_flight), num_returns=1, timeout=POLL_S)
            for ref in done:
                index = in_flight.pop(ref)
                try:
                    result = ray.get(ref)
                except Exception as exc:  # the task's worker died
                    result = _crashed(exc)
                yield index, result
    except BaseException:  # e.g. Ctrl-C: cancel the tasks in flight
        for ref in in_flight:
            try:
                ray.cancel(ref, force=True)
            except Exception:  # already finished or gone
                pass
        raise
    finally:
        if started:
            ray.shutdown()


EXECUTORS = {"local": local_executor, "ray": ray_executor}
