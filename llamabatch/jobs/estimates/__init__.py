"""What a job would cost before it runs (`estimate_job`, `run --dry-run`): estimate.py reads the
input and the model; estimate_arithmetic.py is the arithmetic alone."""
