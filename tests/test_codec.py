"""The chunk codec: kernels vs the pure-Python reference, golden vectors, round trips."""

from __future__ import annotations

import contextlib
import json
import os
import struct
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aggregator.store import codec
from aggregator.store import codec_reference as ref

GOLDEN = Path(__file__).parent / "golden" / "codec"
SPECIAL = [0.0, -0.0, float("inf"), float("-inf"), 5e-324, -2.2250738585072014e-308,
           1.7976931348623157e308]
NAN_PAYLOADS = [0x7FF8000000000000, 0x7FF0000000000001, 0xFFF8DEADBEEF0001, 0x7FFFFFFFFFFFFFFF]


def _f(bits: list[int]) -> np.ndarray:
    return np.array(bits, dtype=np.uint64).view(np.float64)


def _bits(a: np.ndarray) -> list[int]:
    return np.ascontiguousarray(a, dtype=np.float64).view(np.uint64).tolist()


def _cases() -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Named inputs covering every tag, both stream kinds and the edge cases."""
    rng = np.random.default_rng(7)
    t = 1_767_225_600_000 + np.arange(40, dtype=np.int64) * 1000 + rng.integers(-4, 5, 40)
    temp = 40.0 + np.cumsum(rng.integers(-1, 2, 40))
    power = np.round((300 + np.cumsum(rng.normal(0, 3, 40))) * 1000) / 1000
    energy = np.round(1e7 + np.cumsum(power) * 1000) / 1000
    clocks = 1.41e9 + 15e6 * rng.integers(0, 4, 40)
    fb = (50_000 + np.cumsum(rng.integers(0, 3, 40))) * float(1 << 20)
    counter = np.arange(40) * 3.0 + 17
    noise = rng.random(40)
    special = _f([*(_bits(np.array(SPECIAL))), *NAN_PAYLOADS] * 4)[:40]
    ratio = np.round(rng.random(40), 2)
    beat = np.tile([386.0, 689.0, 672.0], 14)[:40] + np.round(rng.normal(0, 2, 40), 3)
    rhythm = np.round(np.tile([0.1, 0.98, 0.97, 0.99, 0.12], 8) + rng.integers(0, 2, 40) / 100, 2)
    energy_beat = np.round(5e6 + np.cumsum(beat) * 1000) / 1000
    # 16-digit decimals: exact as n / 10**3, yet XOR is smaller than their integer stream
    many_digits = np.array([7063192700511.662, 4599477098528.483, 8047328758528.165,
                            6698820670802.434, 8094981316492.672, 8371869938674.606,
                            2830692372664.564])
    n = 120  # one chunk of noisy readings: where the entropy stage wins
    tn = 1_767_225_600_000 + np.arange(n, dtype=np.int64) * 1000 + rng.integers(-4, 5, n)
    watts = np.round(250_000 + np.cumsum(rng.normal(0, 2_500, n))) / 1000  # mW, a random walk
    joules = np.round(9e9 + np.cumsum(watts * 1000)) / 1000  # its energy: noisy dods
    pcie = np.round(rng.laplace(0, 4_000, n) + 80_000)  # KiB/s, heavy-tailed
    util = rng.integers(0, 101, n).astype(np.float64)
    wide = np.cumsum(np.round(rng.normal(0, 2.0**33, n)))  # raw bits in three pieces
    return {
        "noisy": (tn, np.stack([watts, joules, pcie, util, wide], axis=1)),
        "many_digits": (t[:7], many_digits[:, None]),
        "periodic": (t, np.stack([beat, rhythm, energy_beat], axis=1)),
        "fleet_like": (t, np.stack([temp, power, energy, clocks, fb, counter, noise, special,
                                    ratio, np.full(40, 700.0), np.full(40, -0.0),
                                    np.zeros(40)], axis=1)),
        "one_sample": (t[:1], np.array([[1.5, np.nan]])),
        "two_samples": (t[:2], np.array([[1.0], [2.0]])),
        "empty": (t[:0], np.zeros((0, 3))),
        "huge_gaps": (np.array([-2**62, 0, 1, 2**62, 2**62 + 7, -5], np.int64),
                      np.array([[1e300], [-1e-300], [3.25], [3.25], [float("nan")], [2.0]])),
        "big_ints": (np.arange(5, dtype=np.int64), np.array(
            [[2.0**53], [-(2.0**53)], [0.0], [2.0**53 - 1], [1e15]])),
    }


def _ref_encode(ts: np.ndarray, vals: np.ndarray, entropy_coded: bool = False) -> bytes:
    return ref.encode_group(ts.tolist(), [vals[:, j].tolist() for j in range(vals.shape[1])],
                            entropy_coded)


@pytest.mark.parametrize("name", sorted(_cases()))
def test_kernel_matches_reference_and_golden(name: str) -> None:
    ts, vals = _cases()[name]
    blob = codec.encode_group(ts, vals)
    assert blob == _ref_encode(ts, vals)
    sealed = codec.encode_group(ts, vals, entropy_coded=True)  # the form compaction writes
    assert sealed == _ref_encode(ts, vals, entropy_coded=True)
    path = GOLDEN / f"{name}.json"
    case = {"ts": ts.tolist(), "values_bits": [_bits(vals[:, j]) for j in range(vals.shape[1])],
            "k": vals.shape[1], "blob_hex": blob.hex(), "entropy_blob_hex": sealed.hex()}
    if os.environ.get("FLEETPULSE_REGEN_GOLDEN"):
        path.write_text(json.dumps(case, indent=1) + "\n")
    golden = json.loads(path.read_text())
    assert golden["blob_hex"] == blob.hex(), "layout changed: bump VERSION, regenerate golden"
    assert golden["entropy_blob_hex"] == sealed.hex(), "entropy layout or tables changed"
    for form in (golden["blob_hex"], golden["entropy_blob_hex"]):
        gts, gcols = ref.decode_group(bytes.fromhex(form))
        assert gts == golden["ts"] and gcols == golden["values_bits"]
        dts, dv = codec.decode_group(bytes.fromhex(form))
        assert dts.tolist() == ts.tolist() and dv.shape == vals.shape
        assert [_bits(dv[:, j]) for j in range(vals.shape[1])] == golden["values_bits"]


def test_entropy_stage_takes_a_column_only_where_it_is_smaller() -> None:
    ts, vals = _cases()["noisy"]
    _, fast_tags, fast_sizes = codec.column_layout(codec.encode_group(ts, vals))
    _, tags, sizes = codec.column_layout(codec.encode_group(ts, vals, entropy_coded=True))
    # watts, joules (their dods), pcie, util, wide: every streamed column wins here
    assert fast_tags == [codec.C_DELTA, codec.C_DOD, codec.C_DELTA, codec.C_DELTA,
                         codec.C_DELTA]
    assert tags == [codec.C_DELTA_ANS, codec.C_DOD_ANS, codec.C_DELTA_ANS, codec.C_DELTA_ANS,
                    codec.C_DELTA_ANS]
    assert all(a < b for a, b in zip(sizes, fast_sizes, strict=True))
    # where the prefix code is as good (a constant step, a few distinct values), it stays
    for name in ("fleet_like", "periodic"):
        cts, cvals = _cases()[name]
        _, ft, fs = codec.column_layout(codec.encode_group(cts, cvals))
        _, et, es = codec.column_layout(codec.encode_group(cts, cvals, entropy_coded=True))
        for a, b, x, y in zip(ft, et, fs, es, strict=True):
            assert (a, x) == (b, y) or (b - a == codec.C_DELTA_ANS - codec.C_DELTA and y < x)


def test_entropy_streams_round_trip_every_symbol_class() -> None:
    """Residuals from 0 to 2**54 (magnitude classes of every size the codec's scaled
    integers reach, raw bits in 1 to 4 pieces) under both model families: kernel,
    reference and a decode agree bit for bit."""
    rng = np.random.default_rng(11)
    t = np.arange(120, dtype=np.int64) * 1000
    hit = set()
    for scale in [0.3, 3.0, 40.0, 2.0**10, 2.0**17, 2.0**30, 2.0**36, 2.0**50]:
        for law in (rng.normal, rng.laplace):
            steps = np.clip(np.round(law(0, scale, (120, 2))), -(2.0**52), 2.0**52)
            vals = np.cumsum(steps, axis=0) if scale < 2.0**36 else steps
            vals[:, 1] = np.cumsum(vals[:, 0])  # a counter of it: its dods are the steps
            blob = codec.encode_group(t, vals, entropy_coded=True)
            assert blob == _ref_encode(t, vals, entropy_coded=True)
            hit.update(codec.column_tags(blob))
            dv = codec.decode_group(blob)[1]
            assert np.array_equal(dv.view(np.uint64), vals.view(np.uint64))
            assert ref.decode_group(blob)[1] == [_bits(vals[:, j]) for j in range(2)]
    assert codec.C_DELTA_ANS in hit and codec.C_DOD_ANS in hit


def test_corrupt_entropy_streams_raise_codec_error() -> None:
    ts, vals = _cases()["noisy"]
    blob = codec.encode_group(ts, vals, entropy_coded=True)
    for cut in range(0, len(blob), 7):
        with pytest.raises(codec.CodecError):
            codec.decode_group(blob[:cut])
    rng = np.random.default_rng(5)
    caught = 0
    for _ in range(300):  # a flipped bit in a rANS stream: an error or values, never a crash
        bad = bytearray(blob)
        bad[int(rng.integers(len(blob) // 4, len(bad)))] ^= 1 << int(rng.integers(0, 8))
        try:
            codec.decode_group(bytes(bad))
        except codec.CodecError:
            caught += 1
    # the end-state check catches damage that reaches a symbol; raw bits carry no check
    # (like the prefix code's): the store's record CRC is what guards them
    assert caught > 0


def test_each_encoding_is_chosen_where_it_wins() -> None:
    ts, vals = _cases()["fleet_like"]
    tags = codec.column_tags(codec.encode_group(ts, vals))
    # temp, power, energy, clocks, fb, counter, noise, special, ratio, const, -0.0, zero
    assert tags[6] == tags[7] == codec.C_XOR
    assert tags[9] == codec.C_CONST_INT and tags[10] == codec.C_CONST
    assert tags[11] == codec.C_ZERO
    many = codec.encode_group(*_cases()["many_digits"])
    assert codec.column_tags(many) == [codec.C_XOR]  # decimal, but XOR is smaller
    assert tags[5] == codec.C_DOD  # a counter with a constant rate: all dods are zero
    assert set(tags[:5]) | {tags[8]} <= {codec.C_DELTA, codec.C_DOD}
    small = codec.encode_group(ts, vals[:, [3, 4, 5, 9]])
    # clocks in 15 MHz steps, MiB in bytes, a counter, a constant: far below plain Gorilla
    gorilla = sum(len(codec.encode_gorilla(ts, vals[:, j])) for j in [3, 4, 5, 9])
    assert len(small) * 3 < gorilla


def test_column_subset_and_batch_api() -> None:
    ts, vals = _cases()["fleet_like"]
    blob = codec.encode_group(ts, vals)
    _t2, sub = codec.decode_group(blob, [8, 1, 8])
    assert _bits(sub[:, 0]) == _bits(vals[:, 8]) == _bits(sub[:, 2])
    assert _bits(sub[:, 1]) == _bits(vals[:, 1])
    g_ts = np.stack([ts, ts + 5])
    g_vals = np.stack([vals, vals[::-1]])
    buf, off = codec.encode_groups(g_ts, g_vals)
    assert buf[off[0]:off[1]].tobytes() == blob
    d_ts, d_vals = codec.decode_groups(buf, off, vals.shape[1], ts.size)
    assert np.array_equal(d_ts, g_ts)
    assert np.array_equal(d_vals.view(np.uint64), g_vals.view(np.uint64))
    with pytest.raises(codec.CodecError, match="shape"):
        codec.decode_groups(buf, off, vals.shape[1] + 1, ts.size)


def test_gorilla_baseline_matches_reference() -> None:
    ts, vals = _cases()["fleet_like"]
    for j in range(vals.shape[1]):
        blob = codec.encode_gorilla(ts, vals[:, j])
        assert blob == ref.encode_gorilla(ts.tolist(), vals[:, j].tolist())
        dts, dv = codec.decode_gorilla(blob)
        assert dts.tolist() == ts.tolist() and _bits(dv) == _bits(vals[:, j])
    gts, gv = _cases()["fleet_like"]
    total = codec.gorilla_bytes(gts[None], gv[None])
    assert total == sum(len(codec.encode_gorilla(ts, vals[:, j])) for j in range(vals.shape[1]))


def test_corrupt_blobs_raise_codec_error() -> None:
    ts, vals = _cases()["fleet_like"]
    blob = codec.encode_group(ts, vals)
    for cut in range(len(blob)):
        with pytest.raises(codec.CodecError):
            codec.decode_group(blob[:cut])
    with pytest.raises(codec.CodecError):
        codec.decode_group(blob + b"\x00")
    rng = np.random.default_rng(3)
    for _ in range(300):  # flipped bits: an error or some values, never a crash
        bad = bytearray(blob)
        i = int(rng.integers(0, len(bad)))
        bad[i] ^= 1 << int(rng.integers(0, 8))
        with contextlib.suppress(codec.CodecError):
            codec.decode_group(bytes(bad))


_bit_patterns = st.integers(0, 2**64 - 1)
_decimals = st.builds(lambda n, e: n / 10.0**e, st.integers(-(10**9), 10**9), st.integers(0, 4))
_value_bits = st.one_of(_bit_patterns, _decimals.map(lambda v: ref.f2u(v)),
                        st.sampled_from(NAN_PAYLOADS + [ref.f2u(x) for x in SPECIAL]))


@st.composite
def _groups(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray]:
    n = draw(st.integers(0, 30))
    k = draw(st.integers(1, 4))
    step = draw(st.sampled_from([1000, 250, 1]))
    start = draw(st.integers(-(2**60), 2**60))
    jitter = draw(st.lists(st.integers(-(2**20), 2**20), min_size=n, max_size=n))
    ts = [start + i * step + j for i, j in enumerate(jitter)]
    cols = []
    for _ in range(k):
        kind = draw(st.sampled_from(["any", "walk", "const", "periodic"]))
        if kind == "periodic":
            period = draw(st.integers(2, 9))
            shape = draw(st.lists(st.integers(-(10**5), 10**5), min_size=period,
                                  max_size=period))
            noise = draw(st.lists(st.integers(-3, 3), min_size=n, max_size=n))
            cols.append([ref.f2u((shape[i % period] + noise[i]) / 1000) for i in range(n)])
        elif kind == "const":
            cols.append([draw(_value_bits)] * n)
        elif kind == "walk":
            base = draw(st.integers(-(10**6), 10**6))
            steps = draw(st.lists(st.integers(-50, 50), min_size=n, max_size=n))
            e = draw(st.integers(-3, 3))
            cols.append([ref.f2u(ref.decode_scaled(base + sum(steps[:i + 1]), e))
                         for i in range(n)])
        else:
            cols.append(draw(st.lists(_value_bits, min_size=n, max_size=n)))
    vals = np.array(cols, dtype=np.uint64).reshape(k, n).T.view(np.float64)
    return np.array(ts, dtype=np.int64), vals


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_groups())
def test_round_trip_bit_exact_and_equal_to_reference(group: tuple[np.ndarray, np.ndarray]) -> None:
    ts, vals = group
    for entropy_coded in (False, True):
        blob = codec.encode_group(ts, vals, entropy_coded)
        assert blob == _ref_encode(ts, vals, entropy_coded)
        dts, dv = codec.decode_group(blob)
        assert dts.tolist() == ts.tolist()
        assert np.array_equal(dv.view(np.uint64), vals.view(np.uint64))
        rts, rcols = ref.decode_group(blob)
        assert rts == ts.tolist() and rcols == [_bits(vals[:, j]) for j in range(vals.shape[1])]


def test_scaled_integers_are_exact_at_the_limits() -> None:
    # 0.1 + 0.2 is not the double of "0.3": it must not be stored as 3 / 10
    vals = np.array([[0.1 + 0.2], [0.3], [0.1]])
    blob = codec.encode_group(np.arange(3), vals)
    assert _bits(codec.decode_group(blob)[1][:, 0]) == _bits(vals[:, 0])
    assert struct.pack("<d", 0.1 + 0.2) != struct.pack("<d", 0.3)


def _lag_of_column(blob: bytes, j: int) -> int:
    """The lag byte of column j (C_DELTA/C_DOD): tag | e | varint n0 | varint g | lag."""
    head, tags, sizes = codec.column_layout(blob)
    pos = head + sum(sizes[:j])
    assert tags[j] in (codec.C_DELTA, codec.C_DOD)
    pos += 2
    for _ in range(2):
        while blob[pos] & 0x80:
            pos += 1
        pos += 1
    return blob[pos]


def test_periodic_load_picks_its_period_as_lag() -> None:
    ts, vals = _cases()["periodic"]
    blob = codec.encode_group(ts, vals)
    assert _lag_of_column(blob, 0) == 3  # a beat of period 3 s sampled at 1 Hz
    assert _lag_of_column(blob, 1) == 5
    walk = codec.encode_group(*_cases()["fleet_like"])
    assert _lag_of_column(walk, 1) == 1  # a random walk gains nothing from a lag


def test_empty_wide_group_and_absurd_headers() -> None:
    blob = codec.encode_group(np.zeros(0, np.int64), np.zeros((0, 50)))
    ts, vals = codec.decode_group(blob)
    assert ts.size == 0 and vals.shape == (0, 50)
    # a header claiming 2**40 samples or more columns than bytes is refused, not allocated
    with pytest.raises(codec.CodecError):
        codec.decode_group(bytes([1, 1]) + bytes([0x80, 0x80, 0x80, 0x80, 0x80, 0x20]))
    with pytest.raises(codec.CodecError):
        codec.decode_group(bytes([1, 0xE8, 0x07, 5, 1, 0]))


def test_decode_selected_matches_decode_group_for_many_chunks() -> None:
    cases = _cases()
    names = ["fleet_like", "periodic", "one_sample", "huge_gaps", "empty", "two_samples",
             "noisy"]
    blobs = [codec.encode_group(*cases[n], entropy_coded=n == "noisy") for n in names]
    picks = [[0, 4, 11], [1], [1], [], [], [0], [1, 4]]
    gap = b"\xff" * 5  # the store's record framing sits between blobs
    buf = gap.join(blobs)
    starts, pos = [], 0
    for b in blobs:
        starts.append(pos)
        pos += len(b) + len(gap)
    ends = [s + len(b) for s, b in zip(starts, blobs, strict=True)]
    colptr = np.cumsum([0] + [len(p) for p in picks])
    counts, ts, vals = codec.decode_selected(np.frombuffer(buf, np.uint8), starts, ends, colptr,
                                             np.concatenate([np.array(p, np.int64)
                                                             for p in picks]))
    t_at = v_at = 0
    for name, pick, n in zip(names, picks, counts.tolist(), strict=True):
        want_ts, want_v = cases[name]
        assert n == (want_ts.size if pick else 0)
        assert ts[t_at:t_at + n].tolist() == want_ts.tolist()[:n]
        t_at += n
        for j in pick:
            assert _bits(vals[v_at:v_at + n]) == _bits(want_v[:, j])
            v_at += n
    assert v_at == vals.size
    with pytest.raises(codec.CodecError, match="column selection"):
        codec.decode_selected(np.frombuffer(blobs[0], np.uint8), [0], [len(blobs[0])], [0, 2],
                              [4, 0])  # not increasing
    with pytest.raises(codec.CodecError):
        codec.decode_selected(np.frombuffer(blobs[0], np.uint8), [0], [len(blobs[0]) - 9],
                              [0, 1], [11])  # cut short
