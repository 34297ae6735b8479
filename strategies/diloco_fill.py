"""Synchronous DiLoCo whose rounds leave no worker idle: the sync reference of the fleets studies.

Sync DiLoCo with fixed H makes every fast worker wait at the barrier for the slowest
(the straggler effect); ``diloco-dylu`` removes the wait by giving the slow workers
fewer steps, which on a fleet whose round trips are WAN-bound leaves them one step
per round. ``diloco-fill`` keeps sync DiLoCo's round length (the slowest whole job of
H steps) and gives every other worker as many steps as fit in it
(``local_steps = fill``, fedlm/strategies/local_steps.py): all workers compute for
the whole round, so sync spends its time as an asynchronous method does, and a
comparison with DN + DyLU tells what asynchrony itself buys.

``--set strategy=diloco-fill`` is ``strategy=diloco local_steps=fill
outer.weighting=WEIGHTING``, bit for bit, where ``WEIGHTING`` is the merge chosen on
tuning seeds (experiments/archive/results/fleets.md, "Choosing the merge"): with a 10x
spread of speeds the fastest worker runs 10x the slowest one's steps, and whether its
update should count by its tokens, alike, or normalised per step (FedNova) is an
empirical question. ``local_steps`` other than ``fill`` are refused: with ``fixed``
it is ``diloco``, with DyLU ``diloco-dylu``.
"""

from __future__ import annotations

from typing import ClassVar

from fedlm.strategies.diloco import DiLoCo

_OTHER_ARM = "it is sync DiLoCo on fill's job sizes; for {} use strategy={}"


class DiLoCoFill(DiLoCo):
    """Sync DiLoCo with local_steps fill: every worker computes until the round's slowest job ends."""

    source = ("fedlm's own: DiLoCo (follows its paper) on fill's job sizes; the merge "
              "(tokens, uniform, FedNova) chosen on tuning seeds")

    name = "diloco-fill"
    default_local_steps: ClassVar[str] = "fill"
    refused_local_steps: ClassVar[dict[str, str]] = {
        "fixed": _OTHER_ARM.format("fixed H", "diloco"),
        "dylu": _OTHER_ARM.format("DyLU's job sizes", "diloco-dylu"),
        "dylu-floor": _OTHER_ARM.format("DyLU's job sizes", "diloco-dylu"),
        "dylu-online": _OTHER_ARM.format("DyLU's job sizes", "diloco-dylu"),
        "dylu-paper": _OTHER_ARM.format("DyLU's job sizes", "diloco-dylu")}

    def __init__(self, *, lr: float = 0.7, momentum: float = 0.9, nesterov: bool = True,
                 weighting: str = "tokens", min_replies: int = 1, **sampling) -> None:
        super().__init__(lr=lr, momentum=momentum, nesterov=nesterov, weighting=weighting,
                         min_replies=min_replies, **sampling)
