"""The optional extras of the wheel, and the one-line error when a feature's extra is missing.

`pip install prebake` bakes and fetches through a folder registry; each extra brings the packages
of one feature. pyproject.toml's [project.optional-dependencies] holds the same table
(tests/repo/test_extras.py checks one against the other). A feature calls `require` where it
starts, before importing anything of its extra.
"""

from __future__ import annotations

from importlib.util import find_spec

from prebake.artifacts.errors import MissingExtraError

# extra -> the modules it brings (import names); a new extra adds a row
EXTRAS: dict[str, tuple[str, ...]] = {
    "torch": ("torch", "safetensors"),
    "serve": ("fastapi", "uvicorn", "jinja2", "prometheus_client", "tokenizers"),
    "gguf": ("gguf",),
    "s3": ("boto3", "tqdm"),
    "hf": ("huggingface_hub",),
    "oci": ("httpx",),
    "azure": ("azure.storage.blob",),
    "model-signing": ("model_signing", "OpenSSL"),
    "ray": ("ray",),
}


def missing(extra: str) -> str | None:
    """The first module of `extra` that cannot be imported here, or None when all can."""
    for module in EXTRAS[extra]:
        try:
            found = find_spec(module)
        except ModuleNotFoundError:  # a dotted name whose parent package is absent
            found = None
        if found is None:
            return module
    return None


def require(extra: str, feature: str) -> None:
    """Raise MissingExtraError, one line naming the extra, unless every module of `extra` is installed.

    `feature` names who needs it and starts the line: "an s3:// registry", "prebake serve".
    """
    module = missing(extra)
    if module is not None:
        raise MissingExtraError(f"{feature} needs {module}: pip install 'prebake[{extra}]'")
