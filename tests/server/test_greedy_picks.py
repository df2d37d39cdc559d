"""server/decode_rounds.greedy_picks: a batched step's plain greedy rows picked in one reduction
give exactly the tokens the one-by-one route gives (`picker.pick(finite_logits(row))`), and the
rows that route must handle -- non-finite logits, pickers that are not plain greedy -- are left
to it."""
import math

import pytest
import torch

from muser.engine.logits_processors import Controls
from muser.engine.picker import TokenPicker
from muser.engine.sampling import SamplingParams
from muser.server.decode_rounds import greedy_picks
from muser.server.sampler import finite_logits

V = 1000
GREEDY = SamplingParams()


def row(seed: int, edit=None) -> torch.Tensor:
    r = torch.randn(V, generator=torch.Generator().manual_seed(seed))
    if edit:
        edit(r)
    return r


def tie(r):                 # two equal maxima: the first one wins both routes
    r[17] = r[900] = 50.0


def nan(r):
    r[3] = math.nan


def posinf(r):
    r[400] = math.inf


def neginf(r):
    r[5] = -math.inf


def late_nan(r):            # after the maximum: a max that stopped at the max would miss it
    r[17] = 50.0
    r[999] = math.nan


CASES = [  # (picker, row edit, expect the quick route)
    (lambda: TokenPicker(GREEDY), None, True),
    (lambda: TokenPicker(GREEDY), tie, True),
    (lambda: TokenPicker(GREEDY), nan, False),
    (lambda: TokenPicker(GREEDY), posinf, False),
    (lambda: TokenPicker(GREEDY), neginf, False),
    (lambda: TokenPicker(GREEDY), late_nan, False),
    (lambda: TokenPicker(SamplingParams(temperature=0.8, seed=1)), None, False),
    (lambda: TokenPicker(GREEDY, logprobs=2), None, False),
    (lambda: TokenPicker(GREEDY, Controls(repetition_penalty=1.3), prompt=[1, 2]), None, False),
    (lambda: TokenPicker(GREEDY), None, True),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_greedy_rows_picked_together_equal_rows_picked_alone(dtype):
    logits = torch.stack([row(i, edit) for i, (_, edit, _) in enumerate(CASES)]).to(dtype)
    quick = greedy_picks([make() for make, _, _ in CASES], logits)
    assert sorted(quick) == [i for i, (_, _, fast) in enumerate(CASES) if fast]
    for i, tok in quick.items():
        alone = CASES[i][0]().pick(finite_logits(logits[i])).token
        assert tok == alone
    assert quick[1] == 17


def test_rows_given_as_a_list_or_pickers_without_the_capability_go_the_usual_way():
    logits = torch.stack([row(0), row(1)])
    sampled = TokenPicker(SamplingParams(temperature=0.8, seed=1))
    assert greedy_picks([TokenPicker(GREEDY), sampled], logits) == {0: int(logits[0].argmax())}
    assert greedy_picks([TokenPicker(GREEDY)] * 2, list(logits)) == {}
    assert greedy_picks([object(), TokenPicker(GREEDY)], logits) == {1: int(logits[1].argmax())}
