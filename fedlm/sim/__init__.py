"""The simulated world: virtual clock, worker profiles (the fleet), shared network
links, injected faults, wire sizes and compression. No torch except compression.
"""
