"""The Transformer: size against the paper, an nn.Transformer oracle, masks, precisions, incremental decoding."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from transformer.config import ModelConfig
from transformer.model.transformer import MultiHeadAttention, Transformer, safe_mask, sinusoids

PAD, START, V = 0, 1, 23
SMALL = dict(N=2, d_model=32, d_ff=64, h=4, dropout=0.0)


def small(**overrides) -> Transformer:
    torch.manual_seed(0)
    return Transformer(ModelConfig(**{**SMALL, **overrides}), V, PAD)


def padded_batch(lengths: list[int], vocab: int = V, seed: int = 1) -> torch.Tensor:
    """Random tokens (never PAD or START), right-padded to the longest length."""
    g = torch.Generator().manual_seed(seed)
    out = torch.full((len(lengths), max(lengths)), PAD)
    for i, n in enumerate(lengths):
        out[i, :n] = torch.randint(START + 1, vocab, (n,), generator=g)
    return out


def n_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def test_parameter_counts_against_table_3():
    """Base and big with a shared 37,000-token vocabulary, tied embeddings and generator.

    Exact counts: base 63,082,496 (paper: 65M), big 214,245,376 (paper: 213M). Per layer this code has
    exactly the paper's matrices and biases (4 attention projections with biases per attention, two
    feed-forward layers with biases, LayerNorm gain and bias) and the generator has no bias. The paper
    gives rounded numbers for an approximate vocabulary ("about 37000 tokens"), and no single vocabulary
    size reproduces both: 65M needs about 41,800 tokens and 213M about 35,800. Base is 3% under, big
    0.6% over, which is within what the rounded vocabulary and counting conventions allow.
    """
    counts = {}
    with torch.device("meta"):
        for name, overrides, paper in (("base", {}, 65e6), ("big", dict(d_model=1024, d_ff=4096, h=16), 213e6)):
            counts[name] = n_params(Transformer(ModelConfig(**overrides), 37000, PAD))
            print(f"{name}: {counts[name]:,} parameters (paper: {paper / 1e6:.0f}M)")
            assert abs(counts[name] - paper) / paper < 0.04
    assert counts == {"base": 63_082_496, "big": 214_245_376}


def test_tied_and_untied_embeddings():
    tied = small()
    assert tied.generator.weight is tied.src_embed.weight is tied.tgt_embed.weight
    untied = small(tie_embeddings=False)
    assert untied.generator.weight is not untied.tgt_embed.weight is not untied.src_embed.weight
    assert untied(padded_batch([3, 5]), padded_batch([4, 2])).shape == (2, 4, V)


def oracle_from(model: Transformer, norm_first: bool) -> tuple[nn.Module, nn.Module]:
    """nn.TransformerEncoder/Decoder (ReLU, dropout 0) holding a copy of model's layer weights."""
    d, N, h, d_ff = SMALL["d_model"], SMALL["N"], SMALL["h"], SMALL["d_ff"]
    kw = dict(dropout=0.0, batch_first=True, norm_first=norm_first)
    encoder = nn.TransformerEncoder(
        nn.TransformerEncoderLayer(d, h, d_ff, **kw),
        N,
        norm=nn.LayerNorm(d) if norm_first else None,
        enable_nested_tensor=False,
    )
    decoder = nn.TransformerDecoder(
        nn.TransformerDecoderLayer(d, h, d_ff, **kw), N, norm=nn.LayerNorm(d) if norm_first else None
    )
    renames = [
        ("cross_attn", "multihead_attn"),
        ("in_proj.", "in_proj_"),
        ("ff.w_1", "linear1"),
        ("ff.w_2", "linear2"),
        ("norms.0", "norm1"),
        ("norms.1", "norm2"),
        ("norms.2", "norm3"),
    ]
    for ours, theirs in ((model.encoder, encoder), (model.decoder, decoder)):
        state = {}
        for name, tensor in ours.state_dict().items():
            for old, new in renames:
                name = name.replace(old, new)
            state[name] = tensor
        theirs.load_state_dict(state, strict=True)
    return encoder, decoder


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("train", [True, False])
def test_matches_torch_transformer(norm_first, train):
    """Encoder and decoder outputs equal nn.Transformer's with copied weights, on a random padded batch."""
    model = small(norm_first=norm_first).train(train)
    encoder, decoder = (m.train(train) for m in oracle_from(model, norm_first))
    src, tgt = padded_batch([5, 9, 1, 7]), padded_batch([6, 3, 8, 8], seed=2)
    with torch.set_grad_enabled(train):
        x = model.embed(src, model.src_embed)
        memory, src_keep = model.encode(src)
        pad = ~src_keep[:, 0, 0]
        torch.testing.assert_close(memory, encoder(x, src_key_padding_mask=pad), atol=1e-5, rtol=0)
        y = model.embed(tgt, model.tgt_embed)
        causal = nn.Transformer.generate_square_subsequent_mask(tgt.size(1))
        expected = decoder(y, memory, tgt_mask=causal, tgt_is_causal=True, memory_key_padding_mask=pad)
        torch.testing.assert_close(model.decoder(y, memory, src_keep), expected, atol=1e-5, rtol=0)


