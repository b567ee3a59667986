#!/usr/bin/env python3
"""Compares two builds' pooled bench samples (files written with HPK_BENCH_SAMPLES=FILE).

Usage: scripts/bench-compare.py BEFORE_FILE AFTER_FILE

Per measurement: the pooled p50, p99 and mean of each side, and the 95 % interval of the p50
difference (after - before) from a bootstrap over the pooled samples (2,000 resamples, fixed
seed, so the same files give the same figures).
"""
import collections
import math
import random
import statistics
import sys


def load(path):
    samples = collections.defaultdict(list)
    with open(path, encoding="utf-8") as f:
        for line in f:
            name, value = line.rstrip("\n").split("\t")
            samples[name].append(float(value))
    return samples


def percentile(values, q):
    ordered = sorted(values)
    return ordered[max(0, math.ceil(len(ordered) * q) - 1)]


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    before, after = load(sys.argv[1]), load(sys.argv[2])
    rng = random.Random(1)
    print("| measurement | n | p50 before → after | p99 before → after | mean before → after | p50 change, 95 % |")
    print("|---|---|---|---|---|---|")
    for name in before:
        a, b = before[name], after.get(name, [])
        if not b:
            print(f"| {name} | {len(a)}/0 | no samples after | | | |")
            continue
        diffs = sorted(
            percentile([rng.choice(b) for _ in b], 0.5) - percentile([rng.choice(a) for _ in a], 0.5)
            for _ in range(2000)
        )
        print(
            f"| {name} | {len(a)}/{len(b)} | {percentile(a, .5):.1f} → {percentile(b, .5):.1f} ms "
            f"| {percentile(a, .99):.1f} → {percentile(b, .99):.1f} ms "
            f"| {statistics.mean(a):.1f} → {statistics.mean(b):.1f} ms "
            f"| {diffs[50]:+.2f} … {diffs[1949]:+.2f} ms |"
        )


main()
