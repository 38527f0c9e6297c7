#!/usr/bin/env python3
"""The same-card reference for `polyattn bench`: PyTorch SDPA (flash and cuDNN backends).

Runs `torch.nn.functional.scaled_dot_product_attention` on the prefill and decode cases of the
polyattn shape table (perf-anchors.md section 10, read from benches/shapes.json, which
`polyattn bench --shapes all,C --dump-shapes benches/shapes.json` writes), contiguous
(B, H, S, D) tensors, GQA through `enable_gqa` (repeat_interleave where a backend refuses it),
timed with CUDA events: warm-up, many repetitions, median and spread, random inputs rotated
through several sets and a 256 MB L2 flush before every repetition (which also keeps the GPU
busy while the host enqueues the call, so small kernels are not timed as launch latency). In the same run it measures the
card's two ceilings (a 4 GiB device copy and an 8192^3 matmul in the benchmark dtype) and
records the card, driver and clocks (nvidia-smi) before and after.

The output is the JSON of `polyattn bench --json` (schema polyattn-bench/1), rows with backend
"torch-flash" / "torch-cudnn", so that

    polyattn bench --shapes P2,D1 --compare torch.json      prints our ratio to each, and
    polyattn bench --from ours.json --compare torch.json --results-md benches/RESULTS.md

puts both in RESULTS.md. Cases SDPA cannot express are kept as skipped rows with the reason:
ragged batches, fp8 KV caches, MLA, KV writes and merges.

On the H200 (PyTorch 2.11 with cuDNN, no network):

    python3 benches/reference_sdpa.py --shapes P1,P2,P3,P4,D1,D2,D3,D4 --out $OUT/torch.json

Needs only torch; stdlib otherwise. `--help` lists the knobs (reps, budget, sets, dtype).
"""

import argparse
import json
import math
import os
import platform
import socket
import subprocess
import sys
import time

SCHEMA = "polyattn-bench/1"
HERE = os.path.dirname(os.path.abspath(__file__))
GROUPS = ["P1", "P2", "P3", "P4", "P5", "D1", "D2", "D3", "D4", "D5", "M", "K", "G", "C", "DCP"]
BYTES = {"f32": 4, "f16": 2, "bf16": 2, "fp8_e4m3": 1, "fp8_e5m2": 1, "float16": 2, "bfloat16": 2}


def utc_now():
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def nvidia_smi():
    """(name, driver, clocks) as polyattn's machine.rs formats them, or None."""
    q = "name,driver_version,clocks.sm,clocks.mem,clocks.max.sm,power.draw,temperature.gpu"
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=" + q, "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30).stdout
    except Exception:
        return None
    lines = out.strip().splitlines()
    if not lines:
        return None
    f = [x.strip() for x in lines[0].split(",")]
    if len(f) < 7:
        return None
    return f[0], f[1], f"sm {f[2]}, mem {f[3]}, max sm {f[4]}, {f[5]}, {f[6]} C"


def cpuinfo(key):
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                k, _, v = line.partition(":")
                if k.strip() == key:
                    return v.strip()
    except OSError:
        pass
    return None


def mem_total_gb():
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024 / 1e9
    except OSError:
        pass
    return 0.0


def machine(torch):
    smi = nvidia_smi()
    mhz = cpuinfo("cpu MHz")
    m = {
        "date": utc_now(),
        "hostname": socket.gethostname(),
        "os": f"{platform.system().lower()} {platform.machine()}",
        "kernel": platform.release(),
        "cpu_model": cpuinfo("model name") or platform.processor() or "unknown",
        "logical_cpus": os.cpu_count() or 1,
        "threads": torch.get_num_threads(),
        "cpu_mhz": float(mhz) if mhz else None,
        "mem_total_gb": mem_total_gb(),
        "gpu": None,
        "software": f"torch {torch.__version__}, CUDA {torch.version.cuda}, "
                    f"cuDNN {torch.backends.cudnn.version()}",
        "extra": {
            "torch": str(torch.__version__),
            "cuda": str(torch.version.cuda),
            "cudnn": str(torch.backends.cudnn.version()),
            "capability": ".".join(map(str, torch.cuda.get_device_capability())),
            "generator": "benches/reference_sdpa.py",
        },
    }
    name = torch.cuda.get_device_name()
    m["gpu"] = {"name": smi[0] if smi else name, "driver": smi[1] if smi else "",
                "clocks_before": smi[2] if smi else "", "clocks_after": ""}
    return m


def quantile(sorted_xs, q):
    """Linear between order statistics, as polyattn's timing.rs."""
    n = len(sorted_xs)
    if n == 0:
        return 0.0
    x = min(max(q, 0.0), 1.0) * (n - 1)
    lo, hi = math.floor(x), math.ceil(x)
    w = x - lo
    return sorted_xs[lo] * (1 - w) + sorted_xs[hi] * w


