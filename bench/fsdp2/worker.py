"""One FSDP2 training run: one (config, mode, repetition), under torchrun.

    torchrun --standalone --nproc-per-node=2 bench/fsdp2/worker.py \
        --preset 3.5b --batch 2 --seq 2048 --mode symm --out result.json

run.py starts it once per (config, mode, repetition) and sets the mode's
SYMMPOOL_COLLECTIVES in its environment (it must be set before the "symm"
group exists); this file only records it. Rank 0 writes every rank's
measurements to --out.
"""

from __future__ import annotations

import time

STARTED = time.perf_counter()  # before torch's import: the process's own start-up counts

import argparse  # noqa: E402
import datetime  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.distributed.device_mesh import DeviceMesh  # noqa: E402
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard  # noqa: E402

from configs import INSTALLS_SYMMPOOL, MODES, PRESETS, config_name, model_fields, parse_config  # noqa: E402
import host_meter  # noqa: E402
import llama  # noqa: E402

try:  # every mode imports symmpool, so that every process looks the same
    import symmpool
    SYMMPOOL_IMPORT_ERROR = None
except ImportError as e:  # only stock modes can run without it (CPU tests on an unbuilt tree)
    symmpool, SYMMPOOL_IMPORT_ERROR = None, f"{type(e).__name__}: {e}"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", required=True, choices=sorted(PRESETS))
    p.add_argument("--batch", type=int, required=True)
    p.add_argument("--seq", type=int, required=True)
    p.add_argument("--mode", required=True, choices=list(MODES))
    p.add_argument("--steps", type=int, default=30, help="measured steps")
    p.add_argument("--warmup", type=int, default=5, help="steps before the measured ones, not measured")
    p.add_argument("--profile-steps", type=int, default=3,
                   help="steps after the measured ones, under the profiler, for exposed communication; 0: none")
    p.add_argument("--host-ops", action="store_true",
                   help="the profiled steps also record CPU ops (their host time per step, in the profile)")
    p.add_argument("--keep-trace", metavar="STEM",
                   help="keep each rank's profiler trace at STEM.rank<N>.json.gz (Chrome format)")
    p.add_argument("--host-threads", action="store_true",
                   help="each thread's CPU and run-queue time in the host part of every measured step (reading "
                        "/proc costs the host about a millisecond a step, outside the host time)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--compile", nargs="?", const="inductor", metavar="BACKEND",
                   help="torch.compile each block before sharding it, as torchtitan does (default backend: "
                        "inductor); FSDP2's hooks and collectives stay outside the compiled code")
    p.add_argument("--deterministic", action="store_true",
                   help="deterministic kernels (run.py also sets CUBLAS_WORKSPACE_CONFIG): for loss comparisons")
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                   help="cpu: gloo, stock mode only (tests without a GPU)")
    p.add_argument("--memory-trace", type=int, default=0, metavar="STEPS",
                   help="memory before and after each FSDP2 all-gather and reduce-scatter of the first STEPS steps")
    p.add_argument("--out", required=True, help="JSON file rank 0 writes")
    args = p.parse_args(argv)
    try:
        parse_config(config_name(args.preset, args.batch, args.seq))  # same checks as run.py
    except ValueError as e:
        p.error(str(e))
    if args.steps < 1 or args.warmup < 0 or args.profile_steps < 0 or args.memory_trace < 0:
        p.error("--steps must be >= 1, --warmup, --profile-steps and --memory-trace >= 0")
    if args.device == "cpu" and args.mode != "stock":
        p.error(f"mode {args.mode} needs CUDA; --device cpu runs the stock mode only")
    return args


def used_bytes(device) -> int | None:
    """Device memory in use as the device sees it (every allocator, the CUDA
    context, NCCL's buffers), not only torch's."""
    if device.type != "cuda":
        return None
    free, total = torch.cuda.mem_get_info(device)
    return total - free


def init_world(args, device) -> None:
    """The default group's CUDA backend is the mode's ("nccl" or "symm"), as a
    user switching to symmpool would write it: every mode then has exactly one
    NCCL communicator, so device memory compares like with like."""
    backend, _, _ = MODES[args.mode]
    if backend == "symm" and symmpool is None:
        raise SystemExit(f"mode {args.mode} needs symmpool, which does not import: {SYMMPOOL_IMPORT_ERROR}")
    if device.type == "cuda":
        dist.init_process_group(f"cpu:gloo,cuda:{backend}", device_id=device)
    else:
        dist.init_process_group("gloo")


def make_mesh(args, device) -> DeviceMesh:
    return DeviceMesh.from_group(dist.group.WORLD, device.type)


def build_model(args, mesh, device):
    model = llama.build_on_meta(args.preset, args.seq)
    if args.compile:
        llama.compile_blocks(model, args.compile)
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for block in model.layers:
        fully_shard(block, mesh=mesh, mp_policy=mp)
    fully_shard(model, mesh=mesh, mp_policy=mp)
    buffers = MODES[args.mode][1]
    if buffers == "flag":
        # what symmpool.allocate_fsdp_comm_buffers_from_symm does; here for "nccl" groups too
        for m in model.modules():
            if isinstance(m, FSDPModule):
                m.set_allocate_memory_from_process_group_for_comm(True)
    elif buffers == "hooks":
        if symmpool is None:
            raise SystemExit(f"mode {args.mode} needs symmpool, which does not import: {SYMMPOOL_IMPORT_ERROR}")
        symmpool.fsdp.enable(model)
    model.to_empty(device=device)
    model.init_weights(args.seed)
    return model


