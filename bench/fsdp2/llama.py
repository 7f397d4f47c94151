"""A Llama-style decoder: RMSNorm, rotary embeddings, multi-head or
grouped-query causal attention (F.scaled_dot_product_attention), SwiGLU MLP,
untied embedding and output head.

Built on the meta device and materialized after sharding
(`to_empty` + `init_weights`), so a 7B model never needs its full size on one
GPU. The initial weights depend only on the seed and each parameter's name:
every rank computes a parameter's full value on its device, one parameter at a
time, and keeps its own shard, so every mode and world size starts from the
same model.
"""

from __future__ import annotations

import math
import sys
import zlib

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.tensor import DTensor

from configs import PRESETS, ModelSpec, param_count


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # normalize in fp32 as Llama does: bf16 squares lose too much
        y = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps)
        return y.type_as(x) * self.weight


def rotary_tables(head_dim: int, seq: int, device, theta: float = 10000.0) -> tuple[torch.Tensor, torch.Tensor]:
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim)
    angles = torch.outer(torch.arange(seq, device=device, dtype=torch.float32), inv_freq)
    angles = torch.cat([angles, angles], dim=-1)  # (seq, head_dim), halves rotated together
    return angles.cos(), angles.sin()


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: (batch, heads, seq, head_dim); rotates the pairs (i, i + head_dim/2)."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos.to(x.dtype) + rotated * sin.to(x.dtype)


class Attention(nn.Module):
    def __init__(self, spec: ModelSpec):
        super().__init__()
        if spec.dim % spec.heads or spec.heads % spec.kv_heads:
            raise ValueError(f"dim {spec.dim}, heads {spec.heads}, kv_heads {spec.kv_heads} do not divide")
        self.heads, self.kv_heads, self.head_dim = spec.heads, spec.kv_heads, spec.dim // spec.heads
        self.wq = nn.Linear(spec.dim, spec.heads * self.head_dim, bias=False)
        self.wk = nn.Linear(spec.dim, spec.kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(spec.dim, spec.kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(spec.heads * self.head_dim, spec.dim, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q = self.wq(x).view(b, t, self.heads, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.kv_heads != self.heads)
        return self.wo(y.transpose(1, 2).reshape(b, t, -1))


class FeedForward(nn.Module):
    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.w1 = nn.Linear(spec.dim, spec.mlp, bias=False)  # gate
        self.w3 = nn.Linear(spec.dim, spec.mlp, bias=False)  # up
        self.w2 = nn.Linear(spec.mlp, spec.dim, bias=False)  # down

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class TransformerBlock(nn.Module):
    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.attention_norm = RMSNorm(spec.dim)
        self.attention = Attention(spec)
        self.ffn_norm = RMSNorm(spec.dim)
        self.feed_forward = FeedForward(spec)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x), cos, sin)
        return x + self.feed_forward(self.ffn_norm(x))


class Llama(nn.Module):
    def __init__(self, spec: ModelSpec, max_seq: int):
        super().__init__()
        self.spec, self.max_seq = spec, max_seq
        self.tok_embeddings = nn.Embedding(spec.vocab, spec.dim)
        self.layers = nn.ModuleList(TransformerBlock(spec) for _ in range(spec.layers))
        self.norm = RMSNorm(spec.dim)
        self.output = nn.Linear(spec.dim, spec.vocab, bias=False)
        # Not parameters: FSDP2 leaves buffers whole on every rank.
        cos, sin = rotary_tables(spec.dim // spec.heads, max_seq, device=self.output.weight.device)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        t = tokens.shape[1]
        if t > self.max_seq:
            raise ValueError(f"sequence of {t} tokens, the model was built for at most {self.max_seq}")
        cos, sin = self.rope_cos[:t], self.rope_sin[:t]
        x = self.tok_embeddings(tokens)
        for layer in self.layers:
            x = layer(x, cos, sin)
        return self.output(self.norm(x))

    @torch.no_grad()
    def init_weights(self, seed: int) -> None:
        """Deterministic from `seed` and the parameter names alone (see the
        module docstring); call after `to_empty`."""
        device = self.output.weight.device
        cos, sin = rotary_tables(self.spec.dim // self.spec.heads, self.max_seq, device=device)
        self.rope_cos.copy_(cos)
        self.rope_sin.copy_(sin)
        residual_std = 0.02 / math.sqrt(2 * self.spec.layers)  # GPT-2's scaling of the residual outputs
        for name, param in self.named_parameters():
            if name.endswith("norm.weight"):
                _set_full_value(param, lambda shape, dtype: torch.ones(shape, dtype=dtype, device=device))
                continue
            if name == "tok_embeddings.weight":
                std = 1.0
            elif name == "output.weight":
                std = self.spec.dim ** -0.5
            elif name.endswith(("wo.weight", "w2.weight")):
                std = residual_std
            else:
                std = 0.02
            gen = torch.Generator(device=device).manual_seed(_param_seed(seed, name))
            _set_full_value(param, lambda shape, dtype: torch.randn(shape, generator=gen, dtype=dtype,
                                                                    device=device) * std)


def compile_blocks(model: Llama, backend: str = "inductor") -> None:
    """torch.compile every block in place, as torchtitan does before
    fully_shard: each block becomes a compiled wrapper that FSDP2 then shards
    (its hooks and collectives run outside the compiled code)."""
    for index, block in model.layers.named_children():
        model.layers.register_module(index, torch.compile(block, backend=backend, fullgraph=True))


def _param_seed(seed: int, name: str) -> int:
    # a compiled block's parameters are named through its wrapper: the same
    # weights with or without compile
    name = name.replace("._orig_mod.", ".")
    return (seed * 1_000_003 + zlib.crc32(name.encode())) % (2**63)


def _set_full_value(param: torch.Tensor, make) -> None:
    """Writes this rank's part of the full value `make(shape, dtype)`: the
    whole tensor for a plain parameter, the dim-0 shard for an FSDP2 DTensor
    (FSDP2 splits dim 0 as torch.chunk does: ceil(n / world) rows per rank,
    the last ranks possibly short or empty)."""
    if not isinstance(param, DTensor):
        param.copy_(make(param.shape, param.dtype))
        return
    local = param.to_local()
    if local.numel() == 0:
        return
    placements = [p for p in param.placements if not p.is_replicate()]
    if len(placements) != 1 or not placements[0].is_shard(0):
        raise ValueError(f"expected FSDP2's Shard(0) placement, got {param.placements}")
    mesh = param.device_mesh
    shard_dim = param.placements.index(placements[0])
    world, rank = mesh.size(shard_dim), mesh.get_local_rank(shard_dim)
    rows = -(-param.shape[0] // world)
    full = make(param.shape, local.dtype)
    shard = full[rank * rows: rank * rows + local.shape[0]]
    if shard.shape != local.shape:
        raise ValueError(f"shard shape {tuple(shard.shape)} != local shape {tuple(local.shape)}")
    local.copy_(shard)


def build_on_meta(preset: str, max_seq: int) -> Llama:
    if preset not in PRESETS:
        raise ValueError(f"unknown model preset {preset!r}; known: {', '.join(PRESETS)}")
    with torch.device("meta"):
        return Llama(PRESETS[preset], max_seq)


if __name__ == "__main__":  # python llama.py: every preset's size
    for name, spec in PRESETS.items():
        n = sum(p.numel() for p in build_on_meta(name, 16).parameters())
        assert n == param_count(spec), (name, n, param_count(spec))
        print(f"{name:>5}: {n / 1e9:6.3f} B parameters ({spec})", file=sys.stdout)
