#!/usr/bin/env python3
"""One memory snapshot of a running Envoy, as a JSON line on stdout.

    memstat.py PID ADMIN_PORT [LABEL]

How the wasm VM memory is measured. Envoy 1.40 has no gauge for a wasm VM's memory (its
/stats only has wasm.wasm_vm_count and wasm.envoy.wasm.runtime.v8.{active,created}), so it is
read from the process's memory map: V8 reserves, for every wasm32 instance, one contiguous
region of ~8 GiB + the linear memory; the pages the module can use (its linear memory,
`memory.size`, 64 KiB wasm pages) are the read-write mapping that directly precedes the large
inaccessible (---p) guard mapping, and growing the memory moves that boundary. So for each
---p mapping of >= 1 GiB whose start equals the end of a rw-p mapping, that rw-p mapping is
one VM's linear memory: we report its size (what the VM has grown to, never shrinks) and its
resident size (Rss from /proc/PID/smaps). Also reported: the process VmRSS/RssAnon, Envoy's
/memory (tcmalloc: `allocated`, `heap_size`; the shared-data cache lives there, outside the
VMs) and the wasm stats.
"""

import json
import re
import sys
import urllib.request


def smaps(pid):
    maps, cur = [], None
    with open(f"/proc/{pid}/smaps", encoding="utf-8", errors="replace") as f:
        for line in f:
            m = re.match(r"^([0-9a-f]+)-([0-9a-f]+) (\S+)", line)
            if m:
                cur = {"start": int(m.group(1), 16), "end": int(m.group(2), 16),
                       "perm": m.group(3), "rss_kb": 0}
                maps.append(cur)
            elif line.startswith("Rss:") and cur is not None:
                cur["rss_kb"] = int(line.split()[1])
    return maps


def wasm_memories(pid):
    maps = smaps(pid)
    out = []
    for prev, m in zip(maps, maps[1:]):
        if (m["perm"] == "---p" and m["end"] - m["start"] >= 1 << 30
                and prev["end"] == m["start"] and prev["perm"] == "rw-p"):
            out.append({"linear_kb": (prev["end"] - prev["start"]) // 1024,
                        "rss_kb": prev["rss_kb"]})
    return out


def status(pid):
    out = {}
    with open(f"/proc/{pid}/status", encoding="utf-8") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in ("VmRSS", "RssAnon", "VmHWM"):
                out[k] = int(v.split()[0])
    return out


def admin(port, path):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
        return r.read().decode("utf-8", "replace")


def main():
    pid, port = sys.argv[1], sys.argv[2]
    label = sys.argv[3] if len(sys.argv) > 3 else ""
    st = status(pid)
    mem = json.loads(admin(port, "/memory"))
    stats = {}
    for line in admin(port, "/stats?filter=^wasm").splitlines():
        k, _, v = line.partition(": ")
        if v.strip().isdigit() and ("wasm_vm_count" in k or "runtime" in k
                                    or k.startswith("wasmcustom.incontext_requests")
                                    or "cache_" in k and k.startswith("wasmcustom")):
            stats[k] = int(v)
    vms = wasm_memories(pid)
    print(json.dumps({
        "label": label,
        "rss_kb": st.get("VmRSS"), "rss_anon_kb": st.get("RssAnon"), "hwm_kb": st.get("VmHWM"),
        "tcmalloc_allocated": int(mem.get("allocated", 0)),
        "tcmalloc_heap_size": int(mem.get("heap_size", 0)),
        "wasm_vms": vms,
        "wasm_linear_kb_total": sum(v["linear_kb"] for v in vms),
        "wasm_rss_kb_total": sum(v["rss_kb"] for v in vms),
        "stats": stats,
    }))


if __name__ == "__main__":
    main()
