"""One optimizer update: the compiled step and the CUDA-graph step compute what the eager step computes, and the
update's tail on the device (clipping, check, Adam's step, zeroing) what the plain update computes."""

import math
from dataclasses import replace
from itertools import count

import pytest
import torch
from tiny import tiny_config

from transformer.model.transformer import Transformer
from transformer.text.batching import encode_corpus, make_batches
from transformer.text.corpus import load_split
from transformer.text.tokenizer import train_tokenizer
from transformer.training import update
from transformer.training.loss import generator_loss
from transformer.training.schedule import learning_rate, make_optimizer
from transformer.training.update import Levers, Updater, collate_update

CUDA = torch.cuda.is_available()


def _tiny(tmp_path, **train):
    """A dropout-free tiny fp32 config, its tokenizer, the encoded sample corpus and its first epoch's batches."""
    cfg = tiny_config(tmp_path, model={"dropout": 0.0}, train={"batch_tokens": 200, **train})
    cfg = replace(cfg, precision="fp32")
    corpus = load_split(cfg.data, cfg.data.train_split)
    tok = train_tokenizer(cfg.tokenizer, corpus)
    data = encode_corpus(corpus, tok, cfg.data.max_len, tmp_path / "cache")
    order = make_batches(data, cfg.train.batch_tokens, cfg.seed, 0, pad_multiple=cfg.train.pad_multiple)
    return cfg, tok, data, order


def _updater(cfg, tok, device, fused=None, levers=Levers()):
    """An Updater of a fresh tiny model, seeded: the same initial weights every time."""
    torch.manual_seed(0)
    model = Transformer(cfg.model, tok.vocab_size, tok.pad_id).to(device).train()
    opt = make_optimizer(model, cfg.train, device, fused=fused)
    return Updater(cfg, device, model, model, opt, torch.amp.GradScaler(device.type, enabled=False), levers)


def _updates(tmp_path, device, count, **train):
    """Parameters after ``count`` updates (cycling over the first 3 batches) of a dropout-free tiny model, and the
    losses."""
    cfg, tok, data, order = _tiny(tmp_path, **train)
    step = _updater(cfg, tok, device)
    losses = [step(collate_update([order[r % 3]], data, tok, cfg), r + 1).result().loss for r in range(count)]
    return [p.detach().cpu() for p in step.model.parameters()], losses, step


def _assert_same(a, b, tol):
    """Same losses and weights, but for the key biases: their gradient is zero up to rounding (softmax ignores a
    constant added to a row of scores), and Adam turns that rounding into steps as large as the learning rate."""
    (params_a, losses_a, step), (params_b, losses_b, _) = a, b
    assert losses_b == pytest.approx(losses_a, rel=tol)
    for (name, _), x, y in zip(step.model.named_parameters(), params_a, params_b):
        if name.endswith("in_proj.bias"):
            d = x.numel() // 3
            x, y = torch.cat([x[:d], x[2 * d :]]), torch.cat([y[:d], y[2 * d :]])  # W_Q's and W_V's biases
        torch.testing.assert_close(y, x, rtol=tol, atol=tol)


def test_compiled_step_gives_the_eager_losses_and_weights(tmp_path, monkeypatch):
    """torch.compile's graph capture and autograd (aot_eager: the same tracing as inductor, eager kernels) change
    nothing that is learned."""
    monkeypatch.setattr(update, "COMPILE_BACKEND", "aot_eager")
    cpu = torch.device("cpu")
    _assert_same(_updates(tmp_path / "eager", cpu, 4), _updates(tmp_path / "compiled", cpu, 4, compile=True), 1e-5)


