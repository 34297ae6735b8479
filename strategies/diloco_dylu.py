"""Synchronous DiLoCo on DyLU's job sizes: the sync baseline for DN + DyLU.

Liu et al. 2024 ("Asynchronous Local-SGD Training for Language Modeling",
https://arxiv.org/abs/2401.09135) pair delayed Nesterov with dynamic local updates
(DyLU: a worker v times slower than the fastest gets H/v inner steps, so every job
takes about as long as the fastest worker's H steps), and compare the pair with
synchronous DiLoCo whose every worker runs H steps, so that each round waits for the
slowest worker's H steps. This arm gives the synchronous round DyLU's job sizes too,
so that a comparison tells what the job sizes do from what asynchrony does.

``--set strategy=diloco-dylu`` is ``strategy=diloco local_steps=dylu
outer.weighting=tokens``, bit for bit (a test pins the final weights):

- ``local_steps`` is ``dylu`` where the config leaves it out (``default_local_steps``,
  read by ``registry.local_steps_for`` when the config is loaded); ``dylu-floor`` and
  ``dylu-online`` are taken as given; ``fixed`` is refused, since this arm without
  DyLU's job sizes is plain ``diloco``.
- ``outer.weighting`` is ``tokens``, DiLoCo's own: a worker's outer gradient counts
  in proportion to the tokens it trained (with DyLU, to its steps: 20, 9, 4 and 2 at
  H = 20 on the 4-worker ``very`` fleet). ``uniform`` (each worker alike, as each
  arrival is in delayed Nesterov) ended behind or level on every tuning run;
  docs/async_local_sgd.md has the measurement.

No streaming settings (``stream.fragments``, ``overlap``, ``mix``): streaming rounds
need the same H for every worker.
"""

from __future__ import annotations

from typing import ClassVar

from fedlm.strategies.diloco import DiLoCo


class DiLoCoDyLU(DiLoCo):
    """Sync DiLoCo on DyLU's job sizes: local_steps dylu, so slow workers run fewer steps."""

    source = ("fedlm's own: DiLoCo (follows its paper) on DyLU's job sizes, the sync twin "
              "of DN + DyLU (Liu et al. 2024 compare DN + DyLU with fixed-H DiLoCo instead)")

    name = "diloco-dylu"
    # Read by the registry when a config is loaded (``registry.local_steps_for``): the
    # policy a run gets where the config leaves ``local_steps`` out, and the policies
    # refused, each with the hint its one-line message gives.
    default_local_steps: ClassVar[str] = "dylu"
    refused_local_steps: ClassVar[dict[str, str]] = {
        "fixed": "it is sync DiLoCo on DyLU's job sizes; for fixed H use strategy=diloco"}

    def __init__(self, *, lr: float = 0.7, momentum: float = 0.9, nesterov: bool = True,
                 weighting: str = "tokens", min_replies: int = 1, **sampling) -> None:
        super().__init__(lr=lr, momentum=momentum, nesterov=nesterov, weighting=weighting,
                         min_replies=min_replies, **sampling)
