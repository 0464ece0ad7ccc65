"""`llamabatch bench`: throughput, latency and tick telemetry."""
