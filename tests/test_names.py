"""The shared names (moepolicy.names) are the ones the document's schema, the rule grammar and the
CLI accept: one list each, no drift."""

from __future__ import annotations

import json
from typing import get_args

from moepolicy._resources import data_file
from moepolicy.names import (
    LAUNCH_MODE,
    TUNED_REGIMES,
    Backend,
    Engine,
    Order,
    OrderName,
    Regime,
    WireDtype,
    WireDtypeName,
)
from moepolicy.rules import grammar


def _schema_enum(defn: str, prop: str) -> list[str]:
    schema = json.loads(data_file("policy.schema.json").read_text())
    return schema["$defs"][defn]["properties"][prop]["enum"]


def test_the_document_schema_takes_exactly_the_shared_names():
    for defn in ("LayerDoc", "DecisionDoc", "BucketOrderDoc"):
        assert _schema_enum(defn, "order") == list(Order.values())
    assert _schema_enum("WireDoc", "dtype") == list(WireDtype.values())
    assert _schema_enum("DeepEPDoc", "regime") == [r.value for r in TUNED_REGIMES]
    assert _schema_enum("TargetDoc", "backend") == list(Backend.values())
    assert _schema_enum("TargetDoc", "engine") == list(Engine.values())


def test_rules_and_cli_use_them():
    assert grammar.ORDERS == Order.values() and grammar.WIRE_DTYPES == WireDtype.values()
    from moepolicy.cli.main import build_parser

    parser = build_parser()
    tune = parser._subparsers._group_actions[0].choices["tune"]
    choices = {a.dest: a.choices for a in tune._actions if a.choices}
    assert (
        tuple(choices["backend"]) == Backend.values()
        and tuple(choices["engine"]) == Engine.values()
    )
    assert list(choices["regime"]) == [r.value for r in TUNED_REGIMES]
    bench = parser._subparsers._group_actions[0].choices["bench"]
    assert list(next(a.choices for a in bench._actions if a.dest == "regime")) == list(
        Regime.values()
    )
    assert set(LAUNCH_MODE) == set(Regime.values())


def test_members_are_their_strings():
    assert Order.QUANT_THEN_DISPATCH == "quant_then_dispatch" and str(WireDtype.BF16) == "bf16"
    assert json.dumps({"order": Order.NO_QUANT}) == '{"order": "no_quant"}'


def test_the_static_literals_are_the_enums():
    # the document's fields are typed by Literals spelled out (a checker reads no Literal built at
    # run time); they hold exactly the enums' values, in the enums' order (the JSON Schema's)
    assert get_args(OrderName) == Order.values()
    assert get_args(WireDtypeName) == WireDtype.values()
