"""FSDP2 benchmark driver: configs x modes x repetitions, each run in its own
`torchrun --standalone` process (FSDP2 state lives in reference cycles, so
modes sharing a process would leak memory into each other), repetitions
interleaved (rep 0 of every config and mode, then rep 1, ...; the mode order
rotates each rep so no mode always runs first).

    python bench/fsdp2/run.py                                   # the issue's configs, all modes, 3 reps
    python bench/fsdp2/run.py --configs 3.5b-b2s2048 --modes stock,symm --reps 5
    python bench/fsdp2/run.py --merge a.json b.json --out all.json

Writes the JSON after every finished run (a killed job keeps what it had),
then a PNG next to it and a table. Exit status 1 if a run failed (or, with
--loss-rtol, if a mode's losses differ from stock's beyond it). Refuses a
tree whose tracked files differ from its commit unless --allow-dirty
(bench/provenance.py).
"""

from __future__ import annotations

import argparse
import collections
import datetime
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
BENCH = os.path.dirname(HERE)
ROOT = os.path.dirname(BENCH)
sys.path.insert(0, HERE)
sys.path.append(BENCH)

import aggregate  # noqa: E402
import provenance  # noqa: E402  (bench/)
from configs import ISSUE_CONFIGS, MODE_ENV, MODES, config_name, parse_config, parse_modes  # noqa: E402

# NVLink multicast must stay off on the shared GPU hosts (scripts/env.sh):
# set in every child whatever the caller's environment says.
MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1",
                 "SYMMPOOL_DISABLE_MULTICAST": "1"}
ENV_OF_NOTE = ("NCCL_", "SYMMPOOL_", "TORCH_NCCL_", "TORCH_SYMM_MEM_", "NVSHMEM_", "CUDA_VISIBLE_DEVICES",
               "PYTORCH_CUDA_ALLOC_CONF", "GLIBC_TUNABLES", "MALLOC_")