def roofline(flops, nbytes, secs, pt, pb):
    """perf-anchors section 8: t_min = max(F/P, B/BW); fraction = t_min / t."""
    tc = flops / (pt * 1e12) if pt > 0 else 0.0
    tm = nbytes / (pb * 1e9) if pb > 0 else 0.0
    bound = "compute" if tc >= tm else "memory"
    return {
        "tflops": flops / secs / 1e12,
        "gbps": nbytes / secs / 1e9,
        "bound": bound,
        "fraction": max(tc, tm) / secs,
    }


_FLUSH = []


def flush_buffer(torch):
    """256 MB zeroed before every timed repetition, as triton's do_bench does: it evicts L2,
    and it keeps the GPU busy while the host enqueues the next call, so the events around the
    call time the GPU's work, not the host's launch latency."""
    if not _FLUSH:
        _FLUSH.append(torch.empty(256 << 20, dtype=torch.int8, device="cuda"))
    return _FLUSH[0]


def time_events(torch, fn, warmup, min_reps, max_reps, budget):
    """Per-repetition CUDA-event times in seconds; fn(i) gets the repetition index."""
    flush = flush_buffer(torch)
    i = 0
    t0 = time.perf_counter()
    for _ in range(max(warmup, 1)):
        fn(i)
        i += 1
        if time.perf_counter() - t0 > budget:
            break
    torch.cuda.synchronize()
    secs = []
    spent = 0.0
    while len(secs) < max(max_reps, min_reps) and (len(secs) < min_reps or spent < budget):
        n = min(10, max(max_reps, min_reps) - len(secs))
        ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(n)]
        for s, e in ev:
            flush.zero_()
            s.record()
            fn(i)
            e.record()
            i += 1
        torch.cuda.synchronize()
        for s, e in ev:
            t = s.elapsed_time(e) / 1e3
            secs.append(t)
            spent += t
    return sorted(secs)


def measure_peaks(torch, dtype, args):
    """The card's two ceilings in this run: a device copy and a matmul, best of the reps."""
    dev = torch.device("cuda")
    n = (args.copy_gib << 30) // 4
    a = torch.randn(n, device=dev, dtype=torch.float32)
    b = torch.empty_like(a)
    t = time_events(torch, lambda i: b.copy_(a), 3, 20, 20, 0.0)
    copy = 2 * n * 4 / t[0] / 1e9
    t = time_events(torch, lambda i: a.sum(), 3, 20, 20, 0.0)
    read = n * 4 / t[0] / 1e9
    del a, b
    m = args.gemm
    x = torch.randn(m, m, device=dev, dtype=dtype)
    y = torch.randn(m, m, device=dev, dtype=dtype)
    t = time_events(torch, lambda i: x @ y, 3, 20, 20, 0.0)
    tflops = 2 * m ** 3 / t[0] / 1e12
    del x, y
    torch.cuda.empty_cache()
    name = torch.cuda.get_device_name()
    dname = str(dtype).replace("torch.", "").replace("bfloat16", "bf16").replace("float16", "f16")
    return {
        "device": name,
        "kind": "cuda",
        "dtype": dname,
        "compute_tflops": tflops,
        "compute_method": f"torch {dname} matmul {m}^3, random normal, CUDA events, best of 20",
        "mem_gbps": copy,
        "mem_method": f"torch b.copy_(a) of {args.copy_gib} GiB fp32, read+write counted, "
                      "CUDA events, best of 20",
        "read_gbps": read,
    }


def select(cases, spec):
    names = [s.strip() for s in spec.split(",") if s.strip()]
    keep = []
    for name in names:
        hit = False
        for c in cases:
            if name.lower() == "all":
                m = c["group"] not in ("C", "DCP")
            else:
                m = c["group"].lower() == name.lower() or c["id"].lower() == name.lower()
            if m:
                hit = True
                if c not in keep:
                    keep.append(c)
        if not hit:
            sys.exit(f"unknown shape '{name}'; valid: all, the groups {', '.join(GROUPS)}, "
                     "or a case id from benches/shapes.json")
    order = {c["id"]: i for i, c in enumerate(cases)}
    return sorted(keep, key=lambda c: order[c["id"]])


def expand(requests):
    """[[count, sq, sk], ...] -> [(sq, sk), ...]."""
    out = []
    for count, sq, sk in requests:
        out += [(sq, sk)] * count
    return out


