"""fedlm: federated and low-communication training of language models, on Flower.

``strategies/`` and ``dashboard/`` sit at the top of the repository, where the product
card puts them, and are installed as ``fedlm.strategies`` and ``fedlm.dashboard``
(pyproject's ``package-dir``), so no generic top-level name lands in site-packages.
Where this package runs from a source tree or a Flower app bundle (a SuperNode loads
the bundle's copy of ``fedlm/``), those two folders are siblings of this one, not
inside it; they are registered here under the same names, so one import path works
everywhere.
"""

import importlib.util
import sys
from pathlib import Path

_HERE = Path(__file__).resolve().parent


def _sibling_package(name: str) -> None:
    folder = _HERE.parent / name
    if (_HERE / name).is_dir() or not (folder / "__init__.py").is_file():
        return  # installed inside fedlm (a wheel), or not there at all
    full = f"{__name__}.{name}"
    if full in sys.modules:
        return
    spec = importlib.util.spec_from_file_location(
        full, folder / "__init__.py", submodule_search_locations=[str(folder)])
    module = importlib.util.module_from_spec(spec)
    sys.modules[full] = module
    spec.loader.exec_module(module)
    globals()[name] = module


for _name in ("strategies", "dashboard"):
    _sibling_package(_name)
