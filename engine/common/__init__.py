"""What every engine and command shares: the host probe, the environment table, logging, the
engine-adapter interface. Nothing here imports an engine, the composition root or the CLI."""
