"""The decode step's experts (muser.backends.cuda.triton_moe) against the eager specification
(muser.model.moe), both styles: routing equal, outputs close, rows batch-invariant bitwise
(a token's experts give the same bits alone or beside others routed elsewhere), stacking
leaves the layer's expert lists as views (nothing held twice)."""
import pytest
import torch

from muser.config import MoeSpec
from muser.model import moe
from muser.model.weights import MoeWeights

from cudautil import HAS_CUDA, needs_kernels, rel

pytestmark = needs_kernels

DEV = "cuda" if HAS_CUDA else "cpu"
DT = torch.bfloat16 if HAS_CUDA else torch.float16       # the interpreter has no bfloat16


def layer(style, E=8, k=3, hidden=96, inter=80, seed=0, scale=False):
    g = torch.Generator().manual_seed(seed)

    def r(*shape, s=0.1):
        return (torch.randn(*shape, generator=g) * s).to(DEV, DT)
    ms = MoeSpec(style, E, k, inter)
    gpt = style == "gpt_oss"
    mw = MoeWeights(router=r(E, hidden), w_gate=[r(inter, hidden) for _ in range(E)],
                    w_up=[r(inter, hidden) for _ in range(E)], w_down=[r(hidden, inter) for _ in range(E)],
                    router_bias=r(E) if gpt else None, b_gate=r(E, inter) if gpt else None,
                    b_up=r(E, inter) if gpt else None, b_down=r(E, hidden) if gpt else None,
                    expert_scale=(1 + r(E)) if scale else None)
    return mw, ms


def x_rows(n, hidden=96, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, hidden, generator=g).to(DEV, DT)


def _plain(x, w, b=None):
    return torch.nn.functional.linear(x, w, b)


@pytest.mark.interp
@pytest.mark.parametrize("style,scale", [("gpt_oss", False), ("gemma4", False), ("gemma4", True)])
def test_experts_match_the_eager_moe(style, scale):
    from muser.backends.cuda.triton_moe import experts_rows, route_rows
    mw, ms = layer(style, scale=scale)
    x = x_rows(5)
    w_ref, i_ref = moe.route(mw, ms, x)
    w, i = route_rows(x, mw, ms, _plain)
    assert torch.equal(i, i_ref) and torch.allclose(w, w_ref, rtol=1e-5, atol=1e-7)
    ref = moe.experts(mw, ms, x, w_ref, i_ref)
    out = experts_rows(x, mw, ms, w, i)
    assert out.dtype == x.dtype and rel(out.float(), ref.float()) < 2e-2


@pytest.mark.interp
@pytest.mark.parametrize("style", ["gpt_oss", "gemma4"])
def test_a_row_is_bitwise_the_same_alone_or_in_a_batch(style):
    from muser.backends.cuda.triton_moe import experts_rows, route_rows
    mw, ms = layer(style, E=4, k=2)                      # 4 experts, 17 rows: tiles of 16 overflow
    x = x_rows(17, seed=2)
    w, i = route_rows(x, mw, ms, _plain)
    batch = experts_rows(x, mw, ms, w, i)
    for b in (0, 5, 16):
        assert torch.equal(batch[b:b + 1], experts_rows(x[b:b + 1], mw, ms, w[b:b + 1], i[b:b + 1]))


@pytest.mark.interp
@pytest.mark.parametrize("style", ["gpt_oss", "gemma4"])
def test_a_long_chunk_gives_its_rows_the_decode_bits(style):
    """Past GROUP_MAX pairs (a prefill chunk) the grouping runs through torch, the expert kernels
    are the same: row t of the chunk == row t computed alone (as a decode step computes it)."""
    from muser.backends.cuda.triton_moe import GROUP_MAX, experts_rows, route_rows
    mw, ms = layer(style, E=4, k=2)
    n = GROUP_MAX // 2 + 5
    x = x_rows(n, seed=3)
    w, i = route_rows(x, mw, ms, _plain)
    chunk = experts_rows(x, mw, ms, w, i)
    for t in (0, 77, n - 1):
        assert torch.equal(chunk[t:t + 1], experts_rows(x[t:t + 1], mw, ms, w[t:t + 1], i[t:t + 1]))


def test_stacking_leaves_views_of_one_tensor():
    from muser.backends.cuda.triton_moe import stack_experts, supported
    mw, _ = layer("gpt_oss")
    before = [t.clone() for t in mw.w_gate]
    assert supported(mw)
    st = stack_experts(mw)
    assert stack_experts(mw) is st
    for e, t in enumerate(before):
        assert torch.equal(mw.w_gate[e], t)
        assert mw.w_gate[e].data_ptr() == st["gu"][e].data_ptr()
        assert mw.w_down[e].data_ptr() == st["down"][e].data_ptr()


