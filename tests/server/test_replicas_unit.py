"""The replica pieces without Ray: routing keys, the routing policy, merged metrics,
the shared tier (a cut moves between replicas bitwise; a bad file is a miss) and the CLI's
flag checks.  Replicas here are `ReplicaCore`s in this process over one tiny engine.
"""
from __future__ import annotations

import asyncio
import json
import random

import pytest

from muser.server.replicas.keys import block_keys, extend_keys, matched_blocks, session_key
from muser.server.replicas.promtext import merge
from muser.server.replicas.routing import ReplicaView, rank


# ---------------------------------------------------------------------- keys
def test_block_keys_name_whole_prefixes():
    a = list(range(100, 140))
    b = a[:16] + [7] + a[17:]
    ka, kb = block_keys(a, 8), block_keys(b, 8)
    assert len(ka) == 5 and ka[:2] == kb[:2] and all(x != y for x, y in zip(ka[2:], kb[2:]))
    assert block_keys(a[:7], 8) == [] and block_keys(a[:39], 8) == ka[:4]
    assert extend_keys(ka[:2], a, 8) == ka and extend_keys([], a, 8) == ka
    assert extend_keys(ka, a[:20], 8) == ka[:2]
    held = set(block_keys(a[:24], 8)) | set(block_keys(b, 8))
    assert matched_blocks(ka, held) == 3 and matched_blocks(kb, held) == 5
    assert matched_blocks(ka, set()) == 0


def test_session_keys_are_short_stable_hashes():
    assert session_key("user-1") == session_key(" user-1 ") != session_key("user-2")
    assert len(session_key("user-1")) == 16 and "user" not in session_key("user-1")
    assert session_key(None) is None and session_key("  ") is None


# ---------------------------------------------------------------------- routing policy
def V(i, queue=0, sessions=(), keys=(), mine=False, depth=0):
    return ReplicaView(i, queue, frozenset(sessions), frozenset(keys), mine, depth)


REQ = block_keys(list(range(50, 90)), 8)          # 5 blocks
CASES = [
    # (views, session, keys, first group must be within, rule)
    ([V("a", mine=True), V("b", keys=REQ)], "s", REQ, {"a"}, "session"),
    ([V("a"), V("b", sessions={"s"})], "s", REQ, {"b"}, "session"),
    ([V("a", queue=9, mine=True), V("b", keys=REQ[:2])], "s", REQ, {"b"}, "prefix"),
    ([V("a", keys=REQ[:2]), V("b", keys=REQ[:3]), V("c")], None, REQ, {"b"}, "prefix"),
    ([V("a", depth=4), V("b", keys=REQ[:3])], None, REQ, {"a"}, "prefix"),
    ([V("a", queue=9, keys=REQ), V("b")], None, REQ, {"a", "b"}, "balance"),  # Ray takes b
    ([V("a", keys=REQ), V("b", keys=REQ), V("c", keys=REQ), V("d")], None, REQ, {"a", "b", "c"},
     "prefix"),
    ([V("a"), V("b"), V("c")], "new", REQ, {"a", "b", "c"}, "balance"),
]


@pytest.mark.parametrize("views,session,keys,expect,why", CASES)
def test_rank_prefers_session_then_longest_prefix_within_the_imbalance_bound(
        views, session, keys, expect, why):
    groups, rule = rank(views, session, keys, imbalance=4, rng=random.Random(0))
    assert rule == why
    assert set(groups[0]) <= expect and 1 <= len(groups[0]) <= 2   # power of two choices
    assert {i for g in groups for i in g} == {v.id for v in views}  # nobody is unreachable
    assert set(groups[-1]) == {v.id for v in views} or len(views) <= 2


def test_two_choices_spread_new_requests():
    views = [V(c) for c in "abcd"]
    rng = random.Random(1)
    firsts = [tuple(sorted(rank(views, None, [], 4, rng)[0][0])) for _ in range(200)]
    assert len(set(firsts)) == 6                       # every pair of the 4 gets drawn
    assert rank([], "s", REQ, 4, rng) == ([], "none")


