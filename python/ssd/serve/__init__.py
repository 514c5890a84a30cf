"""``ssd serve``: an OpenAI-compatible HTTP server with Prometheus metrics (docs/serving.md).

app: the FastAPI application and its handlers; protocol: request bodies and
their SamplingParams; metrics: the /metrics series; server: uvicorn with a
drain on SIGTERM, and a thread-hosted server for tests and benchmarks.
"""
from ssd.serve.app import ServerState, build_app
from ssd.serve.server import ServerThread, make_server

__all__ = ["ServerState", "ServerThread", "build_app", "make_server"]