def symmpool_stats(device) -> dict | None:
    if symmpool is None or device.type != "cuda":
        return None
    return symmpool.memory_stats(device)


def run(args) -> dict:
    """This rank's measurements."""
    if args.mode in INSTALLS_SYMMPOOL:
        if symmpool is None or args.device != "cuda":
            raise SystemExit(f"mode {args.mode} needs symmpool and CUDA: {SYMMPOOL_IMPORT_ERROR or args.device}")
        symmpool.install()  # before CUDA's first allocation (set_device initialises torch's allocator)
    if args.device == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    if args.deterministic:
        # Some GEMMs vary between runs otherwise; torch only warns where an op
        # has no deterministic kernel, and the fused attention backwards
        # (flash, memory-efficient, cuDNN) are such ops: they accumulate with
        # atomics. Attention then runs as plain matmuls + softmax.
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.backends.cuda.enable_flash_sdp(False)
        torch.backends.cuda.enable_mem_efficient_sdp(False)
        torch.backends.cuda.enable_cudnn_sdp(False)
    # Seconds of each phase since the previous one: which part of a run's
    # wall time the steps are, and what start-up costs (for --time-budget).
    phases, mark = {"start_s": time.perf_counter() - STARTED}, time.perf_counter()

    def phase(name: str) -> None:
        nonlocal mark
        now = time.perf_counter()
        phases[name], mark = now - mark, now

    init_world(args, device)
    results_group = dist.new_group(backend="gloo")  # gathers results, never touches the GPU
    mesh = make_mesh(args, device)
    rank, world = dist.get_rank(), dist.get_world_size()
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    phase("init_s")
    baseline = used_bytes(device)  # before the model: context, communicators
    model = build_model(args, mesh, device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, fused=True)
    spec = PRESETS[args.preset]
    total_steps = args.warmup + args.steps + args.profile_steps
    data = torch.Generator(device="cpu").manual_seed(args.seed * 1000 + rank)
    # All batches made up front: no host RNG or host-to-device copy inside a step.
    tokens = torch.randint(0, spec.vocab, (total_steps, args.batch, args.seq + 1), generator=data).to(device)
    if device.type == "cuda":
        sync()
        torch.cuda.empty_cache()  # init made each full parameter once; start every mode from the same cache
        torch.cuda.reset_peak_memory_stats(device)
        if symmpool is not None:
            symmpool.reset_peak_memory_stats(device)
    losses, step_ms, host_ms, device_used = [], [], [], []
    meter = host_meter.StepHostMeter(threads=args.host_threads)  # why a host is slow
    trace = None
    if args.memory_trace:
        from memory_trace import MemoryTrace
        trace = MemoryTrace(device, args.memory_trace, used_bytes, symmpool_stats)
    sample = used_bytes if device.type == "cuda" else (lambda d: None)
    phase("build_s")

    def step(i: int, phases: bool) -> None:
        batch = tokens[i]
        logits = model(batch[:, :-1])
        if phases:
            device_used.append(sample(device))
        loss = F.cross_entropy(logits.float().reshape(-1, spec.vocab), batch[:, 1:].reshape(-1))
        loss.backward()
        if phases:
            device_used.append(sample(device))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.detach())
        if trace is not None:
            trace.step += 1

    def heap_exchanges():  # host round trips to the peers so far (None: no symmpool)
        stats = symmpool_stats(device)
        return stats.get("heap_exchanges") if stats else None

    exchanges_before = None
    for i in range(total_steps - args.profile_steps):
        measured = i >= args.warmup
        if i == args.warmup:
            exchanges_before = heap_exchanges()
        meter.start(measured)
        start = time.perf_counter()
        # Memory after forward and backward in warm-up only (the caches reach
        # their size there); measured steps sample once, outside the timing.
        step(i, phases=not measured)
        host_done = time.perf_counter()  # the host's part: every call of the step has returned
        meter.host_done()  # after the host time; in the step's only where the GPU is not behind
        sync()
        end = time.perf_counter()
        meter.step_done()
        device_used.append(sample(device))
        if measured:
            step_ms.append((end - start) * 1e3)
            host_ms.append((host_done - start) * 1e3)

    host_diagnostics = meter.results()
    exchanges_after = heap_exchanges()
    # A steady step should need none: each one waits for the peers' hosts.
    # Without warm-up the first step's heap formation would count: none then.
    exchanges_per_step = (None if exchanges_before is None or exchanges_after is None or not step_ms
                          or args.warmup == 0 else (exchanges_after - exchanges_before) / len(step_ms))
    phase("steps_s")
    profile = None
    if args.profile_steps and device.type == "cuda":
        import comm_profile
        first = total_steps - args.profile_steps
        it = iter(range(first, total_steps))
        try:
            profile = comm_profile.profile_steps(lambda: step(next(it), phases=False), args.profile_steps,
                                                 host_ops=args.host_ops,
                                                 keep_trace=args.keep_trace and f"{args.keep_trace}.rank{rank}.json.gz")
        except Exception as e:  # the measured steps above must not be lost to the profiler
            profile = {"error": f"{type(e).__name__}: {e}"}
            print(f"rank {rank}: profiling failed: {profile['error']}", file=sys.stderr, flush=True)
            for i in it:  # the remaining steps, so every mode has the same losses to compare
                step(i, phases=False)
        # kept apart from the peak: the profiler (CUPTI) may hold device memory of its own
        profile["device_used_after_bytes"] = sample(device)
    elif args.profile_steps:
        for i in range(total_steps - args.profile_steps, total_steps):
            step(i, phases=False)
    sync()
    phase("profile_s")

    mine = {
        "rank": rank,
        "losses": [float(x) for x in torch.stack(losses).cpu()],
        "step_ms": step_ms,
        "host_ms": host_ms,
        **host_diagnostics,
        "heap_exchanges_per_step": exchanges_per_step,
        "device_baseline_bytes": baseline,
        "device_peak_bytes": max((u for u in device_used if u is not None), default=None),
        "torch_peak_allocated_bytes": torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None,
        "torch_peak_reserved_bytes": torch.cuda.max_memory_reserved(device) if device.type == "cuda" else None,
        "symmpool": symmpool_stats(device),
        "profile": profile,
        "phases_s": phases,
        # graphs dynamo compiled (one for every block shares it; more means recompiles)
        "compiled_graphs": torch._dynamo.utils.counters["stats"]["unique_graphs"] if args.compile else None,
    }
    if trace is not None:
        mine["memory_trace"] = trace.close()
    gathered = [None] * world
    dist.all_gather_object(gathered, mine, group=results_group)
    dist.destroy_process_group()
    return {"world": world, "ranks": gathered}