def test_one_encoder_layer_and_one_decoder_layer_are_compiled_for_all_n_and_every_shape(tmp_path, monkeypatch):
    """Regional compilation: 3 + 3 layers and 3 batch shapes make 2 graphs; validation's eager block compiles none.
    (The loss, compiled apart, is left eager here: test_loss checks it.)"""
    graphs = []

    def counting(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    monkeypatch.setattr(update, "COMPILE_BACKEND", counting)
    torch._dynamo.reset()
    cfg, tok, data, order = _tiny(tmp_path, compile=True)
    cfg = replace(cfg, model=replace(cfg.model, N=3))
    step = _updater(cfg, tok, torch.device("cpu"), levers=Levers(compiled_loss=False))
    shapes = set()
    for r, idx in enumerate(order):
        work = collate_update([idx], data, tok, cfg)
        shapes.add(work.batches[0][0].src.shape)
        step(work, r + 1)
        if len(shapes) == 3:
            break
    assert len(shapes) == 3 and len(graphs) == 2
    with step.eager(), torch.no_grad():
        step.model.eval()(work.batches[0][0].src, work.batches[0][0].tgt_in)
    assert len(graphs) == 2
    assert set(step.model.state_dict()) == set(Transformer(cfg.model, tok.vocab_size, tok.pad_id).state_dict())


@pytest.mark.slow
def test_inductor_compiled_layers_give_the_eager_losses_and_gradients(tmp_path):
    """The layers and the loss as inductor compiles them on the CPU (C++ kernels: the code path of the GPU's Triton
    kernels before code generation) give the eager losses and gradients."""
    cpu = torch.device("cpu")
    cfg, tok, data, order = _tiny(tmp_path)
    batches = [collate_update([order[r]], data, tok, cfg).batches[0][0] for r in range(2)]
    eager, compiled = _updater(cfg, tok, cpu), _updater(replace(cfg, train=replace(cfg.train, compile=True)), tok, cpu)
    for b in batches:  # gradients add up over the two batches, as over an update's micro-batches
        losses = []
        for step in (eager, compiled):
            loss, _ = step.micro_loss(b, b.n_tokens)
            loss.backward()
            losses.append(float(loss))
        assert losses[1] == pytest.approx(losses[0], rel=1e-5)
        for (name, p), q in zip(eager.model.named_parameters(), compiled.model.parameters()):
            torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-6, msg=name)


def test_static_shapes_add_only_empty_rows(tmp_path):
    """Rows of nothing but <PAD> change neither the loss nor the gradients."""
    cpu = torch.device("cpu")
    _assert_same(_updates(tmp_path / "a", cpu, 3), _updates(tmp_path / "b", cpu, 3, static_shapes=True), 1e-5)


@pytest.mark.skipif(not CUDA, reason="CUDA graphs need a CUDA GPU")
def test_cuda_graphs_replay_the_eager_update(tmp_path):
    """Each of 3 shapes runs eagerly, is captured, then replayed: 9 updates end where 9 eager ones do."""
    gpu = torch.device("cuda")
    eager = _updates(tmp_path / "eager", gpu, 9, static_shapes=True)
    graphed = _updates(tmp_path / "graphs", gpu, 9, static_shapes=True, cuda_graphs=True)
    assert len(graphed[2].graphs) == 3 and graphed[2].tail.graph is not None  # the tail replayed too
    _assert_same(eager, graphed, 1e-4)


def test_an_update_reports_the_gradient_norm_before_clipping(tmp_path):
    """The reported norm is the whole gradient's, as computed apart here, though clipping cut it to 1e-3."""
    cpu = torch.device("cpu")
    cfg, tok, data, order = _tiny(tmp_path, clip_norm=1e-3)
    work = collate_update([order[0]], data, tok, cfg)
    same = _updater(cfg, tok, cpu)  # the same initial weights, for the gradient by hand
    loss, _ = same.micro_loss(work.batches[0][0], work.total)
    loss.backward()
    norm = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in same.model.parameters()]))
    out = _updater(cfg, tok, cpu)(work, 1).result()
    assert out.grad_norm == pytest.approx(float(norm), rel=1e-5) and out.grad_norm > 1e-2


def _poison(monkeypatch, bad):
    """Make the loss of the updates numbered in ``bad`` NaN (one micro-batch per update: the n-th call is update n)."""
    real, calls = Updater.micro_loss, count(1)

    def poisoned(self, batch, total):
        loss, nll = real(self, batch, total)
        return (loss * math.nan, nll) if next(calls) in bad else (loss, nll)

    monkeypatch.setattr(Updater, "micro_loss", poisoned)


def _plain_updates(cfg, tok, data, order, n, bad):
    """The plain update, written out: loss, backward, clipping, then torch's per-tensor Adam at the schedule's rate,
    stepped by the host unless the loss or the gradient norm is not finite. Losses (None if skipped) and the model."""
    torch.manual_seed(0)
    model = Transformer(cfg.model, tok.vocab_size, tok.pad_id).train()
    opt = torch.optim.Adam(model.parameters(), betas=tuple(cfg.train.betas), eps=cfg.train.eps, foreach=False)
    losses = []
    for r in range(n):
        work = collate_update([order[r % 3]], data, tok, cfg)
        b = work.batches[0][0]
        hidden = model(b.src, b.tgt_in, logits=False)
        loss, _ = generator_loss(hidden, model.generator.weight, b.tgt_out, cfg.train.label_smoothing, tok.pad_id)
        loss = loss / work.total * (math.nan if r + 1 in bad else 1.0)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.train.clip_norm)
        finite = math.isfinite(float(norm)) and math.isfinite(float(loss.detach()))
        if finite:
            for group in opt.param_groups:
                group["lr"] = learning_rate(r + 1, cfg.train, cfg.model.d_model)
            opt.step()
        losses.append(float(loss.detach()) if finite else None)
        opt.zero_grad()
    return model, opt, losses


