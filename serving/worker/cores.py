"""CPU slots: the cores a replica's engine computes on, the CPU counterpart of a GPU per replica.

Left to itself, every engine on a host computes on every core, so two replicas side by side
(stable and a candidate) spin on each other's cores:
a revision that costs more per token then slows its neighbour as much as itself, and paired or
side-by-side latency stops telling the two apart (measured: a revision 3.5x slower per token came
out 0.6x of stable's time per token unbound, 2.2x bound to its own core, on a loaded two-core host).
The worker splits its cores into slots, gives each new replica the least used one and binds the
engine's process to it (serving.worker.engine); replicas on slots of one size take turns on them
(below). Pure functions over core ids.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

Slot = tuple[int, ...]
DEFAULT_TURN_EVERY_S = 1.0  # a latency gate's look spans about 10 s of the demo's canary: many turns each


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


# --- taking turns -------------------------------------------------------------------------------
# A slot is not a GPU: whatever else runs on the host (the router, the users' clients, the control
# plane, another test) lands on some cores more than others, so two identical replicas on two slots
# measured up to 1.36x apart, and the latency gates read that as the candidate's own. Replicas whose
# slots have the same size therefore take turns: every few seconds each moves to the next such slot,
# so over a stage every replica computes on every core for about the same time and a core's load
# falls on both arms alike.


def next_turn(held: Mapping[str, int], slots: Sequence[Slot]) -> dict[str, int]:
    """Each replica's slot after one turn: the replicas on the i-th held slot of a size move to the
    (i+1)-th held slot of that size, cyclically. A size held on one slot only stays where it is."""
    by_size: dict[int, list[int]] = {}
    for index in sorted(set(held.values())):
        by_size.setdefault(len(slots[index]), []).append(index)
    step: dict[int, int] = {}
    for indices in by_size.values():
        step |= {index: indices[(position + 1) % len(indices)] for position, index in enumerate(indices)}
    return {replica: step[index] for replica, index in held.items()}


def moved_affinity(affinity: frozenset[int], old: Slot, new: Slot) -> frozenset[int] | None:
    """A thread's cores after its replica moves from ``old`` to ``new`` (same size): each core of ``old``
    becomes the core at its position in ``new``. None for a thread not bound within ``old`` (it floats
    over the host's cores, so it stays as it is)."""
    if not affinity or not affinity <= set(old):
        return None
    position = {core: index for index, core in enumerate(old)}
    return frozenset(new[position[core]] for core in affinity)
