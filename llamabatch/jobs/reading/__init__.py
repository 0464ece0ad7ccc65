"""Reading a job's INPUT: the prompts file or stdin line by line (input_source.py), the
context the lines need before the engine opens (context_fit.py), and which read line starts
next (start_order.py)."""
