"""The start-up agreement: every rank's vote (apply the policy with this digest, or not and why), and
one decision that every voting rank follows.

Votes travel through the group's key-value store (``c10d.Store``), never as a collective on the
group: a rank where the plugin installed nothing (``MOEPOLICY_POLICY`` unset, moepolicy missing,
another vLLM) casts no vote, and a collective would then pair with that rank's next collective on the
same group (DeepEP's buffer set-up) and hang or corrupt it. Through the store the voters wait
``timeout_s`` for every vote, then decide without the missing ranks: vLLM's own behaviour. The
decision is written once (``compare_set``: the first rank to decide wins) and every voter reads it, so
a rank that arrives just after another gave up follows that rank rather than deciding anew.

A group without a store (none here) falls back to ``all_gather_object``.
"""

from __future__ import annotations

import datetime
import json
from typing import Optional

from moepolicy.integrations.vllm.serving import Vote, verdict

# every rank's vote is awaited this long: the vote runs as vLLM builds the EP group's manager, just
# after the gloo rendezvous that lined the ranks up (before the model loads), so ranks arrive close
# together; it stays well under gloo's default 30-minute collective timeout
VOTE_TIMEOUT_S = 120.0
_PREFIX = "moepolicy-vote"
_AGREED = "agreed"


def agree(group, vote: Vote, timeout_s: Optional[float] = None) -> str:
    """Every rank's decision for this start: "" when all ranks vote to apply the same digest, else
    why not (the same words on every voting rank)."""
    found = _store_of(group)
    if found is None:
        return verdict(gather_votes(group, vote))
    store, rank, world = found
    return _agree_through(
        store, rank, world, vote, VOTE_TIMEOUT_S if timeout_s is None else timeout_s
    )


def _store_of(group):
    """(store, rank, world size) of vLLM's ``StatelessProcessGroup`` or a torch process group."""
    if all(hasattr(group, a) for a in ("store", "rank", "world_size")):
        return group.store, int(group.rank), int(group.world_size)
    try:  # a torch ProcessGroup (also one built outside torch's registry, as vLLM's elastic EP does)
        return group.get_group_store(), int(group.rank()), int(group.size())
    except Exception:  # noqa: BLE001 (a group without a store: the collective instead)
        return None


def _agree_through(store, rank: int, world: int, vote: Vote, timeout_s: float) -> str:
    round_ = store.add(f"{_PREFIX}/rounds/{rank}", 1)  # this rank's n-th start on this group
    base = f"{_PREFIX}/{round_}"
    store.set(f"{base}/{rank}", json.dumps(_plain(vote)))
    keys = [f"{base}/{r}" for r in range(world)]
    try:
        store.wait(keys, datetime.timedelta(seconds=timeout_s))
    except Exception:  # noqa: BLE001 (DistStoreError on timeout): decide without the missing ranks
        missing = [r for r, key in enumerate(keys) if not store.check([key])]
    else:
        missing = []
    if missing:
        proposal = (
            f"rank(s) {','.join(map(str, missing))} of {world} had not voted within {timeout_s:g} s "
            "(MOEPOLICY_POLICY unset there, moepolicy not installed, another vLLM, or a rank that "
            "started later than that: keep the nodes alike; a late rank follows this decision)"
        )
    else:  # every vote is in (the last may have landed just as the wait gave up)
        proposal = verdict([_vote(store.get(key), i) for i, key in enumerate(keys)]) or _AGREED
    decided = store.compare_set(f"{base}/decision", "", proposal)
    decided = decided.decode() if isinstance(decided, bytes) else str(decided)
    return "" if decided == _AGREED else decided


def gather_votes(group, vote: Vote) -> list[Vote]:
    """Every rank's vote as a collective on ``group`` (for a group without a store), as plain dicts:
    a rank with another moepolicy still answers."""
    mine = _plain(vote)
    if hasattr(group, "all_gather_obj"):  # vLLM's StatelessProcessGroup
        answers = group.all_gather_obj(mine)
    else:
        import torch.distributed as dist

        answers = [None] * dist.get_world_size(group)
        dist.all_gather_object(answers, mine, group=group)
    return [_vote(a, i) for i, a in enumerate(answers)]


def _plain(vote: Vote) -> dict:
    return {
        "rank": vote.rank,
        "applied": vote.applied,
        "digest": vote.digest,
        "reason": vote.reason,
    }


def _vote(answer, i: int) -> Vote:
    """A rank's answer as a :class:`Vote` (JSON text from the store, or a dict); anything else is a
    vote not to apply."""
    if isinstance(answer, (bytes, str)):
        try:
            answer = json.loads(answer)
        except ValueError:
            answer = None
    if not isinstance(answer, dict):
        return Vote(i, False, "", "an answer this moepolicy cannot read")
    return Vote(
        int(answer.get("rank", i)),
        bool(answer.get("applied")),
        str(answer.get("digest", "")),
        str(answer.get("reason", "")),
    )
