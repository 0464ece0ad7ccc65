"""A job over tables: what a run does with them, decided before the model loads
(table_plan.py), reading rows as lines (table_input.py), and writing the results table
(table_output.py, table_writers.py, table_layout.py, sqlite_output.py)."""
