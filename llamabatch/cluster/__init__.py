"""Scale-out for `run --ray`: engines on Ray workers behind one Engine-like pool.

pool.py (the pool), startup.py (Ray and the actors started), worker.py (the actor),
watcher.py (the calls and the thread that watches them) and ray_errors.py are the only modules
of llamabatch that import ray (import pool.py lazily); dispatch.py (which worker runs which
line, crashes, poison), affinity.py (online requests to the worker that ran their prefix) and
plan.py (placement, per-worker tallies) are plain Python, tested without a cluster.
"""
