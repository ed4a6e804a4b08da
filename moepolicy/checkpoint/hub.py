"""Model ids on the Hugging Face hub, read through ``huggingface_hub`` (imported only when needed).

An id (``org/name``, or ``org/name@revision``) is resolved to its ``config.json`` and, where the
repository has one, ``hf_quant_config.json``, with huggingface_hub's own cache, token (``HF_TOKEN``),
endpoint (``HF_ENDPOINT``) and offline mode. ``network=False`` (the runtime, ``MOEPOLICY_OFFLINE``,
``HF_HUB_OFFLINE``) reads the cache only. Each way of failing has its own one-line message: not in
the cache while offline, no such repository (404), gated or needs a token (401/403), the hub could
not be reached; "could not be reached" is said only when the hub was asked.

Folders of the cache name their model: ``.../models--org--name/snapshots/<commit>/`` is ``org/name``.
"""

from __future__ import annotations

import logging
import re
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Optional

from moepolicy.checkpoint import catalog
from moepolicy.errors import CheckpointError
from moepolicy.redact import redact_text, redact_url
from moepolicy.settings import hub_cache_dir, hub_endpoint, offline_reason

DEFAULT_ENDPOINT = "https://huggingface.co"
ETAG_TIMEOUT_S = 10.0
# config.json: kilobytes; a quant config with long ignore lists, megabytes
MAX_CONFIG_BYTES = 16 * 1024 * 1024
# a config file's download: said when it takes this long, given up after this long (a hub or proxy
# that trickles the bytes never trips the client's per-read timeout)
DOWNLOAD_SAY_S = 10.0
DOWNLOAD_DEADLINE_S = 120.0
_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
_REVISION = re.compile(r"^[\w./-]+$")
MAX_REVISION = 255  # a branch, tag or commit name (git's own limit on a ref's name)
_TRANSPORT_MODULES = ("httpx", "httpcore", "requests", "urllib3", "socket", "ssl")


@dataclass(frozen=True)
class HubId:
    """``org/name`` and the revision asked for (None: the repository's default branch)."""

    repo_id: str
    revision: Optional[str] = None

    def __str__(self) -> str:
        return self.repo_id + (f"@{self.revision}" if self.revision else "")


@dataclass(frozen=True)
class HubFiles:
    """Where the two config files lie in the cache (``quant`` None: the repository has none)."""

    config: Path
    quant: Optional[Path]
    commit: str
    notes: tuple[str, ...] = ()


def parse_id(spec: str) -> Optional[HubId]:
    """``org/name`` or ``org/name@rev`` as a :class:`HubId`; None for anything else (huggingface_hub
    refuses ``--`` and ``..`` in an id). An id whose revision is not a branch, tag or commit name
    (``..``, a part starting with ``.``: huggingface_hub would read it as a path in its cache) is
    refused in one line."""
    name, at, revision = spec.strip().partition("@")
    if not _REPO_ID.match(name) or "--" in name or ".." in name:
        return None
    if at and not _REVISION.match(revision):
        return None
    if at and revision_problem(revision):
        raise CheckpointError(
            f"model '{spec.strip()}': the revision {revision!r} {revision_problem(revision)}; give a "
            "branch, a tag or a commit hash (org/name@main)",
            field="model",
        )
    return HubId(name, revision or None)


def revision_problem(revision: str) -> str:
    """Why ``revision`` is no branch, tag or commit name (git's rules for a ref's parts), or ''.
    huggingface_hub looks a revision up as a file under its cache's ``refs/``: ``..`` or an empty
    part would make it a path to any file, read whole."""
    if len(revision) > MAX_REVISION:
        return f"is longer than {MAX_REVISION} characters"
    for part in revision.split("/"):
        if not part:
            return "has an empty part (a leading, trailing or doubled '/')"
        if part.startswith("."):
            return "has a part starting with '.' (such as '..')"
        if part.endswith(".lock"):
            return "has a part ending in '.lock'"
    return ""


def snapshot_repo_id(folder: Path) -> Optional[str]:
    """``org/name`` for a folder of the Hugging Face cache (``models--org--name/snapshots/<commit>``)."""
    folder = Path(folder).expanduser().absolute()
    repo = folder.parent.parent
    if folder.parent.name != "snapshots" or not repo.name.startswith("models--"):
        return None
    parts = repo.name[len("models--") :].split("--")
    return "/".join(parts) if len(parts) == 2 and all(parts) else None


