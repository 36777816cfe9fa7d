"""The ``trimtab`` command's parser: its subcommands, the tools' plug-in, exit statuses."""

from __future__ import annotations

import argparse
import logging
from typing import Any

import pytest

from trimtab.cli import build_parser, main, plugins


def _subcommands(parser: argparse.ArgumentParser) -> list[str]:
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return list(sub.choices)


def test_every_subcommand_is_there_in_its_order() -> None:
    assert _subcommands(build_parser()) == [
        "run",
        "train",
        "coordinator",
        "server",
        "scale",
        "checkpoint",
        "testbed",
        "report",
        "start",
        "experiment",
        "bench",
        "simulate",
    ]


def test_every_subcommand_says_who_carries_it_out() -> None:
    parser = build_parser()
    for argv in (
        ["run", "--", "true"],
        ["train"],
        ["coordinator"],
        ["server"],
        ["scale", "--servers", "3"],
        ["checkpoint"],
        ["start", "--", "true"],
        ["bench", "overlap"],
        ["bench", "collectives"],
        ["experiment", "psld"],
    ):
        assert callable(parser.parse_args(argv).handler), argv


class _Point:
    def __init__(self, name: str, load: Any) -> None:
        self.name, self.value, self.load = name, f"fake:{name}", load


def test_a_broken_plugin_is_reported_and_left_out(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken() -> Any:
        raise ImportError("no module named fake")

    def good() -> Any:
        return lambda sub: sub.add_parser("hello").set_defaults(handler=lambda args: 7)

    monkeypatch.setattr(
        plugins, "entry_points", lambda group: [_Point("b", good), _Point("a", broken)]
    )
    with caplog.at_level(logging.WARNING, logger="trimtab.cli"):
        parser = build_parser()
    assert _subcommands(parser)[-1] == "hello" and "bench" not in _subcommands(parser)
    assert "fake:a could not be loaded: no module named fake" in caplog.text
    assert main(["hello"]) == 7


def test_settings_errors_exit_2_with_the_message(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in ("TRIMTAB_COORDINATOR", "DMLC_PS_ROOT_URI", "DMLC_PS_ROOT_PORT"):
        monkeypatch.delenv(name, raising=False)
    assert main(["scale", "--servers", "3"]) == 2
    assert "which job? give --coordinator" in capsys.readouterr().err
    assert main(["run", "--mode", "asp", "--placement", "psld", "--", "true"]) == 2
    assert "use it with --mode bsp, not asp" in capsys.readouterr().err
    monkeypatch.setenv("TRIMTAB_NUM_WORKERS", "many")
    assert main(["coordinator"]) == 2
    assert "TRIMTAB_NUM_WORKERS='many' must be a whole number" in capsys.readouterr().err


def test_role_defaults_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DMLC_NUM_WORKER", "4")
    monkeypatch.setenv("DMLC_PS_ROOT_URI", "10.1.1.1")
    monkeypatch.setenv("DMLC_PS_ROOT_PORT", "9091")
    monkeypatch.setenv("TRIMTAB_JOB", "j7")
    monkeypatch.setenv("TRIMTAB_PRIORITY", "0")
    monkeypatch.delenv("TRIMTAB_COORDINATOR", raising=False)
    parser = build_parser()
    coord = parser.parse_args(["coordinator"])
    assert (coord.workers, coord.host, coord.port, coord.job) == (4, "10.1.1.1", 9091, "j7")
    server = parser.parse_args(["server"])
    assert server.coordinator == "tcp://10.1.1.1:9091" and server.no_priority


def test_the_runtime_does_not_require_scikit_learn() -> None:
    """scikit-learn is the example's (an extra), not a requirement of the package."""
    from importlib.metadata import requires

    required = [r for r in requires("trimtab") or [] if "extra ==" not in r]
    assert not any(r.startswith("scikit-learn") for r in required), required
    assert any(r.startswith("scikit-learn") and "example" in r for r in requires("trimtab") or [])


def test_train_without_scikit_learn_says_what_to_install_before_starting_anything(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import importlib.util

    from trimtab.launch import train

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "sklearn" else real(name, *a)
    )
    monkeypatch.setattr(train, "Job", None)  # starting a job would fail loudly
    assert main(["train"]) == 2
    assert "pip install 'trimtab[example]'" in capsys.readouterr().err
