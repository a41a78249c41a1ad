"""Promotion: a serving pod's write-back, reviewed on a trusted builder, enters the shared index.

For each write-back in the quarantine namespace (registry.review.writeback), upstream kinds
first: re-verify its blob and files in a scratch store, check that every upstream bundle is in
the index, sign a copy without the writeback label with the promoter's key (with a provenance
statement of build type PROMOTE_TYPE), publish it create-only, and move it out of the
quarantine's index where the backend can. A rebuild is the stronger review: `prebake bake` on
the trusted builder makes the same key from source and wins the index over any write-back not
yet promoted. docs/trust.md lists each check.
"""

from __future__ import annotations

import datetime as dt
import tempfile
from dataclasses import dataclass

from prebake.artifacts.bake.bake_kind import MODEL_SIGNATURE_SIDE_NAME, ModelSign
from prebake.artifacts.bake.provenance import PROMOTE_TYPE, SIDE_NAME, Attest, BuildContext, statement
from prebake.artifacts.bundle.manifest import Manifest
from prebake.artifacts.errors import PrebakeError
from prebake.artifacts.fetch.gate import WRITE_BACK_LABEL, unreviewed
from prebake.artifacts.ports.errors import PublishConflict
from prebake.artifacts.ports.registry import Maintainable, Registry, SideFiles
from prebake.artifacts.recipe.schema import load_recipe, targets
from prebake.artifacts.store.local import Store
from prebake.registry.trust.signing import KeySigner


@dataclass(frozen=True)
class Promoted:
    kind: str
    key_digest: str
    outcome: str  # "promoted", "already in the index", "refused: ...", "would promote"

    @property
    def ok(self) -> bool:
        return not self.outcome.startswith("refused")


@dataclass(frozen=True)
class Review:
    """What `prebake promote` did (or `--list` found waiting) between a quarantine and its index."""

    quarantine: str
    index: str
    results: tuple[Promoted, ...] = ()
    waiting: tuple[Manifest, ...] | None = None  # --list: the write-backs awaiting review

    def to_json(self) -> dict[str, object]:
        if self.waiting is not None:
            rows = [
                {"kind": m.kind, "key": m.key_digest, "model": m.labels.get("model", ""), "created": m.created,
                 "builder": m.builder}
                for m in self.waiting
            ]  # fmt: skip
            return {"quarantine": self.quarantine, "waiting": rows}
        return {"quarantine": self.quarantine, "index": self.index, "results": [r.__dict__ for r in self.results]}

    def render_waiting(self) -> str:
        waiting = self.waiting or ()
        lines = [f"{len(waiting)} write-back(s) awaiting review in {self.quarantine}"]
        for m in waiting:
            model = m.labels.get("model", "")
            lines.append(f"  {m.kind:9} {m.key_digest[:16]}  {model:20} {m.created}  {m.builder}")
        return "\n".join(lines)

    def render(self) -> str:
        lines = [f"promote {self.quarantine} -> {self.index}: {len(self.results)} write-back(s)"]
        return "\n".join([*lines, *(f"  {r.kind:9} {r.key_digest[:16]}  {r.outcome}" for r in self.results)])


def promote(
    incoming: Registry,
    index: Registry,
    *,
    signer: KeySigner,
    attest: Attest | None,
    kind: str | None = None,
    key_prefix: str = "",
    dry_run: bool = False,
    model_sign: ModelSign | None = None,
) -> list[Promoted]:
    """Review and promote every write-back in `incoming` (narrowed to a kind and key prefix) into `index`;
    with `model_sign`, each reviewed tree also gets its OpenSSF model signature beside its blob."""
    entries = [m for m in incoming.list(kind) if m.key_digest.startswith(key_prefix)]
    entries.sort(key=lambda m: len(m.inputs))  # upstream kinds first
    return [_promote_one(m, incoming, index, signer, attest, dry_run, model_sign) for m in entries]


def _promote_one(
    m: Manifest,
    incoming: Registry,
    index: Registry,
    signer: KeySigner,
    attest: Attest | None,
    dry_run: bool,
    model_sign: ModelSign | None = None,
) -> Promoted:
    def out(outcome: str) -> Promoted:
        return Promoted(m.kind, m.key_digest, outcome)

    if m.labels.get(WRITE_BACK_LABEL) != "quarantine":
        return out("refused: not a write-back (no writeback=quarantine label); bake it instead")
    if (why := _inputs_problem(m, index)) is not None:
        return out(f"refused: {why}")
    with tempfile.TemporaryDirectory(prefix="prebake-promote-") as scratch:
        store = Store(scratch)
        try:
            installed = store.install(m, incoming)  # the digest, then every file against the list
        except PrebakeError as exc:
            return out(f"refused: it does not verify: {exc}")
        if dry_run:
            return out("would promote")
        reviewed = _reviewed(m, signer)
        if attest is not None and isinstance(index, SideFiles):
            try:
                document = _statement(reviewed, m, incoming, attest.context)
            except PrebakeError as exc:
                return out(
                    f"refused: its provenance cannot be written here ({exc}); promote on a builder with the recipe"
                )
            index.put_side(reviewed.blob.digest, SIDE_NAME, attest.seal(document))
        if model_sign is not None and isinstance(index, SideFiles):
            index.put_side(reviewed.blob.digest, MODEL_SIGNATURE_SIDE_NAME, model_sign(installed.tree))
        try:
            published = index.publish(reviewed, store.blob_path(m.blob.digest))
        except PublishConflict as exc:
            return out(f"refused: the index already holds another build of this key ({exc}); nothing to promote")
    if isinstance(incoming, Maintainable):
        incoming.quarantine(m.kind, m.key_digest)
    return out("promoted" if published.created else "already in the index (the same bundle)")


def _inputs_problem(m: Manifest, index: Registry) -> str | None:
    for kind, blob in sorted(m.inputs.items()):
        key = m.key.get("inputs", {}).get(kind)
        entry = index.lookup(kind, key) if key else None
        if entry is None or entry.blob.digest != blob or unreviewed(entry) is not None:
            return (
                f"it was built on {kind} blob {blob[:23]}, which the index does not hold reviewed; promote that first"
            )
    return None


def _reviewed(m: Manifest, signer: KeySigner) -> Manifest:
    labels = {k: v for k, v in m.labels.items() if k != WRITE_BACK_LABEL}
    copy = m.model_copy(
        update={"labels": labels, "signatures": (), "builder": f"{m.builder}; promoted by {signer.name}"}
    )
    return signer(copy)


def _statement(reviewed: Manifest, original: Manifest, incoming: Registry, context: BuildContext) -> bytes:
    now = dt.datetime.now(dt.UTC)
    labels = reviewed.labels
    recipe = load_recipe(labels.get("model", ""))
    tp = int(labels["tp"]) if labels.get("tp", "").isdigit() else None
    target = targets(recipe, dtype=labels.get("precision"), tp=tp)[0]
    review = {"from": incoming.url, "original_builder": original.builder, "created": original.created}
    return statement(
        reviewed, recipe, target, context, started=now, finished=now, build_type=PROMOTE_TYPE, review=review
    )
