"""Reading the shipped CI examples: the workflow's steps, the manifests' commands, the prebake calls in them."""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator
from pathlib import Path

import yaml

from tests.support.baking import REPO

EXAMPLES = REPO / "examples"
WORKFLOW = EXAMPLES / "github-actions" / "bake.yml"
_PREBAKE_CALL = re.compile(r"(?:^|[\s;(|&])(prebake\s[^;|&)>\n]*)")
_EXPRESSION = re.compile(r"\$\{\{\s*([^}]*?)\s*\}\}")


def manifests() -> list[tuple[Path, dict]]:
    return [
        (p, doc) for p in sorted((EXAMPLES / "kubernetes").glob("*.yaml")) for doc in yaml.safe_load_all(p.read_text())
    ]


def pod_scripts(doc: dict) -> Iterator[tuple[str, list[str]]]:
    """(container name, its command line) of every container and init container of a Job or Deployment."""
    pod = doc["spec"]["template"]["spec"]
    for container in pod.get("initContainers", []) + pod["containers"]:
        yield container["name"], [*container.get("command", []), *container.get("args", [])]


def prebake_calls(script: str) -> list[list[str]]:
    """Every `prebake ...` command in a shell script, split into words (continuations joined)."""
    joined = script.replace("\\\n", " ")
    return [shlex.split(m.group(1)) for m in _PREBAKE_CALL.finditer(joined)]


def workflow() -> dict:
    return yaml.safe_load(WORKFLOW.read_text())


def resolve(text: str, context: dict[str, str]) -> str:
    """Replace `${{ a.b }}` expressions by their values in `context` (an unknown one fails the test)."""

    def value(match: re.Match) -> str:
        name = match.group(1)
        if name not in context:
            raise AssertionError(f"the workflow uses ${{{{ {name} }}}}, which the test does not provide")
        return context[name]

    return _EXPRESSION.sub(value, text)