def repo_snapshot(folder: Path) -> Optional[Path]:
    """The snapshot ``refs/main`` points at, for a cache folder ``models--org--name`` itself."""
    ref = folder / "refs" / "main"
    if not folder.name.startswith("models--") or not ref.is_file():
        return None
    try:
        commit = ref.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        return None
    snapshot = folder / "snapshots" / commit
    return snapshot if commit and snapshot.is_dir() else None


def fetch(hub_id: HubId, *, network: bool, why_offline: str = "") -> HubFiles:
    """The config files of ``hub_id`` from the cache, downloading them first when ``network``.

    ``why_offline`` says why the network is not asked (for the message when the cache lacks them).
    Raises :class:`CheckpointError` with one line per way of failing.
    """
    hf = _huggingface_hub(hub_id)

    # keyword arguments of huggingface_hub's calls
    common: dict[str, Any] = {"revision": hub_id.revision, "cache_dir": str(hub_cache_dir())}
    if not network:
        # the cache's files only: hf_hub_download would still build request headers, and
        # huggingface_hub 2.x fetches its agent registry from the endpoint while doing so
        config = _cached(hf, hub_id, "config.json", common)
        if config is None:
            raise CheckpointError(_not_cached(hub_id, why_offline))
        quant, notes = _quant_from_cache(hf, hub_id, common)
        return HubFiles(config=config, quant=quant, commit=config.parent.name, notes=notes)
    common.update(endpoint=hub_endpoint(), etag_timeout=ETAG_TIMEOUT_S)
    with _quiet(hf):
        silent, size = _probe(hf, hub_id, "config.json", common["endpoint"])
        if silent is not None:
            # read the cache now: asked again, huggingface_hub backs off ~23 s per file
            return _from_cache_when_silent(hf, hub_id, common, silent)
        _check_size(hub_id, "config.json", size)
        try:
            config = Path(_download(hf, hub_id, "config.json", common))
        except CheckpointError:
            raise
        except Exception as exc:  # noqa: BLE001 (every failure becomes one line, by what caused it)
            raise CheckpointError(_failure(hub_id, exc)) from None
        quant, notes = _quant_config(hf, hub_id, common)
    return HubFiles(config=config, quant=quant, commit=config.parent.name, notes=notes)


def _probe(
    hf, hub_id: HubId, filename: str, endpoint: Optional[str]
) -> tuple[Optional[BaseException], Optional[int]]:
    """``filename``'s metadata asked once, without retries: (the error when the hub does not answer
    at all (no HTTP status: DNS, refused, timed out), the file's size as the hub gives it). Both None
    when it answered with an error, which the download then names."""
    url = hf.hf_hub_url(hub_id.repo_id, filename, revision=hub_id.revision, endpoint=endpoint)
    try:
        metadata = hf.get_hf_file_metadata(url, timeout=ETAG_TIMEOUT_S)
    except Exception as exc:  # noqa: BLE001
        return (None if any(_status(cause) is not None for cause in _chain(exc)) else exc), None
    size = getattr(metadata, "size", None)
    return None, size if isinstance(size, int) else None


def _check_size(hub_id: HubId, filename: str, size: Optional[int]) -> None:
    """Refuse, before a byte is downloaded, a config file larger than any config (the cache would
    keep it whole: a 287 MB "config.json" stayed there)."""
    if size is not None and size > MAX_CONFIG_BYTES:
        raise CheckpointError(
            f"model '{hub_id}': its {filename} on the Hugging Face hub ({shown_endpoint()}) is {size} "
            f"bytes, more than any config ({MAX_CONFIG_BYTES} bytes): not downloaded; check the id, or "
            "pass the model folder"
        )


def _download(hf, hub_id: HubId, filename: str, common: dict) -> str:
    """``hf_hub_download`` of one config file, bounded in time: it runs on a thread while this one
    waits (Ctrl-C ends the wait), says after ``DOWNLOAD_SAY_S`` that it is still going, and gives up
    after ``DOWNLOAD_DEADLINE_S`` (the thread is left to the process's end)."""
    import threading
    import time

    done: list = []

    def run() -> None:
        try:
            done.append((True, hf.hf_hub_download(hub_id.repo_id, filename, **common)))
        except BaseException as exc:  # noqa: BLE001 (handed to the waiting thread)
            done.append((False, exc))

    worker = threading.Thread(target=run, name="moepolicy-hub-download", daemon=True)
    began, said = time.monotonic(), False
    worker.start()
    while True:
        worker.join(timeout=0.2)
        if done:
            ok, value = done[0]
            if ok:
                return value
            raise value
        waited = time.monotonic() - began
        if waited >= DOWNLOAD_DEADLINE_S:
            raise CheckpointError(
                f"model '{hub_id}': the Hugging Face hub ({shown_endpoint()}) sent too little of "
                f"{filename} in {waited:.0f} s (a stalled or trickling transfer); nothing was read: "
                "retry, check the network or a proxy, or pass the model folder"
            )
        if not said and waited >= DOWNLOAD_SAY_S:
            said = True
            logging.getLogger("moepolicy.checkpoint").warning(
                "model '%s': %s is still downloading from the Hugging Face hub (%s) after %.0f s; "
                "given up after %.0f s (Ctrl-C stops it)",
                hub_id,
                filename,
                shown_endpoint(),
                waited,
                DOWNLOAD_DEADLINE_S,
            )


