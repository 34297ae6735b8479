"""Flower's deployment engine: a local SuperLink + SuperNodes (``fedlm deploy local``),
credentials, the SuperNode with its warm executor, the node's worker process.
"""
