"""Any job-size policy on Streaming DiLoCo's fragment rounds (``stream.fragments = P``):
the streamed server's view of the run's ``local_steps``.

A policy sizes a worker's *outer step*: H_w inner steps (``fixed``: H), which the
streamed server splits into its P rounds as the paper splits H (``segment_steps``).
What a policy that times its jobs (``fill``, ``dylu``) must see is a fragment round,
not a DiLoCo round: it lasts about 1/P of the outer step's compute, and what it waits
for is its fragment's exchange, less the τ steps that hide it. So the policy is shown
a fragment round in units of 1/P of a step:

    step time    s_w / P         (a round of H units is H / P steps: a fragment round)
    transfers    max(0, X_w / P − τ · s_w)    (the exposed part of a fragment's exchange)

(X_w: the whole model's transfers on worker w's own link; a fragment moves about 1/P of
the model, so 1/P of them, latency included: nominal.) Then fill's round ends when the
slowest worker's fragment job ends, a fast worker gets the units that fit before it,
and its segment of them is the steps of its fragment job. What a job took is shown to
the policy in the same units (its seconds over P). ``fixed`` gives H, and its segments
are the built-in streaming's, bit for bit. With P = 1 and τ = H it is a whole-model
round whose exchange hides behind its compute (the overlapped and eager plug-ins').
"""

from __future__ import annotations

from fedlm.strategies.local_steps import LocalSteps


class FragmentRoundSteps(LocalSteps):
    """The run's policy (``inner``), shown fragment rounds of P fragments overlapped by
    τ steps (the module's docstring)."""

    name = "fragment rounds"

    def __init__(self, inner: LocalSteps, fragments: int, overlap: int) -> None:
        self.inner, self.fragments, self.overlap = inner, fragments, overlap
        self.sizes_rounds = inner.sizes_rounds  # fill is offered each fragment round
        self.source = inner.source

    def start(self, *, steps: int, step_times: list[float],
              transfer_times: list[float] | None = None) -> None:
        p, tau = self.fragments, self.overlap
        units = [s / p for s in step_times]
        exposed = (None if transfer_times is None else
                   [max(0.0, x / p - tau * s) for x, s in zip(transfer_times, step_times)])
        self.inner.start(steps=steps, step_times=units, transfer_times=exposed)

    def sizes_even(self) -> bool:
        return self.inner.sizes_even()

    def local_steps(self, worker: int) -> int:
        """Units of ``worker``'s outer step (the server takes a fragment's segment)."""
        return self.inner.local_steps(worker)

    def observe(self, worker: int, *, steps: int, seconds: float,
                transfer: float | None = None) -> None:
        self.inner.observe(worker, steps=steps, seconds=seconds / self.fragments,
                           transfer=transfer)

    def offered(self, *, now: float, version: int, workers: list[int], busy: int) -> None:
        self.inner.offered(now=now, version=version, workers=workers, busy=busy)

    def presence(self, worker: int, *, at: float, here: bool) -> None:
        self.inner.presence(worker, at=at, here=here)

    def state_dict(self) -> dict:
        return self.inner.state_dict()  # a checkpoint of the policy alone, as before

    def load_state_dict(self, state: dict) -> None:
        self.inner.load_state_dict(state)
