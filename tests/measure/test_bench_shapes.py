"""The shapes the GPU scripts measure come from the model catalog (``moepolicy/measure/shapes.py``)."""

import pytest

from moepolicy.measure.shapes import BENCH_MODELS, MoeShape, bench_shape


def test_the_script_shapes_are_the_catalog_models_first_moe_layer():
    # DeepSeek-V3: hidden 7168, 256 routed experts, top-8, expert intermediate 2048 (its config.json)
    assert bench_shape("deepseek-v3") == MoeShape(7168, 256, 8, 2048)
    # Qwen3-30B-A3B: hidden 2048, 128 experts, top-8, expert intermediate 768
    assert bench_shape("qwen3-30b-a3b") == MoeShape(2048, 128, 8, 768)
    assert set(BENCH_MODELS) == {"deepseek-v3", "qwen3-30b-a3b"}


def test_an_unknown_shape_name_is_refused_with_the_known_ones():
    with pytest.raises(ValueError, match="unknown shape 'mixtral'.*deepseek-v3"):
        bench_shape("mixtral")
