"""Benchmark dlrun against PyTorch eager and JAX: same workloads, weights, data and optimizer.

    python benchmarks/run.py [--rounds 3] [--repeats 5] [--threads 2] [--only spiral,mlp]
    python benchmarks/run.py --device gpu      # CuPy against PyTorch CUDA, GPU-sized workloads

On the CPU, JAX (the optional ``jax`` extra) is a third column: the training step compiled with
``jax.jit`` and called once per batch (benchmarks/bench_jax.py); without JAX the column says
so. JAX dispatches asynchronously, so its Python loop and its compiled step may overlap on two
cores even at ``--threads 1``: ``--clock cpu`` counts both.

Every configuration runs in its own process (numpy and torch never share one), interleaved
over rounds; each process does one untimed warm-up run, then ``--repeats`` timed runs. The
table shows the median of the per-round medians and the min-max over all timed runs.
Results go to benchmarks/results/bench-<timestamp>.{json,md}.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
from datetime import datetime
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]
from workloads import CPU_DEFAULT, GPU_DEFAULT, WORKLOADS  # noqa: E402


def spawn(args: list[str], threads: int, worker: Path = HERE / "worker.py") -> dict:
    """Run ``worker`` (this checkout's, or another's: it imports the dlrun beside it) with ``args``."""
    env = dict(os.environ)
    for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        env[k] = str(threads)
    p = subprocess.run([sys.executable, str(worker), *args], env=env, capture_output=True, text=True)
    if p.returncode != 0:
        tail = (p.stderr.strip().splitlines() or ["?"])[-1]
        return {"available": False, "reason": f"worker failed: {tail}"}
    return json.loads(p.stdout.strip().splitlines()[-1])


def gpu_info() -> dict:
    probe = subprocess.run([sys.executable, "-c", "import cupy; r = cupy.cuda.runtime; "
                            "print(r.getDeviceProperties(0)['name'].decode(), r.runtimeGetVersion(), cupy.__version__)"],
                           capture_output=True, text=True)
    if probe.returncode != 0:
        return {"gpu": "no CuPy/CUDA device"}
    name, runtime, version = probe.stdout.strip().rsplit(" ", 2)
    return {"gpu": name, "cuda_runtime": runtime, "cupy": version}


def machine(threads: int) -> dict:
    info = {"python": platform.python_version(), "platform": platform.platform(), "cores": os.cpu_count(),
            "threads": threads}
    try:
        cpu = Path("/proc/cpuinfo").read_text()
        info["cpu"] = next(l.split(":", 1)[1].strip() for l in cpu.splitlines() if l.startswith("model name"))
        flags = next(l for l in cpu.splitlines() if l.startswith("flags"))
        info["isa"] = " ".join(f for f in ("avx2", "fma", "avx512f", "amx_tile") if f" {f}" in flags)
        mem = Path("/proc/meminfo").read_text().splitlines()[0].split()[1]
        info["memory_gib"] = round(int(mem) / 2**20, 1)
    except (OSError, StopIteration):
        pass
    import numpy as np

    info["numpy"] = np.__version__
    try:
        blas = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
        info["numpy_blas"] = f"{blas.get('name')} {blas.get('version')}"
    except Exception:  # older numpy: no dict mode
        info["numpy_blas"] = "unknown"
    probe = subprocess.run([sys.executable, "-c", "import torch; print(torch.__version__); "
                            "print(torch.backends.mkl.is_available(), torch.backends.mkldnn.is_available())"],
                           capture_output=True, text=True)
    lines = probe.stdout.split("\n")
    info["torch"] = lines[0] if probe.returncode == 0 else "not installed"
    jax = subprocess.run([sys.executable, "-c", "import jax; print(jax.__version__)"], capture_output=True, text=True)
    info["jax"] = jax.stdout.strip() if jax.returncode == 0 else "not installed"
    if probe.returncode == 0:
        mkl, dnn = lines[1].split()
        info["torch_blas"] = ("MKL" if mkl == "True" else "no MKL") + (", oneDNN" if dnn == "True" else "")
    try:
        info["load_average_at_start"] = os.getloadavg()
    except OSError:
        pass
    return info


def summarise(samples_by_round: list[list[float]]) -> dict:
    flat = [t for r in samples_by_round for t in r]
    return {"median": statistics.median(statistics.median(r) for r in samples_by_round),
            "min": min(flat), "max": max(flat), "samples": samples_by_round}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", choices=["cpu", "gpu"], default="cpu",
                    help="gpu: dlrun on CuPy against torch on CUDA (default workloads: " + ",".join(GPU_DEFAULT) + ")")
    ap.add_argument("--only", default=None,
                    help="comma-separated workloads (" + ", ".join([*WORKLOADS, "gradcheck"]) + ")")
    ap.add_argument("--clock", choices=["wall", "cpu"], default="wall",
                    help="tabulate wall time (default) or process CPU time (steadier on a busy machine at 1 thread)")
    ap.add_argument("--out", type=Path, default=HERE / "results")
    a = ap.parse_args()
    gpu = a.device == "gpu"
    only = a.only or ",".join(GPU_DEFAULT if gpu else [*CPU_DEFAULT, "gradcheck"])
    names = [n for n in only.split(",") if n]
    dev = ["--device", a.device]
    info = machine(a.threads)
    info["device"] = a.device
    if gpu:
        info.update(gpu_info())
    print(f"machine: {info.get('cpu')} x{info['cores']}, numpy {info['numpy']} ({info['numpy_blas']}), "
          f"torch {info['torch']}, {a.threads} threads" + (f", GPU {info['gpu']}" if gpu else ""), flush=True)
    peaks = {}
    key = "gflops" if a.clock == "wall" else "gflops_cpu"  # per CPU-second when timing CPU time
    for lib in ("numpy", "torch"):
        r = [spawn(["gemm", lib, *dev], a.threads) for _ in range(a.rounds)]
        ok = [x[key] for x in r if key in x]
        peaks[lib] = statistics.median(statistics.median(x) for x in ok) if ok else None
        label = ("cupy" if lib == "numpy" else "torch cuda") if gpu else lib
        print(f"float32 {'8192' if gpu else '2048'}^3 GEMM peak, {label}: {peaks[lib] and round(peaks[lib], 1)} GFLOP/s",
              flush=True)
    raw: dict = {n: {} for n in names}
    impls = {n: (["dlrun"] if n == "gradcheck" else ["dlrun", "torch"] + ([] if gpu else ["jax"])) for n in names}
    for n in names:  # the hand-written numpy floor (benchmarks/bench_numpy.py) where one exists
        if n == "spiral" and not gpu:
            impls[n].append("numpy")
    for rnd in range(a.rounds):
        for n in names:
            for impl in impls[n]:
                args = ["gradcheck"] if n == "gradcheck" else ["train", impl, n]
                res = spawn(args + ["--repeats", str(a.repeats if n != "gradcheck" else max(1, a.repeats // 2)), *dev],
                            a.threads)
                raw[n].setdefault(impl, []).append(res)
                state = f"{statistics.median(res['times']) * 1e3:.1f} ms" if res.get("available") else res["reason"]
                print(f"round {rnd + 1}/{a.rounds} {n:<10} {impl:<6} {state}", flush=True)
    rows = []
    for n in names:
        row = {"workload": n, "title": WORKLOADS[n].title if n in WORKLOADS else "`dlrun gradcheck --all` (whole command, child process)"}
        for impl, results in raw[n].items():
            ok = [r for r in results if r.get("available")]
            if not ok:
                row[impl] = {"available": False, "reason": results[0]["reason"]}
                continue
            s = summarise([r["times" if a.clock == "wall" else "cpu_times"] for r in ok])
            s.update(available=True, rss_mib=max(r["rss_mib"] for r in ok), final_loss=ok[-1].get("final_loss"))
            if gpu and all("gpu_mib" in r for r in ok):
                s["gpu_mib"] = max(r["gpu_mib"] for r in ok)
            flops = next((r.get("gemm_flops") for r in raw[n].get("dlrun", []) if r.get("gemm_flops")), None)
            if flops:
                s["gemm_gflops"] = flops / s["median"] / 1e9
                peak = peaks["torch" if impl == "torch" else "numpy"]
                s["percent_of_peak"] = 100 * s["gemm_gflops"] / peak if peak else None
            row[impl] = s
        d, t = row.get("dlrun", {}), row.get("torch", {})
        if d.get("available") and t.get("available"):
            row["time_ratio"] = d["median"] / t["median"]
            row["rss_ratio"] = d["rss_mib"] / t["rss_mib"]
            if "gpu_mib" in d and t.get("gpu_mib"):
                row["gpu_mem_ratio"] = d["gpu_mib"] / t["gpu_mib"]
            j = row.get("jax", {})
            if j.get("available"):
                row["jax_ratio"] = d["median"] / j["median"]
            h = row.get("numpy", {})
            if h.get("available"):
                row["numpy_ratio"] = h["median"] / t["median"]
                row["dlrun_over_numpy"] = d["median"] / h["median"]
        rows.append(row)
    result = {"when": datetime.now().isoformat(timespec="seconds"), "machine": info, "gemm_peak_gflops": peaks,
              "rounds": a.rounds, "repeats": a.repeats, "clock": a.clock, "rows": rows, "raw": raw}
    a.out.mkdir(parents=True, exist_ok=True)
    stem = a.out / f"bench-{datetime.now():%Y%m%d-%H%M%S}"
    stem.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    md = markdown(result)
    stem.with_suffix(".md").write_text(md)
    print(md)
    print(f"wrote {stem}.json and {stem}.md")


def _cell(s: dict) -> str:
    if not s.get("available"):
        return s.get("reason", "not available")
    return f"{s['median'] * 1e3:.1f} ({s['min'] * 1e3:.1f}-{s['max'] * 1e3:.1f})"


def _gf(s: dict) -> str:
    if not s.get("gemm_gflops"):
        return "-"
    pct = s.get("percent_of_peak")
    return f"{s['gemm_gflops']:.1f}" + (f" ({pct:.1f}%)" if pct else "")


def markdown(r: dict) -> str:
    m = r["machine"]
    peaks = r["gemm_peak_gflops"]
    gpu = m.get("device") == "gpu"
    mem, mem_ratio, mem_name = ("gpu_mib", "gpu_mem_ratio", "GPU MiB") if gpu else ("rss_mib", "rss_ratio", "RSS MiB")
    title = "PyTorch CUDA eager" if gpu else "PyTorch CPU eager and JAX jit"
    lines = [f"# dlrun vs {title} ({r['when']})", "",
             f"- machine: {m.get('cpu')}, {m['cores']} cores ({m.get('isa', '')}), {m.get('memory_gib')} GiB, {m['platform']}",
             f"- Python {m['python']}; numpy {m['numpy']} ({m['numpy_blas']}); torch {m['torch']} ({m.get('torch_blas', '-')})"
             + ("" if gpu else f"; JAX {m.get('jax', 'not recorded')} (jax.jit of the training step, called per batch)")]
    if gpu:
        lines += [f"- GPU: {m.get('gpu')}; CuPy {m.get('cupy')} (CUDA runtime {m.get('cuda_runtime')}); float32 "
                  "without TF32 on both sides; data moved to the GPU once before timing; timings synchronize",
                  f"- float32 8192^3 GEMM peak: cupy {peaks['numpy'] and round(peaks['numpy'])} GFLOP/s, "
                  f"torch {peaks['torch'] and round(peaks['torch'])} GFLOP/s",
                  "- memory: dlrun = CuPy memory pool size after the runs (emptied before each), torch = torch.cuda.max_memory_allocated"]
    else:
        lines += [f"- {m['threads']} threads (OMP/OPENBLAS/MKL_NUM_THREADS, torch.set_num_threads); "
                  f"load average at start {tuple(round(x, 2) for x in m.get('load_average_at_start', ()))}",
                  f"- float32 2048^3 GEMM peak: numpy {peaks['numpy'] and round(peaks['numpy'], 1)} GFLOP/s, "
                  f"torch {peaks['torch'] and round(peaks['torch'], 1)} GFLOP/s"]
    jax = not gpu
    lines += [f"- {r['rounds']} interleaved rounds x (1 warm-up + {r['repeats']} timed runs), each configuration in its "
              f"own process; {r.get('clock', 'wall')} times in ms: median of per-round medians (min-max over all runs)",
              "",
              "| workload | dlrun ms | torch ms | dlrun/torch | " + ("jax ms | dlrun/jax | " if jax else "")
              + f"dlrun {mem_name} | torch {mem_name} | memory ratio | GEMM GFLOP/s dlrun (% peak) | torch (% peak) "
              f"| final loss dlrun / torch{' / jax' if jax else ''} |",
              "|---|---|---|---|" + ("---|---|" if jax else "") + "---|---|---|---|---|---|"]
    for row in r["rows"]:
        d, t = row.get("dlrun", {}), row.get("torch", {"available": False, "reason": "-"})
        j = row.get("jax", {"available": False, "reason": "-"})
        ratio = f"{row['time_ratio']:.2f}" if "time_ratio" in row else "-"
        m_ratio = f"{row[mem_ratio]:.2f}" if mem_ratio in row else "-"
        losses = [s.get("final_loss") for s in ((d, t, j) if jax else (d, t))]
        loss = " / ".join("-" if v is None else f"{v:.6g}" for v in losses) if losses[0] is not None else "-"
        jcells = f"{_cell(j)} | {row['jax_ratio']:.2f} | " if "jax_ratio" in row else f"{_cell(j)} | - | "
        lines.append(f"| {row['title']} | {_cell(d)} | {_cell(t)} | {ratio} | " + (jcells if jax else "")
                     + f"{d.get(mem, 0):.0f} | {t.get(mem, 0) and round(t[mem])} | {m_ratio} | "
                     f"{_gf(d)} | {_gf(t)} | {loss} |")
    floors = [row for row in r["rows"] if "numpy_ratio" in row]
    if floors:
        lines += ["", "Hand-written numpy loop (benchmarks/bench_numpy.py: no framework, no accuracy, no NaN guard), "
                  "the floor for numpy on this machine:", "",
                  "| workload | numpy ms | numpy/torch | dlrun/numpy | final loss numpy |", "|---|---|---|---|---|"]
        for row in floors:
            h = row["numpy"]
            lines.append(f"| {row['title']} | {_cell(h)} | {row['numpy_ratio']:.2f} | {row['dlrun_over_numpy']:.2f} | "
                         f"{h['final_loss']:.6g} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
