"""A measured region-to-region network: ``fleet.matrix``, and HALoS's as ``fleet.preset = "halos"``.

A matrix names the regions and gives the bandwidth (Gbit/s) from each region to
each other, and optionally the one-way latency (seconds)::

    [fleet.matrix]
    regions = ["h0", "h1"]            # the server sits in the first
    gbit = [[100, 0.5], [0.5, 100]]   # row -> column; the diagonal: inside the region
    latency = [[0, 0.04], [0.04, 0]]  # optional, default 0

Each region becomes a ``Region`` whose link to the server is its row and column of
the server's region (``up_bw`` = gbit[r][0], ``down_bw`` = gbit[0][r]) and whose
``intra_bw`` is its diagonal: every strategy then sees the matrix through the
links it already uses (a star to the server; halos: workers to their region's
server over the diagonal, region servers to the global one over the server links).

``fleet.preset = "halos"`` is HALoS's environment (utnslab/halos, examples/env.yaml):
four regions with the bandwidths they measured between cloud regions, and four
workers per region at the speeds they give (relative; the fastest runs at
``fleet.base_step_time``). Other worker counts are spread evenly over the four
regions (or as ``fleet.topology`` says), each region cycling through its speeds.
"""

from __future__ import annotations

from typing import Any

from fedlm.sim.links import GBIT

HALOS_REGIONS = ["h0", "h1", "h2", "h3"]
HALOS_GBIT = [[100, 0.537, 0.935, 0.202],
              [0.537, 100, 0.386, 0.117],
              [0.935, 0.386, 100, 0.127],
              [0.202, 0.117, 0.127, 100]]
HALOS_SPEEDS = [[0.232, 0.907, 0.828, 0.347],
                [0.574, 0.531, 0.722, 0.194],
                [0.852, 0.132, 0.896, 0.107],
                [0.827, 0.515, 0.527, 0.788]]
HALOS_MATRIX = {"regions": HALOS_REGIONS, "gbit": HALOS_GBIT}


def matrix_of(preset: str, matrix: dict[str, Any]) -> dict[str, Any]:
    """The fleet's matrix: its own, else the preset's (halos), else none ({})."""
    return matrix or (HALOS_MATRIX if preset == "halos" else {})


def matrix_regions(matrix: dict[str, Any]) -> dict[str, tuple[float, float, float, float]]:
    """name -> (latency, down_bw, up_bw, intra_bw) in seconds and bytes/s, the server in
    the first region."""
    names, gbit = matrix.get("regions", []), matrix.get("gbit", [])
    latency = matrix.get("latency") or [[0.0] * len(names) for _ in names]
    return {name: (float(latency[r][0]), gbit[0][r] * GBIT, gbit[r][0] * GBIT,
                   gbit[r][r] * GBIT) for r, name in enumerate(names)}


def halos_placement(n: int) -> list[str]:
    """HALoS's regions for ``n`` workers: evenly, in blocks (16: four per region)."""
    return [HALOS_REGIONS[w * len(HALOS_REGIONS) // n] for w in range(n)]


def halos_step_times(regions: list[str], base_step_time: float) -> list[float]:
    """Each worker's step time: its region's speeds in turn, the fastest (over all
    regions) at ``base_step_time``."""
    fastest = max(max(s) for s in HALOS_SPEEDS)
    seen = {}
    out = []
    for name in regions:
        r = HALOS_REGIONS.index(name) if name in HALOS_REGIONS else 0
        k = seen[name] = seen.get(name, -1) + 1
        speeds = HALOS_SPEEDS[r]
        out.append(base_step_time * fastest / speeds[k % len(speeds)])
    return out


# What a link of a measured network may be: past these the virtual times stop meaning
# anything (a 1e-300 Gbit/s link takes 1e297 s to cross; a 1e308 s latency is inf).
MIN_GBIT, MAX_GBIT, MAX_LATENCY = 1e-6, 1e6, 3600.0


def matrix_problem(matrix: dict[str, Any]) -> str | None:
    """Why ``matrix`` is not a usable ``fleet.matrix`` (one line), or None."""
    if not matrix:
        return None
    if set(matrix) - {"regions", "gbit", "latency"} or "regions" not in matrix \
            or "gbit" not in matrix:
        return "must be a table {regions = [names], gbit = [[Gbit/s]], latency = [[s]]}"
    names = matrix["regions"]
    if not (isinstance(names, list) and names and all(isinstance(x, str) for x in names)
            and len(set(names)) == len(names)):
        return "regions: must be a list of distinct names"
    for key in ("gbit", "latency"):
        rows = matrix.get(key)
        if rows is None:
            continue
        square = (isinstance(rows, list) and len(rows) == len(names)
                  and all(isinstance(r, list) and len(r) == len(names) for r in rows))
        if not square:
            return f"{key}: must be {len(names)} rows of {len(names)} numbers"
        values = [v for r in rows for v in r]
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
            return f"{key}: must hold numbers"
        if key == "gbit" and not all(MIN_GBIT <= v <= MAX_GBIT for v in values):
            return (f"gbit: every bandwidth must be between {MIN_GBIT:g} and {MAX_GBIT:g} "
                    f"Gbit/s (1 kbit/s to 1 Pbit/s)")
        if key == "latency" and not all(0 <= v <= MAX_LATENCY for v in values):
            return f"latency: every latency must be between 0 and {MAX_LATENCY:g} s"
    return None
