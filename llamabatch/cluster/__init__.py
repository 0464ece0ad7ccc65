"""Scale-out for `run --ray`: engines on Ray workers behind one Engine-like pool.

pool.py is the only module of llamabatch that imports ray (import it lazily); dispatch.py
(which worker runs which line, crashes, poison) and plan.py (placement, per-worker tallies)
are plain Python, tested without a cluster.
"""
