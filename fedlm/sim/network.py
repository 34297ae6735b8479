"""The shared network: transfers as fluid flows on the server's links.

Without contention a job's transfer times are known at dispatch (see
``fleet.JobTimer``). With a limited server link they are not: every download
shares the server's egress bandwidth (``network.server_down``) with the others
in progress, every upload its ingress (``network.server_up``), so the 20th data
centre uploading at once gets a twentieth of it. The model:

- a transfer is a flow of ``bytes`` through its worker's own link (capped at
  the region's bandwidth) and the server's shared link;
- at any moment the shared link's capacity is split max-min fair among the
  flows on it (water-filling: no flow gets more than its own cap, the rest is
  shared equally), so rates change whenever a flow starts or ends;
- latency is paid once per transfer, after its bytes (propagation adds up the
  same either way);
- optionally every bandwidth follows a daily cycle: multiplied by
  ``1 − a·(1 + cos(2π(h − peak)/24))/2`` in hour ``h`` of the virtual day
  (constant within an hour), least at ``peak_hour`` (``fedlm.sim.wire_sizes``, shared
  with the planner).

The engine asks ``next_finish()`` for the next time something changes and
``advance(t)`` for the flows finished by then. Pure virtual time: no wall clock.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from fedlm.sim.wire_sizes import HOUR, daily_factor


@dataclass
class Flow:
    link: str  # "down" (server egress) or "up" (server ingress)
    remaining: float  # bytes still to move
    cap: float  # the worker's own link bandwidth, bytes/s (before the daily factor)


def fair_rates(flows: list[Flow], capacity: float) -> list[float]:
    """Max-min fair rates of ``flows`` sharing ``capacity`` (0 = unlimited)."""
    if capacity <= 0:
        return [f.cap for f in flows]
    order = sorted(range(len(flows)), key=lambda i: flows[i].cap)
    rates = [0.0] * len(flows)
    left = capacity
    for n, i in enumerate(order):
        share = left / (len(order) - n)
        rates[i] = min(flows[i].cap, share)
        left -= rates[i]
    return rates


class Network:
    def __init__(self, server_down: float, server_up: float, daily_amplitude: float = 0.0,
                 peak_hour: float = 14.0) -> None:
        self.capacity = {"down": server_down, "up": server_up}
        self.amplitude = daily_amplitude
        self.peak_hour = peak_hour
        self.flows: dict[tuple[int, str], Flow] = {}  # (job id, phase) -> flow
        self.t = 0.0  # flows' remaining bytes are as of this time
        self.token = 0  # bumps whenever the schedule changes (stale clock events)

    def factor(self, t: float) -> float:
        """Bandwidth multiplier at virtual time ``t`` (constant within an hour)."""
        return daily_factor(t, self.amplitude, self.peak_hour)

    def _rates(self) -> dict[tuple[int, str], float]:
        m = self.factor(self.t)
        out = {}
        for link in ("down", "up"):
            keys = [k for k, f in self.flows.items() if f.link == link]
            flows = [Flow(f.link, f.remaining, f.cap * m) for f in (self.flows[k] for k in keys)]
            cap = self.capacity[link] * m
            out.update(zip(keys, fair_rates(flows, cap)))
        return out

    def add(self, t: float, key: tuple[int, str], link: str, nbytes: float, cap: float) -> None:
        self._integrate(t)
        self.flows[key] = Flow(link, float(nbytes), float(cap))
        self.token += 1

    def remove(self, t: float, key: tuple[int, str]) -> None:
        self._integrate(t)
        if self.flows.pop(key, None) is not None:
            self.token += 1

    def _integrate(self, t: float) -> None:
        """Move every flow on to time ``t`` at the current rates (finished ones stay
        until ``advance`` hands them out)."""
        if t > self.t and self.flows:
            rates = self._rates()
            dt = t - self.t
            for k, f in self.flows.items():
                f.remaining = max(0.0, f.remaining - rates[k] * dt)
        self.t = max(self.t, t)

    def advance(self, t: float) -> list[tuple[int, str]]:
        """Move every flow on to time ``t``; return (and drop) those finished by then."""
        self._integrate(t)
        done = [k for k, f in self.flows.items() if f.remaining <= 1e-6 * max(1.0, f.cap)]
        for k in done:
            del self.flows[k]
        if done:
            self.token += 1
        return sorted(done)

    def next_finish(self) -> float | None:
        """When the next flow ends at the current rates, or the hour (and with it the
        daily factor) changes, whichever comes first; None without flows."""
        if not self.flows:
            return None
        rates = self._rates()
        t = min(self.t + f.remaining / rates[k] for k, f in self.flows.items())
        if self.amplitude > 0:
            t = min(t, (math.floor(self.t / HOUR) + 1) * HOUR)
        return t

    def state_dict(self) -> dict:
        return {"t": self.t, "token": self.token,
                "flows": {k: (f.link, f.remaining, f.cap) for k, f in self.flows.items()}}

    def load_state_dict(self, state: dict) -> None:
        self.t = state["t"]
        self.token = state["token"]
        self.flows = {k: Flow(*v) for k, v in state["flows"].items()}
