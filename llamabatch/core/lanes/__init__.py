"""The engine's lanes: each kind of work the tick loop moves (generation, embeddings) behind one
interface (work_lane.py), and the requests they end (open_requests.py)."""
