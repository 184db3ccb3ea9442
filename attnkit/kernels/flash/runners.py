"""Launching a compiled kernel again without Triton's JIT in between.

``kernel[grid](*args, **options)`` goes through Triton's JIT at every call: it binds the arguments to the
kernel's signature, works out how to specialise the kernel on them (each integer equal to 1 or a
multiple of 16, each pointer's 16-byte alignment, each descriptor's block and layout), hashes that into
a key, looks the compiled kernel up and launches it: a visible share of a short attention call's host time
(docs/flash_notes.md, "Rule: launches through kept runners"). The compiled kernel the JIT returns has a
runner of its own (``compiled[grid](*every_parameter)``) that only launches.

``RUNNERS.launch(kernel, grid, args, options, device)`` launches a key's first call through the JIT and
keeps the runner of the kernel it returns; later calls with that key go through the runner. The key
(``launch_key``) holds more than the JIT specialises on: the grid, the device, the constexprs and
compiler options, every integer's value, every tensor's dtype and address modulo 16, every descriptor's
dtype, address modulo 16, shape, strides, block and layout. So a runner only ever launches the kernel the
JIT would have picked. A runner that raises (a Triton whose compiled kernels launch otherwise) leaves one
RuntimeWarning and the JIT for the rest of the process. Triton's interpreter returns no compiled
kernel, so there nothing is kept.

``RUNNERS.launch_planned(kept, varying, ...)`` is the same for a caller that fixes a launch's arguments per
plan (the paged decode's ``paged_plans.Plan``): keyed by its tensors' alignment, without ``launch_key``.

Used by every launch of the FlashAttention kernels (``plans.run_plan``, the backward's pre-pass, the Gluon
kernels' ``hopper.launch`` and ``hopper_backward.dkdv``); what it saves against the JIT, measured side by
side (``scripts/gpu_flash_host_profile.py``): docs/flash_notes.md, "Rule: launches through kept runners".
Internal API for tests and scripts: ``Runners`` (a fresh set of kept runners), ``launch_key``, ``keep_recent``.
"""
from __future__ import annotations

import warnings

import torch

DESCRIPTOR_FIELDS = ("base", "shape", "strides", "block_shape")


def launch_key(grid, args, options: dict, device) -> tuple | None:
    """What a launch is specialised on, and more; None for an argument of a type not seen here."""
    parts = [tuple(grid), device.index, tuple(sorted(options.items()))]
    for value in args:
        kind = type(value)
        if kind is int or kind is bool:                     # the common cases first, by exact type
            parts.append((kind, value))
        elif kind is float:
            parts.append(kind)
        elif isinstance(value, torch.Tensor):
            parts.append((value.dtype, value.data_ptr() % 16))
        elif value is None or isinstance(value, float):
            parts.append(type(value))
        elif isinstance(value, int):                        # bool among them
            parts.append((type(value), value))
        elif all(hasattr(value, name) for name in DESCRIPTOR_FIELDS):   # a TMA descriptor, Triton's or Gluon's
            base = value.base
            parts.append((base.dtype, base.data_ptr() % 16, tuple(value.shape), tuple(value.strides),
                          tuple(value.block_shape), getattr(value, "layout", None),
                          getattr(value, "padding", None)))
        else:
            return None
    return tuple(parts)


def keep_recent(kept: dict, key, value, most: int) -> None:
    """kept[key] = value, first dropping the oldest key when ``kept`` already holds ``most``."""
    if len(kept) >= most:
        kept.pop(next(iter(kept)))
    kept[key] = value


class Runners:
    """Runners of compiled kernels, by launch key: the ``kept`` most recent keys."""

    def __init__(self, kept: int = 256):
        self.kept = kept
        self.by_key: dict = {}      # (id(kernel), *launch key) -> (kernel, its runner for the key's grid,
        #                             the constexprs in the kernel's order)
        self.enabled = True         # off for the process once a runner has failed

    def launch(self, kernel, grid, args, options: dict, device) -> None:
        """``kernel[grid](*args, **options)``, through the runner kept for its key when there is one.
        ``options``: the constexprs and compiler options (num_warps, num_stages, ...)."""
        key = self._key(kernel, grid, args, options, device)
        kept = self.by_key.get(key) if key is not None else None
        if kept is not None and kept[0] is kernel:
            _, runner, constexprs = kept
            try:
                runner(*args, *constexprs)
                return
            except torch.cuda.OutOfMemoryError:
                raise
            except Exception as exc:     # another Triton's runner: the JIT from now on
                self._give_up(exc)
                key = None
        compiled = kernel[grid](*args, **options)
        if key is not None and self.enabled and hasattr(compiled, "__getitem__"):
            constexprs = tuple(options[name] for name in kernel.arg_names[len(args):])
            self._keep(key, (kernel, compiled[(*grid, 1, 1)[:3]], constexprs))

    def launch_planned(self, kept: dict, varying: tuple, kernel, grid, args, options: dict, device,
                       n_tensors: int) -> None:
        """``launch(kernel, grid, args, options, device)`` for a caller that holds everything of the
        launch fixed per ``kept`` (a plan's own dict) except the first ``n_tensors`` arguments, which are
        tensors, and the integers of ``varying``: the grid, the options, the device, the tensors'
        dtypes and every other argument. Then the launch's key is the tensors' alignment (what Triton
        specialises a pointer on) and ``varying`` alone, not ``launch_key``'s pass over every argument
        (its share of an eager call's host time: docs/paged_notes.md, "The eager call's host time")."""
        if self.enabled:
            key = (id(kernel), varying, *(t.data_ptr() % 16 for t in args[:n_tensors]))
            entry = kept.get(key)
            if entry is not None:
                runner, constexprs = entry
                try:
                    runner(*args, *constexprs)
                    return
                except torch.cuda.OutOfMemoryError:
                    raise
                except Exception as exc:     # another Triton's runner: the JIT from now on
                    self._give_up(exc)
        self.launch(kernel, grid, args, options, device)
        full_key = self._key(kernel, grid, args, options, device)
        entry = self.by_key.get(full_key) if full_key is not None else None
        if entry is not None and entry[0] is kernel and self.enabled:
            keep_recent(kept, key, entry[1:], 16)

    def _key(self, kernel, grid, args, options, device):
        if not self.enabled:
            return None
        if any(name not in options for name in kernel.arg_names[len(args):]):
            return None                  # a parameter left to its default: launched through the JIT
        key = launch_key(grid, args, options, device)
        return None if key is None else (id(kernel), *key)

    def _keep(self, key, entry) -> None:
        keep_recent(self.by_key, key, entry, self.kept)

    def _give_up(self, exc: Exception) -> None:
        import triton

        self.enabled = False
        self.by_key.clear()
        warnings.warn(f"launching a compiled kernel directly failed with Triton {triton.__version__} "
                      f"({type(exc).__name__}: {exc}); launching through Triton's JIT from now on",
                      RuntimeWarning, stacklevel=3)


RUNNERS = Runners()

__all__ = ["RUNNERS", "Runners", "keep_recent", "launch_key"]
