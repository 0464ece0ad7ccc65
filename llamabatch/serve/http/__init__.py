"""`llamabatch serve`'s library: OpenAI's Files and Batches API and the online endpoints
(/v1/chat/completions, /v1/completions, /v1/embeddings) over one shared engine.

    service = Service(engine, data_dir, settings)   # catalogue, file store, batch queue
    app = build_app(service, api_key="...")         # a Starlette ASGI app
    serve(app, host="127.0.0.1", port=8080)         # uvicorn, until SIGINT/SIGTERM

Batches run one at a time, in the order they were created, through llamabatch.jobs with the
service's engine; online requests share that engine (see scheduling.py). Starlette and uvicorn
come with the `serve` extra, imported only by app.py and server.py.
"""
