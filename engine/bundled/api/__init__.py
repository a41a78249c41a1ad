"""The bundled engine's OpenAI-compatible HTTP API (FastAPI): schema, routes, guards, streaming."""
