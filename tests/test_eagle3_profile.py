"""eagle3.profile: the verify-cost table is measured once per machine, target and dtype, then read from its cache."""
import pytest
import torch

from eagle3.profile import Profile, load_or_measure, profile_key, profile_path
from eagle3_helpers import small_vocab_target

GRID = dict(rows=(1, 4), nodes=(1, 8), context=32, reps=1)


def test_profile_is_measured_once_then_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("EAGLE3_CACHE", str(tmp_path))
    target = small_vocab_target(layers=2)
    first = load_or_measure(target, **GRID)
    assert first.rows == [1, 4] and first.nodes == [1, 8]
    assert all(s > 0 for line in first.seconds for s in line)
    path = profile_path(target)
    assert path.parent.parent == tmp_path and path.exists()
    stamp = path.stat().st_mtime_ns
    again = load_or_measure(target, **GRID)
    assert again == first and path.stat().st_mtime_ns == stamp  # read back, not measured again
    assert load_or_measure(target, force=True, **GRID).seconds != first.seconds  # --force measures anew
    other = small_vocab_target(layers=2, dtype=torch.bfloat16)
    assert profile_key(other) != profile_key(target) and profile_path(other) != path  # per dtype


def test_the_key_follows_the_kernels_and_the_wrapper(monkeypatch):
    """A profile measured before a kernel changed, or with the other wrapper around compiled steps, is not read."""
    from eagle3 import profile

    target = small_vocab_target(layers=2)
    key = profile_key(target)
    assert f"kernels {profile.kernels_digest()}" in key
    wrapper = "0" if "(Python wrapper)" in key else "1"
    if not torch.cuda.is_available():  # CUDA runs the Python wrapper either way
        monkeypatch.setenv("EAGLE3_CPP_WRAPPER", "1" if wrapper == "0" else "0")
        assert profile_key(target) != key
    monkeypatch.setenv("EAGLE3_CPP_WRAPPER", wrapper)
    assert profile_key(target) == key
    monkeypatch.setattr(profile, "kernels_digest", lambda: "changed")
    assert profile_key(target) != key


def test_cost_interpolates_within_and_beyond_the_grid():
    prof = Profile("k", [1, 4], [1, 8], [[1.0, 2.0], [3.0, 9.0]])
    assert prof.cost(1, 1) == 1.0 and prof.cost(4, 8) == 9.0
    assert prof.cost(1, 4.5) == 1.5 and prof.cost(2.5, 1) == 2.0
    assert prof.cost(8, 8) == pytest.approx(2 + 7 * 7 / 3)  # rows past the grid: the last segment's slope


def test_a_cell_above_a_bigger_forward_is_priced_as_that_one():
    """A profile measured beside other work: t(1, 2) above t(1, 4) and t(4, 1) above t(4, 2). cost() prices each at
    the smallest cell of as many rows and nodes or more; the measured seconds are kept as they are."""
    seconds = [[7.0, 11.8, 9.6, 12.0], [20.0, 18.0, 25.0, 40.0]]
    prof = Profile("k", [1, 4], [1, 2, 4, 8], seconds)
    assert [prof.cost(1, n) for n in (1, 2, 4, 8)] == [7.0, 9.6, 9.6, 12.0]
    assert [prof.cost(4, n) for n in (1, 2, 4, 8)] == [18.0, 18.0, 25.0, 40.0]
    assert prof.seconds == seconds


def test_forwards_past_max_tokens_are_extrapolated_not_measured():
    from eagle3.profile import measure

    prof = measure(small_vocab_target(layers=2), rows=(1, 4), nodes=(1, 2, 4), context=32, reps=1, max_tokens=4)
    one, two, four = prof.seconds[1]  # 4 rows: 4 and 8 tokens measured (two cells at least), 16 extrapolated
    assert four == pytest.approx(max(two + 2 * (two - one), 0.0))  # the line through the last two cells
    assert prof.seconds[0][2] != pytest.approx(prof.seconds[0][1] + 2 * (prof.seconds[0][1] - prof.seconds[0][0]))
