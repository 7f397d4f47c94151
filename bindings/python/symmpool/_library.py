"""How symmpool registers its torch operators: ``torch.library`` define and
impl, tagged pt2-compliant, a fake (meta) implementation for tracing, and an
Autograd kernel in C++ that passes calls through and makes a backward
through the outputs, or through an input the op mutated, raise.

Not ``torch.library.custom_op``: its Python layers around the same
implementation (autograd wrapper, redispatch, aliasing checks) were a large
share of a fused call's host time
(``bench/results/host_time_h200x1_2026-11-24_custom-op-layers.json``; the
change: ``bench/results/host_time_h200x1_2026-11-24_fused-ops-define-impl-ab.json``).
The fused ops' kernels then moved to C++ as well (``bindings/torch/tp/fused_ops.cpp``).
"""

from __future__ import annotations

from typing import Callable, Optional

import torch

from . import _C

_lib = torch.library.Library("symmpool", "FRAGMENT")


def define(schema: str, impl: Optional[Callable], fake: Callable):
    """Defines ``symmpool::<schema>`` with ``impl`` for every device (the ops
    fall back to unfused collectives on CPU groups; None: its kernel is in
    C++, registered by ``_C`` once defined) and ``fake`` for torch.compile;
    returns the op (an OpOverloadPacket)."""
    name = schema.split("(", 1)[0]
    _lib.define(schema, tags=(torch.Tag.pt2_compliant_tag,))  # as custom_op tags its ops: fullgraph traces them
    if impl is not None:
        _lib.impl(name, impl, "CompositeExplicitAutograd")
    torch.library.register_fake(f"symmpool::{name}", fake, lib=_lib)
    _C._autograd_not_implemented(name)
    return getattr(torch.ops.symmpool, name)
