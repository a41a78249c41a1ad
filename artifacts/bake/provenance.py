"""Provenance: who built a bundle, from what, with which toolchain, as an in-toto Statement.

Each bake writes one Statement (in-toto v1) with the SLSA provenance v1 predicate: subject the
bundle's blob; buildDefinition with the recipe, target, kind and key, and resolvedDependencies
(the recipe's sha256, the source revision, upstream bundles, toolchain and engine packages as
pkg: URIs, the platform probe); runDetails with the builder id and the run's times. The formats
are the maintained bindings' own (in_toto_attestation, protobuf's JSON mapping): nothing here
writes them by hand. registry.trust.attestation seals it in DSSE, published beside the blob
(SideFiles, SIDE_NAME). `read_statement` turns a payload back into the few facts a policy checks.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from prebake.artifacts.bundle.manifest import Manifest
from prebake.artifacts.errors import BundleError
from prebake.artifacts.keys import canonical_json
from prebake.artifacts.recipe.schema import Recipe, Target

if TYPE_CHECKING:
    from in_toto_attestation.v1.resource_descriptor import ResourceDescriptor

# The in-toto and protobuf bindings (0.1 s) are imported by the functions that write or read a
# Statement: a start that checks no provenance (a restore, docs/snapshots.md) imports neither.

PREDICATE_TYPE = "https://slsa.dev/provenance/v1"
BUILD_TYPE = "https://github.com/prebake/prebake/blob/main/docs/trust.md#bake-v1"
PROMOTE_TYPE = "https://github.com/prebake/prebake/blob/main/docs/trust.md#promote-v1"  # a reviewed write-back
PAYLOAD_TYPE = "application/vnd.in-toto+json"  # the DSSE payload type of an in-toto Statement
SIDE_NAME = "provenance.intoto.dsse.json"  # the side file beside the blob

# software factor (prebake.engine.common.probe.Software) -> package URL of the dependency it names
_PACKAGES = {
    "torch": "pkg:pypi/torch",
    "triton": "pkg:pypi/triton",
    "cuda_runtime": "pkg:generic/cuda-runtime",
    "habana": "pkg:pypi/habana-torch-plugin",
    "driver": "pkg:generic/driver",
    "python": "pkg:generic/python",
}
_NAMES = {"cuda_runtime": "cuda-runtime", "habana": "habana-torch-plugin"}
# An engine's own packages come with their names and package URLs (PackageURLs, below).
PackageURLs = Mapping[str, tuple[str, str]]  # software factor -> (dependency name, package URL)


@dataclass(frozen=True)
class SourceRevision:
    """The source checkout a bake ran from: its remote (credentials removed) and commit."""

    uri: str
    commit: str


@dataclass(frozen=True)
class BuildContext:
    """What the composition root knows about this builder, for every statement it writes."""

    builder_id: str
    platform: Mapping[str, str]
    software: Mapping[str, str]  # the prebake.engine.common.probe.Software versions that are set (the driver in full)
    prebake_version: str
    source: SourceRevision | None = None
    invocation_id: str = ""
    packages: PackageURLs = field(default_factory=dict)  # the engines' declared packages among `software`


@dataclass(frozen=True)
class Attest:
    """How a bake attests: the builder's context, and `seal` (Statement JSON -> DSSE envelope JSON)."""

    context: BuildContext
    seal: Callable[[bytes], bytes] = field(repr=False)


@dataclass(frozen=True)
class Provenance:
    """The facts of a Statement a trust policy checks."""

    subject_digest: str  # "sha256:<hex>"
    builder_id: str
    build_type: str
    dependencies: dict[str, str]  # name -> version ("torch" -> "2.13.0+cpu")
    recipe_digest: str | None
    finished: str | None  # RFC 3339


def recipe_digest(recipe: Recipe) -> str:
    """The recipe as it was validated, hashed: the same recipe reads the same wherever it lies."""
    return hashlib.sha256(canonical_json(recipe.model_dump(mode="json"))).hexdigest()


