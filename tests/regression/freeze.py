"""Record the regression fixture: `python tests/regression/freeze.py` runs every
case of cases.py, with and without the pass log, and writes the sha256 of each
output file to frozen.json. Run it only on the code the refactor must match."""

import hashlib
import json
import os
import sys
import tempfile

from click.testing import CliRunner
from ruamel.yaml import YAML

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from regression.cases import HOST_KEYS, ROWS, cases  # noqa: E402
from servesim.cli.main import main  # noqa: E402


def run_case(name, cfg, pass_log, folder):
    path = os.path.join(folder, f"{name}.yaml")
    with open(path, "w") as f:
        YAML(typ="safe").dump(cfg, f)
    out = os.path.join(folder, f"{name}-{int(pass_log)}")
    args = ["run", path, "-o", out, "-q", "--telemetry-interval-ms", "2000"]
    if "trace" in cfg["workload"]:
        args += ["--limit", str(ROWS)]
    if pass_log:
        args.append("--pass-log")
    result = CliRunner().invoke(main, args)
    if result.exit_code != 0:
        raise RuntimeError(f"{name}: exit {result.exit_code}\n{result.output}\n{result.exception}")
    return digests(out)


from servesim.results.outdir import MANIFEST  # noqa: E402


def digests(out):
    found = {}
    for file in sorted(os.listdir(out)):
        if file == MANIFEST:  # the folder's record of what servesim wrote, not an output
            continue
        with open(os.path.join(out, file), "rb") as f:
            data = f.read()
        if file == "summary.json":
            summary = json.loads(data)
            for key in HOST_KEYS:
                summary.pop(key)
            workload = summary["config"]["workload"]
            if workload.get("trace"):  # where the checkout lives
                workload["trace"] = os.path.basename(workload["trace"])
            data = json.dumps(summary).encode()
        found[file] = hashlib.sha256(data).hexdigest()
    return found


def run_all():
    frozen = {}
    with tempfile.TemporaryDirectory() as folder:
        for name, cfg in cases().items():
            for pass_log in (False, True):
                frozen[f"{name}-{'passlog' if pass_log else 'plain'}"] = run_case(
                    name, cfg, pass_log, folder)
    return frozen


if __name__ == "__main__":
    frozen = run_all()
    with open(os.path.join(HERE, "frozen.json"), "w") as f:
        json.dump(frozen, f, indent=1, sort_keys=True)
        f.write("\n")
    print(f"{len(frozen)} runs frozen")
