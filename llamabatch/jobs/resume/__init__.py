"""What makes a job resumable and checkable: the manifest and its fields, the settings
fingerprint compared on --resume, the line ids already answered (id_sets.py), the crash and
retry journals, the resumable OUTPUT that ties them to the batch loop, and verify.py's re-run
of a sample."""
