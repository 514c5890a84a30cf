"""``ssd serve``: an OpenAI-compatible HTTP server with Prometheus metrics (docs/serving.md).

app: the FastAPI application and its handlers; guard: what every request
passes first (API key, body size and read time); prepare: a body parsed,
rendered and tokenised on worker threads; protocol: request bodies and their
SamplingParams; connections: deadlines on headers and a cap on connections;
metrics: the /metrics series; server: uvicorn with a drain on SIGTERM or
SIGINT, and a thread-hosted server for tests and benchmarks.
"""
from ssd.serve.app import ServerState, build_app
from ssd.serve.server import ServerThread, make_server

__all__ = ["ServerState", "ServerThread", "build_app", "make_server"]