# FSDP2's reduce-scatter copy-in (torch._chunk_cat) builds its kernel's
# metadata on the host in vectors of megabytes per call (8 bytes per 2 KiB of
# gradient). glibc serves blocks that big with a fresh mmap unless its dynamic
# threshold has risen past them, which depends on each process's history: a
# run either reuses heap memory or faults in every page every call (17,673
# faults and +45 ms of backward CPU per step on wide4b, in stock runs as in
# flag-mode ones). Keeping such blocks in the heap in every mode makes runs
# comparable; --glibc-malloc default measures without it.
MALLOC_KEEPS_BUFFERS = "glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=4294967296"
LOG_TAIL_CHARS = 4000


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--configs", help=f"comma-separated <preset>-b<batch>s<seq>; default: {','.join(ISSUE_CONFIGS)}")
    p.add_argument("--preset", "--model", dest="preset", help="one config from a preset (instead of --configs)")
    p.add_argument("--batch", type=int, help="with --preset (default 2)")
    p.add_argument("--seq", type=int, help="with --preset (default 1024)")
    p.add_argument("--modes", default=",".join(MODES), help=f"comma-separated, of {', '.join(MODES)}")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--steps", type=int, default=30, help="measured steps per run")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--profile-steps", type=int, default=3, help="profiled steps after the measured ones; 0: none")
    p.add_argument("--host-ops", action="store_true",
                   help="the profiled steps also record CPU ops: the ops that took the host longest, per step")
    p.add_argument("--keep-traces", action="store_true",
                   help="keep every rank's profiler trace in the log directory (<run>.rank<N>.json.gz)")
    p.add_argument("--host-threads", action="store_true",
                   help="each thread's CPU and run-queue time per measured step (perturbs a host-bound step)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--memory-trace", type=int, default=0, metavar="STEPS",
                   help="record memory around each FSDP2 all-gather and reduce-scatter of the first STEPS "
                        "steps (in each run's record; docs/fsdp2_flag_memory.md)")
    p.add_argument("--deterministic", action="store_true",
                   help="deterministic kernels in every run (for loss comparisons; may cost speed)")
    p.add_argument("--compile", nargs="?", const="inductor", metavar="BACKEND",
                   help="torch.compile every block in every run, as torchtitan does (default backend: inductor): "
                        "fewer, fused kernels to launch, for shapes host-bound in eager mode")
    p.add_argument("--nproc", type=int, help="processes per run (default: every visible GPU; 2 with --device cpu)")
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--out", "--json", dest="out",
                   help="result JSON (default: <out-dir>/fsdp2_<gpu>x<N>_<date>.json, a letter added if taken)")
    p.add_argument("--out-dir", default=os.path.join(ROOT, "bench", "results"))
    p.add_argument("--log-dir", help="every run's output (default: a new directory under /tmp)")
    p.add_argument("--run-timeout", type=float, default=300, help="seconds before a run is killed")
    p.add_argument("--time-budget", type=float,
                   help="seconds: launch no run that would likely end past it (estimated from finished runs)")
    p.add_argument("--loss-rtol", type=float, help="fail if a mode's losses differ from stock's beyond this")
    p.add_argument("--glibc-malloc", choices=["keep", "default"], default="keep",
                   help="keep: every run's malloc keeps blocks up to 32 MiB in its heap (GLIBC_TUNABLES, added to the "
                        "caller's unless it sets a malloc threshold), so no run pays page faults another does "
                        "not; default: GLIBC_TUNABLES as the caller set it")
    p.add_argument("--no-plot", action="store_true")
    provenance.add_allow_dirty(p)
    p.add_argument("--merge", nargs="+", metavar="JSON",
                   help="combine result files into --out, each file's context kept in runs_context; runs nothing")
    args = p.parse_args(argv)
    try:
        if args.merge:
            if not args.out:
                p.error("--merge needs --out")
            return args
        if args.configs and (args.preset or args.batch or args.seq):
            p.error("give --configs or --preset/--batch/--seq, not both")
        if args.preset or args.batch or args.seq:
            args.configs = [parse_config(config_name(args.preset or "1b", args.batch or 2, args.seq or 1024))]
        else:
            args.configs = [parse_config(c.strip()) for c in (args.configs or ",".join(ISSUE_CONFIGS)).split(",")
                            if c.strip()]
        args.modes = parse_modes(args.modes)
    except ValueError as e:
        p.error(str(e))
    if args.reps < 1 or args.steps < 1 or args.warmup < 0 or args.profile_steps < 0 or args.memory_trace < 0:
        p.error("--reps and --steps must be >= 1, --warmup, --profile-steps and --memory-trace >= 0")
    if args.device == "cpu" and args.modes != ["stock"]:
        p.error("--device cpu runs the stock mode only (--modes stock)")
    return args


def probe() -> dict:
    """GPU model and count, torch, NCCL and CUDA versions
    (provenance.torch_versions), asked in a child process: the driver itself
    must hold no CUDA context (it would use memory on GPU 0 that rank 0's
    mem_get_info counts)."""
    code = f"import json, sys; sys.path.insert(0, {BENCH!r}); import provenance; " \
           "print(json.dumps(provenance.torch_versions()))"
    return json.loads(subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                                     text=True).stdout.strip().splitlines()[-1])


def short_gpu_name(name: str | None) -> str:
    """"NVIDIA H200" -> "h200"; no GPU -> "cpu"."""
    if not name or name == "none":
        return "cpu"
    words = [w for w in name.lower().replace("nvidia", "").split() if w]
    return "".join(c for c in (words[0] if words else "gpu") if c.isalnum())


def default_out(out_dir: str, gpu: str, ranks: int) -> str:
    stem = f"fsdp2_{gpu}x{ranks}_{datetime.date.today().isoformat()}"
    for suffix in [""] + [chr(c) for c in range(ord("b"), ord("z") + 1)]:
        path = os.path.join(out_dir, f"{stem}{suffix}.json")
        if not os.path.exists(path):
            return path
    raise SystemExit(f"every name {stem}[b-z].json in {out_dir} is taken; give --out")


def plan(configs, modes, reps) -> list[tuple[int, object, str]]:
    """(rep, config, mode): reps outermost so a cut-short job has every
    config and mode at least once; the mode order rotates by rep."""
    return [(rep, config, modes[(i + rep) % len(modes)])
            for rep in range(reps) for config in configs for i in range(len(modes))]


