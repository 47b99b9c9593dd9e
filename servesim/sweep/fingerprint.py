"""What a sweep point's outputs were computed from, so that resuming trusts
only what it can verify (README "Sweeps and reports").

A point's fingerprint is the SHA-256 of its resolved config (as summary.json
records it) and of every file it reads — the trace, a fitted model, an aic
calibration, a model folder's config.json — by size and SHA-256 of the bytes.
Hashing a large trace for every point of every rerun would be slow, so file
hashes are cached in the sweep's folder (`.servesim-hashes.json`), keyed by
path and trusted while the file's size and mtime are unchanged.
"""

import hashlib
import json
import os
from pathlib import Path

FINGERPRINT_FILE = "fingerprint.json"
HASH_CACHE = ".servesim-hashes.json"


class FileHashes:
    """File digests, cached by (path, size, mtime) in a JSON file."""

    def __init__(self, cache_path):
        self.path = Path(cache_path)
        try:
            self.entries = json.loads(self.path.read_text(encoding="utf-8"))
            if not isinstance(self.entries, dict):
                self.entries = {}
        except (OSError, ValueError):
            self.entries = {}
        self.changed = False

    def digest(self, path) -> dict | None:
        """{"size", "sha256"} of the file at `path`, or None if unreadable."""
        path = os.path.abspath(path)
        try:
            st = os.stat(path)
        except OSError:
            return None
        entry = self.entries.get(path)
        if isinstance(entry, dict) and entry.get("size") == st.st_size and entry.get("mtime_ns") == st.st_mtime_ns:
            return {"size": st.st_size, "sha256": entry.get("sha256")}
        h = hashlib.sha256()
        try:
            with open(path, "rb") as f:
                for chunk in iter(lambda: f.read(1 << 20), b""):
                    h.update(chunk)
        except OSError:
            return None
        self.entries[path] = {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": h.hexdigest()}
        self.changed = True
        return {"size": st.st_size, "sha256": h.hexdigest()}

    def save(self) -> None:
        """Write the cache back (atomically) if it changed; a cache that
        cannot be written is only a lost speed-up."""
        if not self.changed:
            return
        tmp = self.path.with_name(self.path.name + ".tmp")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(json.dumps(self.entries, indent=1, sort_keys=True), encoding="utf-8")
            os.replace(tmp, self.path)
        except OSError:
            tmp.unlink(missing_ok=True)
        self.changed = False


def input_files(config) -> list:
    """The files a resolved config reads, by their absolute paths in it: the
    trace, a fitted model, an aic calibration, a model folder's config.json
    (in the engine block or a pool's)."""
    found = []

    def walk(node):
        if isinstance(node, dict):
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)
        elif isinstance(node, str) and os.path.isabs(node):
            if os.path.isfile(node):
                found.append(node)
            elif os.path.isfile(os.path.join(node, "config.json")):
                found.append(os.path.join(node, "config.json"))

    walk(config)
    return sorted(set(found))


def fingerprint(config: dict, hashes: FileHashes) -> str:
    """The fingerprint of a point's inputs: its resolved config dict and the
    content of every file it reads (`input_files`)."""
    doc = {"config": config, "files": {path: hashes.digest(path) for path in input_files(config)}}
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode("utf-8")).hexdigest()


def read_fingerprint(point_dir) -> str | None:
    try:
        doc = json.loads((Path(point_dir) / FINGERPRINT_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return doc.get("fingerprint") if isinstance(doc, dict) else None


def write_fingerprint(point_dir, value: str) -> None:
    path = Path(point_dir) / FINGERPRINT_FILE
    tmp = path.with_name("." + path.name + ".tmp")
    tmp.write_text(json.dumps({"fingerprint": value}) + "\n", encoding="utf-8")
    os.replace(tmp, path)