# ---------------------------------------------------------------------- metrics
def test_merged_metrics_are_per_replica_and_summed():
    t = ("# HELP muser_x_total things\n# TYPE muser_x_total counter\n"
         'muser_x_total{status="200"} {v}\n# HELP muser_s time\n# TYPE muser_s summary\n'
         "muser_s_sum {v}\nmuser_s_count 2\n")
    out = merge({"r1": t.replace("{v}", "3"), "r2": t.replace("{v}", "4")}, "muser_ingress_y 1\n")
    lines = out.splitlines()
    assert lines.count("# HELP muser_x_total things") == 1
    assert 'muser_x_total{status="200"} 7' in lines
    assert 'muser_x_total{status="200",replica="r1"} 3' in lines
    assert "muser_s_sum 7" in lines and "muser_s_count 4" in lines
    assert 'muser_s_count{replica="r2"} 2' in lines and lines[-1] == "muser_ingress_y 1"


# ---------------------------------------------------------------------- replicas in-process
@pytest.fixture(scope="module")
def engine():
    from muser.server.replicas.settings import EngineOptions
    from muser.testing import tiny_model_dir
    return EngineOptions(str(tiny_model_dir())).load()        # CPU default: bf16 + int8


def spec(tier_dir, save="turns", **server):
    from muser.server.config import ServerConfig
    from muser.server.replicas.settings import ReplicaSpec, RoutingConfig, TierConfig
    server = {"slots": 2, "output_reserve": 32, **server}
    return ReplicaSpec(server=ServerConfig(model_id="tiny", **server),
                       routing=RoutingConfig(block_tokens=8),
                       tier=TierConfig(dir=str(tier_dir), save=save))


async def complete(core, prompt, max_tokens, session=None):
    from muser.server.replicas.wire import Forwarded
    body = json.dumps({"model": "tiny", "prompt": prompt, "max_tokens": max_tokens,
                       "temperature": 0}).encode()
    fwd = Forwarded("POST", "/v1/completions", headers=((b"content-type", b"application/json"),),
                    body=body, session=session_key(session), prompt=tuple(prompt),
                    keys=tuple(block_keys(prompt, 8)))
    items = [i async for i in core.handle(fwd)]
    assert items[0] == ("accepted", core.name) and items[1][0] == "start"
    return items[1][1], json.loads(b"".join(i[1] for i in items if i[0] == "body"))


async def chat(core, messages, max_tokens, session=None):
    from muser.server.replicas.wire import Forwarded
    ids = core.engine.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    body = json.dumps({"model": "tiny", "messages": messages, "max_tokens": max_tokens,
                       "temperature": 0}).encode()
    fwd = Forwarded("POST", "/v1/chat/completions",
                    headers=((b"content-type", b"application/json"),), body=body,
                    session=session_key(session), prompt=tuple(ids), keys=tuple(block_keys(ids, 8)))
    items = [i async for i in core.handle(fwd)]
    return json.loads(b"".join(i[1] for i in items if i[0] == "body"))


def run(coro_fn, *cores):
    async def main():
        for c in cores:
            await c.start()
        try:
            return await coro_fn()
        finally:
            for c in cores:
                await c.stop()
    return asyncio.run(main())


P1 = [2] + [10 + (5 * j) % 300 for j in range(30)]
P2 = P1 + [41, 42, 43, 44, 45]


@pytest.mark.parametrize("session", ["conv-1", None])
def test_a_turn_end_cut_continues_bitwise_on_another_replica(engine, tmp_path, session):
    from muser.server.replicas.core import ReplicaCore
    a, b, solo = (ReplicaCore(engine, spec(tmp_path), n) for n in "AB") , None, None
    a, b = list(a)
    solo = ReplicaCore(engine, spec(tmp_path / "solo"), "solo")

    async def go():
        st, r1 = await complete(a, P1, 1, session)
        assert st == 200 and r1["muser"]["replica"] == "A"
        sub = "sessions" if session else "prefix"
        assert list(a.tier.root.joinpath(sub).glob("*.pack"))
        keys = a.routing_stats()["keys"]
        assert set(block_keys(P1, 8)) <= set(keys)
        if session:
            assert a.routing_stats()["sessions"] == [session_key(session)]
        st, r2 = await complete(b, P2, 8, session)           # A is gone; B reads the tier
        assert st == 200 and r2["usage"]["prompt_tokens_details"]["cached_tokens"] == len(P1)
        slot = b.state.pool.slots[r2["muser"]["slot"]].session
        cold = engine.new_session()
        cold.prefill(list(slot.tokens))
        assert slot.snapshot().equal(cold.snapshot())        # the moved cache, bit for bit
        await complete(solo, P1, 1)
        st, ref = await complete(solo, P2, 8)                  # one uninterrupted server
        assert ref["usage"]["prompt_tokens_details"]["cached_tokens"] == len(P1)
        assert r2["choices"][0]["text"] == ref["choices"][0]["text"]
    run(go, a, b, solo)


