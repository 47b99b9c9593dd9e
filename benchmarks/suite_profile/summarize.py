"""Per test file: tests, wall, CPU (own, children) and compiles, from the two logs
of sitecustomize.py and cputime_plugin.py; then the kernel specializations
compiled more than once (by several processes).

    python benchmarks/suite_profile/summarize.py suite-times.jsonl compiles.jsonl"""

import collections
import json
import sys


def main(times_path, compiles_path):
    times = [json.loads(line) for line in open(times_path)]
    compiles = [json.loads(line) for line in open(compiles_path)]
    files = collections.defaultdict(lambda: [0, 0.0, 0.0, 0.0, 0, 0.0])
    for t in times:
        f = files[t["test"].split("::")[0]]
        f[0] += 1
        f[1] += t["wall"]
        f[2] += t["cpu"]
        f[3] += t["child_cpu"]
    for c in compiles:
        f = files[c["test"].split("::")[0]]
        f[4] += 1
        f[5] += c["self_s"]
    print("| file | tests | wall s | CPU s | children's CPU s | compiles | compile s (wall) |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, (n, wall, cpu, child, k, ks) in sorted(files.items(), key=lambda x: -(x[1][2] + x[1][3])):
        print(f"| {name} | {n} | {wall:.1f} | {cpu:.1f} | {child:.1f} | {k} | {ks:.1f} |")
    seen = collections.defaultdict(list)
    for c in compiles:
        seen[(c["kernel"], c["sig"])].append(c)
    servesim = {key for key in seen if key[0].startswith("servesim.")}
    print(f"\n{len(servesim)} servesim specializations compiled")
    for (kernel, _), rows in sorted(seen.items(), key=lambda x: -sum(r["self_s"] for r in x[1][1:])):
        if len(rows) > 1 and kernel.startswith("servesim."):
            print(f"  x{len(rows)} {kernel}: {sum(r['self_s'] for r in rows[1:]):.1f} s again, "
                  f"processes {sorted({r['pid'] for r in rows})}")


if __name__ == "__main__":
    main(*sys.argv[1:3])
