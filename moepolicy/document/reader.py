"""Read a policy document from disk: safe YAML, schema version, Pydantic validation, integrity.

Used by the CLI (``validate``, ``explain``, ``audit``, ``export``) and the runtime loader. Every
problem is a :class:`PolicyError` whose one line names the file, the YAML path and the rule broken.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Generic, Optional, Protocol, Sequence, TypeVar
from typing import overload

from moepolicy.errors import PolicyError
from moepolicy.schema.locations import yaml_path
from moepolicy.text import is_digits
from moepolicy.document.keys import compute_keys
from moepolicy.document.constraints import (
    READABLE_MAJORS,
    SCHEMA_VERSION,
    CHUNK_DEFAULTS,
    CHUNK_FIELDS,
)
from moepolicy.deepep.buffers import ht_buffer_bytes, low_latency_bytes_hint
from moepolicy.files import read_bounded, file_kind

if TYPE_CHECKING:
    from moepolicy.document.model import PolicyDoc

READER_MAJOR, READER_MINOR = (int(x) for x in SCHEMA_VERSION.split("."))


class PolicyView(Protocol):
    """A validated policy with attribute access: the CLI's Pydantic ``PolicyDoc`` or the runtime's
    light ``View`` over the validated tree; both have these sections."""

    @property
    def schema_version(self) -> str: ...
    @property
    def model(self) -> Any: ...
    @property
    def target(self) -> Any: ...
    @property
    def rules(self) -> Any: ...
    @property
    def deepep(self) -> Any: ...
    @property
    def layers(self) -> Any: ...


# what a parser validated the document into: the Pydantic PolicyDoc, or the light reader's dict
DocT = TypeVar("DocT")


@dataclass(frozen=True)
class LoadedPolicy(Generic[DocT]):
    doc: DocT
    raw: dict[str, Any]
    warnings: tuple[str, ...] = field(default_factory=tuple)


def check_version(raw: dict[str, Any], source: str) -> None:
    version = raw.get("schema_version")
    if (
        not isinstance(version, str)
        or version.count(".") != 1
        or not all(is_digits(p) for p in version.split("."))
    ):
        raise PolicyError(
            f"{source}: schema_version must be 'MAJOR.MINOR' (this reader: "
            f"{SCHEMA_VERSION}), got {version!r}"
        )
    major = int(version.split(".")[0])
    if major not in READABLE_MAJORS:
        raise PolicyError(
            f"{source}: schema_version {version} needs a reader of major version {major}; this "
            f"moepolicy reads {' and '.join(f'{m}.x' for m in READABLE_MAJORS)} (upgrade moepolicy, or re-plan "
            "with this one)"
        )


def _parse_raw(text: str, source: str) -> dict[str, Any]:
    # YAML: loaded when a document is read, not with the reader's names
    from moepolicy.document.yaml_io import parse_text
    from moepolicy.safe_yaml import yaml_problem

    import yaml

    try:
        raw = parse_text(text)
    except yaml.YAMLError as exc:
        raise PolicyError(f"{source}: {yaml_problem(exc)}") from None
    except (ValueError, RecursionError) as exc:  # alias bombs, absurd numbers, deep nesting
        raise PolicyError(f"{source}: unreadable document ({type(exc).__name__}: {exc})") from None
    except PolicyError as exc:  # layer facts named in layer_facts that do not resolve
        raise PolicyError(f"{source}: {exc}", field=exc.field) from None
    if not isinstance(raw, dict):
        raise PolicyError(f"{source}: a policy is a mapping at the top, got {type(raw).__name__}")
    check_version(raw, source)
    return raw


def _finish(
    raw: dict[str, Any], doc: DocT, extra: list[str], version: str, source: str, strict: bool
) -> LoadedPolicy[DocT]:
    warnings = []
    if extra:
        newer = tuple(int(x) for x in version.split(".")) > (READER_MAJOR, READER_MINOR)
        # a 1.x document's unknown keys are checked against 2.x's fields, the superset
        why = (
            f"from schema {version}, newer than this reader's {SCHEMA_VERSION}"
            if newer
            else "not in schema " + SCHEMA_VERSION
        )
        message = f"{source}: unknown keys {why}: {', '.join(extra[:5])}" + (
            f" (+{len(extra) - 5} more)" if len(extra) > 5 else ""
        )
        if strict:
            raise PolicyError(message + " (refused in strict mode)")
        warnings.append(message + " (ignored)")
    try:
        expected = compute_keys(raw)
    except (TypeError, ValueError, KeyError, AttributeError) as exc:
        raise PolicyError(
            f"{source}: key parts cannot be computed ({type(exc).__name__}: {exc})"
        ) from None
    for part in ("decision", "tuning", "content"):
        if raw["key"][part] != expected[part]:
            raise PolicyError(
                f"{source}: key.{part} does not match the document's contents (edited by hand or "
                f"damaged); re-plan, or run 'moepolicy validate --rekey' after checking the edit"
            )
    problem = buffer_fit_problem(raw)
    if problem:
        raise PolicyError(f"{source}: {problem}")
    return LoadedPolicy(doc=doc, raw=raw, warnings=tuple(warnings))


def buffer_fit_problem(raw: dict[str, Any]) -> Optional[str]:
    """DeepEP's buffers too small for the chunk configs the document gives it (DeepEP's own size
    formulas; a buffer that does not fit traps or hangs in the first dispatch)."""
    target, deepep, model = raw["target"], raw["deepep"], raw["model"]
    if target["deep_ep"]["api"] != "legacy":
        return None  # DeepEP v2 sizes its buffers itself
    hidden, ranks = model["hidden_size"], target["ep_size"]
    if target["backend"] == "deepep_ll":
        ll = deepep.get("low_latency") or {}
        tokens = ll.get("num_max_dispatch_tokens_per_rank")
        need = low_latency_bytes_hint(tokens, hidden, model["num_experts"]) if tokens else 0
        have, what = deepep["num_rdma_bytes"], "num_rdma_bytes"
    else:
        configs = [
            _chunk_tuple(b[part]) for b in deepep["buckets"] for part in ("dispatch", "combine")
        ]
        nvl, rdma = ht_buffer_bytes(deepep["num_sms"], configs, hidden, ranks)
        if deepep["num_nvl_bytes"] < nvl:
            return (
                f"deepep.num_nvl_bytes {deepep['num_nvl_bytes']} is smaller than the {nvl} bytes DeepEP needs "
                f"for these chunk configs at {deepep['num_sms']} SMs, hidden {hidden}, EP{ranks}"
            )
        need, have, what = rdma, deepep["num_rdma_bytes"], "num_rdma_bytes"
    if have < need:
        return (
            f"deepep.{what} {have} is smaller than the {need} bytes DeepEP needs for this target"
        )
    return None


def _chunk_tuple(chunk: dict[str, Any]) -> tuple[Optional[int], ...]:
    """A bucket's chunk fields, with the schema's defaults for the RDMA ones (a document may omit them)."""
    return tuple(chunk.get(name, CHUNK_DEFAULTS.get(name)) for name in CHUNK_FIELDS)


def parse_policy(text: str, source: str, strict: bool = False) -> LoadedPolicy[PolicyDoc]:
    """Validate with the Pydantic models (the CLI's reader: attribute access, JSON Schema)."""
    from pydantic import ValidationError

    from moepolicy.document.model import PolicyDoc, unknown_keys

    raw = _parse_raw(text, source)
    try:
        doc = PolicyDoc.model_validate(raw)
    except RecursionError:
        raise PolicyError(f"{source}: nested too deeply to be a policy") from None
    except ValidationError as exc:
        from moepolicy.document.fast_validate import error_message

        err = exc.errors()[0]
        more = f" (+{len(exc.errors()) - 1} more)" if len(exc.errors()) > 1 else ""
        raise PolicyError(
            f"{source}: {yaml_path(tuple(err.get('loc', ())))}: {error_message(err)}{more}"
        ) from None
    return _finish(raw, doc, unknown_keys(doc), doc.schema_version, source, strict)


def parse_policy_light(
    text: str, source: str, strict: bool = False
) -> LoadedPolicy[dict[str, Any]]:
    """Validate with pydantic-core directly (the runtime's reader: the same rules, a fraction of
    the import time); ``doc`` is the validated dict."""
    from moepolicy.document.fast_validate import unknown_keys, validate

    raw = _parse_raw(text, source)
    doc = validate(raw, source)
    return _finish(raw, doc, unknown_keys(raw), doc["schema_version"], source, strict)


MAX_POLICY_BYTES = 64 * 1024 * 1024


@overload
def read_policy(
    path: str | Path, strict: bool = False, parse: None = None
) -> LoadedPolicy[PolicyDoc]: ...


@overload
def read_policy(
    path: str | Path, strict: bool = False, *, parse: Callable[..., LoadedPolicy[DocT]]
) -> LoadedPolicy[DocT]: ...


def read_policy(
    path: str | Path,
    strict: bool = False,
    parse: Optional[Callable[..., LoadedPolicy[Any]]] = None,
) -> LoadedPolicy[Any]:
    p = Path(path)
    data = read_bounded(p, MAX_POLICY_BYTES, PolicyError)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise PolicyError(f"{p}: is not UTF-8 text") from None
    return (parse or parse_policy)(text, str(p), strict=strict)


MAX_PACK_BYTES = 16 * 1024 * 1024  # a rule pack file (datasheets.MAX_DATA_FILE_BYTES)


@dataclass(frozen=True)
class PackFile:
    """A user rule pack's file, found by the name a policy gives it: its path, bytes and sha256."""

    path: Path
    data: bytes
    sha256: str


def find_user_pack(
    name: str, file_name: Optional[str], places: Sequence[str | Path]
) -> Optional[PackFile]:
    """The file of the user rule pack ``name`` (planned from a file called ``file_name``), looked up
    only in ``places`` (files, or folders searched for ``file_name``, ``name.yaml``, ``name.yml``);
    a file is that pack when its ``pack:`` says ``name``. Never a path from the policy, so what is
    found does not depend on the working folder; reads are bounded."""
    for candidate in _pack_candidates(name, file_name, places):
        try:
            data = read_bounded(candidate, MAX_PACK_BYTES, PolicyError)
        except PolicyError:
            continue
        if _pack_name(data) == name:
            import hashlib

            return PackFile(candidate, data, hashlib.sha256(data).hexdigest())
    return None


def _pack_candidates(
    name: str, file_name: Optional[str], places: Sequence[str | Path]
) -> list[Path]:
    out: list[Path] = []
    for place in places:
        folder = Path(place)
        if file_kind(folder) == "a regular file":
            out.append(folder)
        elif file_kind(folder) == "a folder":
            names = [
                n
                for n in (file_name, f"{name}.yaml", f"{name}.yml")
                if n and "/" not in n and n != ".."
            ]
            out += [folder / n for n in names if file_kind(folder / n) == "a regular file"]
    return out


def _pack_name(data: bytes) -> Optional[str]:
    """The ``pack:`` of a rule pack's bytes (safe YAML), or None for anything else."""
    # YAML: loaded when a pack is read
    from moepolicy.document.yaml_io import parse_text

    try:
        raw = parse_text(data.decode("utf-8"))
    except Exception:  # noqa: BLE001 (not a pack: not this one)
        return None
    return raw.get("pack") if isinstance(raw, dict) and isinstance(raw.get("pack"), str) else None