def _gemma4_flat(dtype, device):
    """Gemma 4 with experts, global layers twice as wide with V = K and 1 kv head, v-norm,
    proportional RoPE, layer scales -- no per-layer inputs, no KV sharing (the 26B-A4B's wiring)."""
    import json
    import tempfile

    import transformers as tr
    import muser
    types = ["sliding_attention", "sliding_attention", "full_attention"] * 2
    cfg = tr.Gemma4TextConfig(vocab_size=384, hidden_size=64, intermediate_size=96, num_hidden_layers=6,
                              num_attention_heads=4, num_key_value_heads=2, head_dim=16, sliding_window=4,
                              max_position_embeddings=256, layer_types=types, global_head_dim=32,
                              attention_k_eq_v=True, num_global_key_value_heads=1, hidden_size_per_layer_input=0,
                              num_kv_shared_layers=0, final_logit_softcapping=30.0, enable_moe_block=True,
                              num_experts=4, top_k_experts=2, moe_intermediate_size=24)
    torch.manual_seed(0)
    model = tr.Gemma4ForCausalLM(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1 or "scale" in name:
                p.add_(0.1 * torch.randn_like(p))
    path = tempfile.mkdtemp(prefix="muser-gemma4-flat-")
    model.save_pretrained(path)
    assert json.load(open(f"{path}/config.json"))["hidden_size_per_layer_input"] == 0
    return muser.load(path, device=device, dtype=dtype, quant="none", progress=False)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("arch", ["gpt_oss", "gemma4_flat", "olmo3", "exaone4"])
def test_the_families_take_the_fused_decode_step(arch, dtype):
    """gpt-oss (sinks, YaRN, experts), Gemma 4 (per-layer geometry, V = K, v-norm, experts beside
    the MLP, layer scales), OLMo 3 (post-norms, qk-norm over all heads, YaRN) and EXAONE 4
    (post-norms, NoPE full layers) in the captured step's kernels: through ring wraps the step
    agrees with the float32 CPU oracle (float32 under the interpreter: to rounding; bf16 on a GPU:
    within the families' bound), and a session's logits are bitwise the same decoded alone or
    beside a neighbour at another position."""
    from muser.backends.cuda.graph import GraphRunner
    from muser.testing import tiny_model
    if dtype == "bfloat16" and not HAS_CUDA:
        pytest.skip("the interpreter has no bfloat16 (float32 runs the same kernels)")
    if arch == "gemma4_flat":
        eng, oracle = _gemma4_flat(dtype, DEV), _gemma4_flat("float32", "cpu")
    else:
        eng = tiny_model(arch, device=DEV, dtype=dtype, tokenizer=False)
        oracle = tiny_model(arch, tokenizer=False)
    runner = GraphRunner(eng, capture=HAS_CUDA)
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(3, 300, (21,), generator=g).tolist()
    steps = torch.randint(3, 300, (12,), generator=g).tolist()          # the rings wrap
    a, b, c, o = eng.new_session(), eng.new_session(), eng.new_session(), oracle.new_session()
    for s in (a, b, c, o):
        s.prefill(prompt, chunk_size=8)
    c.prefill([7, 8, 9])                                 # a neighbour at another position
    truth = [o.decode(t) for t in steps]
    worst = 0.0
    for t, want in zip(steps, truth):
        both = runner.decode([a, c], [t, t])
        alone = runner.decode([b], [t])
        assert torch.equal(both[0], alone[0])
        worst = max(worst, rel(alone[0].cpu(), want))
    for s in (a, b, c):
        s.check_invariants()
    if dtype == "float32":                               # interpreter: exact maths; GPU: TF32 dots
        assert worst < (1e-2 if HAS_CUDA else 1e-4), worst
        return
    # bf16: no worse than twice what bf16 does to the same model on the CPU (bf16 flips the
    # tiny random models' expert routing: test_cuda_families)
    cpu = (_gemma4_flat("bfloat16", "cpu") if arch == "gemma4_flat"
           else tiny_model(arch, dtype="bfloat16", tokenizer=False))
    s = cpu.new_session()
    s.prefill(prompt, chunk_size=8)
    bound = max(2 * max(rel(s.decode(t), want) for t, want in zip(steps, truth)), 0.05)
    print(f"{arch}: fused step vs the f32 oracle {worst:.2e} (bound {bound:.2e})")
    assert worst < bound, (worst, bound)


@pytest.mark.interp
@pytest.mark.parametrize("B,k,E", [(1, 4, 32), (16, 8, 128), (70, 2, 4), (9, 3, 8)])
def test_pairs_are_grouped_by_expert_stably(B, k, E):
    """group_kernel == a stable argsort of the experts, with their counts and first slots."""
    from muser.backends.cuda.triton_moe import _kernels, _pow2
    g = torch.Generator().manual_seed(B)
    idx = torch.randint(0, E, (B, k), generator=g).to(DEV)
    P = B * k
    order, counts, first = (torch.full((n,), -7, dtype=torch.int32, device=DEV) for n in (P, E, E))
    _kernels()[3][(1,)](idx, order, counts, first, P, E=E, BLOCK_E=_pow2(E), BLOCK_P=64)
    flat = idx.reshape(-1)
    want = torch.bincount(flat, minlength=E)
    assert torch.equal(order.long(), torch.argsort(flat, stable=True))
    assert torch.equal(counts.long(), want) and torch.equal(first.long(), torch.cumsum(want, 0) - want)
