"""What moepolicy computes about DeepEP without running it, against the installed DeepEP itself: the
NVLink buffer size hint (moepolicy sizes buffers from the same formula where deep_ep is not imported)
and DeepEP's built-in config tables (the capability sheet's ``defaults``), at EP 2, 4 and 8."""

import inspect
import re

import pytest

from gpu_support import WORLDS, require

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("world", WORLDS, ids=lambda w: f"ep{w}")
@pytest.mark.parametrize("hidden", [2048, 2880, 4096, 7168])
def test_the_nvl_buffer_formula_equals_deepeps_hint(world, hidden):
    require(1, need_deep_ep=True)
    import deep_ep

    from moepolicy.deepep.buffers import nvl_bytes_hint

    for num_sms in (8, 20, 24, 48):
        for nvl_recv in (128, 256, 512):
            config = deep_ep.Config(num_sms, 6, nvl_recv, 6, 128)
            assert nvl_bytes_hint(
                num_sms, nvl_recv, hidden * 2, world
            ) == config.get_nvl_buffer_size_hint(hidden * 2, world), (
                world,
                hidden,
                num_sms,
                nvl_recv,
            )


@pytest.mark.parametrize("world", WORLDS, ids=lambda w: f"ep{w}")
def test_the_sheets_default_configs_are_the_installed_deepeps(world):
    """DeepEP's Config has no readable fields: its tables are read from the installed source."""
    require(1, need_deep_ep=True)
    import deep_ep

    from moepolicy import datasheets
    from moepolicy.deepep.configs import ChunkConfig, default_configs, default_num_sms
    from moepolicy.deepep.probe import imported_features, matching_sheet

    sheet = matching_sheet(imported_features(), datasheets.deepep_sheets())
    assert sheet is not None, "the installed deep_ep matches no capability sheet"
    assert default_num_sms(sheet) == deep_ep.Buffer.num_sms
    for part, fn in (
        ("dispatch", deep_ep.Buffer.get_dispatch_config),
        ("combine", deep_ep.Buffer.get_combine_config),
    ):
        table = {
            int(n): tuple(int(v) for v in args.split(","))
            for n, args in re.findall(
                r"(\d+): Config\(Buffer\.num_sms, ([\d, ]+)\)", inspect.getsource(fn)
            )
        }
        mine = default_configs(sheet, world)[0 if part == "dispatch" else 1]
        assert mine == ChunkConfig(*table[world]).effective(), (part, world)