@pytest.mark.parametrize("fused", [True, False])
def test_the_update_on_the_device_is_the_plain_update(tmp_path, monkeypatch, fused):
    """6 updates, the 3rd non-finite: the same losses, weights and Adam state as the plain update, with fused Adam
    skipping on the device (found_inf) and with torch's per-tensor Adam, which the host skips."""
    cfg, tok, data, order = _tiny(tmp_path, clip_norm=0.5)
    plain, plain_opt, plain_losses = _plain_updates(cfg, tok, data, order, 6, {3})
    _poison(monkeypatch, {3})
    step = _updater(cfg, tok, torch.device("cpu"), fused=fused)
    outs = [step(collate_update([order[r % 3]], data, tok, cfg), r + 1).result() for r in range(6)]
    assert [o is None for o in outs] == [x is None for x in plain_losses] == [False, False, True, False, False, False]
    assert [o.loss for o in outs if o] == pytest.approx([x for x in plain_losses if x is not None], rel=1e-5)
    params = list(step.model.named_parameters())
    _assert_same(
        ([p.detach() for _, p in params], [], step), ([p.detach() for p in plain.parameters()], [], None), 1e-5
    )
    for (name, p), q in zip(params, plain.parameters()):
        ours, theirs = step.optimizer.state[p], plain_opt.state[q]
        assert float(ours["step"]) == float(theirs["step"]) == 5, name
        for key in ("exp_avg", "exp_avg_sq"):
            torch.testing.assert_close(ours[key], theirs[key], rtol=1e-4, atol=1e-8, msg=f"{name} {key}")


def test_loss_scaling_changes_nothing_but_the_scale(tmp_path, monkeypatch):
    """fp16's GradScaler (here on the CPU, scale 2^8): unscaled before the norm, the check and Adam, the same weights
    as without it; a non-finite update skipped on the device and the scale halved."""
    cfg, tok, data, order = _tiny(tmp_path)
    _poison(monkeypatch, {2, 6})  # calls 1-4 are the first run's updates, 5-8 the second's
    works = [collate_update([order[r % 3]], data, tok, cfg) for r in range(4)]
    steps = []
    for scaled in (False, True):
        step = _updater(cfg, tok, torch.device("cpu"))
        step.scaler = torch.amp.GradScaler("cpu", enabled=scaled, init_scale=2.0**8)
        assert [step(w, r + 1).result() is None for r, w in enumerate(works)] == [False, True, False, False]
        steps.append(step)
    assert steps[1].scaler.get_scale() == 2.0**7
    assert all(torch.equal(p, q) for p, q in zip(steps[0].model.parameters(), steps[1].model.parameters()))


def test_after_max_bad_steps_in_a_row_the_device_skips_every_later_update(tmp_path, monkeypatch):
    """max_bad_steps 2, updates 2 and 3 non-finite: update 4, finite, is skipped too (the host reads verdicts one
    update late and stops before booking it), so the weights stay as update 1 left them; a resumed count goes on."""
    cfg, tok, data, order = _tiny(tmp_path, max_bad_steps=2)
    _poison(monkeypatch, {2, 3})
    step = _updater(cfg, tok, torch.device("cpu"))
    works = [collate_update([order[r % 3]], data, tok, cfg) for r in range(4)]
    assert step(works[0], 1).result() is not None
    after_one = [p.detach().clone() for p in step.model.parameters()]
    assert [step(works[r], r + 1).result() for r in (1, 2, 3)] == [None, None, None]
    assert all(torch.equal(p, q) for p, q in zip(step.model.parameters(), after_one))

    again = _updater(cfg, tok, torch.device("cpu"))
    again.resume(2)  # a checkpoint saved after two non-finite updates in a row
    assert again(works[0], 1).result() is None


def test_queueing_an_update_reads_no_value_on_the_host(tmp_path, monkeypatch):
    """With fused Adam nothing in an update asks for a tensor's value (on a GPU each ask would wait for the device);
    its figures are read when asked for."""
    cfg, tok, data, order = _tiny(tmp_path)
    step = _updater(cfg, tok, torch.device("cpu"))
    work = collate_update([order[0]], data, tok, cfg)
    step(work, 1).result()  # Adam makes its state

    def refused(*args, **kwargs):
        raise AssertionError("a tensor's value was read on the host inside an update")

    with monkeypatch.context() as m:
        for name in ("item", "tolist", "__bool__", "__float__", "__int__"):
            m.setattr(torch.Tensor, name, refused)
        queued = step(work, 2)
    assert queued.result() is not None
