"""Value checks made on the device (``check_values="device"``): one contract for every paged kernel.

A kernel that reads index tensors (page tables, lengths, offsets) can check their contents in three ways
(``check_values``): "strict" copies them to the host and raises ValueError at once (a synchronisation on a
GPU); False checks nothing; "device" checks them on the device, without synchronising, so that the call
can run inside a CUDA graph and costs no round trip. The contract of "device":

- **The kernel stays memory-safe.** Every paged kernel clamps what it reads (lengths to the table, page
  ids to the pool, offsets to the packed rows), so a bad value gives a wrong answer, never a fault.
- **Bounded state.** Each device keeps one int64 tensor of three numbers: the index of the first bad call
  since the last read, how many calls were bad, and which rules the first bad call broke (a bit mask,
  ``RULES``). A call adds to it in place; nothing grows with the number of calls (the host counts calls
  in one integer per device).
- **Raised by one function, attributed to the call.** ``raise_pending_errors()`` reads every device's
  state (one synchronisation each), resets it and raises one ValueError that names the first bad call
  (its kernel, its index among the calls checked since the last read) and the arguments and rules it
  broke. Nothing else raises it: a later call, strict or not, reports only its own inputs.
- Checks are skipped while a CUDA graph is being captured (a replay does not check again).
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

_LOCK = threading.Lock()
_STATE: dict = {}           # device -> int64 [3]: first bad call's index (-1: none), bad calls, first's rules
_CALLS: dict = {}           # device -> calls checked since the last read (a host integer)


def capturing(t: torch.Tensor) -> bool:
    """True while a CUDA graph is being captured on ``t``'s device (a device check would be recorded once)."""
    return t.is_cuda and torch.cuda.is_current_stream_capturing()


def flag(kernel: str, rules: torch.Tensor) -> None:
    """Record one call of ``kernel`` (a name in ``KERNELS``) whose broken rules are ``rules``, a 0-d int64
    tensor on the call's device (a sum of ``RULES`` bits, 0: all good). No synchronisation."""
    if capturing(rules):
        return
    device = rules.device
    code = KERNELS.index(kernel)
    with _LOCK:
        state = _STATE.get(device)
        if state is None:
            state = _STATE[device] = torch.tensor([-1, 0, 0], dtype=torch.int64, device=device)
        index = _CALLS.get(device, 0)
        _CALLS[device] = index + 1
        bad = rules != 0
        first = state[0] < 0
        take = bad & first
        # the first bad call's index (times KERNELS' size, plus its kernel) and its rules; the count
        state[0] = torch.where(take, index * len(KERNELS) + code, state[0])
        state[2] = torch.where(take, rules, state[2])
        state[1] += bad.to(torch.int64)


def raise_pending_errors() -> None:
    """Read what the device checks found since the last read (one synchronisation per device), reset it,
    and raise ValueError naming the first bad call and the rules it broke."""
    with _LOCK:
        found = []
        for device, state in list(_STATE.items()):
            calls = _CALLS.pop(device, 0)
            values = state.tolist()
            del _STATE[device]
            if values[1]:
                found.append((device, calls, *values))
    if not found:
        return
    device, calls, first, count, rules = found[0]
    index, kernel = divmod(first, len(KERNELS))
    broken = "; ".join(f"{names}: {rule}" for bit, (names, rule) in RULES.items() if rules & bit)
    more = "".join(f"; on {d} too: {n} of {c}" for d, c, _, n, _ in found[1:])
    raise ValueError(f"{count} of the last {calls} calls checked on the device ({device}) had bad values, so their "
                     f"outputs are wrong{more}. The first was {KERNELS[kernel]} call {index + 1} of {calls}: "
                     f"{broken}. Call it with check_values='strict' to see the entry.")


__all__ = ["flag", "raise_pending_errors", "capturing", "RULES", "KERNELS"]
