"""Local-steps policies: how many inner steps a worker's next job gets.

Chosen independently of the strategy (config key ``local_steps``). A policy
sees the worker's profile-derived speed and the configured H and returns an
int >= 1.
"""

from __future__ import annotations

import copy
import heapq
import math
import statistics
from abc import ABC, abstractmethod
from collections import Counter
from typing import ClassVar


class LocalSteps(ABC):
    name: ClassVar[str] = ""
    source: ClassVar[str] = ""  # as Strategy.source: follows PAPER / reconstruction / fedlm's own
    # Whether it sizes jobs so that the ones handed out together finish together
    # (then the engine's grace = "auto" waits for them: fedlm/engine/grace.py).
    even_times: ClassVar[bool] = False
    # Whether it sizes a synchronous round as a whole: the engine then tells it who is
    # offered a job, and when, before it asks for any job's size (``offered``), and
    # refuses it beside an asynchronous strategy, which has no rounds.
    sizes_rounds: ClassVar[bool] = False

    def start(self, *, steps: int, step_times: list[float],
              transfer_times: list[float] | None = None) -> None:
        """``steps`` = configured H; ``step_times`` = nominal seconds per step per worker;
        ``transfer_times`` = seconds of each worker's job spent moving the model and its
        update (the link model's, on the virtual clock; None: not known in advance)."""
        self.steps = steps
        self.step_times = list(step_times)
        self.transfer_times = list(transfer_times) if transfer_times is not None else None

    def sizes_even(self) -> bool:
        """Whether the jobs it hands out together end together (after ``start``)."""
        return self.even_times

    @abstractmethod
    def local_steps(self, worker: int) -> int:
        """Inner steps for ``worker``'s next job."""

    def observe(self, worker: int, *, steps: int, seconds: float,
                transfer: float | None = None) -> None:
        """A job of ``steps`` steps took ``seconds`` of compute and ``transfer`` seconds
        of everything else (for online estimates)."""

    def presence(self, worker: int, *, at: float, here: bool) -> None:
        """``worker`` came (``here``) or went away at ``at`` seconds, told once it has
        happened (every worker is there at 0; a fault's time offline is not an absence)."""

    def offered(self, *, now: float, version: int, workers: list[int], busy: int) -> None:
        """(``sizes_rounds`` policies only) ``workers`` are about to be offered jobs at
        ``now`` from global ``version``, while ``busy`` jobs are in flight."""

    def state_dict(self) -> dict:
        """What the policy has learnt so far (for checkpoints): its attributes, but
        those named with a leading underscore (what it derives from the others)."""
        return {k: copy.deepcopy(v) for k, v in vars(self).items() if not k.startswith("_")}

    def load_state_dict(self, state: dict) -> None:
        vars(self).update(copy.deepcopy(state))
        self._derive()

    def _derive(self) -> None:
        """Rebuild what the policy derives from its state (after ``start`` or a load)."""


class Fixed(LocalSteps):
    """Every job runs the configured H steps."""

    source = "follows DiLoCo and Local SGD: every job H steps"

    name = "fixed"

    def local_steps(self, worker: int) -> int:
        return self.steps


