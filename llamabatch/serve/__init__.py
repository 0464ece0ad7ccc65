"""The libraries behind the serving commands: stdin/ (serve-stdin's JSON-lines protocol and its
I/O loop) and http/ (the HTTP service). Neither is imported here, so each loads only what it needs."""
