"""``fedlm states``: the workers' saved-state folders on this machine, and which of
them a resume can still use (``fedlm.worker.state_folders``); ``--clean`` removes
the rest."""

from __future__ import annotations

import argparse

from fedlm.files import shown_size


def cmd_states(args: argparse.Namespace) -> int:
    from fedlm.worker import state_folders  # torch (its paths' modules): only when it runs

    folders = state_folders.survey(args.older_than)
    where = state_folders.states_root()
    if not folders:
        print(f"no worker-state folders in {where}")
        return 0
    print(f"{len(folders)} worker-state folders in {where}, "
          f"{shown_size(sum(f.size for f in folders))}")
    removable = [f for f in folders if f.removable]
    for f in folders:
        verdict = "removable" if f.removable else "kept"
        print(f"  {f.path.name[:12]:<12}  {shown_size(f.size):>10}  {f.idle_days:6.1f} d  "
              f"{verdict}: {f.why} ({f.owner})")
    size = shown_size(sum(f.size for f in removable))
    if not args.clean:
        if removable:
            print(f"{len(removable)} removable, {size}: `fedlm states --clean` removes them")
        return 0
    removed = [f for f in removable if state_folders.remove(f)]
    others = len(removable) - len(removed)  # a second --clean at the same time took them
    print(f"removed {len(removed)} folders, {shown_size(sum(f.size for f in removed))}; "
          f"kept {len(folders) - len(removable)}"
          + (f"; {others} removed meanwhile by another `fedlm states --clean`" if others else ""))
    return 0
