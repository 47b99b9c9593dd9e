"""What the benchmark scripts share: the commit and the machine a measurement
ran on, and appending a dated section to benchmarks/RESULTS.md."""

import os
import platform
import subprocess
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "RESULTS.md"


def commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=HERE.parent,
                              capture_output=True, text=True).stdout.strip() or "-"
    except OSError:
        return "-"


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    import numba
    import numpy
    return (f"{cpu}, {os.cpu_count()} cores, Python {platform.python_version()}, "
            f"NumPy {numpy.__version__}, Numba {numba.__version__}")


def publish(lines: list, write: bool) -> None:
    """Print a results section and, when `write`, append it to RESULTS.md."""
    text = "\n".join(lines) + "\n"
    print(text)
    if write:
        with open(RESULTS, "a") as f:
            f.write("\n" + text)
