"""CPU slots: the cores a replica's engine computes on, the CPU counterpart of a GPU per replica.

vLLM on the CPU binds its compute threads to cores. Left to itself, every engine on a host binds to
the same cores, so two replicas side by side (stable and a candidate) spin on each other's cores:
a revision that costs more per token then slows its neighbour as much as itself, and paired or
side-by-side latency stops telling the two apart (measured: a revision 3.5x slower per token came
out 0.6x of stable's time per token unbound, 2.2x bound to its own core, on a loaded two-core host).
The worker splits its cores into slots and gives each new replica the least used one.
Pure functions over core ids.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

Slot = tuple[int, ...]


def split_cores(cores: Sequence[int], count: int) -> tuple[Slot, ...]:
    """``cores`` (sorted) in ``count`` contiguous slots of near-equal size; fewer slots than cores allow.

    No slots (``count`` 0, or no cores): engines bind as vLLM decides.
    """
    ordered = sorted(set(cores))
    count = min(count, len(ordered))
    if count <= 0:
        return ()
    size, extra = divmod(len(ordered), count)
    slots: list[Slot] = []
    start = 0
    for index in range(count):
        end = start + size + (1 if index < extra else 0)
        slots.append(tuple(ordered[start:end]))
        start = end
    return tuple(slots)


def least_used(slots: Sequence[Slot], used: Mapping[int, int]) -> int | None:
    """The index of the slot with the fewest replicas on it (the lowest index on a tie); None without slots."""
    if not slots:
        return None
    return min(range(len(slots)), key=lambda index: (used.get(index, 0), index))


def bind_mask(slot: Slot) -> str:
    """The slot as vLLM's ``VLLM_CPU_OMP_THREADS_BIND`` list (``"0,1"``)."""
    return ",".join(str(core) for core in slot)