def context(args) -> dict:
    ctx = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "symmpool_import_error": SYMMPOOL_IMPORT_ERROR,
        "symmpool_collectives": os.environ.get("SYMMPOOL_COLLECTIVES"),  # None: unset (the table decides)
    }
    if args.device == "cuda":
        ctx["gpu"] = torch.cuda.get_device_name()
        ctx["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
    return ctx


def check_mode(args, result: dict) -> list[str]:
    """Reasons the run did not do what its mode says (then its numbers would
    mislead). Only where something crosses ranks: a 1-rank world may skip
    collectives."""
    if result["world"] < 2 or args.device != "cuda":
        return []
    stats = result["ranks"][0]["symmpool"] or {}
    backend, buffers, collectives = MODES[args.mode]
    problems = []
    if backend == "symm" and buffers == "flag" and not stats.get("allocations"):
        problems.append("the flag is on but symmpool made no allocation")
    if buffers == "hooks" and not stats.get("allocations"):
        problems.append("symmpool's FSDP2 hooks are on but symmpool made no allocation")
    if args.mode in INSTALLS_SYMMPOOL and not symmpool._C._process_allocator_installed():
        problems.append("symmpool is not the process's CUDA allocator")
    if collectives == "always" and not stats.get("symm_collectives"):
        problems.append("SYMMPOOL_COLLECTIVES=always but no collective ran on symmpool")
    if collectives == "0" and stats.get("symm_collectives"):
        problems.append(f"SYMMPOOL_COLLECTIVES=0 but {stats['symm_collectives']} collectives ran on symmpool")
    expected = MODES[args.mode][2]
    if os.environ.get("SYMMPOOL_COLLECTIVES") != expected:
        problems.append(f"SYMMPOOL_COLLECTIVES is {os.environ.get('SYMMPOOL_COLLECTIVES')!r}, "
                        f"mode {args.mode} needs {expected!r} (run.py sets it)")
    return problems


def main(argv=None) -> int:
    args = parse_args(argv)
    result = run(args)
    if int(os.environ.get("RANK", 0)) != 0:
        return 0
    result.update(config=config_name(args.preset, args.batch, args.seq), mode=args.mode,
                  model=model_fields(parse_config(config_name(args.preset, args.batch, args.seq))),
                  warmup=args.warmup, steps=args.steps, profile_steps=args.profile_steps, seed=args.seed,
                  device=args.device, context=context(args))
    result["mode_problems"] = check_mode(args, result)
    with open(args.out, "w") as f:
        json.dump(result, f)
    r0 = result["ranks"][0]
    step = sorted(max(r["step_ms"][i] for r in result["ranks"]) for i in range(args.steps))[args.steps // 2]
    print(f"{result['config']} {args.mode}: {result['world']} ranks, median step {step:.1f} ms, "
          f"first/last loss {r0['losses'][0]:.5f}/{r0['losses'][-1]:.5f}", flush=True)
    for problem in result["mode_problems"]:
        print(f"MODE PROBLEM: {problem}", file=sys.stderr, flush=True)
    return 3 if result["mode_problems"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
