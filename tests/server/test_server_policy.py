"""The context policy as pure functions: no model, no server, no torch."""
import ast
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from muser.errors import ContextOverflow, RequestError
from muser.server.policy import Limits, ReplayPlan, match_lineage, plan_chat, split_chat
from muser.server.raw_policy import RawReplay, plan_raw, plan_raw_continuation


def msg(role, content):
    return {"role": role, "content": content}


def count(messages):
    """A stand-in template: 2 tokens of framing + 1 per message + 1 per character."""
    return 2 + sum(1 + len(m["content"]) for m in messages)


SYS = msg("system", "be brief")            # 9 tokens


def convo(n_turns, size=10):
    out = [SYS]
    for i in range(n_turns):
        out += [msg("user", f"u{i}".ljust(size, ".")), msg("assistant", f"a{i}".ljust(size, "."))]
    return out + [msg("user", "last".ljust(size, "."))]


@pytest.mark.parametrize("planner", ["policy.py", "raw_policy.py"])
def test_policy_imports_no_torch(planner):
    src = (Path(__file__).resolve().parents[2] / "muser/server" / planner).read_text()
    tree = ast.parse(src)
    names = {a.name for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))
             for a in n.names}
    names |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert not any("torch" in x for x in names), names


def test_split_attaches_everything_after_a_user_message():
    ms = [SYS, msg("user", "a"), msg("assistant", "b"), msg("tool", "c"), msg("user", "d")]
    s = split_chat(ms)
    assert s.system == (SYS,)
    assert [len(t) for t in s.turns] == [3, 1]
    # messages before the first user message form a leading turn
    s = split_chat([msg("assistant", "hi"), msg("user", "x")])
    assert [len(t) for t in s.turns] == [1, 1]


def test_split_refuses_late_system_and_empty():
    with pytest.raises(RequestError, match="system messages must all come before"):
        split_chat([msg("user", "a"), msg("system", "b")])
    with pytest.raises(RequestError):
        split_chat([])


def test_fits_keeps_everything():
    ms = convo(3)
    p = plan_chat(ms, count, Limits(max_context=1000, output_reserve=10))
    assert not p.shifted and p.messages() == ms and p.prompt_tokens == count(ms)


def test_shift_keeps_system_and_newest_whole_turns():
    ms = convo(6)                             # 7 turns of 22 or 11 tokens, system 9
    lim = Limits(max_context=100, output_reserve=20)
    p = plan_chat(ms, count, lim)
    assert p.shifted and p.system == (SYS,)
    assert p.prompt_tokens + 20 <= 100
    assert p.prompt_tokens == count(p.messages())
    # keeping one more turn would not fit: the plan keeps as many as possible
    kept_plus_one = [SYS, *(m for t in split_chat(ms).turns[p.first_kept - 1:] for m in t)]
    assert count(kept_plus_one) + 20 > 100
    assert p.turns == split_chat(ms).turns[p.first_kept:]
    assert p.turns[-1][0]["content"].startswith("last")
    assert "dropped" in p.reason and str(p.prompt_tokens) in p.reason


def test_error_policy_refuses_with_numbers():
    ms = convo(6)
    with pytest.raises(ContextOverflow) as e:
        plan_chat(ms, count, Limits(max_context=100, output_reserve=20, policy="error"))
    assert e.value.needed == count(ms) + 20 and e.value.limit == 100
    assert str(count(ms)) in str(e.value) and "100" in str(e.value)


def test_unfittable_newest_turn_is_refused_with_numbers():
    ms = [SYS, msg("user", "x" * 50), msg("assistant", "y"), msg("user", "z" * 200)]
    with pytest.raises(ContextOverflow) as e:
        plan_chat(ms, count, Limits(max_context=100, output_reserve=20))
    need = count([SYS, ms[-1]])
    assert e.value.needed == need + 20 and e.value.limit == 100
    assert str(need) in str(e.value) and "20" in str(e.value)


def test_start_drops_turns_unconditionally():
    ms = convo(3)
    p = plan_chat(ms, count, Limits(max_context=1000, output_reserve=10), start=2)
    assert p.first_kept == 2 and p.shifted


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 40), min_size=1, max_size=12), st.integers(0, 30),
       st.integers(40, 300), st.integers(0, 30))
def test_plan_is_minimal_drop_that_fits(sizes, sys_len, max_context, reserve):
    ms = [msg("system", "s" * sys_len)] + [msg("user" if i % 2 == 0 else "assistant", "c" * n)
                                           for i, n in enumerate(sizes)]
    lim = Limits(max_context=max_context, output_reserve=min(reserve, max_context - 1))
    turns = split_chat(ms).turns
    fits = [count([ms[0], *(m for t in turns[i:] for m in t)]) <= lim.budget
            for i in range(len(turns))]
    try:
        p = plan_chat(ms, count, lim)
    except ContextOverflow:
        assert not fits[-1]
        return
    assert fits[p.first_kept] and not any(fits[:p.first_kept])
    assert p.prompt_tokens + lim.output_reserve <= lim.max_context


def test_lineage_matches_a_retained_run_under_identical_system():
    ms = convo(6)
    lim = Limits(max_context=100, output_reserve=20)
    p = plan_chat(ms, count, lim)
    rp = p.replay(epoch=1)
    # the client continues: assistant reply to the last turn, then a new user message
    nxt = ms + [msg("assistant", "reply"), msg("user", "more")]
    assert match_lineage(rp, nxt) == p.first_kept
    # changed system content: a new conversation
    other = [msg("system", "be long")] + nxt[1:]
    assert match_lineage(rp, other) is None
    # an edited retained message breaks the run
    edited = list(nxt)
    k = len(ms) - 2
    edited[k] = msg("assistant", "edited")
    assert match_lineage(rp, edited) is None
    # a run that is not at a turn boundary does not count
    assert match_lineage(ReplayPlan((SYS,), (ms[2],), 1), ms) is None


def test_raw_plan_keeps_prefix_and_newest_suffix():
    lim = Limits(max_context=50, output_reserve=10, keep=4)
    p = plan_raw(100, lim, pinned=1)
    assert p.prefix == 5 and p.kept == 40 and p.shifted
    toks = list(range(100))
    assert p.apply(toks) == toks[:5] + toks[65:]
    assert not plan_raw(40, lim, pinned=1).shifted
    with pytest.raises(ContextOverflow) as e:
        plan_raw(41, Limits(max_context=50, output_reserve=10, policy="error"))
    assert e.value.needed == 51 and e.value.limit == 50
    with pytest.raises(ContextOverflow):
        plan_raw(100, Limits(max_context=50, output_reserve=10, keep=45), pinned=1)


def test_raw_continuation():
    lim = Limits(max_context=50, output_reserve=10, keep=4)
    toks = list(range(100))
    p = plan_raw(100, lim, pinned=1)
    rr = RawReplay(tuple(toks[:p.prefix]), p.suffix_start, 1)
    assert plan_raw_continuation(toks[:100] + [7], lim, rr) is None      # 41 > 40: reshift
    shorter = Limits(max_context=60, output_reserve=10, keep=4)
    c = plan_raw_continuation(toks + [7, 8], shorter, rr)
    assert c is not None and c.apply(toks + [7, 8])[:40] == p.apply(toks)
    assert plan_raw_continuation([9] + toks[1:], shorter, rr) is None    # prefix differs


def test_limits_validate():
    with pytest.raises(RequestError):
        Limits(max_context=10, output_reserve=10)
    with pytest.raises(RequestError):
        Limits(max_context=10, output_reserve=1, policy="drop")