class DyLU(LocalSteps):
    """Dynamic Local Updates: slower workers get fewer steps, so jobs take the same time.

    From Liu et al. 2024, https://arxiv.org/abs/2401.09135: every worker's job
    then takes about as long as the fastest worker's H steps.

        H_w = max(1, round(v_w / v_r · H + v_w · (X_r − X_w))),   v = steps per second

    where X is the seconds a worker's job spends on transfers (download and upload
    over its link, from the link model the engine times jobs with) and r the worker
    whose whole job of H steps, X_r + H / v_r, is the shortest: each worker computes
    for what is left of that job time once its own transfers are done, so the *whole*
    jobs handed out together end together, not only their compute. With equal links
    (X_r = X_w) this is the paper's rule, v_w / max v · H, bit for bit. A worker whose
    transfers alone outlast the target gets one step (no fewer): its jobs end after
    the cohort's, by its transfers' excess, so the jobs handed out together no longer
    end together and ``grace = auto`` does not open the adaptive window
    (``sizes_even``; fedlm/engine/grace.py).

    Speeds come from the workers' profiles (nominal seconds per step). Rounded to
    the nearest step, so a job lands within half a step of the target time, early
    or late; the paper's floor (``dylu-floor``) always lands early, up to a whole
    step: at H = 20 on the 8-worker ``very`` fleet its jobs take 14.4-20 s, nearest's
    18.6-21.6 s, and jobs handed out together are meant to finish together
    (fedlm/engine/grace.py).
    """

    source = ("fedlm's extension of Liu et al. 2024's DyLU: rounded to the nearest step, "
              "and each worker's transfers counted so whole jobs end together (the paper's "
              "rule: dylu-paper)")

    name = "dylu"
    even_times = True

    def start(self, *, steps: int, step_times: list[float],
              transfer_times: list[float] | None = None) -> None:
        super().start(steps=steps, step_times=step_times, transfer_times=transfer_times)
        self._derive()

    def _derive(self) -> None:
        # the reference worker, asked at every job: not a pass over the fleet
        self._fastest = max(self.speeds())
        x = self.transfer_times
        if not x or min(x) == max(x):  # equal links: the fastest computer is the reference
            self._ref = (self._fastest, x[0] if x else 0.0)
        else:
            v = self.speeds()
            r = min(range(len(v)), key=lambda w: x[w] + self.steps / v[w])
            self._ref = (v[r], x[r])

    def speeds(self) -> list[float]:
        return [1.0 / t for t in self.step_times]

    def speed(self, worker: int) -> float:
        return 1.0 / self.step_times[worker]

    def transfer(self, worker: int) -> float:
        return self.transfer_times[worker] if self.transfer_times else 0.0

    def fastest(self) -> float:
        """``max(self.speeds())``."""
        return self._fastest

    def reference(self) -> tuple[float, float]:
        """(speed, transfer seconds) of the worker whose whole job of H steps is shortest."""
        return self._ref

    def sizes_even(self) -> bool:
        """True unless some worker's transfers alone outlast the reference job by more
        than half of its step: it is held at one step and its jobs end late."""
        x = getattr(self, "transfer_times", None)
        if not x or min(x) == max(x):  # not started, links unknown, or equal links
            return True
        v_ref, x_ref = self.reference()
        return all(self.speed(w) * (x_ref + self.steps / v_ref - self.transfer(w)) >= 0.5
                   for w in range(len(self.step_times)))

    def local_steps(self, worker: int) -> int:
        v_ref, x_ref = self.reference()
        v = self.speed(worker)
        return max(1, self.round(v / v_ref * self.steps + v * (x_ref - self.transfer(worker))))

    @staticmethod
    def round(x: float) -> int:
        return math.floor(x + 0.5)  # half up, not Python's half-to-even


class DyLUFloor(DyLU):
    """DyLU rounded down as the paper rounds; fedlm's link term kept (``dylu-paper``: without)."""

    source = ("the paper's rounding (floor) with fedlm's link term: not the paper's rule on "
              "unequal links (that is dylu-paper)")

    name = "dylu-floor"

    @staticmethod
    def round(x: float) -> int:
        return math.floor(x + 1e-9)  # 20.0 computed as 19.999... is still 20


class DyLUPaper(DyLUFloor):
    """The paper's DyLU as it states it: H_w = max(1, floor(v_w / max v · H)), compute only.

    Liu et al. 2024, Sec. 3.2: every worker's compute takes about as long as the
    fastest worker's H steps; the paper's workers share one network, so its rule has no
    link term. On unequal links the whole jobs (transfers and compute) then end apart,
    which ``dylu`` and ``dylu-floor`` correct for; this policy is the paper's rule for
    comparing against them."""

    source = ("follows Liu et al. 2024 (arXiv 2401.09135), Sec. 3.2: H_w = max(1, floor(v_w "
              "/ max v * H)), compute only")

    name = "dylu-paper"

    def _derive(self) -> None:
        self._fastest = max(self.speeds())
        self._ref = (self._fastest, 0.0)

    def transfer(self, worker: int) -> float:
        return 0.0  # compute only

    def sizes_even(self) -> bool:
        x = getattr(self, "transfer_times", None)  # None: not started, or links unknown
        return not x or min(x) == max(x)


