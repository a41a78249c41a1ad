"""Builder profiles: the recorded host facts of one class of builder, so a planner elsewhere can key its targets.

A profiles file (TOML) lists one `[[profile]]` per runner class (name, runner_labels,
[profile.platform], [profile.software]); `prebake profile --name N --label L` prints this host's,
ready to append, and examples/profiles/fleet.toml is one. The fields are exactly
prebake.engine.common.probe's Platform and Software (engine packages beside them, by factor), so a
profile keys a target as the probe on that runner would. Found in --profiles, else $PREBAKE_PROFILES.
Reads the file only. docs/fleet.md.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from pathlib import Path

from pydantic import Field

from prebake.artifacts.bake.fleet_plan import Profile
from prebake.artifacts.errors import RecipeError
from prebake.artifacts.frozen import Frozen
from prebake.artifacts.tomlfile import load_toml
from prebake.engine.common.probe import Host, Platform, Software, declared_packages

PROFILES_ENV = "PREBAKE_PROFILES"


class PlatformModel(Frozen):
    device: str
    arch: str
    device_name: str = ""
    device_count: int = Field(default=1, ge=0)
    isa: tuple[str, ...] = ()


class ProfileModel(Frozen):
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    runner_labels: tuple[str, ...] = ()
    platform: PlatformModel
    software: dict[str, str]  # Software's fields and the declared engine packages, by factor (others refused)


class ProfilesFile(Frozen):
    profile: tuple[ProfileModel, ...] = ()


def load_profiles(path: str | Path | None = None, env: Mapping[str, str] = os.environ) -> list[Profile]:
    """The profiles in `path` (else $PREBAKE_PROFILES); none when neither is set."""
    path = path or env.get(PROFILES_ENV)
    if not path:
        return []
    fix = "write one with `prebake profile` on each runner class, and compare with its output"
    models = load_toml(path, ProfilesFile, what="profiles file", error=RecipeError, fix=fix).profile
    return [to_profile(m, path) for m in models]


def to_profile(model: ProfileModel, where: Path | str = "profile") -> Profile:
    try:
        platform = Platform(**model.platform.model_dump())
    except ValueError as exc:
        raise RecipeError(f"{where}: profile {model.name!r}: {exc}") from exc
    host = Host(platform=platform, software=_software(model.software, f"{where}: profile {model.name!r}"))
    return Profile(model.name, host, tuple(model.runner_labels))


def _software(given: Mapping[str, str], where: str) -> Software:
    """The probe's Software from a profile's table: its fields, and every declared engine package
    (absent: not installed on that runner)."""
    own = {f.name for f in dataclasses.fields(Software)} - {"packages"}
    declared = {p.factor for p in declared_packages()}
    unknown = sorted(set(given) - own - declared)
    if unknown or "python" not in given:
        raise RecipeError(
            f"{where}: [profile.software] "
            + (f"names {', '.join(unknown)}, which no probe field or engine package is" if unknown else "lacks python")
            + f"; it takes {', '.join(sorted(own | declared))}: write it again with `prebake profile`"
        )
    packages = tuple(sorted((factor, given.get(factor)) for factor in declared))
    return Software(**{k: v for k, v in given.items() if k in own}, packages=packages)


def host_profile(host: Host, name: str, labels: tuple[str, ...] = ()) -> ProfileModel:
    return ProfileModel(
        name=name,
        runner_labels=labels,
        platform=PlatformModel(**dataclasses.asdict(host.platform)),
        software=host.software.versions() | {"prebake_schema": host.software.prebake_schema},
    )


def render_toml(model: ProfileModel) -> str:
    """One `[[profile]]` table; values are JSON strings and lists, which TOML reads the same."""
    lines = [
        "[[profile]]",
        f"name = {json.dumps(model.name)}",
        f"runner_labels = {json.dumps(list(model.runner_labels))}",
    ]
    for section in ("platform", "software"):
        lines.append(f"[profile.{section}]")
        values = getattr(model, section)
        for k, v in (values.model_dump() if section == "platform" else values).items():
            if v is not None:
                lines.append(f"{k} = {json.dumps(list(v) if isinstance(v, tuple) else v)}")
    return "\n".join(lines) + "\n"
