"""Load the data sheets in ``moepolicy/data/sheets/`` (validated once, cached).

Errors name the file, the YAML path and the field, with the nearest valid name where one exists.
"""

from __future__ import annotations

import difflib
from functools import lru_cache
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from moepolicy._resources import data_dir
from moepolicy.errors import RulePackError
from moepolicy.schema.capability import DeepEPSheet, GpuProfile, GpuSheet, KernelSheet
from moepolicy.schema.locations import yaml_path

T = TypeVar("T", bound=BaseModel)


MAX_DATA_FILE_BYTES = 16 * 1024 * 1024  # a rule pack, sheet, search space or calibration file


def read_yaml(path: Path) -> Any:
    """Safe-load a YAML file; any problem becomes one line naming the file."""
    from moepolicy.files import read_bounded

    try:
        text = read_bounded(path, MAX_DATA_FILE_BYTES, RulePackError).decode("utf-8")
    except UnicodeDecodeError:
        raise RulePackError(f"{path}: is not UTF-8 text") from None
    from moepolicy.safe_yaml import loads, yaml_problem

    try:
        return loads(text)
    except yaml.YAMLError as exc:
        raise RulePackError(f"{path}: {yaml_problem(exc)}") from None
    except (ValueError, RecursionError) as exc:
        raise RulePackError(f"{path}: unreadable ({type(exc).__name__}: {exc})") from None


def describe_validation(path: Path | str, exc: ValidationError, model: type[BaseModel]) -> str:
    err = exc.errors()[0]
    loc = tuple(err.get("loc", ()))
    where = yaml_path(loc)
    message = err.get("msg", "invalid")
    if err.get("type") == "extra_forbidden" and loc:
        valid = _field_names(model, loc[:-1])
        near = difflib.get_close_matches(str(loc[-1]), valid, n=1)
        message = f"unknown field '{loc[-1]}'" + (f" (did you mean '{near[0]}'?)" if near else "")
    more = f" (+{len(exc.errors()) - 1} more)" if len(exc.errors()) > 1 else ""
    return f"{path}: {where}: {message}{more}"


def _field_names(model: type[BaseModel], loc: tuple) -> list[str]:
    current: Any = model
    for part in loc:
        if isinstance(part, int) or not (
            isinstance(current, type) and issubclass(current, BaseModel)
        ):
            continue
        field = current.model_fields.get(str(part))
        if field is None:
            return []
        annotation = field.annotation
        args = getattr(annotation, "__args__", ()) or ()
        candidates = [
            a for a in (annotation, *args) if isinstance(a, type) and issubclass(a, BaseModel)
        ]
        current = candidates[0] if candidates else None
    if isinstance(current, type) and issubclass(current, BaseModel):
        return [f.alias or n for n, f in current.model_fields.items()]
    return []


def load_model(path: Path, model: type[T]) -> T:
    data = read_yaml(path)
    if not isinstance(data, dict):
        raise RulePackError(f"{path}: expected a mapping at the top, got {type(data).__name__}")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise RulePackError(describe_validation(path, exc, model)) from None


@lru_cache(maxsize=None)
def gpu_sheet() -> GpuSheet:
    return load_model(data_dir("sheets") / "gpus.yaml", GpuSheet)


def gpu_profile(name: str) -> GpuProfile:
    from moepolicy.errors import UsageError

    gpus = gpu_sheet().gpus
    key = name.lower()
    if key not in gpus:
        near = difflib.get_close_matches(key, list(gpus), n=1)
        hint = f" (did you mean '{near[0]}'?)" if near else ""
        raise UsageError(
            f"gpu {name!r} is not a known profile{hint}; known: {', '.join(gpus)}", field="gpu"
        )
    return gpus[key]


@lru_cache(maxsize=None)
def kernel_sheet() -> KernelSheet:
    return load_model(data_dir("sheets") / "expert_kernels.yaml", KernelSheet)


@lru_cache(maxsize=None)
def deepep_sheets() -> dict[str, DeepEPSheet]:
    sheets = {}
    for path in sorted((data_dir("sheets") / "deepep").glob("*.yaml")):
        sheet = load_model(path, DeepEPSheet)
        sheets[sheet.name] = sheet
    return sheets


NEWEST_SHEET = "deepep-legacy-29d31c0"


def deepep_sheet(name: str) -> DeepEPSheet:
    from moepolicy.errors import UsageError

    sheets = deepep_sheets()
    for sheet in sheets.values():
        if name in (sheet.name, sheet.version, sheet.commit, sheet.name.removeprefix("deepep-")):
            return sheet
    raise UsageError(
        f"deep_ep_version {name!r} matches no capability sheet; known: "
        + ", ".join(f"{s.name} ({s.version})" for s in sheets.values()),
        field="deep_ep_version",
    )
