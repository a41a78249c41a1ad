"""prebake: a Make-style build system for the compiled artifacts of LLM serving engines.

The one import package of the wheel. Its sub-packages are the repository's top-level folders:

    prebake.artifacts   the core: bucket sets, the bundle format, the local store, the bake itself
    prebake.registry    the backends of the core's registry port: folder, S3, Hugging Face Hub; signing
    prebake.engine      host probe, composition root, CLI, fleet executors, one folder per engine
    prebake.recipes     the shipped recipes (package data)

In a checkout, prebake/ holds symbolic links to those folders, so that the checkout imports exactly
what the wheel installs.
"""

from importlib import metadata as _metadata

# The one version every part reports (`prebake --version`, a manifest's builder): the installed
# distribution's, read from its metadata.

try:
    __version__ = _metadata.version("prebake")
except _metadata.PackageNotFoundError:  # a checkout that was never installed
    __version__ = "unknown (not installed)"