def blank_row(case, backend, device, dtype, kv):
    tr = case["traffic"]
    s_act = BYTES[dtype]
    s_kv = s_act if kv == "auto" else BYTES[kv]
    return {
        "id": case["id"], "group": case["group"], "family": case["family"],
        "shape": case["shape"] + " (contiguous)", "backend": backend, "device": device,
        "dtype": dtype, "kv_dtype": kv, "status": "skipped", "note": None,
        "flops": tr["flops"],
        "bytes": tr["act_elems"] * s_act + tr["cache_elems"] * s_kv + tr["fixed_bytes"],
        "reps": 0, "sets": 0, "timer": None,
        "us_median": None, "us_p10": None, "us_p90": None, "us_min": None, "us_max": None,
        "tflops": None, "gbps": None, "bound": None, "fraction": None,
        "peak_tflops": None, "peak_gbps": None,
    }


def why_not(case, kv):
    if case["family"] not in ("prefill", "decode"):
        return f"{case['family']}: no torch SDPA equivalent"
    if case.get("ranks", 0) > 1:
        return "cache sharded over ranks: the reference is one device (its r1 row)"
    if kv != "auto":
        return f"kv cache {kv}: SDPA has no quantised KV"
    if len(case["requests"]) > 1:
        return "ragged batch: a contiguous SDPA call needs uniform lengths"
    return None


