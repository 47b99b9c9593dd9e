"""One output folder, one run: the lock on a run's output folder and the
checks made before simulating.

`claim(path)` creates the folder if needed and takes its lock, the file
`.servesim.lock` created with O_EXCL and holding the owner's pid; it is
removed when the claim ends. A lock whose pid is no longer alive (a run that
was killed) is stale and taken over. A second run on a locked folder, or a
folder that cannot be created or written (a file in its place, read-only,
permission denied, `/proc`), raises an InputError naming the path and the
reason, before anything is simulated. Claims are re-entrant within a process,
so `Report.write` can take the claim itself when the caller did not.
"""

import contextlib
import errno
import os
from pathlib import Path

from servesim.errors import InputError

LOCK = ".servesim.lock"
_held: dict = {}  # resolved folder -> claim depth, in this process


def _reason(exc: OSError) -> str:
    if isinstance(exc, FileExistsError) or exc.errno in (errno.EEXIST, errno.ENOTDIR):
        return "a file is in the way (not a folder)"
    return exc.strerror or str(exc)


def output_error(path, exc: OSError, doing: str) -> InputError:
    """The InputError for an OSError met while `doing` something in `path`."""
    return InputError(f"{path}: cannot {doing}: {_reason(exc)}")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    return True


def _lock_owner(lock: Path):
    try:
        return int(lock.read_text(encoding="ascii").strip() or "0")
    except (OSError, ValueError):
        return None


def _take_lock(folder: Path) -> None:
    lock = folder / LOCK
    for _ in range(3):
        try:
            fd = os.open(lock, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            owner = _lock_owner(lock)
            if owner is None:  # being written by its owner just now, or garbage
                owner_text = "another run"
            elif owner == os.getpid() or not _pid_alive(owner):
                lock.unlink(missing_ok=True)  # stale: its run is gone
                continue
            else:
                owner_text = f"another run (pid {owner})"
            raise InputError(f"{folder}: output folder is in use by {owner_text}; "
                             f"wait for it or choose another -o (lock file {lock})") from None
        except OSError as exc:
            raise output_error(folder, exc, "write into the output folder") from None
        try:
            os.write(fd, f"{os.getpid()}\n".encode("ascii"))
        except OSError as exc:
            os.close(fd)
            lock.unlink(missing_ok=True)
            raise output_error(folder, exc, "write into the output folder") from None
        os.close(fd)
        return
    raise InputError(f"{folder}: cannot take the output folder's lock {lock}")


@contextlib.contextmanager
def claim(path, remove_if_empty=False):
    """Create `path` if needed and hold its lock for the duration; with
    `remove_if_empty`, a folder this claim created is removed again if it is
    empty at the end (the CLI's claim: a run that failed leaves nothing)."""
    folder = Path(path)
    created = not folder.exists()
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise output_error(folder, exc, "create the output folder") from None
    if not folder.is_dir():
        raise InputError(f"{folder}: cannot create the output folder: a file is in the way (not a folder)")
    key = str(folder.resolve())
    if key in _held:
        _held[key] += 1
    else:
        _take_lock(folder)
        _held[key] = 1
    try:
        yield folder
    finally:
        _held[key] -= 1
        if not _held[key]:
            del _held[key]
            with contextlib.suppress(OSError):
                if _lock_owner(folder / LOCK) == os.getpid():
                    (folder / LOCK).unlink()
                if created and remove_if_empty:
                    folder.rmdir()  # fails unless empty
