"""--memory-trace: memory around each FSDP2 all-gather and reduce-scatter of
a run's first steps, to see which pool grows where (docs/fsdp2_flag_memory.md
predicts where the comm-buffer flag's extra segments come from).

It wraps FSDP2's private foreach_all_gather and foreach_reduce as
_fsdp_param_group calls them; where they are missing (another torch), the
trace says so and the run goes on untraced.
"""

from __future__ import annotations

import torch


class MemoryTrace:
    """Samples before and after each wrapped call while `step` < `steps`."""

    CALLS = ("foreach_all_gather", "foreach_reduce")

    def __init__(self, device: torch.device, steps: int, used_bytes, symmpool_stats):
        self.device, self.steps, self.step = device, steps, 0
        self.used_bytes = used_bytes  # device -> memory in use as the device sees it, or None
        self.symmpool_stats = symmpool_stats  # device -> symmpool.memory_stats or None
        self.events: list[dict] = []
        self.error: str | None = None
        self._restore: list[tuple[object, str, object]] = []
        try:
            from torch.distributed.fsdp._fully_shard import _fsdp_param_group as module
        except ImportError as e:
            self.error = f"FSDP2's _fsdp_param_group does not import: {e}"
            return
        missing = [name for name in self.CALLS if not callable(getattr(module, name, None))]
        if missing:
            self.error = f"_fsdp_param_group has no {', '.join(missing)} in torch {torch.__version__}"
            return
        for name in self.CALLS:
            original = getattr(module, name)
            self._restore.append((module, name, original))
            setattr(module, name, self._wrapped(name, original))

    def sample(self) -> dict:
        cuda = self.device.type == "cuda"
        stats = self.symmpool_stats(self.device)
        return {
            "device_used": self.used_bytes(self.device),
            "torch_reserved": torch.cuda.memory_reserved(self.device) if cuda else None,
            "torch_allocated": torch.cuda.memory_allocated(self.device) if cuda else None,
            "symmpool_reserved": stats["reserved_bytes"]["current"] if stats else None,
            "symmpool_segment_maps": stats["segment_maps"] if stats else None,
        }

    def _wrapped(self, name: str, original):
        def call(*args, **kwargs):
            if self.step >= self.steps:
                return original(*args, **kwargs)
            before = self.sample()
            result = original(*args, **kwargs)
            self.events.append({"step": self.step, "call": name, "before": before, "after": self.sample()})
            return result

        return call

    def close(self) -> dict:
        """Unwraps the calls; what was traced, for the run's JSON."""
        for module, name, original in self._restore:
            setattr(module, name, original)
        self._restore.clear()
        return {"steps": self.steps, "events": self.events, "error": self.error}
