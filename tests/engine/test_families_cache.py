"""Cache contracts that are specific to the 2025-26 families.

gpt-oss's 128-token window under 512-token prefill chunks (the case staged wrapped prefill
exists for), Gemma 4's KV-shared layers (a layer that reads another layer's plane owns
none: cuts, packs, checkpoints and the cost curve count it once), batched decode on the
int8 path for MoE/sinks/shared layers, and packs refusing another architecture."""
from __future__ import annotations

import pytest
import torch

import muser
from muser.errors import PackModelMismatch
from muser.pack.format import pack_to_bytes
from muser.pack.reader import pack_from_bytes
from muser.testing import FAMILIES, prompt_ids as ids, tiny_model, tiny_model_dir

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def gpt_oss_128():
    path = tiny_model_dir("gpt_oss", layers=2, window=128, max_context=1024, tokenizer=False)
    hf = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32,
                                                           attn_implementation="eager").eval()
    return path, hf


def test_gpt_oss_128_ring_under_512_chunks_matches_transformers(gpt_oss_128):
    """700 tokens in 512-token chunks over a 128-row ring: the second chunk wraps the ring
    several times inside itself (staged shadow), sinks and YaRN on both layer kinds."""
    path, hf = gpt_oss_128
    engine = muser.load(str(path), dtype="float32", quant="none", progress=False, chunk_size=512)
    prompt = ids(700, 1)
    with torch.no_grad():
        want = hf(torch.tensor([prompt + [7, 8, 9]])).logits[0]
    s = engine.new_session()
    torch.testing.assert_close(s.prefill(prompt), want[699], rtol=1e-4, atol=1e-4)
    assert s.planes[0].capacity == 128 and s.planes[0].origin_logical == 700 - 128
    for i, t in enumerate([7, 8]):
        torch.testing.assert_close(s.decode(t), want[700 + i], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("split", [1, 127, 128, 129, 300])
def test_gpt_oss_128_ring_restores_bitwise_at_wrap_phases(gpt_oss_128, split):
    """Default CPU path (bf16 + int8): cut at `split`, restore, then a 512-chunk prefill
    and decodes replay bit for bit."""
    path, _ = gpt_oss_128
    engine = muser.load(str(path), progress=False, chunk_size=512)
    prompt = ids(split + 520, 2)
    live = engine.new_session()
    live.prefill(prompt[:split])
    restored = engine.restore(pack_from_bytes(pack_to_bytes(live.snapshot())))
    for s in (live, restored):
        s.out = [s.prefill(prompt[split:]), s.decode(5), s.decode(6)]
    assert all(torch.equal(a, b) for a, b in zip(live.out, restored.out))
    assert live.snapshot().equal(restored.snapshot())


@pytest.fixture(scope="module")
def gemma4():
    return tiny_model("gemma4", layers=6, window=4, tokenizer=False)


def test_kv_shared_layers_own_no_plane(gemma4):
    spec = gemma4.spec
    owners = [l.index for l in spec.layers if l.kv_source is None]
    s = gemma4.new_session()
    s.prefill(ids(11))
    assert [p.layer for p in s.planes] == owners == [0, 1, 2, 3]
    assert s.plane_of == [0, 1, 2, 3, 3, 2]
    assert [(p.kv_heads, p.head_dim) for p in s.planes] == [(2, 16), (2, 16), (1, 32), (2, 16)]
    snap = s.snapshot()
    assert [c.layer for c in snap.planes] == owners
    assert snap.nbytes() == sum(p.row_bytes() * min(11, p.capacity) for p in s.planes)
    packed = pack_from_bytes(pack_to_bytes(snap))          # a pack holds one cut per plane
    assert [c.layer for c in packed.planes] == owners
    restored = gemma4.restore(packed)
    cp = s.checkpoint(3)
    s.extend(ids(3, 4))
    assert len(cp.retained_rows()) == len(owners)             # one undo log per plane, not per layer
    s.rollback(cp, 1)
    s.check_invariants()
    restored.extend(ids(3, 4)[:1])
    assert s.snapshot().equal(restored.snapshot())
    assert torch.equal(s.decode(9), restored.decode(9))


def test_cache_plan_counts_shared_planes_once(gemma4):
    from muser.cache.plan import plan
    from muser.cli.plan import geometry
    g = geometry(gemma4.spec, "bfloat16", 256)
    p = plan(g, 200)
    assert (p.sliding_layers, p.full_layers, p.shared_layers) == (3, 1, 2)
    assert p.sliding_bytes == 3 * 4 * (2 * 2 * 16 * 2) and p.full_bytes == 200 * (2 * 1 * 32 * 2)
    assert p.shared_saved_bytes == 4 * (2 * 2 * 16 * 2) + 200 * (2 * 1 * 32 * 2)
    s = gemma4.new_session()
    s.prefill(ids(200, 3))
    assert s.snapshot().nbytes() == 2 * p.total_bytes              # f32 planes: twice the bf16 plan


@pytest.mark.parametrize("arch", FAMILIES)
def test_batched_decode_equals_decoding_alone(arch):
    """MoE routing, sinks and shared planes keep the int8 path's row invariance."""
    engine = tiny_model(arch, window=4, tokenizer=False, dtype="bfloat16", quant="int8")
    lengths = [1, 4, 9, 17]
    make = lambda: [engine.new_session() for _ in lengths]                      # noqa: E731
    batched, alone = make(), make()
    for s, t, n in zip(batched, alone, lengths):
        s.prefill(ids(n, n))
        t.prefill(ids(n, n))
    for step in range(4):
        toks = [(11 * step + i) % 300 + 3 for i in range(len(lengths))]
        out = engine.decode_batch(batched, toks)
        assert torch.equal(out, torch.stack([s.decode(t) for s, t in zip(alone, toks)]))
    assert all(a.snapshot().equal(b.snapshot()) for a, b in zip(batched, alone))


@pytest.mark.parametrize("src, dst", [("gpt_oss", "olmo3"), ("gemma4", "gemma4_moe"), ("exaone4", "ministral"),
                                      ("gemma3", "gemma4")])
def test_packs_refuse_another_architecture(src, dst):
    a = tiny_model(src, window=4, tokenizer=False)
    b = tiny_model(dst, window=4, tokenizer=False)
    s = a.new_session()
    s.prefill(ids(6))
    data = pack_to_bytes(s.snapshot())
    target = b.new_session()
    target.prefill(ids(2))
    before = target.snapshot()
    with pytest.raises(PackModelMismatch):
        b.restore(pack_from_bytes(data), into=target)
    assert target.snapshot().equal(before)


@pytest.mark.parametrize("arch", ["gpt_oss", "gemma4"])
def test_an_engine_over_a_state_dict_in_memory_equals_the_loaded_one(arch):
    """`loader.from_state_dict` (the real-shape GPU benchmarks' way in: no checkpoint written)
    builds the engine `muser.load` builds from the saved directory: logits torch.equal."""
    import json
    from safetensors.torch import load_file
    from muser.engine.loader import from_state_dict
    from muser.testing import tiny_model_dir
    path = tiny_model_dir(arch, layers=2, tokenizer=False)
    sd = {}
    for f in sorted(path.glob("*.safetensors")):
        sd.update(load_file(str(f)))
    mem = from_state_dict(json.loads((path / "config.json").read_text()), sd, device="cpu", dtype="float32")
    disk = muser.load(str(path), device="cpu", dtype="float32", quant="none", progress=False)
    ids = list(range(3, 40))
    assert torch.equal(mem.new_session().prefill(ids), disk.new_session().prefill(ids))