def run_case(torch, F, case, dtype, backends, peaks, args, device_name):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    reqs = expand(case["requests"])
    B = len(reqs)
    sq, sk = reqs[0]
    hq, hkv, d, dv = case["num_heads"], case["num_kv_heads"], case["head_size"], case["head_size_v"]
    tdt = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}[dtype]
    s = BYTES[dtype]
    set_bytes = B * (hq * sq * (d + dv) + hkv * sk * (d + dv)) * s
    free, _ = torch.cuda.mem_get_info()
    limit = args.max_gb * 1e9 if args.max_gb else 0.8 * free
    sets = args.sets or min(max(math.ceil(256e6 / set_bytes), 2), 8)
    sets = max(2, min(sets, int(limit // max(set_bytes, 1))))
    rows = []
    if 2 * set_bytes > limit:
        for name in backends:
            r = blank_row(case, "torch-" + name, device_name, dtype, "auto")
            r["note"] = f"needs {2 * set_bytes / 1e9:.1f} GB for 2 input sets, limit {limit / 1e9:.1f} GB"
            rows.append(r)
        return rows
    gen = torch.Generator(device="cuda").manual_seed(args.seed)
    data = []
    for _ in range(sets):
        q = torch.randn(B, hq, sq, d, device="cuda", dtype=tdt, generator=gen)
        k = torch.randn(B, hkv, sk, d, device="cuda", dtype=tdt, generator=gen)
        v = torch.randn(B, hkv, sk, dv, device="cuda", dtype=tdt, generator=gen)
        data.append((q, k, v))
    # Bottom-right causal: is_causal when square; a lower-right bias when Sq < Sk; a single
    # query token sees every key.
    mask, is_causal = None, False
    if case["causal"] and sq > 1:
        if sq == sk:
            is_causal = True
        else:
            from torch.nn.attention.bias import causal_lower_right
            mask = causal_lower_right(sq, sk)
    gqa = hq != hkv
    table = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}
    expanded = []

    def sdpa(i, gqa_kernel):
        if gqa_kernel:
            q, k, v = data[i % len(data)]
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal,
                                                  enable_gqa=gqa)
        # K/V expanded to every query head beforehand: the kernel then reads g times the KV
        # bytes; the row still counts the useful bytes of section 8.
        if not expanded:
            g = hq // hkv
            expanded.extend((q, k.repeat_interleave(g, dim=1).contiguous(),
                             v.repeat_interleave(g, dim=1).contiguous()) for q, k, v in data)
        q, k, v = expanded[i % len(expanded)]
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal)

    for name in backends:
        row = blank_row(case, "torch-" + name, device_name, dtype, "auto")
        note = []
        try:
            with sdpa_kernel([table[name]]):
                native = True
                try:
                    out = sdpa(0, True)
                except RuntimeError:
                    if not gqa:
                        raise
                    native = False
                    out = sdpa(0, False)
                    note.append("GQA via pre-expanded K/V")
                if not torch.isfinite(out).all():
                    raise RuntimeError("non-finite output")
                secs = time_events(torch, lambda i: sdpa(i, native), args.warmup, args.min_reps,
                                   args.max_reps, args.budget)
        except Exception as e:  # noqa: BLE001 - every failure becomes the row's note
            msg = str(e).strip().splitlines()[0][:200] if str(e).strip() else ""
            row["status"] = "error"
            row["note"] = f"{type(e).__name__}: {msg}"
            rows.append(row)
            torch.cuda.synchronize()
            continue
        med = quantile(secs, 0.5)
        row.update({
            "status": "ok", "reps": len(secs), "sets": sets, "timer": "CUDA events, 256 MB L2 flush before each rep",
            "us_median": med * 1e6, "us_p10": quantile(secs, 0.1) * 1e6,
            "us_p90": quantile(secs, 0.9) * 1e6, "us_min": secs[0] * 1e6, "us_max": secs[-1] * 1e6,
            "note": "; ".join(note) or None,
        })
        pt = peaks["compute_tflops"] if peaks else 0.0
        pb = peaks["mem_gbps"] if peaks else 0.0
        rl = roofline(row["flops"], row["bytes"], med, pt, pb)
        row["tflops"], row["gbps"] = rl["tflops"], rl["gbps"]
        if peaks:
            row.update({"bound": rl["bound"], "fraction": rl["fraction"],
                        "peak_tflops": pt, "peak_gbps": pb})
        rows.append(row)
        time.sleep(args.pause)
    del data, expanded
    torch.cuda.empty_cache()
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes-json", default=os.path.join(HERE, "shapes.json"))
    ap.add_argument("--shapes", default="P1,P2,P3,P4,D1,D2,D3,D4",
                    help="groups or case ids, comma-separated, or all")
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "f16"])
    ap.add_argument("--backends", default="flash,cudnn")
    ap.add_argument("--out", default="reference_sdpa.json")
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--min-reps", type=int, default=20)
    ap.add_argument("--max-reps", type=int, default=1000)
    ap.add_argument("--budget", type=float, default=0.5, help="seconds of timed reps per row")
    ap.add_argument("--sets", type=int, default=0, help="input sets (default: span 256 MB, 2..8)")
    ap.add_argument("--max-gb", type=float, default=0.0, help="default: 80%% of free memory")
    ap.add_argument("--pause", type=float, default=0.1, help="seconds between rows")
    ap.add_argument("--copy-gib", type=int, default=4)
    ap.add_argument("--gemm", type=int, default=8192)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--list", action="store_true", help="print the selected cases and exit")
    args = ap.parse_args()

    with open(args.shapes_json) as fh:
        cases = select(json.load(fh), args.shapes)
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    for b in backends:
        if b not in ("flash", "cudnn"):
            sys.exit(f"unknown SDPA backend '{b}'; valid: flash, cudnn")
    if args.list:
        for c in cases:
            print(c["id"], c["shape"], why_not(c, "auto") or "")
        return

    import torch
    import torch.nn.functional as F
    if not torch.cuda.is_available():
        sys.exit("no CUDA device: this reference runs on the GPU")
    tdt = {"bf16": torch.bfloat16, "f16": torch.float16}[args.dtype]
    mach = machine(torch)
    device_name = torch.cuda.get_device_name()
    print("machine:", mach["gpu"], mach["software"], flush=True)
    peaks = measure_peaks(torch, tdt, args)
    print(f"ceilings: {peaks['compute_tflops']:.0f} TFLOP/s, copy {peaks['mem_gbps']:.0f} GB/s, "
          f"read {peaks['read_gbps']:.0f} GB/s", flush=True)

    rows = []
    total = len(cases)
    t0 = time.time()
    for i, case in enumerate(cases):
        kvs = sorted({kv for _, kv in case["dtypes"]}) or ["auto"]
        first = len(rows)
        for kv in kvs:
            reason = why_not(case, kv)
            if reason:
                for b in backends:
                    r = blank_row(case, "torch-" + b, device_name, args.dtype, kv)
                    r["note"] = reason
                    rows.append(r)
                continue
            rows += run_case(torch, F, case, args.dtype, backends, peaks, args, device_name)
        done = rows[first:]
        summary = ", ".join(
            f"{r['backend']}/{r['kv_dtype']} {r['us_median']:.1f} us" if r["us_median"]
            else f"{r['backend']}/{r['kv_dtype']} {r['status']}"
            for r in done)
        print(f"[{i + 1}/{total} {time.time() - t0:5.0f}s] {case['id']}: {summary}",
              file=sys.stderr, flush=True)

    smi = nvidia_smi()
    if smi and mach["gpu"]:
        mach["gpu"]["clocks_after"] = smi[2]
    out = {
        "schema": SCHEMA,
        "generator": "benches/reference_sdpa.py",
        "command": " ".join(["reference_sdpa.py"] + sys.argv[1:]),
        "machine": mach,
        "peaks": [peaks],
        "rows": rows,
    }
    d = os.path.dirname(os.path.abspath(args.out))
    os.makedirs(d, exist_ok=True)
    with open(args.out, "w") as fh:
        json.dump(out, fh, indent=1)
        fh.write("\n")
    print(f"wrote {args.out} ({sum(r['status'] == 'ok' for r in rows)} timed rows)")


if __name__ == "__main__":
    main()
