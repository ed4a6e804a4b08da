"""What a rank receives under a model's router (measure.routing), and the expert-kernel rules'
grammar: a pack that decides the kernel names where the kernel comes from, or says why not."""

import pytest

from moepolicy.errors import RulePackError
from moepolicy.measure.routing import ExpertShape, check_shape, rank_view
from moepolicy.rules.grammar import parse_pack


def test_a_rank_receives_each_token_once_with_every_local_expert_it_picked():
    shape = ExpertShape(7168, 2048, 256, 8, 8)
    view = rank_view(shape, 2048, seed=1)
    assert view.tokens <= view.rows * 8 and view.rows <= 2048 * 8
    assert sum(view.per_expert) == view.pairs
    assert all(len(row) == 8 and any(e >= 0 for e in row) for row in view.topk_local)
    # top-8 of 256 experts: on average top_k x tokens pairs per rank (8 x 2048), within 3 %
    assert abs(view.pairs - 8 * 2048) / (8 * 2048) < 0.03


def test_group_limited_routing_sends_a_token_to_fewer_ranks():
    """DeepSeek-V3's router (8 groups, top 4) keeps a token to 4 of the 8 ranks at EP 8 (one group
    per rank): rank 0 is in a token's groups half the time, and then holds one of its 8 picks from
    the 128 experts of those groups unless all 8 miss its 32; uniform top-8 of 256 reaches it more
    often."""
    from math import comb

    grouped = rank_view(ExpertShape(7168, 2048, 256, 8, 8, (8, 4)), 1024, seed=2)
    uniform = rank_view(ExpertShape(7168, 2048, 256, 8, 8), 1024, seed=2)
    total = 1024 * 8
    assert abs(grouped.rows / total - 0.5 * (1 - comb(96, 8) / comb(128, 8))) < 0.02
    assert abs(uniform.rows / total - (1 - comb(224, 8) / comb(256, 8))) < 0.02
    assert grouped.pairs > uniform.pairs * 0.95  # the same experts' work, on fewer rows


def test_shapes_that_cannot_be_routed_say_why():
    assert "do not split over EP 3" in check_shape(ExpertShape(1024, 512, 64, 8, 3))
    assert "exceeds the experts of 1 groups" in check_shape(
        ExpertShape(1024, 512, 64, 9, 2, (8, 1))
    )
    with pytest.raises(ValueError, match="top_k 0"):
        rank_view(ExpertShape(1024, 512, 64, 0, 2), 16)


def _pack(then: dict, **extra):
    return {
        "pack": "mine",
        "version": "1",
        "decides": "expert_kernel",
        "rules": [{"id": "r", "priority": 1, "then": then, "why": "w", "source": "s", **extra}],
    }


def test_an_expert_kernel_rule_names_where_its_kernel_comes_from():
    pack = parse_pack(_pack({"expert_kernel": "measured"}), "mine.yaml", "0" * 64, frozenset())
    assert pack.decides == "expert_kernel" and pack.rules[0].then.fact == "measured.faster_kernel"
    with pytest.raises(RulePackError, match="asked|engine|measured") as err:
        parse_pack(_pack({"expert_kernel": "fastest"}), "mine.yaml", "0" * 64, frozenset())
    assert "fastest" in str(err.value)
    with pytest.raises(RulePackError, match="no DeepEP capability"):
        parse_pack(
            _pack({"expert_kernel": "asked"}, requires=["x"]), "mine.yaml", "0" * 64, frozenset()
        )


def test_a_pack_that_decides_something_unknown_is_refused():
    raw = {**_pack({"expert_kernel": "asked"}), "decides": "gpu"}
    with pytest.raises(RulePackError, match="decides"):
        parse_pack(raw, "mine.yaml", "0" * 64, frozenset())