def test_a_shifted_conversation_keeps_its_lineage_on_another_replica(engine, tmp_path):
    from test_server_shift import conversation

    from muser.server.replicas.core import ReplicaCore
    cfg = dict(slots=1, max_context=160, output_reserve=24)
    a, b = (ReplicaCore(engine, spec(tmp_path, **cfg), n) for n in "AB")
    msgs = conversation(8)

    async def go():
        r = await chat(a, msgs, 1, "long")
        assert r["muser"]["shifted"] and r["muser"]["context_epoch"] == 1
        nxt = msgs + [{"role": "assistant", "content": "ok"}, {"role": "user", "content": "more"}]
        r2 = await chat(b, nxt, 1, "long")                     # B never saw this session
        assert r2["muser"]["shifted"] is False and r2["muser"]["context_epoch"] == 1
        assert r2["usage"]["prompt_tokens_details"]["cached_tokens"] == r["usage"]["prompt_tokens"]
    run(go, a, b)


def test_drain_saves_live_slots_for_the_next_replica(engine, tmp_path):
    from muser.server.replicas.core import ReplicaCore
    a = ReplicaCore(engine, spec(tmp_path, save="drain"), "A")
    b = ReplicaCore(engine, spec(tmp_path, save="drain"), "B")

    async def go():
        await a.start()
        await complete(a, P1, 1, "drained")
        assert not list(a.tier.root.glob("*/*.pack"))        # "drain": nothing per turn
        await a.stop()                                        # scale-down: save, then stop
        assert len(list(a.tier.root.glob("sessions/*.pack"))) == 1
        st, r2 = await complete(b, P2, 4, "drained")
        assert r2["usage"]["prompt_tokens_details"]["cached_tokens"] == len(P1)
    run(go, b)


def test_a_corrupt_tier_file_is_refused_removed_and_recomputed(engine, tmp_path):
    from muser.server.replicas.core import ReplicaCore
    a, b = ReplicaCore(engine, spec(tmp_path), "A"), ReplicaCore(engine, spec(tmp_path), "B")

    async def go():
        await complete(a, P1, 1, "bad")
        pack = next(a.tier.root.glob("sessions/*.pack"))
        raw = bytearray(pack.read_bytes())
        raw[-64] ^= 0xFF                                      # a flipped byte in the tensors
        pack.write_bytes(bytes(raw))
        st, r2 = await complete(b, P2, 4, "bad")
        assert st == 200 and r2["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        assert "muser_tier_refused_total 1" in b.state.metrics.render()
        from muser.pack import load_pack                        # B's turn replaced the bad file
        assert load_pack(pack).position > len(P1)
    run(go, a, b)


# ---------------------------------------------------------------------- CLI
@pytest.mark.parametrize("argv,needle", [
    (["--replicas", "0"], "--replicas must be >= 1"),
    (["--replicas", "2", "--max-replicas", "1"], "--max-replicas (1) must be >= --replicas (2)"),
    (["--ray-address", "auto"], "--ray-address only apply with --replicas N"),
])
def test_replica_flags_fail_before_anything_starts(argv, needle, capsys):
    pytest.importorskip("ray.serve")
    from muser.cli import main
    assert main(["serve", "--model", "nowhere", *argv]) == 2
    assert needle in capsys.readouterr().err


def test_serve_app_hands_replicas_autoscaling_and_resources_to_ray():
    pytest.importorskip("ray.serve")
    import muser
    app = muser.serve_app("gemma3-270m", num_replicas=None, num_gpus=1, num_cpus=2,
                          autoscaling_config={"min_replicas": 1, "max_replicas": 3})
    # Ray's Application has no public accessor for its bound deployments.
    engine = app._bound_deployment.init_args[0]._bound_deployment
    cfg = engine._deployment_config
    assert engine.name == "MuserEngine" and engine.ray_actor_options == {"num_cpus": 2, "num_gpus": 1}
    assert cfg.autoscaling_config.max_replicas == 3
    assert cfg.request_router_config.request_router_class == "muser.server.replicas.router.MuserRouter"
    fixed = muser.serve_app("gemma3-270m", num_replicas=3)._bound_deployment.init_args[0]
    assert fixed._bound_deployment.num_replicas == 3
    with pytest.raises(ValueError, match="num_replicas must be None or 'auto'"):
        muser.serve_app("gemma3-270m", num_replicas=2, autoscaling_config={"max_replicas": 3})