def hub_endpoint_raw() -> str:
    return hub_endpoint() or DEFAULT_ENDPOINT


def shown_endpoint() -> str:
    """The hub's address as moepolicy prints it: credentials in ``HF_ENDPOINT`` hidden."""
    return redact_url(hub_endpoint_raw())


def _from_cache_when_silent(hf, hub_id: HubId, common: dict, error: BaseException) -> HubFiles:
    """The cache's files when the hub did not answer, said in a note; not cached: could not be reached."""
    config = _cached(hf, hub_id, "config.json", common)
    if config is None:
        raise CheckpointError(_unreachable(hub_id, shown_endpoint(), error))
    quant, notes = _quant_from_cache(hf, hub_id, common)
    said = (
        f"the Hugging Face hub ({shown_endpoint()}) did not answer: read from its cache "
        "(HF_HUB_OFFLINE=1 skips asking)"
    )
    logging.getLogger("moepolicy.checkpoint").warning("model '%s': %s", hub_id, said)
    return HubFiles(config=config, quant=quant, commit=config.parent.name, notes=(said, *notes))


def _cached(hf, hub_id: HubId, filename: str, common: dict) -> Optional[Path]:
    found = hf.try_to_load_from_cache(
        hub_id.repo_id, filename, cache_dir=common["cache_dir"], revision=hub_id.revision
    )
    return Path(found) if isinstance(found, str) else None


@contextmanager
def _quiet(hf) -> Iterator[None]:
    """huggingface_hub's own warnings (its retries while the hub does not answer) and progress bars
    (two small files) are not shown: what failed is said once, in moepolicy's one line. Both are
    restored after."""
    # huggingface_hub's own switch: it sets its loggers up on first use
    verbosity = hf.utils.logging
    level, bars_off = verbosity.get_verbosity(), hf.utils.are_progress_bars_disabled()
    verbosity.set_verbosity_error()
    hf.utils.disable_progress_bars()
    try:
        yield
    finally:
        verbosity.set_verbosity(level)
        if not bars_off:
            hf.utils.enable_progress_bars()


def _huggingface_hub(hub_id: HubId):
    try:
        import huggingface_hub
        import huggingface_hub.utils  # noqa: F401 (disable_progress_bars, the error classes)
    except ImportError:
        raise CheckpointError(
            f"model '{hub_id}': not a file, a folder or a catalog name; reading Hugging Face ids needs "
            "huggingface_hub, which is not installed here (pip install 'huggingface_hub>=0.34')"
        ) from None
    return huggingface_hub


def _quant_config(hf, hub_id: HubId, common: dict) -> tuple[Optional[Path], tuple[str, ...]]:
    """``hf_quant_config.json`` where the repository has one: a 404 means it has none; when the hub
    does not answer, the cache decides (config.json came from it)."""
    _silent, size = _probe(hf, hub_id, "hf_quant_config.json", common["endpoint"])
    _check_size(hub_id, "hf_quant_config.json", size)
    try:
        return Path(_download(hf, hub_id, "hf_quant_config.json", common)), ()
    except CheckpointError:
        raise
    except Exception as exc:  # noqa: BLE001
        if _is_missing_file(exc):
            return None, ()
        if any(_status(cause) is not None for cause in _chain(exc)):  # the hub answered: say what
            raise CheckpointError(_failure(hub_id, exc, "hf_quant_config.json")) from None
    return _quant_from_cache(hf, hub_id, common)


