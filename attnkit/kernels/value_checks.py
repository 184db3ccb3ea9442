"""Value checks made on the device (``check_values="device"``): one contract for every paged kernel.

A kernel that reads index tensors (page tables, lengths, offsets) can check their contents in three ways
(``check_values``): "strict" copies them to the host and raises ValueError at once (a synchronisation on a
GPU); False checks nothing; "device" checks them on the device, without synchronising, so that the call
can run inside a CUDA graph and costs no round trip. The contract of "device":

- **The kernel stays memory-safe.** Every paged kernel clamps what it reads (lengths to the table, page
  ids to the pool, offsets to the packed rows), so a bad value gives a wrong answer, never a fault.
- **Bounded state.** Each device keeps one int64 tensor of four numbers (``state``): the index of the first
  bad call since the last read (times ``len(KERNELS)``, plus its kernel; -1: none), how many calls were
  bad, which rules the first bad call broke (a bit mask, ``RULES``), and how many calls were checked. A
  call updates it in place on the device, in stream order; nothing grows with the number of calls, and
  the host keeps no count of its own.
- **Two ways to check, one state.** ``flag(kernel, rules)`` records a call whose rules a few PyTorch
  operations evaluated; a kernel may instead evaluate them itself and update ``state(device)`` in one of
  its programs (``paged_decode`` does: no extra launch, no extra operation), by the same layout.
- **Raised by one function, attributed to the call.** ``raise_pending_errors()`` reads every device's
  state (one synchronisation each), resets it and raises one ValueError that names the first bad call
  (its kernel, its index among the calls checked since the last read) and the arguments and rules it
  broke. Nothing else raises it: a later call, strict or not, reports only its own inputs.
- Checks are skipped while a CUDA graph is being captured (a replay does not check again).

``states()`` lists every device's state made so far (what a test reads to see that it stays bounded).
"""
from __future__ import annotations

import threading

import torch

# The rules a device check can find broken: bit -> (arguments, rule).
RULES = {
    1: ("seq_lens", "a length outside 1 .. max_pages * page_size (paged_decode) or outside its chunk's "
                    "length .. max_pages * page_size (paged_extend)"),
    2: ("block_table", "a used page id outside [0, num_pages)"),
    4: ("k_scale, v_scale", "a scale that is not finite and > 0"),
    8: ("cu_seqlens_q", "offsets that do not start at 0, decrease, or do not end at total_q"),
    16: ("max_q_len", "smaller than the longest chunk of cu_seqlens_q"),
}
KERNELS = ("paged_decode", "paged_extend")

FIRST, BAD_CALLS, FIRST_RULES, CALLS = range(4)     # the layout of a device's state
EMPTY = (-1, 0, 0, 0)

_LOCK = threading.Lock()
_STATE: dict = {}           # device -> int64 [4]: first bad call's code (-1: none), bad calls, first's rules, calls


def capturing(t: torch.Tensor) -> bool:
    """True while a CUDA graph is being captured on ``t``'s device (a device check would be recorded once)."""
    return t.is_cuda and torch.cuda.is_current_stream_capturing()


def state(device) -> torch.Tensor:
    """The int64 [4] state of ``device`` (module docstring), made on first use; the same tensor until the
    process ends, so a kernel (or a CUDA graph) may keep its address."""
    device = torch.device(device)
    with _LOCK:
        found = _STATE.get(device)
        if found is None:
            found = _STATE[device] = torch.tensor(EMPTY, dtype=torch.int64, device=device)
        return found


def states() -> dict:
    """{device: its state tensor} for every device a check has used so far (a new dict; the same tensors)."""
    with _LOCK:
        return dict(_STATE)


def flag(kernel: str, rules: torch.Tensor) -> None:
    """Record one call of ``kernel`` (a name in ``KERNELS``) whose broken rules are ``rules``, a 0-d int64
    tensor on the call's device (a sum of ``RULES`` bits, 0: all good). No synchronisation."""
    if capturing(rules):
        return
    code = KERNELS.index(kernel)
    current = state(rules.device)
    with _LOCK:
        bad = rules != 0
        take = bad & (current[FIRST] < 0)
        # the first bad call's index (times KERNELS' size, plus its kernel) and its rules; the counts
        current[FIRST] = torch.where(take, current[CALLS] * len(KERNELS) + code, current[FIRST])
        current[FIRST_RULES] = torch.where(take, rules, current[FIRST_RULES])
        current[BAD_CALLS] += bad.to(torch.int64)
        current[CALLS] += 1


def raise_pending_errors() -> None:
    """Read what the device checks found since the last read (one synchronisation per device), reset it,
    and raise ValueError naming the first bad call and the rules it broke."""
    with _LOCK:
        found = []
        for device, current in _STATE.items():
            first, count, rules, calls = current.tolist()
            if calls:
                current.copy_(torch.tensor(EMPTY, dtype=torch.int64), non_blocking=False)   # reset in place
            if count:
                found.append((device, calls, first, count, rules))
    if not found:
        return
    device, calls, first, count, rules = found[0]
    index, kernel = divmod(first, len(KERNELS))
    broken = "; ".join(f"{names}: {rule}" for bit, (names, rule) in RULES.items() if rules & bit)
    more = "".join(f"; on {d} too: {n} of {c}" for d, c, _, n, _ in found[1:])
    raise ValueError(f"{count} of the last {calls} calls checked on the device ({device}) had bad values, so their "
                     f"outputs are wrong{more}. The first was {KERNELS[kernel]} call {index + 1} of {calls}: "
                     f"{broken}. Call it with check_values='strict' to see the entry.")


__all__ = ["flag", "state", "raise_pending_errors", "capturing", "RULES", "KERNELS"]
