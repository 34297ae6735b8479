"""A job on a worker: the inner loop (``train``), the optimizer states kept by job id
(``states``), the arithmetic of the inner loop on CPU or GPU (``precision``), the
device each worker's jobs run on (``placement``).
"""