def _quant_from_cache(hf, hub_id: HubId, common: dict) -> tuple[Optional[Path], tuple[str, ...]]:
    found = hf.try_to_load_from_cache(
        hub_id.repo_id,
        "hf_quant_config.json",
        cache_dir=common["cache_dir"],
        revision=hub_id.revision,
    )
    if isinstance(found, str):
        return Path(found), ()
    if found is None:  # not the 'known absent' marker: never downloaded
        return None, ("hf_quant_config.json is not in the Hugging Face cache: read as absent",)
    return None, ()


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    current: Optional[BaseException] = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def _status(exc: BaseException) -> Optional[int]:
    response = getattr(exc, "response", None)
    status = getattr(response, "status_code", None)
    return status if isinstance(status, int) else None


def _is_missing_file(exc: BaseException) -> bool:
    """The hub answered that the repository exists but has no such file (EntryNotFound)."""
    from huggingface_hub import utils

    local = utils.LocalEntryNotFoundError
    return (
        isinstance(exc, utils.EntryNotFoundError)
        and not isinstance(exc, local)
        and _status(exc) == 404
    )


def _failure(hub_id: HubId, exc: BaseException, filename: str = "config.json") -> str:
    """The one line for a failed download, by the first cause huggingface_hub recorded."""
    from huggingface_hub import utils

    endpoint = shown_endpoint()
    for cause in _chain(exc):
        status = _status(cause)
        if isinstance(cause, utils.GatedRepoError):
            return _needs_access(hub_id, endpoint, status, gated=True)
        if isinstance(cause, utils.RevisionNotFoundError):
            return (
                f"model '{hub_id}': the Hugging Face hub ({endpoint}) has no revision "
                f"'{hub_id.revision or 'main'}' of {hub_id.repo_id} (HTTP {status})"
            )
        if isinstance(cause, utils.RepositoryNotFoundError) and status == 404:
            return _not_found(hub_id, endpoint)
        if _is_missing_file(cause):
            return (
                f"model '{hub_id}': the repository has no {filename} on the Hugging Face hub ({endpoint}); "
                "moepolicy reads a transformers checkpoint's config.json"
            )
        if status in (401, 403):
            return _needs_access(hub_id, endpoint, status, gated=False)
        if type(cause).__name__ == "FileMetadataError":  # it answered, but not as a hub does
            return (
                f"model '{hub_id}': the server at {endpoint} does not answer as a Hugging Face hub (no "
                "commit or ETag header); check HF_ENDPOINT and any proxy"
            )
        if status is not None:
            return (
                f"model '{hub_id}': the Hugging Face hub ({endpoint}) answered HTTP {status} and the model "
                "is not in the Hugging Face cache; retry later, or pass the model folder"
            )
    return _unreachable(hub_id, endpoint, exc)


MAX_CACHED_REPOS = 10_000  # folders of the Hugging Face cache read for suggestions, at most


def cached_repo_ids() -> list[str]:
    """``org/name`` of the models the Hugging Face cache holds (its ``models--org--name`` folders)."""
    import itertools

    try:
        folders = list(itertools.islice(hub_cache_dir().iterdir(), MAX_CACHED_REPOS))
    except OSError:
        return []
    found = []
    for folder in folders:
        parts = folder.name[len("models--") :].split("--")
        if folder.name.startswith("models--") and len(parts) == 2 and all(parts):
            found.append("/".join(parts))
    return sorted(found)


def close_ids(spec: str, limit: int = 3) -> list[str]:
    """Ids of the catalog and of the Hugging Face cache that look like ``spec``: the same name under
    another organisation first (``deepseek/DeepSeek-V3``), then names close to it."""
    import difflib

    pool = {e.repo_id.lower(): e.repo_id for e in catalog.entries()}
    pool.update({repo.lower(): repo for repo in cached_repo_ids()})
    wanted = spec.strip().lower()
    name = wanted.split("/", 1)[-1]
    by_name: dict[str, list[str]] = {}
    for key, repo in pool.items():
        by_name.setdefault(key.split("/", 1)[-1], []).append(repo)
    found = sorted(r for r in by_name.get(name, []) if r.lower() != wanted)
    for hit in difflib.get_close_matches(wanted, list(pool), n=limit * 2, cutoff=0.6):
        found.append(pool[hit])
    for hit in difflib.get_close_matches(name, list(by_name), n=limit * 2, cutoff=0.6):
        found += by_name[hit]
    return list(dict.fromkeys(r for r in found if r.lower() != wanted))[:limit]


def did_you_mean(spec: str) -> str:
    """'; did you mean: a/b, c/d' from the catalog and the Hugging Face cache, or ''."""
    close = close_ids(spec)
    return f"; did you mean: {', '.join(close)}" if close else ""


