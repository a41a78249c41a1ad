"""What every backend shares: verified transfers, ranged downloads, and the registry over an object store."""
