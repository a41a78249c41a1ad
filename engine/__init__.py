"""Host probe, model runtime, start-up pipeline, HTTP server, adapters and the CLI."""