def _did_you_mean(hub_id: HubId) -> str:
    close = close_ids(hub_id.repo_id)
    return (
        f"did you mean: {', '.join(close)} (the catalog, 'moepolicy models', and the Hugging Face cache)"
        if close
        else ("check the name ('moepolicy models' lists the built-in catalog)")
    )


def _not_found(hub_id: HubId, endpoint: str) -> str:
    return (
        f"unknown model '{hub_id}': not a file, a folder or a catalog name, and the Hugging Face hub "
        f"({endpoint}) has no such repository (HTTP 404); {_did_you_mean(hub_id)}"
    )


def _needs_access(hub_id: HubId, endpoint: str, status: Optional[int], gated: bool) -> str:
    """401/403: gated, private, or (without a token, as the hub answers) a name it does not have."""
    from huggingface_hub import get_token

    page = f"{endpoint}/{hub_id.repo_id}"
    token = "a token was sent" if get_token() else "no token was sent"
    if gated:
        fix = (
            f"accept its terms at {page} with an account whose token can read it"
            if get_token()
            else f"accept its terms at {page}, then set HF_TOKEN (or run 'hf auth login')"
        )
        return f"model '{hub_id}' is gated on the Hugging Face hub (HTTP {status}, {token}); {fix}"
    return (
        f"model '{hub_id}': the Hugging Face hub refused it (HTTP {status}, {token}): the repository is "
        f"private or gated, or no such name exists (the hub does not say which); if it is gated, accept its "
        f"terms at {page} and set HF_TOKEN; {_did_you_mean(hub_id)}"
    )


def _not_cached(hub_id: HubId, why_offline: str) -> str:
    cache = hub_cache_dir()
    why = f" ({why_offline})" if why_offline else ""
    revision = f" --revision {hub_id.revision}" if hub_id.revision else ""
    reason = offline_reason()
    fix = (  # offline, a download cannot work: what can
        f"pass the model folder or its config.json (or download it where {reason.split()[0]} is "
        "not set)"
        if reason
        else f"download it first (hf download {hub_id.repo_id} config.json{revision}) or pass the "
        "model folder"
    )
    copy = (
        f"; '{hub_id.repo_id}' without a revision reads moepolicy's catalog copy"
        if hub_id.revision and catalog.lookup(hub_id.repo_id) is not None
        else ""
    )
    hint = did_you_mean(hub_id.repo_id)
    return (
        f"unknown model '{hub_id}': not a file, a folder or a catalog name, and its config.json is not in "
        f"the Hugging Face cache ({cache}){why}; {fix}{copy}{hint}"
    )


def cached_snapshot(repo_id: str) -> Optional[Path]:
    """The folder of ``repo_id``'s snapshot in the Hugging Face cache (never the network), or None."""
    try:
        return fetch(HubId(repo_id), network=False).config.parent
    except CheckpointError:  # not cached, or huggingface_hub not installed
        return None


def real_config_words(repo_id: str) -> str:
    """Where ``repo_id``'s own config can be read instead of moepolicy's catalog copy, in words that
    work here: online its id at a revision; offline (no download can work) its snapshot in the
    Hugging Face cache where there is one, else the checkpoint's folder or config.json."""
    reason = offline_reason()
    if not reason:
        return f"'{repo_id}@main' (the Hugging Face hub's, or its cache's), or the checkpoint's folder"
    snapshot = cached_snapshot(repo_id)
    if snapshot is not None:
        return (
            f"its snapshot in the Hugging Face cache, {snapshot} ({reason}: the hub is not read)"
        )
    return (
        f"the checkpoint's folder or its config.json ({reason}: the hub is not read, and the Hugging "
        "Face cache holds no copy)"
    )


def _unreachable(hub_id: HubId, endpoint: str, exc: BaseException) -> str:
    causes = list(_chain(exc))
    transport = [
        c
        for c in causes
        if type(c).__module__.split(".")[0] in _TRANSPORT_MODULES
        or isinstance(c, (ConnectionError, TimeoutError))
    ]
    innermost = (transport or causes)[-1]
    reason = " ".join(str(innermost).split())[:160] or type(innermost).__name__
    reason = redact_text(reason, hub_endpoint_raw())  # a transport error may echo the URL
    return (
        f"model '{hub_id}': the Hugging Face hub at {endpoint} could not be reached "
        f"({type(innermost).__name__}: {reason}) and the model is not in the Hugging Face cache; check the "
        "network, a proxy or HF_ENDPOINT, or set HF_HUB_OFFLINE=1 to read the cache only"
        + did_you_mean(hub_id.repo_id)
    )
