"""One output folder, one run: the lock on a run's output folder, the
checks made before simulating, and the manifest of what servesim wrote.

`claim(path)` creates the folder if needed and takes its lock, the file
`.servesim.lock` created with O_EXCL and holding the owner's pid; it is
removed when the claim ends. A lock whose pid is no longer alive (a run that
was killed), or that holds no pid (garbage, empty, `0`: its writer died
before writing it), is stale and taken over. A second run on a locked
folder, or a folder that cannot be created or written (a file in its place,
read-only, permission denied, `/proc`), raises an InputError naming the path
and the reason, before anything is simulated; so does an empty path (`-o ''`,
an unset shell variable). Claims are re-entrant within a process, so
`Report.write` can take the claim itself when the caller did not.

Nothing of the user's is replaced: every file or folder servesim writes into
an output folder is recorded in its manifest, `.servesim-manifest` (one name a
line), and a name already in the folder that the manifest does not hold (the
user's own `report.html`, a folder where `sweep.csv` goes) is refused before
simulating (`claim(..., replaces=names)`, `check_replaceable`). `write_file`
writes one file that way: a temporary name, then a rename, an OSError (a full
disk, read-only) an InputError naming the file, no temporary left behind.
"""

import contextlib
import errno
import os
import time
from pathlib import Path

from servesim.errors import InputError

LOCK = ".servesim.lock"
MANIFEST = ".servesim-manifest"
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
    """The pid in `lock`; 0 when it holds none (empty, garbage, `0`); None
    when it cannot be read."""
    try:
        text = lock.read_bytes()
    except OSError:
        return None
    try:
        pid = int(text.decode("ascii").strip())
    except (UnicodeDecodeError, ValueError):
        return 0
    return pid if pid > 0 else 0


# a lock with no pid younger than this may be its owner's, between creating
# it and writing its pid
_UNWRITTEN_LOCK_S = 2.0


def _age_s(path: Path) -> float:
    try:
        return time.time() - path.stat().st_mtime
    except OSError:
        return 0.0


def _take_lock(folder: Path) -> None:
    lock = folder / LOCK
    for _ in range(30):
        try:
            fd = os.open(lock, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            owner = _lock_owner(lock)
            if owner == 0 and _age_s(lock) < _UNWRITTEN_LOCK_S:
                time.sleep(0.1)  # its owner may be writing its pid just now: look again
                continue
            if owner is None:
                owner_text = "another run"
            elif owner == 0 or owner == os.getpid() or not _pid_alive(owner):
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


def written_by_servesim(folder) -> set:
    """The names servesim recorded in `folder`'s manifest."""
    try:
        text = (Path(folder) / MANIFEST).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return set()
    return {line for line in text.splitlines() if line}


def check_replaceable(folder, names) -> None:
    """Refuse (InputError) when one of `names` is in `folder` and servesim
    did not write it (it is not in the manifest)."""
    folder = Path(folder)
    owned = None
    for name in names:
        path = folder / name
        if not os.path.lexists(path):
            continue
        if owned is None:
            owned = written_by_servesim(folder)
        if name not in owned:
            kind = "a folder" if path.is_dir() else "a file"
            raise InputError(f"{path}: {kind} servesim did not write is in the way of its output "
                             f"(not in {folder / MANIFEST}); servesim replaces only its own files: "
                             "move it, or choose another output folder")


def record_written(folder, names) -> None:
    """Add `names` to `folder`'s manifest, once they are in place (a name
    recorded but never written would let a file of the user's by that name
    be replaced later; one written but not recorded is only refused)."""
    folder = Path(folder)
    owned = written_by_servesim(folder)
    if set(names) <= owned:
        return
    text = "".join(name + "\n" for name in sorted(owned | set(names)))
    _replace_text(folder / MANIFEST, text)


def _replace_text(path: Path, text: str) -> None:
    tmp = path.with_name("." + path.name.lstrip(".") + f".{os.getpid()}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8", newline="") as f:
            f.write(text)
        os.replace(tmp, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise output_error(path, exc, "write") from None
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def write_file(path, text: str) -> Path:
    """Write `text` to `path` in an output folder: refused if something of
    the user's is there (`check_replaceable`), written to a temporary name
    and renamed, then recorded in the manifest; an OSError is an InputError
    naming the file, and no temporary is left."""
    path = Path(path)
    check_replaceable(path.parent, [path.name])
    _replace_text(path, text)
    record_written(path.parent, [path.name])
    return path


@contextlib.contextmanager
def claim(path, remove_if_empty=False, replaces=()):
    """Create `path` if needed and hold its lock for the duration; with
    `remove_if_empty`, a folder this claim created is removed again if it is
    empty at the end (the CLI's claim: a run that failed leaves nothing).
    `replaces`: the names the command will write or replace, refused now
    when something of the user's holds one (`check_replaceable`)."""
    if not str(path).strip():
        raise InputError("output folder: an empty path (an unset shell variable?); "
                         "name a folder, e.g. -o out")
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
        try:
            _take_lock(folder)
        except BaseException:
            if created:  # a full disk: no empty new folder left behind
                with contextlib.suppress(OSError):
                    folder.rmdir()
            raise
        _held[key] = 1
    try:
        check_replaceable(folder, replaces)
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
