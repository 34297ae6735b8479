"""The simulated world: virtual clock, worker profiles (the fleet), shared network
links, injected faults, wire sizes and compression, and what a run holds in this
machine's memory (``memory``: ``fedlm run`` refuses one that cannot fit). No torch
except compression.
"""
