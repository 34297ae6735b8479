"""Flower's side of a run: the ServerApp and ClientApp, the messages between them,
and the call into Flower's simulation engine (Ray).
"""
