"""Local-steps policies that fill synchronous rounds (``fill``, ``fill-online``), and
fill's job sizes without a round (``fill-sizes``). The DyLU family is beside them in
``local_steps``."""

from __future__ import annotations

import math
import statistics

from fedlm.strategies.local_steps import LocalSteps


class Fill(LocalSteps):
    """Sync rounds without idle time: every worker computes until the round's slowest job ends.

    A synchronous round lasts as long as its slowest whole job of H steps (transfers
    and compute: the link model's, as DyLU's). DyLU shortens the slow workers' jobs to
    the fastest one's; ``fill`` does the opposite and lengthens the fast workers' jobs
    to the slowest one's, so that no worker idles at the barrier:

        T = max_w (X_w + H / v_w)              over the workers the round opens with
        H_w = max(1, floor(v_w · (t_end − now − X_w))),   t_end = t_open + T

    (v = nominal steps per second, X = seconds of transfers per job). The floor makes
    every job end at the round's end or up to one step before it, never after, so the
    round is as long as sync DiLoCo's (fixed H) with the same slowest worker.

    A round opens when the first jobs of a new global version are handed out, or when
    nothing is in flight (a round that starts over from the same model). A worker that
    comes back (or joins) while a round runs gets the time that is left (``now`` is
    later); if less than one step is left it gets no job and waits for the next round.
    A worker that leaves mid-round loses its job (``departed``) and the round closes
    without it, as any sync round does; the next round is sized over the workers
    present then, so a departed slow worker no longer sets its length. Nominal speeds
    (the profiles) are used: a slowed or straggling job ends late and the round waits
    for it, as sync DiLoCo's does (``fill-online`` sizes from what the workers show).
    """

    source = ("fedlm's own (no paper): each job sized to end with the round's slowest whole "
              "job")

    name = "fill"
    sizes_rounds = True

    def start(self, *, steps: int, step_times: list[float],
              transfer_times: list[float] | None = None) -> None:
        super().start(steps=steps, step_times=step_times, transfer_times=transfer_times)
        self.round_version: int | None = None  # the version the open round started from
        self.round_open = self.round_end = 0.0  # when it opened; when its slowest job ends
        self._now = 0.0

    def job_seconds(self, worker: int) -> float:
        """Seconds of ``worker``'s whole job of H steps (nominal: its profile's)."""
        return self.transfer(worker) + self.steps * self.step_seconds(worker)

    def step_seconds(self, worker: int) -> float:
        return self.step_times[worker]

    def transfer(self, worker: int) -> float:
        return self.transfer_times[worker] if self.transfer_times else 0.0

    def offered(self, *, now: float, version: int, workers: list[int], busy: int) -> None:
        if workers and (version != self.round_version or not busy):
            self.round_version, self.round_open = version, now
            self.round_end = now + max(self.job_seconds(w) for w in workers)
        self._now = now

    def local_steps(self, worker: int) -> int:
        left = self.round_end - self._now - self.transfer(worker)
        steps = math.floor(left / self.step_seconds(worker) + 1e-9)  # 20.0 as 19.999... is 20
        # at the round's opening one step at least; a worker that comes in later with
        # less than a step left gets none (it waits for the next round)
        return max(1, steps) if self._now == self.round_open else max(0, steps)


class FillOnline(Fill):
    """Fill, sized from observed step and transfer times (nominal until a worker has shown them).

    Each worker's seconds per step and per job's transfers are the medians of its last
    ``window`` jobs (a worker not yet seen: its profile's), so a round under a lasting
    slow-down is sized to the speeds the workers have now and its fast workers idle
    less; a lone straggling job moves a median little. The round's length follows the
    slowest worker's *observed* whole job of H steps.
    """

    source = "fedlm's own: fill from the medians of each worker's last 5 observed jobs"

    name = "fill-online"
    window = 5

    def start(self, *, steps: int, step_times: list[float],
              transfer_times: list[float] | None = None) -> None:
        super().start(steps=steps, step_times=step_times, transfer_times=transfer_times)
        self.seen_step: list[list[float]] = [[] for _ in step_times]
        self.seen_transfer: list[list[float]] = [[] for _ in step_times]

    def observe(self, worker: int, *, steps: int, seconds: float,
                transfer: float | None = None) -> None:
        if steps > 0 and seconds > 0:
            self.seen_step[worker] = [*self.seen_step[worker], seconds / steps][-self.window:]
        if transfer is not None and transfer >= 0:
            self.seen_transfer[worker] = [*self.seen_transfer[worker], transfer][-self.window:]

    def step_seconds(self, worker: int) -> float:
        seen = self.seen_step[worker]
        return statistics.median(seen) if seen else self.step_times[worker]

    def transfer(self, worker: int) -> float:
        seen = self.seen_transfer[worker]
        return statistics.median(seen) if seen else super().transfer(worker)


class FillSizes(LocalSteps):
    """Fill's job sizes without its rounds: each job as a fill round opened with every worker sizes it.

        T = max_w (X_w + H / v_w),   H_w = max(1, floor(v_w · (T − X_w)))

    Fixed per worker, for any strategy: beside an asynchronous one it isolates what
    asynchrony does from what fill's job sizing does (the same job sizes, no barrier).
    """

    source = ("fedlm's own: fill's sizes, fixed per worker, to isolate asynchrony from job "
              "sizing")

    name = "fill-sizes"

    def start(self, *, steps: int, step_times: list[float],
              transfer_times: list[float] | None = None) -> None:
        super().start(steps=steps, step_times=step_times, transfer_times=transfer_times)
        self._derive()

    def _derive(self) -> None:
        x = self.transfer_times or [0.0] * len(self.step_times)
        longest = max(xw + self.steps * t for xw, t in zip(x, self.step_times))
        self._sizes = [max(1, math.floor((longest - xw) / t + 1e-9))
                       for xw, t in zip(x, self.step_times)]

    def local_steps(self, worker: int) -> int:
        return self._sizes[worker]
