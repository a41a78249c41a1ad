"""Process snapshots of the bundled engine (docs/snapshots.md): a warm, parked serving process
dumped with CRIU at the bake (dump.py, of prebake.engine.bundled.parked), packed as the `snapshot` kind (kind.py), and
restored before serving (restore.py, serving.py), falling back to the usual start on any failure.
host.py says whether this host can; files.py and image.py say what a restore depends on."""
