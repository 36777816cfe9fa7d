"""The job's settings: one home for defaults and rules, and the flags built from it."""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from trimtab.errors import ConfigError
from trimtab.launch import env as envvars
from trimtab.launch.spec import (
    LaunchConfig,
    add_flags,
    add_job_flags,
    from_args,
    job_settings_from_args,
    to_argv,
)
from trimtab.roles.coordinator import CoordinatorConfig
from trimtab.settings import (
    BatchingSettings,
    ConsistencySettings,
    ElasticSettings,
    JobSettings,
    PlacementSettings,
)


def _job_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_job_flags(parser)
    return parser.parse_args(list(argv))


def test_the_defaults_are_written_once_and_agree_everywhere() -> None:
    launch = LaunchConfig()
    coord = CoordinatorConfig(2, 2, "j")
    flags = _job_args()
    assert launch.placement == coord.placement == flags.placement == "greedy"
    assert launch.chunk_bytes == coord.chunk_bytes == flags.chunk_bytes == 1 << 20
    assert launch.consistency == coord.consistency == flags.mode == "bsp"
    assert launch.staleness == coord.staleness == flags.staleness == 3
    assert launch.batching == coord.batching == flags.batching == "equal"
    assert launch.rebalance_every == coord.rebalance_every == flags.rebalance_every == 0
    assert launch.settings == JobSettings(workers=2, servers=2)


@pytest.mark.parametrize(
    ("flat", "says"),
    [
        ({"placement": "psld", "consistency": "asp"}, "live migration .* --mode bsp, not asp"),
        ({"rebalance_every": 2, "consistency": "ssp"}, "live migration .* --mode bsp"),
        ({"max_servers": 3, "consistency": "saps"}, "live migration .* --mode bsp"),
        ({"batching": "lbbsp", "consistency": "asp"}, "--batching lbbsp .* --mode bsp, not asp"),
        ({"servers": 3, "max_servers": 2}, "below num_servers.*at least --servers"),
        ({"workers": 0}, "at least 1 worker"),
    ],
)
def test_rules_across_components_are_checked_once_for_every_config(
    flat: dict[str, object], says: str
) -> None:
    """The launcher's config, the coordinator's and the components refuse the same
    settings with the same words (the rule is written once, in JobSettings)."""
    kw: dict[str, object] = {"workers": 2, "servers": 2, **flat}
    with pytest.raises(ConfigError, match=says):
        LaunchConfig(**kw)  # type: ignore[arg-type]
    coord = {("num_" + k if k in ("workers", "servers") else k): v for k, v in kw.items()}
    with pytest.raises(ConfigError, match=says):
        CoordinatorConfig(job="j", **coord)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=says):
        JobSettings(
            workers=kw["workers"],  # type: ignore[arg-type]
            servers=kw["servers"],  # type: ignore[arg-type]
            placement=PlacementSettings(str(kw.get("placement", "greedy"))),
            consistency=ConsistencySettings(str(kw.get("consistency", "bsp"))),
            batching=BatchingSettings(str(kw.get("batching", "equal"))),
            elastic=ElasticSettings(
                int(kw.get("max_servers", 0)),  # type: ignore[call-overload]
                int(kw.get("rebalance_every", 0)),  # type: ignore[call-overload]
            ),
        )