def child_env(mode: str, deterministic: bool = False, keep_malloc_buffers: bool = True) -> dict:
    env = dict(os.environ)
    if keep_malloc_buffers:
        theirs = env.get("GLIBC_TUNABLES", "")
        if "glibc.malloc.mmap_threshold" not in theirs:  # a caller's own threshold wins
            env["GLIBC_TUNABLES"] = f"{theirs}:{MALLOC_KEEPS_BUFFERS}" if theirs else MALLOC_KEEPS_BUFFERS
    if deterministic:
        env["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"  # cuBLAS's condition for deterministic GEMMs
    env.pop("SYMMPOOL_COLLECTIVES", None)
    if MODES[mode][2] is not None:
        env["SYMMPOOL_COLLECTIVES"] = MODES[mode][2]
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)  # each mode's allocator is its own
    env.update(MODE_ENV.get(mode, {}))
    env.update(MULTICAST_OFF)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def run_env(mode: str, args) -> dict:
    """child_env for one run of this invocation."""
    return child_env(mode, args.deterministic, args.glibc_malloc == "keep")


def launch(rep: int, config, mode: str, args, log_dir: str, timeout: float) -> dict:
    """One torchrun; a record for aggregate.py, whatever happened."""
    stem = f"{config.name}_{mode}_rep{rep}"
    out = os.path.join(log_dir, stem + ".json")
    log = os.path.join(log_dir, stem + ".log")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={args.nproc}",
           os.path.join(HERE, "worker.py"), "--preset", config.preset, "--batch", str(config.batch),
           "--seq", str(config.seq), "--mode", mode, "--steps", str(args.steps), "--warmup", str(args.warmup),
           "--profile-steps", str(args.profile_steps), "--seed", str(args.seed), "--device", args.device,
           "--out", out] + (["--deterministic"] if args.deterministic else []) + (
               ["--compile", args.compile] if args.compile else []) + (
               ["--memory-trace", str(args.memory_trace)] if args.memory_trace else []) + (
               ["--host-ops"] if args.host_ops else []) + (["--host-threads"] if args.host_threads else []) + (
               ["--keep-trace", os.path.join(log_dir, stem)] if args.keep_traces else [])
    record = {"config": config.name, "mode": mode, "rep": rep, "returncode": None, "reason": None,
              "log": log, "log_tail": None, "result": None}
    start = time.monotonic()
    with open(log, "w") as f:
        f.write(" ".join(cmd) + "\n")
        f.flush()
        proc = subprocess.Popen(cmd, env=run_env(mode, args), stdout=f, stderr=subprocess.STDOUT, cwd=HERE,
                                start_new_session=True)  # its own process group: a timeout kills every rank
        try:
            record["returncode"] = proc.wait(timeout=timeout)
            timed_out = False
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill_group(proc)
            record["returncode"] = proc.returncode
    record["wall_s"] = round(time.monotonic() - start, 1)
    if os.path.exists(out):
        with open(out) as f:
            record["result"] = json.load(f)
    problems = (record["result"] or {}).get("mode_problems") or []
    if timed_out:
        record.update(status="timeout", reason=f"killed after {timeout:.0f} s")
    elif record["returncode"] != 0 or record["result"] is None or problems:
        record.update(status="failed", reason="; ".join(problems) or
                      (f"exit code {record['returncode']}" if record["returncode"] else "the worker wrote no result"))
    else:
        record["status"] = "ok"
    if record["status"] != "ok":
        with open(log, errors="replace") as f:
            record["log_tail"] = f.read()[-LOG_TAIL_CHARS:]
    return record


