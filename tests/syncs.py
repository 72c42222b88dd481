"""A recorder of what makes the host wait for the device: the tests of the training step and of
evaluation run under it and assert it saw nothing.

    with HostSyncs() as syncs:
        train_step(state, batch)
    assert not syncs.seen, syncs.report()

It records, each with the few project frames it came from:

- aten ops that read a device value back or size an output by one (``_local_scalar_dense``
  behind ``.item()`` / ``bool()`` / ``int()``, ``nonzero``, the ``unique`` family,
  ``masked_select``, indexing by a boolean mask, ``repeat_interleave`` without ``output_size``)
  and copies from a non-CPU tensor to the CPU (a torch dispatch mode);
- Tensor methods that hand a value to Python (``.item()``, ``.tolist()``, ``.numpy()``,
  ``bool()``, ``.cpu()``, ``.to("cpu")``...): on a CPU-only machine these never reach a device
  copy, so they are caught by name (a torch function mode);
- calls into numpy and scipy from outside them (``sys.setprofile``): host work on device values.

The dispatch mode ignores compile internals, so a compiled region runs compiled under it and
only its calls to eager kernels are seen. Dynamo traces a function mode, and breaks graphs
inside it, so around compiled code ``HostSyncs(compiled=True)`` catches the Tensor methods by
the profiler instead (their C calls: ``.to("cpu")``'s argument is not seen there).
"""

from __future__ import annotations

import sys
import traceback
from types import FrameType
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten
# aten ops that wait for a device value (a scalar read, or an output sized by the data)
SYNC_OPS = {aten._local_scalar_dense.default, aten.nonzero.default, aten.nonzero.out, aten._unique.default,
            aten._unique2.default, aten.unique_dim.default, aten.unique_consecutive.default,
            aten.masked_select.default, aten.is_nonzero.default}
MASK_INDEXING = {aten.index.Tensor, aten.index_put.default, aten.index_put_.default,
                 aten._index_put_impl_.default}
# Tensor methods that hand a value to Python (a sync on any device but the CPU)
HOST_READS = {"item", "tolist", "numpy", "cpu", "__bool__", "__float__", "__int__", "__index__"}
HOST_MODULES = ("numpy", "scipy")


def _where(depth: int = 8) -> str:
    """The innermost project (urm_ray) frames of the current stack, innermost last."""
    frames = [f for f in traceback.extract_stack() if "/urm_ray/" in f.filename]
    return " <- ".join(f"{f.filename.split('/urm_ray/')[-1]}:{f.lineno} {f.name}" for f in reversed(frames[-depth:]))


def _is_mask(index: Any) -> bool:
    return isinstance(index, torch.Tensor) and index.dtype in (torch.bool, torch.uint8)


class _Dispatch(TorchDispatchMode):
    def __init__(self, seen: list[str]) -> None:
        super().__init__()
        self.seen = seen

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        return True  # compiled regions run compiled; their eager kernel calls still come here

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self._syncs(func, args, kwargs):
            self.seen.append(f"{func} at {_where()}")
        return func(*args, **kwargs)

    @staticmethod
    def _syncs(func, args, kwargs) -> bool:
        if func in SYNC_OPS:
            return True
        if func in MASK_INDEXING:
            return any(_is_mask(i) for i in (args[1] if len(args) > 1 else kwargs.get("indices", [])))
        if func is aten.repeat_interleave.Tensor:
            return kwargs.get("output_size") is None
        if func in (aten._to_copy.default, aten.copy_.default):
            src = args[1] if func is aten.copy_.default else args[0]
            dst = args[0].device if func is aten.copy_.default else kwargs.get("device") or src.device
            return src.device.type != "cpu" and torch.device(dst).type == "cpu"
        return False


class _Function(TorchFunctionMode):
    def __init__(self, seen: list[str]) -> None:
        super().__init__()
        self.seen = seen

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        # .to(device) with the compute device is no copy on the CPU; only the spelled-out "cpu" is
        if name in HOST_READS or (name == "to" and "cpu" in [*args[1:], *kwargs.values()]):
            self.seen.append(f"Tensor.{name} at {_where()}")
        return func(*args, **kwargs)


class HostSyncs:
    """Records host syncs and numpy / scipy calls inside its block (``seen``)."""

    def __init__(self, compiled: bool = False) -> None:
        self.seen: list[str] = []
        self._modes = (_Dispatch(self.seen),) if compiled else (_Function(self.seen), _Dispatch(self.seen))
        self._methods_by_profile = compiled

    def _profile(self, frame: FrameType, event: str, arg: Any) -> None:
        if event == "call":
            module = frame.f_globals.get("__name__", "")
            caller = frame.f_back.f_globals.get("__name__", "") if frame.f_back else ""
        elif event == "c_call":
            owner = getattr(arg, "__self__", None)
            if self._methods_by_profile and isinstance(owner, torch.Tensor) and arg.__name__ in HOST_READS:
                self.seen.append(f"Tensor.{arg.__name__} at {_where()}")
                return
            module = getattr(arg, "__module__", None) or type(owner).__module__
            caller = frame.f_globals.get("__name__", "")
        else:
            return
        if module.startswith(HOST_MODULES) and not caller.startswith(HOST_MODULES):
            self.seen.append(f"{module}.{getattr(arg, '__name__', frame.f_code.co_name)} at {_where()}")

    def __enter__(self) -> HostSyncs:
        for mode in self._modes:
            mode.__enter__()
        sys.setprofile(self._profile)
        return self

    def __exit__(self, *exc: Any) -> None:
        sys.setprofile(None)
        for mode in reversed(self._modes):
            mode.__exit__(*exc)

    def report(self) -> str:
        return "host syncs:\n  " + "\n  ".join(self.seen)
