"""The studies a storage holds, as ``moepolicy studies`` lists and deletes them (optuna's own
``optuna studies`` and ``optuna delete-study`` are the model).

A tune keeps one parent study (its fingerprint) and one sub-study per (SM count, token bucket),
named ``<study>/sms<S>/t<T>``: a listed study counts its sub-studies' trials, and deleting a study
deletes its sub-studies with it. A storage file that does not exist is never created here.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from typing import Optional

from moepolicy.errors import UsageError
from moepolicy.redact import redact_url
from moepolicy.tuning.storage import check_storage, make_storage, storage_file


@dataclass(frozen=True)
class StudyRow:
    """One tune's study: its name, sub-studies, trials (every state) and when its first began."""

    name: str
    sub_studies: int
    trials: int
    started: Optional[datetime.datetime]


def _summaries(url: str) -> Optional[list]:
    """optuna's summaries of every study in ``url``; None where its file does not exist."""
    import optuna

    check_storage(url)
    path = storage_file(url)
    if path is not None and not path.exists():
        return None
    return optuna.get_all_study_summaries(make_storage(url), include_best_trial=False)


def list_studies(url: str) -> Optional[list[StudyRow]]:
    """The tunes' studies in ``url``, by name (None: no such storage file)."""
    summaries = _summaries(url)
    if summaries is None:
        return None
    rows: dict[str, list] = {}
    for summary in summaries:
        rows.setdefault(summary.study_name.split("/", 1)[0], []).append(summary)
    out = []
    for name, found in sorted(rows.items()):
        subs = [s for s in found if s.study_name != name]
        starts = [s.datetime_start for s in found if s.datetime_start is not None]
        out.append(
            StudyRow(name, len(subs), sum(s.n_trials for s in found), min(starts, default=None))
        )
    return out


def delete_study(url: str, name: str) -> int:
    """Delete study ``name`` and its sub-studies from ``url``; how many optuna studies went."""
    import optuna

    summaries = _summaries(url)
    names = [
        s.study_name
        for s in summaries or ()
        if s.study_name == name or s.study_name.startswith(name + "/")
    ]
    if not names:
        raise UsageError(
            f"--delete {name}: no such study in {redact_url(url)} ('moepolicy studies' lists them)"
        )
    storage = make_storage(url)
    for study in sorted(names, reverse=True):  # the sub-studies first, the parent last
        optuna.delete_study(study_name=study, storage=storage)
    return len(names)