def _kill_group(proc: subprocess.Popen) -> None:
    for sig, wait in ((signal.SIGTERM, 15), (signal.SIGKILL, 15)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def estimate_s(config, records: list[dict]) -> float:
    """A run's likely wall time: the mean of this config's finished runs, else
    the longest run so far, else 0 (nothing to go by)."""
    same = [r["wall_s"] for r in records if r["config"] == config.name]
    if same:
        return statistics.mean(same)
    return max((r["wall_s"] for r in records), default=0.0)


def document(context: dict, records: list[dict], not_run: list[dict]) -> dict:
    ok = [r for r in records if r["status"] == "ok"]
    if ok:  # versions as the workers saw them
        worker_ctx = ok[0]["result"]["context"]
        context.update({k: worker_ctx[k] for k in ("torch", "cuda", "nccl") if worker_ctx.get(k) is not None})
        context["ranks"] = ok[0]["result"]["world"]
    return {"context": context, "configs": aggregate.aggregate(records), "not_run": not_run, "records": records}


def write_json(path: str, doc: dict) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=1)
    os.replace(tmp, path)  # a reader never sees half a file


def report(doc: dict, path: str, loss_rtol: float | None, plot: bool) -> int:
    for config in doc["configs"]:
        print()
        print(aggregate.table(config))
    failures = aggregate.failure_lines(doc["configs"])
    for line in failures:
        print("FAILED:", line)
    for line in aggregate.profile_error_lines(doc["configs"]):
        print("WARNING:", line)
    for line in aggregate.host_bound_lines(doc["configs"]):
        print("HOST-BOUND:", line)
    for n in doc.get("not_run", []):
        print(f"NOT RUN: {n['config']} {n['mode']} rep {n['rep']}: {n['reason']}")
    problems = aggregate.loss_problems(doc["configs"], loss_rtol) if loss_rtol is not None else []
    for line in problems:
        print("LOSSES DIFFER:", line)
    if loss_rtol is not None and not problems:
        print(f"losses agree with stock within {loss_rtol:g} relative")
    print(f"results: {path}")
    if plot:
        try:
            import plot as plot_module
            print(f"plot: {plot_module.plot(path)}")
        except ImportError as e:
            print(f"no plot ({e}); pip install matplotlib, then python {HERE}/plot.py {path}")
    return 1 if failures or problems else 0


def merge_keys(context: dict) -> dict:
    """What runs must share to be aggregated as one (config, mode): the
    machine, compiled or not, and the malloc they ran with (files from before
    a key existed read None for it, which is what they ran with; their "gpu"
    was the short name)."""
    return {"gpu": short_gpu_name(context.get("gpu")), "ranks": context.get("ranks"), "device": context.get("device"),
            "compile": context.get("compile"), "GLIBC_TUNABLES": context.get("env", {}).get("GLIBC_TUNABLES")}


