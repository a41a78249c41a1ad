"""prebake: a Make-style build system for the compiled artifacts of LLM serving engines.

The one import package of the wheel. Its sub-packages are the repository's top-level folders:

    prebake.artifacts   the core: bucket sets, the bundle format, the local store, the bake itself
    prebake.registry    the backends of the core's registry port: folder, S3, Hugging Face Hub; signing
    prebake.engine      host probe, composition root, CLI, fleet executors, one folder per engine
    prebake.recipes     the shipped recipes (package data)

In a checkout, prebake/ holds symbolic links to those folders, so that the checkout imports exactly
what the wheel installs.
"""

NOT_INSTALLED = "unknown (not installed)"  # __version__ in a checkout that was never installed


def __getattr__(name: str) -> str:
    """`prebake.__version__`: the one version every part reports (`prebake --version`, a manifest's
    builder, the store's mark, the HTTP API's /version), the installed distribution's, read from its
    metadata when first asked (importlib's metadata costs a start about 20 ms before it can do anything
    else: common/cores.py)."""
    if name != "__version__":
        raise AttributeError(f"module 'prebake' has no attribute {name!r}")
    from importlib import metadata

    try:
        version = metadata.version("prebake")
    except metadata.PackageNotFoundError:  # a checkout that was never installed
        version = NOT_INSTALLED
    globals()["__version__"] = version
    return version
