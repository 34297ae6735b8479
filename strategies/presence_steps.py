"""A job-size policy that keeps the work of workers who leave: fill's rounds, each job
bounded by how long its worker is expected to stay (``local_steps = fill-presence``).

On a fleet whose workers come and go, a job whose worker leaves before it reports is
lost whole (``departed``): on the churn trace of the far-workers study a sixth of the
workers' present time was such work, with ``fill`` sizing every job to the round's end
whatever its worker's habits. This policy sees each worker arrive and leave (the engine
tells it, ``LocalSteps.presence``, at the time each happened and never before) and
estimates its departure rate from what the run has seen of it:

    λ_w = (d_w + 1) / (T_w + T / D)

d_w departures in T_w seconds present so far (the present span counted up to now),
with one pseudo-departure at the fleet's mean stay T / D as the prior (D departures in
T seconds present, every worker): a worker never seen to leave gets the fleet's rate,
shrunk by how long it has stayed. Until any worker has left, λ = 0 and jobs are fill's.

Under a constant departure rate λ (stays exponential, so the time already stayed says
nothing of the time left), a job of H steps of s seconds after X seconds of transfers
is applied with probability e^(−λ(X + H s)), and its expected applied steps
H e^(−λ(X + H s)) are largest at H s = 1/λ: the job computes no longer than its worker
is expected to stay. So

    H_w = min( fill's H_w, max(1, floor(1 / (λ_w s_w))) )

A bounded job ends before the round does and its worker waits for the round's end:
idle time bought against a lost job. Nominal speeds (the profiles), as ``fill``.
"""

from __future__ import annotations

import math

from fedlm.strategies.fill_steps import Fill


class FillPresence(Fill):
    """Fill, each job bounded by its worker's expected stay, learnt from the run's presence."""

    source = ("fedlm's own: fill's rounds, each job no longer than its worker's expected "
              "stay (1/λ, λ from the departures the run has seen, the fleet's as prior)")

    name = "fill-presence"

    def start(self, *, steps: int, step_times: list[float],
              transfer_times: list[float] | None = None) -> None:
        super().start(steps=steps, step_times=step_times, transfer_times=transfer_times)
        count = len(step_times)
        self.arrived: list[float | None] = [0.0] * count  # the present span's start
        self.stayed = [0.0] * count  # seconds present in spans that have ended
        self.left = [0] * count  # departures seen

    def presence(self, worker: int, *, at: float, here: bool) -> None:
        if here:
            self.arrived[worker] = at
            return
        began = self.arrived[worker]
        if began is None:
            return
        self.stayed[worker] += max(0.0, at - began)
        if at > began:  # else absent from its arrival on (a late joiner): it never stayed
            self.left[worker] += 1
        self.arrived[worker] = None

    def present_seconds(self, worker: int) -> float:
        began = self.arrived[worker]
        return self.stayed[worker] + (max(0.0, self._now - began) if began is not None else 0.0)

    def rate(self, worker: int) -> float:
        """λ_w, departures a second (0: no worker has left yet)."""
        departures = sum(self.left)
        if departures == 0:
            return 0.0
        fleet_stay = sum(self.present_seconds(w) for w in range(len(self.left))) / departures
        return (self.left[worker] + 1) / (self.present_seconds(worker) + fleet_stay)

    def local_steps(self, worker: int) -> int:
        steps = super().local_steps(worker)
        rate = self.rate(worker)
        if steps == 0 or rate == 0.0:
            return steps
        bound = max(1, math.floor(1.0 / (rate * self.step_seconds(worker)) + 1e-9))
        return min(steps, bound)
