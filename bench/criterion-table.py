#!/usr/bin/env python3
"""Prints the `cargo bench --bench core` results (benches/core.rs) as a Markdown table:
median time per request body and the body bytes per second.

    cargo bench --bench core && bench/criterion-table.py [target/criterion]
"""
import json
import os
import sys

GROUPS = ["scan", "analyze", "cache_key", "payload", "splice", "decide", "hit_path",
          "miss_path", "passthrough"]
SIZES = [("2KB", 2048), ("32KB", 32768), ("400KB", 409600), ("1.5MB", 1572864)]


def fmt(ns):
    return f"{ns / 1e6:.2f} ms" if ns >= 1e6 else (f"{ns / 1e3:.1f} µs" if ns >= 1e3 else f"{ns:.0f} ns")


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else "target/criterion"
    print("| work | " + " | ".join(s for s, _ in SIZES) + " |")
    print("|---|" + "--:|" * len(SIZES))
    for g in GROUPS:
        row = []
        for s, b in SIZES:
            p = os.path.join(root, g, s, "new", "estimates.json")
            if not os.path.exists(p):
                row.append("-")
                continue
            ns = json.load(open(p, encoding="utf-8"))["median"]["point_estimate"]
            row.append(f"{fmt(ns)} ({b / ns * 1e9 / 2**20:.0f} MiB/s)")
        print(f"| {g} | " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
