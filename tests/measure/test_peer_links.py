"""Peer access and links between the GPUs of a live group, checked once before any rank starts: the
probe's answer (CUDA's peer access, NVML's NVLink status) is given here at its boundary, and where
DeepEP intranode cannot run the refusal is one line naming the GPU pair."""

import pytest

from moepolicy.errors import InfeasibleError
from moepolicy.measure.placement import RankPlacement
from moepolicy.measure.ranks import PeerLink, check_peer_links

NVLINK, PCIE, UNKNOWN, NO_ACCESS = (
    PeerLink(True, True),
    PeerLink(True, False),
    PeerLink(True),
    PeerLink(False),
)


def answer(default: PeerLink, **pairs: PeerLink):
    """A probe that answers ``default`` for every pair except those named like ``p1_3``."""
    asked = []

    def probe(devices):
        asked.append(devices)
        links = {(a, b): default for i, a in enumerate(devices) for b in devices[i + 1 :]}
        for name, link in pairs.items():
            a, b = map(int, name[1:].split("_"))
            links[(a, b)] = link
        return links

    probe.asked = asked
    return probe


def test_a_pair_without_peer_access_is_refused_in_one_line_naming_it():
    with pytest.raises(InfeasibleError) as info:
        check_peer_links(RankPlacement(4, 8), answer(NVLINK, p1_3=NO_ACCESS))
    said = str(info.value)
    assert said.startswith("GPUs 1 and 3 have no peer access") and "\n" not in said
    assert "CUDA_VISIBLE_DEVICES" in said and info.value.exit_code == 5


def test_pcie_runs_two_ranks_and_refuses_more_naming_the_pair():
    check_peer_links(RankPlacement(2, 8), answer(PCIE))  # DeepEP allows EP 2 over PCIe
    with pytest.raises(
        InfeasibleError, match=r"^GPUs 0 and 1 are joined by PCIe, not NVLink.*4 asked"
    ):
        check_peer_links(RankPlacement(4, 4), answer(PCIE))


def test_only_the_ranks_gpus_are_asked_about_and_unknown_links_pass():
    probe = answer(UNKNOWN)
    check_peer_links(RankPlacement(2, 8), probe)  # EP 2 on an 8-GPU host: GPUs 0 and 1
    assert probe.asked == [(0, 1)]


def test_ranks_sharing_a_gpu_need_no_peer_access():
    probe = answer(NO_ACCESS)
    check_peer_links(RankPlacement(8, 1), probe)
    check_peer_links(RankPlacement(1, 8), probe)
    assert probe.asked == []
