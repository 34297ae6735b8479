import math

import pytest
import torch

from fedlm import model as M


def test_preset_sizes():
    assert M.num_parameters(M.build("tiny", 64, 0)) < 500_000
    assert 1_000_000 < M.num_parameters(M.build("small", 128, 0)) < 10_000_000
    # the paper's shapes: 6 x 256 x 4 heads; 3 and 12 layers of width 896, 16 heads of 64
    assert M.PRESETS["20m"] == (6, 256, 4, 64)
    assert M.PRESETS["60m"] == (3, 896, 16, 64) and M.PRESETS["150m"] == (12, 896, 16, 64)


def test_forward_shapes_tied_embeddings_and_initial_loss():
    net = M.build("tiny", 32, 0)
    x = torch.randint(0, 256, (2, 33))
    logits, loss = net(x[:, :-1], x[:, 1:])
    assert logits.shape == (2, 32, 256)
    assert net.head.weight is net.tok_emb.weight
    assert abs(loss.item() - math.log(256)) < 0.3  # near-uniform at init


def test_attention_is_causal():
    net = M.build("tiny", 16, 0).eval()
    x = torch.randint(0, 256, (1, 16))
    y = x.clone()
    y[0, 10:] = (y[0, 10:] + 1) % 256  # change the future only
    with torch.no_grad():
        a, _ = net(x)
        b, _ = net(y)
    torch.testing.assert_close(a[:, :10], b[:, :10])
    assert not torch.allclose(a[:, 10:], b[:, 10:])


def test_same_seed_same_weights_and_rng_untouched():
    torch.manual_seed(123)
    before = torch.rand(1)
    torch.manual_seed(123)
    a = M.build("tiny", 16, seed=5)
    after = torch.rand(1)
    b = M.build("tiny", 16, seed=5)
    assert torch.equal(before, after)
    for (n, p), (_, q) in zip(a.named_parameters(), b.named_parameters()):
        assert torch.equal(p, q), n


@pytest.mark.parametrize("preset", ["tiny", "60m"])
def test_a_blank_model_is_the_structure_and_takes_any_weights_bit_for_bit(preset):
    """Scratch models (a worker's, the evaluator's, pretraining's) are built without a
    random initialisation (60m and up: on the meta device, then empty storage), since
    their weights are loaded before any use: the same parameters, still tied, the same
    loss once loaded."""
    from fedlm.model import BLANK_ABOVE, blank, build, load_into, snapshot
    from fedlm.presets import parameter_count

    seeded, empty = build(preset, 64, seed=3), blank(preset, 64)
    assert [n for n, _ in empty.named_parameters()] == [n for n, _ in seeded.named_parameters()]
    assert empty.head.weight is empty.tok_emb.weight
    load_into(empty, snapshot(seeded))
    x = torch.randint(0, 256, (2, 64))
    assert torch.equal(empty(x, x)[1], seeded(x, x)[1])
    assert (parameter_count(preset, 64) >= BLANK_ABOVE) == (preset == "60m")
