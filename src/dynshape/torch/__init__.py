"""dynshape for PyTorch users: `torch.compile(model, backend="dynshape")` and `dynshape.torch.explain()`.

The backend is registered with Dynamo through the `torch_dynamo_backends` entry point of the installed package;
`register()` does the same by hand (for a source checkout that is not pip-installed). `ds.from_torch` (through
torch.export, no Dynamo work per call) lives in `dynshape.frontends.torch_export`.
"""

from __future__ import annotations

from dynshape.torch.backend import dynshape_backend, reset
from dynshape.torch.explain import Report, explain


def register(name: str = "dynshape") -> None:
    """Make `torch.compile(..., backend=name)` find the dynshape backend (idempotent)."""
    from torch._dynamo.backends import registry

    if name in getattr(registry, "_COMPILER_FNS", {}):
        return
    registry.register_backend(compiler_fn=dynshape_backend, name=name)


__all__ = ["Report", "dynshape_backend", "explain", "register", "reset"]
