"""``flower-supernode`` with shorter waits: ``python -m fedlm.supernode ARGS``.

Flower 1.41's SuperNode loop (``flwr/supernode/start_client_internal.py``) has
two hard-coded waits and no setting for them: ``time.sleep(3)`` after a poll
of the SuperLink that found no message (a job waits 1.5 s on average before
its node even sees it), and ``time.sleep(0.5)`` while it waits for the
ClientApp's reply or a reply object to be stored. This entry point runs the
same SuperNode with that module's ``time.sleep`` capped: ``EMPTY_POLL_S``
(``FEDLM_SUPERNODE_POLL_S``, default 0.25 s: 4 light requests a second to the
SuperLink per idle node) after an empty poll, ``LOCAL_WAIT_S`` (0.05 s; a
local check) for the others. Nothing else changes: arguments, TLS,
authentication and logs are Flower's. ``fedlm deploy local`` uses it unless
told not to (``LocalDeployment(node_poll=False)``); see docs/deployment.md for
the upstream issue.
"""

from __future__ import annotations

import os
import sys
import time

from flwr.supernode import start_client_internal as _loop

EMPTY_POLL_S = float(os.environ.get("FEDLM_SUPERNODE_POLL_S", "0.25"))
LOCAL_WAIT_S = 0.05


class _ShortWaits:
    """Stands in for the ``time`` module inside Flower's SuperNode loop (which only
    calls ``time.sleep``)."""

    def __getattr__(self, name: str):
        return getattr(time, name)

    @staticmethod
    def sleep(seconds: float) -> None:
        time.sleep(min(seconds, EMPTY_POLL_S if seconds >= 3 else LOCAL_WAIT_S))


_loop.time = _ShortWaits()


def main() -> None:
    from flwr.supernode.cli import flower_supernode

    sys.argv[0] = "flower-supernode"
    flower_supernode()


if __name__ == "__main__":
    main()
