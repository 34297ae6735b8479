"""Sweeps: arms x profiles x seeds (``run``), their report (``report``) and the
statistics over seeds (``uncertainty``).
"""