def merge(paths: list[str], out: str) -> dict:
    docs = []
    for path in paths:
        with open(path) as f:
            docs.append(json.load(f))
    first = docs[0]["context"]
    shared = merge_keys(first)
    for path, doc in zip(paths, docs):
        for key, value in merge_keys(doc["context"]).items():
            if value != shared[key]:
                raise SystemExit(f"cannot merge {path}: its {key} is {value!r}, {paths[0]}'s is {shared[key]!r}")
    records, not_run, merged_from, dates = [], [], [], set()
    for path, doc in zip(paths, docs):
        source = os.path.basename(path)
        records += [dict(r, source=r.get("source", source)) for r in doc["records"]]
        not_run += doc.get("not_run", [])
        # A merged file names the files it came from, not itself.
        merged_from += doc["context"].get("merged_from", [source])
        dates.update(doc["context"].get("dates", [doc["context"].get("date")]))
    # A repetition one file could not run is not missing once another file supplies it.
    ran = collections.Counter((r["config"], r["mode"]) for r in records if r.get("status") == "ok")
    not_run = [n for n in not_run if ran[(n["config"], n["mode"])] <= n["rep"]]
    # Each source's own context (commit, tree, host, date...) in runs_context,
    # found by a record's "source"; the top-level keys say "mixed" where they differ.
    kept = provenance.merged([(os.path.basename(p), d["context"]) for p, d in zip(paths, docs)])
    context = dict(first, **kept, merged_from=merged_from, dates=sorted(d for d in dates if d))
    doc = {"context": context, "configs": aggregate.aggregate(records), "not_run": not_run, "records": records}
    write_json(out, doc)
    return doc


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.merge:
        doc = merge(args.merge, args.out)
        return report(doc, args.out, args.loss_rtol, not args.no_plot)

    tree = provenance.require_clean_tree(args.allow_dirty)
    info = probe()
    if args.device == "cuda" and info["gpus"] < 1:
        raise SystemExit("run.py: no CUDA GPU visible (--device cpu runs the stock mode on CPU)")
    args.nproc = args.nproc or (info["gpus"] if args.device == "cuda" else 2)
    if args.device == "cuda" and args.nproc > info["gpus"]:
        raise SystemExit(f"run.py: --nproc {args.nproc} but only {info['gpus']} GPUs are visible")
    gpu = short_gpu_name(info["gpu"] if args.device == "cuda" else None)
    os.makedirs(args.out_dir, exist_ok=True)
    path = args.out or default_out(args.out_dir, gpu, args.nproc)
    # absolute: the children run in bench/fsdp2 and write their results here
    log_dir = os.path.abspath(args.log_dir or tempfile.mkdtemp(prefix="fsdp2_bench_"))
    os.makedirs(log_dir, exist_ok=True)
    if "SYMMPOOL_COLLECTIVES" in os.environ:
        print(f"run.py: SYMMPOOL_COLLECTIVES={os.environ['SYMMPOOL_COLLECTIVES']} from the environment is "
              "ignored: each mode sets its own", file=sys.stderr)
    context = {
        **provenance.collect(versions=info, state=tree), "ranks": args.nproc, "device": args.device,
        "env": {k: v for k, v in sorted(run_env("stock", args).items()) if k.startswith(ENV_OF_NOTE)},
        "command": [os.path.relpath(sys.argv[0], ROOT)] + sys.argv[1:] if argv is None else ["run.py"] + argv,
        "steps": args.steps, "warmup": args.warmup, "compile": args.compile, "profile_steps": args.profile_steps, "seed": args.seed,
        "modes": args.modes, "log_dir": log_dir,
    }
    runs = plan(args.configs, args.modes, args.reps)
    print(f"run.py: {len(runs)} runs on {args.nproc} x {info['gpu'] if args.device == 'cuda' else 'cpu'}; "
          f"logs in {log_dir}; results in {path}", flush=True)
    records, not_run, began = [], [], time.monotonic()
    for k, (rep, config, mode) in enumerate(runs, 1):
        timeout = args.run_timeout
        if args.time_budget is not None:
            left = args.time_budget - (time.monotonic() - began)
            if estimate_s(config, records) > left or left <= 0:
                not_run += [{"config": c.name, "mode": m, "rep": r,
                             "reason": f"time budget of {args.time_budget:.0f} s"} for r, c, m in runs[k - 1:]]
                print(f"run.py: time budget: {len(runs) - k + 1} runs not started", flush=True)
                break
            timeout = min(timeout, left)
        record = launch(rep, config, mode, args, log_dir, timeout)
        records.append(record)
        write_json(path, document(context, records, not_run))
        print(f"[{k}/{len(runs)}] {_summary(record)}", flush=True)
    write_json(path, document(context, records, not_run))
    with open(path) as f:
        return report(json.load(f), path, args.loss_rtol, not args.no_plot)


def _summary(record: dict) -> str:
    head = f"{record['config']} {record['mode']} rep {record['rep']}: "
    if record["status"] != "ok":
        return head + f"{record['status'].upper()} ({record['reason']}, {record['wall_s']} s; log {record['log']})"
    rep = aggregate.per_rep(record["result"])
    peak = rep["device_peak_bytes"]
    phases = record["result"]["ranks"][0].get("phases_s") or {}  # rank 0's: where the wall time went
    split = ", ".join(f"{name[:-2]} {seconds:.1f}" for name, seconds in phases.items())
    return head + (f"median step {statistics.median(rep['step_ms']):.1f} ms"
                   + (f", device peak {peak / aggregate.GIB:.2f} GiB" if peak else "")
                   + f", {record['wall_s']} s" + (f" ({split})" if split else ""))


if __name__ == "__main__":
    raise SystemExit(main())
