"""One optimizer update: the compiled step and the CUDA-graph step compute what the eager step computes."""

from dataclasses import replace

import pytest
import torch
from tiny import tiny_config

from transformer.model.transformer import build_model
from transformer.text.batching import encode_corpus, make_batches
from transformer.text.corpus import load_split
from transformer.text.tokenizer import train_tokenizer
from transformer.training import update
from transformer.training.schedule import make_optimizer
from transformer.training.update import Updater, collate_update

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


def _updater(cfg, tok, device):
    """An Updater of a fresh tiny model, seeded: the same initial weights every time."""
    torch.manual_seed(0)
    model = build_model(cfg.model, tok.vocab_size, tok.pad_id).to(device).train()
    opt = make_optimizer(model, cfg.train, device)
    return Updater(cfg, device, model, model, opt, torch.amp.GradScaler(device.type, enabled=False))


def _updates(tmp_path, device, count, **train):
    """Parameters after ``count`` updates (cycling over the first 3 batches) of a dropout-free tiny model, and the
    losses."""
    cfg, tok, data, order = _tiny(tmp_path, **train)
    step = _updater(cfg, tok, device)
    losses = [step(collate_update([order[r % 3]], data, tok, cfg), r + 1).loss for r in range(count)]
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
    """Regional compilation: 3 + 3 layers and 3 batch shapes make 2 graphs; validation's eager block compiles none."""
    graphs = []

    def counting(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    monkeypatch.setattr(update, "COMPILE_BACKEND", counting)
    torch._dynamo.reset()
    cfg, tok, data, order = _tiny(tmp_path, compile=True)
    cfg = replace(cfg, model=replace(cfg.model, N=3))
    step = _updater(cfg, tok, torch.device("cpu"))
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
    assert set(step.model.state_dict()) == set(build_model(cfg.model, tok.vocab_size, tok.pad_id).state_dict())


@pytest.mark.slow
def test_inductor_compiled_layers_give_the_eager_losses_and_gradients(tmp_path):
    """The layers as inductor compiles them on the CPU (C++ kernels: the code path of the GPU's Triton kernels
    before code generation) give the eager losses and gradients."""
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
    assert len(graphed[2].graphs) == 3
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
    out = _updater(cfg, tok, cpu)(work, 1)
    assert out.grad_norm == pytest.approx(float(norm), rel=1e-5) and out.grad_norm > 1e-2
