"""Flower's deployment engine: a local SuperLink + SuperNodes (``fedlm deploy local``),
credentials, the SuperLink that only its owner can use, the SuperNode with its warm
executor, the node's worker process.
"""