@pytest.mark.parametrize(
    ("component", "says"),
    [
        (lambda: PlacementSettings("nearest"), "unknown placement 'nearest'.*--placement"),
        (lambda: PlacementSettings(chunk_bytes=8), "at least 64.*--chunk-bytes"),
        (lambda: ConsistencySettings("eventual"), "unknown consistency mode.*--mode"),
        (lambda: ConsistencySettings(staleness=-1), "staleness must be >= 0"),
        (lambda: BatchingSettings("random"), "unknown batching 'random'"),
        (lambda: ElasticSettings(max_servers=-1), "max_servers must be >= 0"),
        (lambda: ElasticSettings(rebalance_every=-1), "rebalance_every must be >= 0"),
    ],
)
def test_each_component_checks_its_own_fields(component: object, says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        component()  # type: ignore[operator]


def test_components_are_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        PlacementSettings().policy = "hash"  # type: ignore[misc]


def test_live_and_elastic_properties() -> None:
    assert PlacementSettings("psld-mxnet").live and not PlacementSettings("mxnet").live
    assert JobSettings(2, 2, placement=PlacementSettings("psld")).migrates
    assert JobSettings(2, 2, elastic=ElasticSettings(max_servers=3)).max_servers == 3
    assert not JobSettings(2, 2).migrates and JobSettings(2, 2).max_servers == 2


def test_flags_read_back_into_the_same_config() -> None:
    args = _job_args(
        "-w", "3", "-s", "2", "--placement", "psld", "--chunk-bytes", "4096",
        "--batching", "lbbsp", "--compression", "fp16", "--max-servers", "4",
        "--straggler", "worker:1:slowdown=2", "--straggler", "server:3:bandwidth=1MB/s",
        "--deadline", "30", "-v",
    )  # fmt: skip
    config = LaunchConfig.from_args(args)
    assert config == dataclasses.replace(
        LaunchConfig(
            workers=3,
            servers=2,
            placement="psld",
            chunk_bytes=4096,
            batching="lbbsp",
            compression="fp16",
            max_servers=4,
            stragglers=("worker:1:slowdown=2", "server:3:bandwidth=1MB/s"),
            deadline_s=30.0,
            verbose=True,
        ),
        job=config.job,
    )


def test_to_argv_is_what_the_flags_parse_back() -> None:
    """The launcher passes the coordinator its settings as flags built the same way."""
    job = JobSettings(
        3,
        2,
        PlacementSettings("psld", 2048),
        ConsistencySettings("bsp", 5),
        BatchingSettings("lbbsp"),
        ElasticSettings(max_servers=4, rebalance_every=7),
    )
    parser = argparse.ArgumentParser()
    parser.add_argument("--workers", type=int)
    parser.add_argument("--servers", type=int)
    for component in (PlacementSettings, ConsistencySettings, BatchingSettings, ElasticSettings):
        add_flags(parser, component)
    argv = ["--workers", "3", "--servers", "2"]
    for part in (job.placement, job.consistency, job.batching, job.elastic):
        argv += to_argv(part)
    assert job_settings_from_args(parser.parse_args(argv)) == job
    assert from_args(ElasticSettings, parser.parse_args(argv)) == job.elastic


def test_flags_refuse_what_the_registries_do_not_know(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        _job_args("--placement", "nearest")
    assert "invalid choice: 'nearest'" in capsys.readouterr().err


def test_the_coordinator_config_composes_and_fills_max_servers() -> None:
    config = CoordinatorConfig.of(
        JobSettings(2, 3, consistency=ConsistencySettings("ssp", 1)), job="j", port=7
    )
    assert (config.num_workers, config.num_servers, config.port) == (2, 3, 7)
    assert (config.consistency, config.staleness, config.max_servers) == ("ssp", 1, 3)
    assert config.settings().consistency == ConsistencySettings("ssp", 1)


def test_environment_readers_take_the_environment_they_are_given() -> None:
    assert envvars.coordinator_address({}) is None
    assert envvars.coordinator_address({"TRIMTAB_COORDINATOR": "tcp://a:1"}) == "tcp://a:1"
    dmlc = {"DMLC_PS_ROOT_URI": "10.0.0.1", "DMLC_PS_ROOT_PORT": "9000"}
    assert envvars.coordinator_address(dmlc) == "tcp://10.0.0.1:9000"
    assert envvars.job_id({}) == "trimtab" and envvars.job_id({"TRIMTAB_JOB": "x"}) == "x"
    assert envvars.priority({}) and not envvars.priority({"TRIMTAB_PRIORITY": "0"})
    names = ("TRIMTAB_NUM_WORKERS", "DMLC_NUM_WORKER")
    assert envvars.env_int({"DMLC_NUM_WORKER": "4"}, *names, default=1) == 4
    assert envvars.env_int({}, *names, default=1) == 1
    with pytest.raises(ConfigError, match="TRIMTAB_NUM_WORKERS='four'"):
        envvars.env_int({"TRIMTAB_NUM_WORKERS": "four"}, *names, default=1)