@pytest.mark.parametrize("key", ["attention_dropout", "relu_dropout"])
def test_attention_and_relu_dropout_act_in_training_only(key):
    """Tensor2Tensor's attention and ReLU dropout: in eval mode the same function as without them, bit for bit;
    in training they drop (outputs move away from the model without them, whose dropout here is 0)."""
    src, tgt = padded_batch([5, 9, 1, 7]), padded_batch([6, 3, 8, 8], seed=2)
    plain, model = small(), small(**{key: 0.5})
    model.load_state_dict(plain.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(model.eval()(src, tgt), plain.eval()(src, tgt), rtol=0, atol=0)
        assert not torch.allclose(model.train()(src, tgt), plain.train()(src, tgt), atol=1e-3)


def test_no_peeking_at_future_or_padded_tokens():
    """Exact in fp32: later target tokens, and whatever sits at padded positions, change no real output."""
    model = small().eval()
    src, tgt = padded_batch([6, 3]), padded_batch([7, 4], seed=2)
    with torch.no_grad():
        logits = model(src, tgt)
        for t in range(tgt.size(1) - 1):
            changed = tgt.clone()
            changed[:, t + 1 :] = (changed[:, t + 1 :] + 1) % (V - 2) + 2
            assert torch.equal(model(src, changed)[:, : t + 1], logits[:, : t + 1])
        memory, src_keep = model.encode(src)
        x = model.embed(src, model.src_embed)
        x[1, 3:], noisy_memory = torch.randn(3, 32), memory.clone()
        noisy_memory[1, 3:] = torch.randn(3, 32)
        assert torch.equal(model.encoder(x, src_keep)[1, :3], memory[1, :3])
        assert torch.equal(model.decode(tgt, noisy_memory, src_keep), logits)
        tgt_pad_changed = tgt.clone()
        tgt_pad_changed[1, 4:] = 5
        assert torch.equal(model(src, tgt_pad_changed)[1, :4], logits[1, :4])


def test_sentence_alone_equals_sentence_padded_in_a_batch():
    model = small().eval()
    src, tgt = padded_batch([4, 9, 2]), padded_batch([3, 8, 6], seed=2)
    with torch.no_grad():
        batch = model(src, tgt)
        alone = model(src[:1, :4], tgt[:1, :3])
    torch.testing.assert_close(alone, batch[:1, :3], atol=1e-5, rtol=0)


def test_fully_masked_attention_row_gives_zeros():
    torch.manual_seed(0)
    mha = MultiHeadAttention(ModelConfig(d_model=16, h=4))
    x = torch.randn(2, 5, 16)
    keep = torch.tensor([[True] * 3 + [False] * 2, [False] * 5])[:, None, None, :]
    mask, rows = safe_mask(keep)
    out = mha.attend(*mha.qkv(x), mask=mask, rows=rows)
    assert torch.equal(out[1], mha.out_proj.bias.expand(5, 16))
    with pytest.raises(TypeError):
        safe_mask(keep.float())


def _precisions() -> list[tuple[str, torch.dtype]]:
    cases = [("cpu", torch.float32), ("cpu", torch.bfloat16)]
    return cases + [("cuda", torch.float16), ("cuda", torch.bfloat16)] if torch.cuda.is_available() else cases


@pytest.mark.parametrize("device,dtype", _precisions())
def test_all_pad_row_is_finite(device, dtype):
    """A batch whose second sentence is nothing but <PAD> (source and target), and an empty source."""
    model = small(dropout=0.1).to(device).train()
    src, tgt = padded_batch([5, 1, 3]).to(device), padded_batch([4, 1, 6], seed=2).to(device)
    src[1], tgt[1] = PAD, PAD
    for s in (src, src[:, :0]):
        model.zero_grad()
        with torch.autocast(device, dtype=dtype, enabled=dtype != torch.float32):
            logits = model(s, tgt[:, :-1])
            loss = F.cross_entropy(logits.float().transpose(1, 2), tgt[:, 1:], ignore_index=PAD)
        loss.backward()
        assert logits.isfinite().all() and loss.isfinite()
        assert all(p.grad.isfinite().all() for p in model.parameters() if p.grad is not None)


def incremental_logits(model: Transformer, src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
    state = model.start_state(*model.encode(src))
    return torch.stack([model.decode_step(tgt[:, t], state) for t in range(tgt.size(1))], 1)


@pytest.mark.parametrize("norm_first", [False, True])
def test_incremental_equals_parallel(norm_first):
    """Past the 32-position initial cache and the 8-position table, so growth and on-the-fly positions run too."""
    model = small(norm_first=norm_first, max_positions=8).eval()
    src, tgt = padded_batch([6, 2, 9]), padded_batch([40, 40, 40], seed=2)
    src[2] = PAD
    with torch.no_grad():
        torch.testing.assert_close(incremental_logits(model, src, tgt), model(src, tgt), atol=1e-5, rtol=0)


@pytest.mark.parametrize("beam,index", [(1, [2, 0, 0]), (2, [1, 0, 5, 4])])
def test_state_select_reorders_and_drops_rows(beam, index):
    """Beam 2: one row per sentence widens to two after the first step, then sentence 1 leaves and
    the beams of sentences 0 and 2 swap; cross K/V stay one per sentence throughout."""
    model = small().eval()
    src, tgt = padded_batch([6, 2, 9]), padded_batch([5] * 3 * beam, seed=2)
    tgt[:, 0] = tgt[::beam, 0].repeat_interleave(beam)  # a sentence's beams share their first token
    index = torch.tensor(index)
    with torch.no_grad():
        state = model.start_state(*model.encode(src))
        model.decode_step(tgt[::beam, 0], state)
        state.select(torch.arange(3).repeat_interleave(beam))
        assert state.cross.size(0) == 3
        for t in range(1, 3):
            model.decode_step(tgt[:, t], state)
        state.select(index, index[::beam] // beam)
        assert state.cross.size(0) == len(index) // beam
        steps = torch.stack([model.decode_step(tgt[index, t], state) for t in range(3, 5)], 1)
        expected = model(src.repeat_interleave(beam, 0)[index], tgt[index])[:, 3:]
    torch.testing.assert_close(steps, expected, atol=1e-5, rtol=0)


def test_teacher_forced_log_prob_is_sum_of_step_log_probs():
    model = small().eval()
    src, seq = padded_batch([6, 4]), padded_batch([9, 9], seed=2)
    tgt_in, tgt_out = seq[:, :-1], seq[:, 1:]
    with torch.no_grad():
        forced = model(src, tgt_in).log_softmax(-1).gather(2, tgt_out[..., None]).sum((1, 2))
        state = model.start_state(*model.encode(src))
        stepwise = sum(
            model.decode_step(tgt_in[:, t], state).log_softmax(-1).gather(1, tgt_out[:, t, None])[:, 0]
            for t in range(tgt_in.size(1))
        )
    torch.testing.assert_close(stepwise, forced, atol=1e-5, rtol=0)


def test_positions_any_length():
    """sin on even, cos on odd dimensions; a small table gives the same model outputs as a large one."""
    pe = sinusoids(0, 50, 8)
    pos, i = 37, 1
    assert pe[pos, 2 * i].item() == pytest.approx(torch.tensor(pos / 10000 ** (2 * i / 8)).sin().item(), abs=1e-6)
    assert pe[pos, 2 * i + 1].item() == pytest.approx(torch.tensor(pos / 10000 ** (2 * i / 8)).cos().item(), abs=1e-6)
    torch.testing.assert_close(sinusoids(30, 20, 8), pe[30:])
    short, long = small(max_positions=8).eval(), small(max_positions=64).eval()
    src, tgt = padded_batch([20, 3]), padded_batch([30, 12], seed=2)
    with torch.no_grad():
        torch.testing.assert_close(short(src, tgt), long(src, tgt), atol=0, rtol=0)


def test_attention_weights_reproduce_sdpa():
    """The explicit probabilities, multiplied into V, give the same layer outputs as the SDPA path."""
    model = small().eval()
    src, tgt = padded_batch([6, 3, 1]), padded_batch([5, 4, 2], seed=2)
    src[2] = PAD
    weights = model.attention_weights(src, tgt)
    assert [len(weights[k]) for k in ("encoder", "decoder", "cross")] == [2, 2, 2]
    assert weights["cross"][1].shape == (3, 4, 5, 6)
    with torch.no_grad():
        memory, src_keep = model.encode(src)
        mask, rows = safe_mask(src_keep)
        x, y = model.embed(src, model.src_embed), model.embed(tgt, model.tgt_embed)
        enc, dec = model.encoder.layers[0].self_attn, model.decoder.layers[0]
        z = dec.sublayer(y, dec.norms[0], lambda a: dec.self_attn.attend(*dec.self_attn.qkv(a), is_causal=True))
        for probs, attn, queries, keys, kw in (
            (weights["encoder"][0], enc, x, x, dict(mask=mask, rows=rows)),
            (weights["decoder"][0], dec.self_attn, y, y, dict(is_causal=True)),
            (weights["cross"][0], dec.cross_attn, z, memory, dict(mask=mask, rows=rows)),
        ):
            q, (k, v) = attn.q(queries), attn.kv(keys)
            merged = (probs @ v).transpose(1, 2).flatten(2)
            torch.testing.assert_close(attn.out_proj(merged), attn.attend(q, k, v, **kw), atol=1e-5, rtol=0)
    assert torch.equal(weights["decoder"][0].triu(1), torch.zeros_like(weights["decoder"][0]))
    assert torch.equal(weights["cross"][0][1, :, :, 3:], torch.zeros(4, 5, 3))
    assert torch.equal(weights["encoder"][0][2], torch.zeros(4, 6, 6))
    torch.testing.assert_close(weights["encoder"][1][:2].sum(-1), torch.ones(2, 4, 6))
    assert not any(m.record_weights for m in model.modules() if isinstance(m, MultiHeadAttention))
