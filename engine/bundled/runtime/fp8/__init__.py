"""FP8 checkpoints and W8A8 linears for the bundled engine (docs/fp8.md): one module per format."""
