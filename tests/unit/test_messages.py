"""The header codec refuses what it cannot trust, with a code and a reason."""

from __future__ import annotations

import msgpack
import pytest

from trimtab import ProtocolError
from trimtab.protocol.messages import (
    INLINE_MAX,
    MAX_HEADER_BYTES,
    Control,
    Data,
    decode,
    encode,
    error_of,
    field,
    fields,
    inline,
    int_list,
    optional,
    payload_frames,
)


def code_of(frame: bytes, job: str = "j1") -> str:
    with pytest.raises(ProtocolError) as info:
        decode(frame, job)
    return error_of(info.value)[0]


def test_round_trip() -> None:
    h = decode(encode({"j": "j1", "o": int(Data.PUSH), "i": 7, "c": 3}), "j1")
    assert h == {"j": "j1", "o": 65, "i": 7, "c": 3}


def test_refusals_carry_codes() -> None:
    assert code_of(b"\xc1garbage") == "malformed"
    assert code_of(msgpack.packb([1, 2])) == "malformed"
    assert code_of(encode({"j": "j1"})) == "malformed"
    assert code_of(encode({"j": "other", "o": 1})) == "wrong_job"
    assert code_of(b"\x00" * (MAX_HEADER_BYTES + 1)) == "too_large"


def test_field_checks_types() -> None:
    h = {"o": 1, "c": True, "n": 3}
    assert field(h, "n", int) == 3
    with pytest.raises(ProtocolError):
        field(h, "c", int)  # a bool is not a chunk id
    with pytest.raises(ProtocolError):
        field(h, "missing", str)


def test_control_and_data_codes_are_disjoint() -> None:
    assert not {int(c) for c in Control} & {int(d) for d in Data}


def test_small_payloads_ride_in_the_header_and_come_back_as_frames() -> None:
    small = memoryview(bytes(range(200)))
    header: dict = {"o": int(Data.PUSH), "j": "job"}
    assert inline(header, small) == [] and header["b"] is small
    got = decode(encode(header), "job")
    frames = payload_frames(got, [])
    assert "b" not in got and len(frames) == 1 and bytes(frames[0]) == bytes(small)
    big = memoryview(bytearray(INLINE_MAX + 1))
    header = {"o": int(Data.PUSH), "j": "job"}
    assert inline(header, big) == [big] and "b" not in header
    assert payload_frames(decode(encode(header), "job"), [big]) == [big]
    with pytest.raises(ProtocolError, match="not bytes"):
        payload_frames({"b": "text"}, [])


def test_optional_fields_are_checked_only_when_present() -> None:
    h = {"o": 1, "lo": 3, "bad": "x"}
    assert optional(h, "lo", int) == 3
    assert optional(h, "absent", int) is None
    with pytest.raises(ProtocolError, match="'bad'"):
        optional(h, "bad", int)
    fields(h, (("lo", int),), (("absent", str),))
    with pytest.raises(ProtocolError, match="'bad'"):
        fields(h, (("lo", int),), (("bad", int),))


def test_int_lists_refuse_other_items() -> None:
    assert int_list({"c": [1, 2]}, "c") == [1, 2]
    for bad in ([1, "2"], [True], "12"):
        with pytest.raises(ProtocolError) as info:
            int_list({"o": 20, "c": bad}, "c")
        assert error_of(info.value)[0] == "malformed"
