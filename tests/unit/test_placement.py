"""Chunking, the placement policies and their registry."""

from __future__ import annotations

import itertools

import pytest

from trimtab import ConfigError
from trimtab.core.chunks import TensorSpec, make_chunks
from trimtab.core.registry import Registry
from trimtab.policies.placement import MXNET_BIGARRAY_BOUND, PLACEMENTS, djb2


def specs(*numels: int) -> list[TensorSpec]:
    return [TensorSpec(f"t{i}", (n,), "float32") for i, n in enumerate(numels)]


def test_chunks_cover_each_tensor_exactly_and_respect_the_limit() -> None:
    tensors = specs(10, 1000, 1, 4097)
    chunks = make_chunks(tensors, chunk_bytes=4096)  # 1024 float32 per chunk
    for t_index, t in enumerate(tensors):
        mine = [c for c in chunks if c.tensor == t_index]
        assert all(c.nbytes <= 4096 for c in mine)
        assert [c.offset for c in mine] == sorted(c.offset for c in mine)
        assert sum(c.numel for c in mine) == t.numel
        assert mine[0].offset == 0
        for a, b in itertools.pairwise(mine):
            assert a.offset + a.numel == b.offset
    assert [c.id for c in chunks] == list(range(len(chunks)))
    assert len([c for c in chunks if c.tensor == 3]) == 5  # 4097 elements: 5 chunks
    assert (
        max(c.numel for c in chunks if c.tensor == 3)
        - min(c.numel for c in chunks if c.tensor == 3)
        <= 1
    )  # even split


def test_chunk_bytes_must_be_positive() -> None:
    with pytest.raises(ConfigError):
        make_chunks(specs(10), 0)


def test_djb2_matches_the_reference_definition() -> None:
    assert djb2("") == 5381
    assert djb2("a") == 5381 * 33 + ord("a")
    assert djb2("ab") == (5381 * 33 + ord("a")) * 33 + ord("b")


def test_hash_placement_is_djb2_of_name_and_part() -> None:
    tensors = specs(100, 5000)
    chunks = make_chunks(tensors, 4096)
    owners = PLACEMENTS.create("hash").place(tensors, chunks, 3)
    for c, owner in zip(chunks, owners, strict=True):
        assert owner == djb2(f"{tensors[c.tensor].name}:{c.part}") % 3


def test_mxnet_places_small_arrays_whole_and_slices_big_ones_evenly() -> None:
    big = MXNET_BIGARRAY_BOUND + 10
    tensors = specs(100, 200, big)
    chunks = make_chunks(tensors, 1 << 20)  # big tensor: 4 chunks
    owners = PLACEMENTS.create("mxnet").place(tensors, chunks, 4)
    by_chunk = dict(zip((c.id for c in chunks), owners, strict=True))
    assert by_chunk[0] == 0 * 9973 % 4
    assert by_chunk[1] == 1 * 9973 % 4
    big_owners = [by_chunk[c.id] for c in chunks if c.tensor == 2]
    assert sorted(big_owners) == [0, 1, 2, 3]


def test_greedy_balances_bytes() -> None:
    tensors = specs(*[1000 * (i + 1) for i in range(12)])
    chunks = make_chunks(tensors, 1 << 20)
    owners = PLACEMENTS.create("greedy").place(tensors, chunks, 3)
    load = [0, 0, 0]
    for c, s in zip(chunks, owners, strict=True):
        load[s] += c.nbytes
    assert max(load) - min(load) <= max(c.nbytes for c in chunks)
    assert max(load) / (sum(load) / 3) < 1.1


def test_registry_refuses_unknown_and_duplicate_names() -> None:
    with pytest.raises(ConfigError, match="choose one of"):
        PLACEMENTS.create("nope")
    reg: Registry[object] = Registry("test")
    reg.register("a")(object)
    with pytest.raises(ConfigError, match="already registered"):
        reg.register("a")(object)
    assert PLACEMENTS.names() == ["greedy", "hash", "mxnet", "psld", "psld-mxnet"]


def test_tensor_spec_rejects_bad_declarations() -> None:
    assert TensorSpec.from_wire(["w", [2, 3], "float32", 0]).numel == 6
    for bad in (["w", [2], "int64", 0], ["w", [-1], "float32", 0], ["w", [2]], "x"):
        with pytest.raises(ValueError):
            TensorSpec.from_wire(bad)


def test_psld_from_mxnet_starts_from_mxnets_map_and_moves_live() -> None:
    from trimtab.policies.placement import is_live
    from trimtab.roles.coordinator import CoordinatorConfig

    tensors = [TensorSpec(f"t{i}", (n,), "float32") for i, n in enumerate([900_000, 100_000] * 4)]
    chunks = make_chunks(tensors, 1 << 18)
    same = PLACEMENTS.create("psld-mxnet").place(tensors, chunks, 4)
    assert same == PLACEMENTS.create("mxnet").place(tensors, chunks, 4)
    assert is_live("psld") and is_live("psld-mxnet") and not is_live("mxnet")
    assert not is_live("psld-nonesuch")  # a name no policy has moves nothing
    with pytest.raises(ConfigError, match="use it with --mode bsp"):
        CoordinatorConfig(2, 2, "j", placement="psld-mxnet", consistency="ssp")


def test_whether_a_placement_moves_chunks_live_is_the_policys_attribute() -> None:
    live = {name for name in PLACEMENTS.names() if PLACEMENTS.create(name).live}
    assert live == {"psld", "psld-mxnet"}
    for name in PLACEMENTS.names():
        assert PLACEMENTS.create(name).name == name  # each names itself, subclasses too
