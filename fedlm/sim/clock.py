"""A discrete-event virtual clock.

A heap of ``(time, seq, event)``; ``seq`` comes from ``itertools.count()`` so
events at the same time pop in the order they were scheduled (FIFO,
deterministic). ``now`` only moves forward: by popping, or by ``advance`` to a time
before the next event (a wait in which nothing happens).
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field
from typing import Generic, TypeVar

E = TypeVar("E")


@dataclass(order=True)
class _Entry(Generic[E]):
    time: float
    seq: int
    event: E = field(compare=False)


class VirtualClock(Generic[E]):
    def __init__(self, start: float = 0.0) -> None:
        self._now = float(start)
        self._heap: list[_Entry[E]] = []
        self._seq = itertools.count()

    @property
    def now(self) -> float:
        return self._now

    def schedule(self, at: float, event: E) -> None:
        """Schedule ``event`` at absolute virtual time ``at`` (not in the past)."""
        if at < self._now:
            raise ValueError(f"cannot schedule at {at} before now={self._now}")
        heapq.heappush(self._heap, _Entry(float(at), next(self._seq), event))

    def peek(self) -> tuple[float, E] | None:
        if not self._heap:
            return None
        e = self._heap[0]
        return e.time, e.event

    def advance(self, to: float) -> None:
        """Move ``now`` forward to ``to`` with nothing happening (no event is due before)."""
        if to < self._now or (self._heap and self._heap[0].time < to):
            raise ValueError(f"cannot advance to {to}: now={self._now}, next event at "
                             f"{self._heap[0].time if self._heap else None}")
        self._now = float(to)

    def pop(self) -> tuple[float, E]:
        """Advance to the earliest event and return ``(time, event)``."""
        e = heapq.heappop(self._heap)
        self._now = e.time
        return e.time, e.event

    def state_dict(self) -> dict:
        """Now, the pending events and the tie-breaking counter (for checkpoints)."""
        nxt = next(self._seq)
        self._seq = itertools.count(nxt)
        return {"now": self._now, "next_seq": nxt,
                "heap": [(e.time, e.seq, e.event) for e in self._heap]}

    def load_state_dict(self, state: dict) -> None:
        self._now = float(state["now"])
        self._heap = [_Entry(t, q, e) for t, q, e in state["heap"]]
        heapq.heapify(self._heap)
        self._seq = itertools.count(state["next_seq"])

    def __len__(self) -> int:
        return len(self._heap)
