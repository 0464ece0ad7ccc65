"""Writing a job's OUTPUT: opened and checked before the model loads (output_sink.py), one
whole record per line from the writer thread (record_writer.py), failed lines to --error-file
(error_file.py), one run per OUTPUT at a time (output_lock.py), and the files a run writes
(written_files.py)."""
