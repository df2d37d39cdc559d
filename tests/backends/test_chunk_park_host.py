"""triton_chunk_park's host side: the split-program count covers every tile a chunk can have
(too few programs would leave a split's keys out, silently), and which chunks take the route."""
from hypothesis import given
from hypothesis import strategies as st

from muser.backends.cuda.triton_chunk_park import PARK_BYTES, park_rows, park_splits, \
    park_workspace


def splits_a_tile_spans(p_min: int, p_max: int, split: int, window: int | None) -> int:
    """chunk_kernel's own count: splits lo_min // SPLIT .. p_max // SPLIT."""
    lo_min = max(p_min - window + 1, 0) if window else 0
    return p_max // split - lo_min // split + 1


@given(rows=st.integers(1, 64), split=st.sampled_from([16, 32, 64, 128]),
       window=st.one_of(st.none(), st.integers(1, 4096)), positions=st.integers(1, 40000),
       data=st.data())
def test_the_split_programs_cover_every_tile_of_a_chunk(rows, split, window, positions, data):
    p_max = data.draw(st.integers(0, positions - 1))
    p_min = max(0, p_max - data.draw(st.integers(0, rows - 1)))
    assert splits_a_tile_spans(p_min, p_max, split, window) <= park_splits(rows, split, window,
                                                                           positions)


def test_a_tile_at_the_bound_needs_every_program():
    # a ring window of 48 over splits of 16: a tile of 4 rows (positions 94..97) sees keys
    # 47..97, 51 positions -- starting at a split's last position, they touch 5 splits (2..6),
    # the bound's ceil(51 / 16) + 1
    assert splits_a_tile_spans(96, 99, 16, 48) == 4
    assert splits_a_tile_spans(94, 97, 16, 48) == 5
    assert park_splits(4, 16, 48, 200) == 5


def test_which_chunks_park():
    assert park_rows({"park": 16, "dsplit": 1}) == 16
    assert park_rows({"park": 16, "dsplit": 2}) == 0          # a column slice per program: no
    assert park_rows({"dsplit": 1}) == 0


def test_a_workspace_past_the_budget_is_refused():
    assert park_workspace("cpu", PARK_BYTES // (258 * 4) + 1, 256) is None
    ms, ls, acc = park_workspace("cpu", 8, 256)
    assert ms.shape == (8,) and ls.shape == (8,) and acc.shape == (8, 256)
