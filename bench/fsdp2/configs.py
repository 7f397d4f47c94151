"""Names the benchmark understands: model presets, configs (preset + batch +
sequence length) and modes. Needs no torch, so the driver and the CPU tests
can use it anywhere."""

from __future__ import annotations

import dataclasses
import re


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    layers: int
    dim: int
    mlp: int  # hidden width of the SwiGLU MLP
    heads: int
    kv_heads: int  # == heads: plain multi-head attention; fewer: grouped-query
    vocab: int = 32000


PRESETS = {
    "tiny": ModelSpec(layers=2, dim=128, mlp=352, heads=4, kv_heads=2, vocab=1024),  # tests, CPU too
    "mid": ModelSpec(layers=4, dim=1024, mlp=2816, heads=8, kv_heads=8),  # the GPU regression test
    "1b": ModelSpec(layers=16, dim=2048, mlp=5632, heads=16, kv_heads=16),  # the main job
    "1.4b": ModelSpec(layers=24, dim=2048, mlp=5632, heads=16, kv_heads=16),
    "3.5b": ModelSpec(layers=16, dim=4096, mlp=11008, heads=32, kv_heads=32),
    # The largest expected to fit FSDP2 on 2 H200s at batch 2, seq 2048 with
    # fp32 master weights and AdamW (about 54 GB of states per GPU).
    "7b": ModelSpec(layers=32, dim=4096, mlp=11008, heads=32, kv_heads=32),
    # Four blocks of Llama-70B's shape (3.96B parameters). Few large layers
    # against few tokens: at batch 1 each block's all-gather and fp32
    # reduce-scatter outlast its matmuls on the GPU while the host (a handful
    # of blocks to launch) stays ahead, so communication is exposed on the
    # GPU. The 1.4b/3.5b/7b batch-1 shapes are host-bound instead: most of
    # their "exposed" communication is the GPU waiting for launches.
    "wide4b": ModelSpec(layers=4, dim=8192, mlp=28672, heads=64, kv_heads=8),
}

# The issue's shapes: batch 2, seq 2048 is compute-heavy; batch 1 with a
# short sequence leaves communication exposed.
ISSUE_CONFIGS = ["1.4b-b2s2048", "1.4b-b1s1024", "3.5b-b2s2048", "3.5b-b1s512", "7b-b2s2048", "7b-b1s512"]

# mode -> (CUDA backend of the FSDP2 mesh, how FSDP2's comm buffers are made, SYMMPOOL_COLLECTIVES or None
# for unset). Buffers: "default" (torch.empty), "flag" (set_allocate_memory_from_process_group_for_comm),
# "hooks" (symmpool.fsdp.enable: symmpool's all-gather and reduce-scatter on a plain "nccl" mesh).
MODES = {
    "stock": ("nccl", "default", None),
    "torch-flag": ("nccl", "flag", None),
    "symm": ("symm", "flag", None),  # unset: symmpool's algorithm table decides
    "symm-always": ("symm", "flag", "always"),
    "symm-nccl": ("symm", "flag", "0"),
    "symm-noflag": ("symm", "default", None),
    "symm-hooks": ("nccl", "hooks", None),
    # symm-hooks with symmpool as the process's CUDA allocator (symmpool.install()):
    # compute and communication share one cache.
    "symm-global": ("nccl", "hooks", None),
    "stock-expandable": ("nccl", "default", None),
}
# Environment a mode's processes get on top of the caller's.
MODE_ENV = {"stock-expandable": {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}}
# Modes whose processes call symmpool.install() before their first CUDA allocation.
INSTALLS_SYMMPOOL = {"symm-global"}

_CONFIG_RE = re.compile(r"^(?P<preset>[0-9a-z.]+)-b(?P<batch>[0-9]+)s(?P<seq>[0-9]+)$")


@dataclasses.dataclass(frozen=True)
class Config:
    name: str
    preset: str
    batch: int
    seq: int

    @property
    def spec(self) -> ModelSpec:
        return PRESETS[self.preset]


def config_name(preset: str, batch: int, seq: int) -> str:
    return f"{preset}-b{batch}s{seq}"


def parse_config(name: str) -> Config:
    """`<preset>-b<batch>s<seq>`, e.g. 3.5b-b2s2048; any known preset and
    positive sizes, not only the issue's list."""
    m = _CONFIG_RE.match(name)
    if not m:
        raise ValueError(f"config {name!r} is not <preset>-b<batch>s<seq> (e.g. 3.5b-b2s2048); "
                         f"the issue's configs: {', '.join(ISSUE_CONFIGS)}")
    preset, batch, seq = m["preset"], int(m["batch"]), int(m["seq"])
    if preset not in PRESETS:
        raise ValueError(f"config {name!r}: unknown model preset {preset!r}; known: {', '.join(PRESETS)}")
    if batch < 1 or seq < 2:
        raise ValueError(f"config {name!r}: batch must be >= 1 and seq >= 2")
    return Config(name, preset, batch, seq)


def parse_modes(text: str) -> list[str]:
    modes = [m.strip() for m in text.split(",") if m.strip()]
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        raise ValueError(f"unknown mode(s) {', '.join(unknown)}; known: {', '.join(MODES)}")
    if len(set(modes)) != len(modes):
        raise ValueError(f"a mode is listed twice in {text!r}")
    if not modes:
        raise ValueError("no mode given")
    return modes


def param_count(spec: ModelSpec) -> int:
    """Parameters of llama.Llama(spec), without building it (the driver and
    the tests check it against the model)."""
    head_dim = spec.dim // spec.heads
    attention = 2 * spec.dim * spec.dim + 2 * spec.dim * spec.kv_heads * head_dim
    block = attention + 3 * spec.dim * spec.mlp + 2 * spec.dim  # + two RMSNorm weights
    return spec.layers * block + 2 * spec.vocab * spec.dim + spec.dim  # embedding, head, final norm


def model_fields(config: Config) -> dict:
    s = config.spec
    return {"preset": config.preset, "params": param_count(s), "layers": s.layers, "dim": s.dim, "mlp": s.mlp,
            "heads": s.heads, "kv_heads": s.kv_heads, "vocab": s.vocab, "batch": config.batch, "seq": config.seq}
