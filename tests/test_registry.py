"""The method registry: every reference resolves, and each capability reaches the command that uses it."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from specbench_cli.cli import app
from specbench_cli.core.errors import UsageError
from specbench_cli.registry import METHODS, calibrator, corpus_layers, entry, load, method_class, recipe_class


@pytest.mark.parametrize("name", sorted(METHODS))
def test_every_reference_of_an_entry_resolves(name):
    e = entry(name)
    assert method_class(name).__name__ == e.code.split(":")[1]
    for ref in (e.recipe, e.calibrator, e.reads_layers):
        if ref is not None:
            assert callable(load(ref)), ref


def test_capabilities_answer_for_what_a_method_lacks():
    with pytest.raises(UsageError, match="did you mean 'eagle3'"):
        entry("eagle4")
    with pytest.raises(UsageError, match="no training recipe for it; trainable: eagle3, dflash, dart, confu, sps"):
        recipe_class("suffix")
    with pytest.raises(UsageError, match="calibrate knows whiflash-entropy, whiflash-neural, hvd"):
        calibrator("hvd-freq")
    assert corpus_layers(30) == sorted(set(load("specbench_methods.eagle3:default_capture")(30))
                                       | set(load("specbench_methods.dflash:default_capture")(30)))


def test_profile_asks_the_registry_which_methods_it_can_measure():
    result = CliRunner().invoke(app, ["profile", "--switching", "--method", "hvd"])
    assert result.exit_code == 2 and "use --method whiflash-entropy or whiflash-neural" in result.output


def test_a_method_listing_a_profile_measurement_offers_its_probes():
    from specbench_cli.commands.profile import PROBES

    for name, e in METHODS.items():
        assert set(e.profiles) <= set(PROBES), f"{name} lists an unknown profile measurement"
        for measurement in e.profiles:
            missing = [hook for hook in PROBES[measurement] if not callable(getattr(method_class(name), hook, None))]
            assert not missing, f"{name} lists '{measurement}' but has no {', '.join(missing)}"