class DyLURtt(DyLU):
    """DyLU, but no job computes for less than its own round trip: H_w = max(DyLU's, ceil(v_w X_w))."""

    source = ("fedlm's own, after Shadowheart SGD (arXiv 2402.04785): a budget from each "
              "worker's compute and communication times; DyLU's size, or the steps that "
              "cover the job's own transfers, whichever is more")
    name = "dylu-rtt"

    def _cover(self, worker: int) -> int:
        return math.ceil(self.speed(worker) * self.transfer(worker) - 1e-9)

    def local_steps(self, worker: int) -> int:
        return max(super().local_steps(worker), self._cover(worker))

    def sizes_even(self) -> bool:
        """As DyLU's, unless a far worker's jobs are lengthened past the cohort's."""
        if not super().sizes_even() or getattr(self, "transfer_times", None) is None:
            return super().sizes_even()  # uneven already, or not started: DyLU's answer
        return all(self._cover(w) <= DyLU.local_steps(self, w)
                   for w in range(len(self.step_times)))


class DyLUOnline(DyLU):
    """DyLU with speeds estimated from observed compute times.

    Each worker's seconds per step is the median of its last ``window``
    observations, so one slow job (a hiccup) does not shrink its H, and one
    slow worker's hiccup does not shrink everyone else's (the max speed is a
    median too). A worker not yet observed is assumed as fast as the fastest
    observed one, so it starts with the full H.
    """

    source = ("fedlm's own: DyLU (the link-aware rule) from observed speeds; the paper allows "
              "estimating speeds, without saying how")

    name = "dylu-online"
    window = 5

    def start(self, *, steps: int, step_times: list[float],
              transfer_times: list[float] | None = None) -> None:
        self.observed: list[list[float]] = [[] for _ in step_times]
        # seconds of each of its last jobs spent on anything but compute (its transfers)
        self.observed_transfer: list[list[float]] = [[] for _ in step_times]
        super().start(steps=steps, step_times=step_times)

    def _derive(self) -> None:
        # each observed worker's speed, and a heap of (-speed, worker) for the fastest:
        # entries that no longer match a worker's speed are dropped when met
        self._speed: list[float | None] = [1.0 / statistics.median(h) if h else None
                                           for h in self.observed]
        self._by_speed = [(-v, w) for w, v in enumerate(self._speed) if v is not None]
        heapq.heapify(self._by_speed)
        if not hasattr(self, "observed_transfer"):  # a checkpoint from before transfers
            self.observed_transfer = [[] for _ in self._speed]
        self._transfer = [statistics.median(h) if h else 0.0 for h in self.observed_transfer]
        self._transfer_values = Counter(self._transfer)  # one key: every transfer the same

    def observe(self, worker: int, *, steps: int, seconds: float,
                transfer: float | None = None) -> None:
        if transfer is not None and transfer >= 0:
            hist = self.observed_transfer[worker]
            hist.append(transfer)
            del hist[:-self.window]
            old, new = self._transfer[worker], statistics.median(hist)
            self._transfer[worker] = new
            values = self._transfer_values
            values[old] -= 1
            if not values[old]:
                del values[old]
            values[new] += 1
        if steps > 0 and seconds > 0:
            hist = self.observed[worker]
            hist.append(seconds / steps)
            del hist[:-self.window]
            v = self._speed[worker] = 1.0 / statistics.median(hist)
            heapq.heappush(self._by_speed, (-v, worker))
            if len(self._by_speed) > 2 * len(self._speed) + 64:
                self._derive()

    def speeds(self) -> list[float]:
        known = [1.0 / statistics.median(h) for h in self.observed if h]
        fastest = max(known) if known else 1.0
        return [1.0 / statistics.median(h) if h else fastest for h in self.observed]

    def fastest(self) -> float:
        """``max(self.speeds())``: the fastest observed speed (1.0 before any)."""
        heap = self._by_speed
        while heap and self._speed[heap[0][1]] != -heap[0][0]:
            heapq.heappop(heap)
        return -heap[0][0] if heap else 1.0

    def speed(self, worker: int) -> float:
        """``self.speeds()[worker]``: its observed speed, else the fastest one's."""
        v = self._speed[worker]
        return self.fastest() if v is None else v

    def transfer(self, worker: int) -> float:
        """The median of its observed transfer seconds (0 before any)."""
        return self._transfer[worker]

    def reference(self) -> tuple[float, float]:
        """As ``DyLU.reference``, from what the workers have shown: the fastest computer
        while every observed transfer time is the same, else the worker whose observed
        whole job of H steps is shortest (a pass over the observed workers)."""
        x = self._transfer
        if len(self._transfer_values) == 1:
            return self.fastest(), x[0]
        known = [w for w, v in enumerate(self._speed) if v is not None]
        if not known:
            return self.fastest(), 0.0
        r = min(known, key=lambda w: x[w] + self.steps / self._speed[w])
        return self._speed[r], x[r]