def statement(
    manifest: Manifest,
    recipe: Recipe,
    target: Target,
    context: BuildContext,
    *,
    started: dt.datetime,
    finished: dt.datetime,
    build_type: str = BUILD_TYPE,
    review: Mapping[str, str] | None = None,
) -> bytes:
    """The in-toto Statement (SLSA provenance v1) for `manifest`'s blob, as JSON bytes. A promotion
    (PROMOTE_TYPE) records what it reviewed in internalParameters.review."""
    from google.protobuf import json_format
    from in_toto_attestation.predicates.provenance.v1 import provenance_pb2
    from in_toto_attestation.v1.resource_descriptor import ResourceDescriptor
    from in_toto_attestation.v1.statement import Statement

    predicate = provenance_pb2.Provenance()
    build = predicate.build_definition
    build.build_type = build_type
    build.external_parameters.update(
        {"recipe": recipe.model.name, "target": target.name, "kind": manifest.kind, "key": manifest.key_digest}
    )
    build.internal_parameters.update({"key": manifest.key, **({"review": dict(review)} if review else {})})
    build.resolved_dependencies.extend(d.pb for d in _dependencies(manifest, recipe, context))
    run = predicate.run_details
    run.builder.id = context.builder_id
    run.metadata.invocation_id = context.invocation_id or f"{manifest.kind}-{manifest.key_digest[:16]}"
    run.metadata.started_on.FromDatetime(started)
    run.metadata.finished_on.FromDatetime(finished)
    subject = ResourceDescriptor(
        name=f"{manifest.kind}/{manifest.key_digest}.tar.zst", digest={"sha256": manifest.blob.hex}
    )
    document = Statement([subject.pb], PREDICATE_TYPE, json_format.MessageToDict(predicate))
    document.validate()
    return json.dumps(json_format.MessageToDict(document.pb), sort_keys=True).encode()


def read_statement(payload: bytes) -> Provenance:
    """The policy's facts from a Statement's JSON; BundleError naming what is wrong with it."""
    from google.protobuf import json_format
    from in_toto_attestation.predicates.provenance.v1 import provenance_pb2
    from in_toto_attestation.v1 import statement_pb2
    from in_toto_attestation.v1.statement import Statement

    try:
        parsed = json_format.Parse(payload, statement_pb2.Statement())
        document = Statement.copy_from_pb(parsed)
        document.validate()
        if document.pb.predicate_type != PREDICATE_TYPE:
            raise ValueError(f"predicate type {document.pb.predicate_type!r} is not {PREDICATE_TYPE}")
        predicate = provenance_pb2.Provenance()
        json_format.ParseDict(json_format.MessageToDict(document.pb.predicate), predicate)
    except (ValueError, json_format.ParseError) as exc:
        raise BundleError(f"the provenance statement is not an in-toto v1 SLSA provenance statement: {exc}") from exc
    if len(document.pb.subject) != 1 or "sha256" not in document.pb.subject[0].digest:
        raise BundleError("the provenance statement must name exactly one subject by its sha256")
    deps: dict[str, str] = {}
    recipe = None
    for dep in predicate.build_definition.resolved_dependencies:
        if dep.name.startswith("recipe:"):
            recipe = dep.digest.get("sha256")
        elif "version" in dep.annotations:
            deps[dep.name] = _text(dep.annotations["version"])
    finished = predicate.run_details.metadata
    return Provenance(
        subject_digest="sha256:" + document.pb.subject[0].digest["sha256"],
        builder_id=predicate.run_details.builder.id,
        build_type=predicate.build_definition.build_type,
        dependencies=deps,
        recipe_digest=recipe,
        finished=finished.finished_on.ToJsonString() if finished.HasField("finished_on") else None,
    )


def _dependencies(manifest: Manifest, recipe: Recipe, context: BuildContext) -> list[ResourceDescriptor]:
    from in_toto_attestation.v1.resource_descriptor import ResourceDescriptor

    deps = [
        ResourceDescriptor(
            name=f"recipe:{recipe.model.name}",
            digest={"sha256": recipe_digest(recipe)},
            annotations={"engine": recipe.model.engine},
        )
    ]
    if context.source is not None:
        deps.append(
            ResourceDescriptor(name="source", uri=context.source.uri, digest={"gitCommit": context.source.commit})
        )
    deps += [
        ResourceDescriptor(name=f"bundle:{kind}", digest={"sha256": digest.removeprefix("sha256:")})
        for kind, digest in sorted(manifest.inputs.items())
    ]
    for name, (purl, version) in _versions(context.software, context.prebake_version, context.packages).items():
        deps.append(ResourceDescriptor(name=name, uri=f"{purl}@{version}", annotations={"version": version}))
    deps.append(ResourceDescriptor(name="platform", annotations=dict(context.platform)))
    return deps


def dependency_versions(software: Mapping[str, str], prebake_version: str, packages: PackageURLs) -> dict[str, str]:
    """The versions a Statement's resolvedDependencies name, by dependency name, for a host's
    software (prebake.engine.common.probe.Software versions): what a policy's "host" constraint compares with."""
    return {name: version for name, (_purl, version) in _versions(software, prebake_version, packages).items()}


def _versions(software: Mapping[str, str], prebake_version: str, packages: PackageURLs) -> dict[str, tuple[str, str]]:
    urls = {f: (_NAMES.get(f, f), purl) for f, purl in _PACKAGES.items()} | dict(packages)
    out = {name: (purl, software[f]) for f, (name, purl) in urls.items() if software.get(f)}
    out["prebake"] = ("pkg:pypi/prebake", prebake_version)
    return out


def _text(value: object) -> str:
    """An annotation's value as text (protobuf's Struct reads JSON numbers back as floats)."""
    return value if isinstance(value, str) else json.dumps(value)
