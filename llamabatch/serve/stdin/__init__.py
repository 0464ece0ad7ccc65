"""serve-stdin as a library: the JSON-lines protocol (protocol.py: lines in, events out, no I/O)
and the loop that serves it over two file descriptors (loop.py: `serve`)."""
