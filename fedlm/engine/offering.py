"""Offering jobs to free workers, the part of the engine's loop that asks who gets one.

At each scan the free workers are offered in the pool's order (sampled when
``max_in_flight`` caps the jobs in flight). Where the strategy draws each round from
those available (a ``Synchronous`` strategy's drawn rounds: client sampling) or the
local-steps policy sizes the round from everyone offered (``fill``), the present workers are offered to
them first, as one list; a draw is logged with the op of the round's first dispatch,
so that replay offers the same list again; those of it not drawn are ``not drawn`` on
the timeline until the round is over (``IntervalKind.NOT_DRAWN``: the pool's
``left_out`` and ``round_over``; nothing a job is given reads it). Then each wanted
worker gets a job of the policy's size, within the local-step budget and the cap.
"""

from __future__ import annotations

from fedlm.engine.types import Interrupted


class Offering:
    """A mixin of ``Engine``: its scan of the free workers (it reads the engine's pool,
    server, policy, presence, budget and log)."""

    def _dispatch_free_workers(self) -> None:
        now = self.now
        cap = self.cfg.max_in_flight
        if self.budget.spent(self.steps_done, self.in_flight.steps()):
            # nobody gets a job: none is asked (not the whole fleet at every event)
            self.pool.pass_over(self.version, len(self.in_flight))
            return
        candidates = self.pool.candidates(self.version, len(self.in_flight))
        asked = self.server.draws_rounds or self.policy.sizes_rounds
        if asked:  # the round is drawn, or sized, from everyone present
            if self.server.awaits_draw and self.pool.not_drawn:  # the last round is over
                self.log.intervals(self.pool.round_over(
                    now, self.version, self.presence and self.presence.absent_since))
            candidates = self._offer([w for w in candidates if self._present(w, now)], now)
        for w in candidates:
            # asked at every job: handing out a round to thousands of workers takes
            # long (in one process each job runs as it is handed out), a stop must not wait
            if self.inbox.should_stop():
                raise Interrupted("interrupted")
            if cap and len(self.in_flight) >= cap:
                self.pool.blocked = True
                break
            if not asked and not self._takes_job(w, now):
                continue
            steps = self.server.job_steps(w, self.version, self._allowed)
            if steps is not None:
                self._dispatch(w, now, steps)

    def _allowed(self, steps: int) -> int:
        """Steps of a job within the local-step budget (``fedlm.engine.budget``)."""
        return self.budget.allow(steps, self.steps_done, self.in_flight.steps())

    def _offer(self, present: list[int], now: float) -> list[int]:
        """The present workers the server wants, once it has drawn its round from them
        (logged with the next op, for replay) and the policy has sized it."""
        among = self.server.offered(present, self.version)
        if among is not None:
            self.log.round_drawn(now, among)
        if self.server.awaits_draw:  # next scan, every free worker: a draw takes them all
            self.pool.blocked = True
        wanted = [w for w in present if self.server.wants_job(w, self.version)]
        if among is not None:  # those it did not draw are not drawn until the round is over
            drawn = set(wanted)
            rows = self.pool.left_out([w for w in among if w not in drawn], now, self.version)
            if rows:
                self.log.intervals(rows)
        if self.policy.sizes_rounds:
            self.policy.offered(now=now, version=self.version, workers=wanted,
                                busy=len(self.in_flight))
        return wanted

    def _present(self, w: int, now: float) -> bool:
        """Whether free worker ``w`` is there (an absent one leaves the pool until it is
        back) and not retired."""
        if self.presence is not None and self.presence.gone_away(w, now, self.version):
            return False
        return w not in self.pool.retired

    def _takes_job(self, w: int, now: float) -> bool:
        """Whether free worker ``w`` is offered a job now: present, and wanted."""
        return self._present(w, now) and self.server.wants_job(w, self.version)
